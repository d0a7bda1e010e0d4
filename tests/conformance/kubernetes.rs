//! The Kubernetes factory: the suite against the Kubernetes provider on the real test
//! node(s) (`tests/setup/node.sh`). Each fixture has its own provider namespace and
//! operator-instance name; its guard deletes the namespace and the test-mode hostPath
//! volumes, also when a check panicked.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use sandbox_operator::provider::kubernetes::pod::{CONTAINER, GATE};
use sandbox_operator::provider::labels::Owner;
use sandbox_operator::provider::{CreateRequest, ImagePullPolicy, Resources, RestartPolicy};

use super::fixture::{Expect, Fixture, Planter, Skipped};
use super::support::unique_hex;
use crate::harness;
use crate::harness::docker::{base_image, idle};
use crate::harness::kubernetes;

/// What the Kubernetes provider offers: volumes, files and bulk files; command, CPU and
/// memory are enforced (the kubelet's cgroups); pids and egress are refused (a per-Pod pids
/// ceiling and domain filtering do not exist in Kubernetes). No hibernation (a Pod cannot
/// pause), no native templates, no in-place resize, no capacity probe, no events.
pub fn expect() -> Expect {
    Expect {
        volumes: true,
        files: true,
        bulk_files: true,
        command: true,
        cpu: true,
        memory: true,
        streaming_exec: true,
        logs: true,
        port_forward: true,
        ..Expect::default()
    }
}

pub async fn fixture() -> Result<Fixture, Skipped> {
    kubernetes::node().await;
    let instance = format!("conf-{}", unique_hex());
    let namespace = harness::cluster::namespace("k8sconf").await;
    let provider = kubernetes::provider("kubernetes-conformance", &namespace).await;
    let base = CreateRequest {
        name: String::new(),
        owner: Owner {
            instance: instance.clone(),
            kind: "Sandbox".into(),
            namespace: String::new(),
            name: String::new(),
            uid: String::new(),
        },
        image: Some(base_image()),
        template: None,
        command: Some(idle()),
        restart_policy: RestartPolicy::Never,
        env: BTreeMap::new(),
        labels: BTreeMap::new(),
        resources: Resources::default(),
        ports: vec![],
        volumes: vec![],
        allowed_domains: None,
        idle_action: None,
        image_pull_policy: ImagePullPolicy::IfNotPresent,
        registry_credentials: Vec::new(),
        secret_env_keys: Default::default(),
    };
    Ok(Fixture {
        provider: Arc::new(provider),
        unreachable: Arc::new(kubernetes::unreachable(&namespace)),
        planter: Some(Arc::new(PodPlanter {
            namespace: namespace.clone(),
        })),
        guard: Some(Box::new(kubernetes::Cleanup {
            namespace,
            instance: instance.clone(),
        })),
        faults: None,
        instance,
        base,
        expect: expect(),
        patience: Duration::from_secs(60),
        history: None,
    })
}

/// Plants gated Pods straight through the API server, behind the provider's back.
struct PodPlanter {
    namespace: String,
}

#[async_trait]
impl Planter for PodPlanter {
    async fn plant(&self, labels: &BTreeMap<String, String>) -> Result<String, String> {
        let pods: kube::Api<Pod> =
            kube::Api::namespaced(harness::cluster::client().await, &self.namespace);
        let name = format!("planted-{}", unique_hex());
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": labels},
            "spec": {
                "schedulingGates": [{"name": GATE}],
                "containers": [{"name": CONTAINER, "image": base_image(), "command": idle(),
                                "imagePullPolicy": "IfNotPresent"}],
            },
        }))
        .map_err(|e| e.to_string())?;
        pods.create(&Default::default(), &pod)
            .await
            .map_err(|e| format!("planting a Pod: {e}"))?;
        Ok(name)
    }
}
