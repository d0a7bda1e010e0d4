//! End to end on the Kubernetes provider: `kubectl apply` → the operator binary → Pods on the
//! real test node(s) (`tests/setup/node.sh`: kubelets with containerd, kube-scheduler,
//! kube-controller-manager, kube-proxy for the host). Each test has its own Sandbox
//! namespace (= operator instance) and its own provider namespace for the Pods.

mod harness;

use std::collections::BTreeMap;
use std::time::Duration;

use harness::cluster::*;
use harness::kubernetes::{Kubernetes, READY_TIMEOUT};
use harness::metrics::{PassCount, Passes};
use harness::registry::create_pull_secret;
use harness::wait_for;
use harness::world::{SWEEPER, foreign_labels};
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use kube::Api;
use kube::api::PostParams;
use sandbox_operator::provider::kubernetes::pod::{CONTAINER, GATE, STOPPED};
use sandbox_operator::provider::{ExecRequest, Files, Provider};
use serde_json::{Value, json};

/// Serves the Pod's hostname (= the Pod name) on 8080 (perl-base only).
const SERVER: &str = "perl -MIO::Socket::INET -e '$s=IO::Socket::INET->new(LocalPort=>8080,Listen=>5,ReuseAddr=>1) or die; \
    while($c=$s->accept){<$c>; print $c \"HTTP/1.0 200 OK\\r\\n\\r\\n$ENV{HOSTNAME}\"; close $c}'";

/// One test's world: the Sandbox namespace (also the operator instance) and the provider's
/// Pod namespace.
type World = harness::world::World<Kubernetes>;

impl World {
    async fn new(prefix: &str) -> World {
        World::kubernetes(prefix).await
    }

    /// Creates a Pod straight through the API (a person with kubectl, a crashed operator
    /// elsewhere), started, carrying `labels`.
    async fn plant(&self, labels: Value) -> String {
        let name = harness::unique("planted");
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": labels},
            "spec": {"containers": [{"name": CONTAINER, "image": harness::docker::base_image(),
                     "imagePullPolicy": "IfNotPresent", "command": ["sleep", "infinity"]}],
                     "terminationGracePeriodSeconds": 0},
        }))
        .expect("pod");
        self.pods()
            .await
            .create(&PostParams::default(), &pod)
            .await
            .expect("plant");
        name
    }
}

fn sleeper() -> Value {
    json!({
        "provider": "k8s",
        "image": harness::docker::base_image(),
        "command": ["sleep", "infinity"],
    })
}

/// GETs `url` until it answers; returns the body.
async fn fetch(url: &str) -> String {
    wait_for(
        &format!("{url} to answer"),
        Duration::from_secs(60),
        || async {
            // Right after a Pod is replaced, the Service can still lead nowhere (endpoints and
            // kube-proxy catch up; this host's gateway answers unknown addresses itself):
            // only a successful, non-empty answer counts.
            match reqwest::get(url).await {
                Ok(r) if r.status().is_success() => match r.text().await {
                    Ok(body) if !body.is_empty() => Ok(body),
                    Ok(_) => Err("empty answer".to_string()),
                    Err(e) => Err(e.to_string()),
                },
                Ok(r) => Err(format!("status {}", r.status())),
                Err(e) => Err(e.to_string()),
            }
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_is_a_scheduled_pod_whose_url_exec_and_files_work_and_survive_a_stop() {
    let w = World::new("e2e-k8s-basic").await;
    let op = w.operator("", vec![]);
    let mut spec = sleeper();
    spec["command"] = json!(["sh", "-c", SERVER]);
    spec["ports"] = json!([{"name": "http", "port": 8080}]);
    spec["resources"] = json!({"cpu": "500m", "memory": "128Mi"});
    spec["env"] = json!([{"name": "GREETING", "value": "hello"}]);
    w.apply("web", spec);
    let s = w.wait_ready("web", &op).await;
    let status = s.status.clone().expect("status");
    let uid = s.metadata.uid.clone().expect("uid");
    let id = status.sandbox_id.clone().expect("sandboxId");
    assert_eq!(
        id,
        format!("sbx-{uid}"),
        "the Pod's name is the external name"
    );
    assert!(status.started_at.is_some());

    // A real Pod, placed by the scheduler, hardened, with the owner labels.
    let pod = w.pods().await.get(&id).await.expect("the sandbox's Pod");
    let spec = pod.spec.clone().expect("spec");
    assert!(
        spec.node_name.is_some_and(|n| n.starts_with("sbx-node-")),
        "scheduled"
    );
    assert_eq!(spec.runtime_class_name.as_deref(), Some("runc"));
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get("sandboxes.dev/owner-uid"), Some(&uid));
    assert_eq!(labels.get("sandboxes.dev/managed-by"), Some(&w.ns));
    let sc = spec.containers[0]
        .security_context
        .clone()
        .expect("securityContext");
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(
        sc.capabilities.and_then(|c| c.drop),
        Some(vec!["ALL".to_string()])
    );
    let limits = spec.containers[0]
        .resources
        .clone()
        .and_then(|r| r.limits)
        .expect("limits");
    assert_eq!(limits["cpu"].0, "500m");

    // The URL is the Service's, and it reaches this Pod.
    let url = status.url.clone().expect("status.url");
    let service = Api::<Service>::namespaced(client().await, &w.pods_ns)
        .get(&id)
        .await
        .expect("the sandbox's Service");
    let cluster_ip = service.spec.and_then(|s| s.cluster_ip).expect("clusterIP");
    assert_eq!(url, format!("http://{cluster_ip}:8080"));
    assert_eq!(fetch(&url).await, id, "the URL reaches this Pod");

    // Exec and files through the Pod exec API.
    let provider = w.provider().await;
    let out = provider
        .exec(
            &id,
            &ExecRequest::shell("printf %s \"$GREETING\"", Duration::from_secs(30)),
        )
        .await
        .expect("exec");
    assert_eq!(
        (out.exit_code, out.stdout.as_slice()),
        (0, b"hello".as_slice())
    );
    let bytes: Vec<u8> = (0..=255).collect();
    provider
        .write_file(&id, "/tmp/e2e/bytes", &bytes, 0o644)
        .await
        .expect("write");
    assert_eq!(
        provider
            .read_file(&id, "/tmp/e2e/bytes")
            .await
            .expect("read"),
        bytes
    );

    // Stopped: the Pod goes (a gated stand-in keeps the identity), the Service stays.
    w.patch_spec("web", json!({"state": "Stopped"})).await;
    w.wait_ready("web", &op).await;
    let stopped = w.pods().await.get(&id).await.expect("the stand-in Pod");
    let gates = stopped
        .spec
        .clone()
        .and_then(|s| s.scheduling_gates)
        .unwrap_or_default();
    assert_eq!(gates.len(), 1, "gated");
    assert_eq!(gates[0].name, GATE);
    assert!(
        stopped
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key(STOPPED)
    );
    assert_ne!(
        stopped.metadata.uid, pod.metadata.uid,
        "the running Pod is gone"
    );
    assert!(
        Api::<Service>::namespaced(client().await, &w.pods_ns)
            .get_opt(&id)
            .await
            .expect("get service")
            .is_some(),
        "the Service outlives a stop"
    );

    // Running again: a new Pod under the same name, the URL answers again.
    w.patch_spec("web", json!({"state": "Running"})).await;
    let s = w.wait_ready("web", &op).await;
    assert_eq!(
        s.status.as_ref().and_then(|st| st.sandbox_id.clone()),
        Some(id.clone())
    );
    let url = s
        .status
        .and_then(|st| st.url)
        .expect("url after the restart");
    assert_eq!(fetch(&url).await, id);
    assert_eq!(w.our_pods().await.len(), 1, "one Pod, never two");

    w.delete_and_wait_gone("web").await;
    assert!(w.our_pods().await.is_empty(), "the Pod is gone");
    let service = Api::<Service>::namespaced(client().await, &w.pods_ns)
        .get_opt(&id)
        .await
        .expect("get service");
    assert!(service.is_none(), "the Service is gone");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crash_between_create_and_status_write_leaves_exactly_one_pod() {
    let w = World::new("e2e-k8s-crash").await;
    w.crash_after_create("crashy", sleeper(), "").await;
    assert_eq!(w.our_pods().await.len(), 1, "the create happened");

    let op = w.operator("", vec![]);
    let s = w.wait_ready("crashy", &op).await;
    let pods = w.our_pods().await;
    assert_eq!(pods.len(), 1, "adopted, not duplicated");
    assert_eq!(
        s.status.and_then(|st| st.sandbox_id),
        pods[0].metadata.name.clone()
    );
    w.delete_and_wait_gone("crashy").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_sweeper_removes_orphan_pods_and_keeps_foreign_ones() {
    let w = World::new("e2e-k8s-sweep").await;
    let orphan = w.plant(w.orphan_labels()).await;
    let foreign = w.plant(foreign_labels()).await;
    let unlabelled = w.plant(json!({"team": "ops"})).await;
    let op = w.operator(SWEEPER, vec![]);
    let pods = w.pods().await;
    wait_for(
        &format!("the orphan Pod swept (log {})", op.log.display()),
        READY_TIMEOUT,
        || async {
            match pods.get_opt(&orphan).await {
                Ok(None) => Ok(()),
                Ok(Some(_)) => Err("still there".to_string()),
                Err(e) => Err(e.to_string()),
            }
        },
    )
    .await;
    let passes = PassCount::now(&op, Passes::Completed);
    passes.wait_more(2.0, "two more sweeper passes").await;
    for kept in [&foreign, &unlabelled] {
        assert!(
            pods.get_opt(kept).await.expect("get").is_some(),
            "{kept} is not ours and must be kept"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn image_pull_secrets_reach_the_pod_and_the_kubelet_pulls_with_them() {
    let w = World::new("e2e-k8s-pull").await;
    let registry = harness::registry::registry();
    let docker = harness::docker::engine().await;
    let repository = format!("e2e/{}", harness::unique("k8s"));
    let reference = harness::registry::push_fresh_image(
        &docker,
        &harness::docker::base_image(),
        &registry,
        &repository,
        "v1",
        "pulled-by-the-kubelet",
    )
    .await;
    create_pull_secret(&w.ns, "regcred", &registry, &registry.password).await;
    let op = w.operator("", vec![]);
    let mut spec = sleeper();
    spec["image"] = json!(format!("{}/{repository}:v1", registry.addr));
    spec["imagePullPolicy"] = json!("Always");
    spec["imagePullSecrets"] = json!([{"name": "regcred"}]);
    w.apply("private", spec);
    let s = w.wait_ready("private", &op).await;
    let id = s.status.and_then(|st| st.sandbox_id).expect("sandboxId");

    let pod = w.pods().await.get(&id).await.expect("pod");
    let spec = pod.spec.expect("spec");
    let pull_secret = format!("{id}-pull");
    let names: Vec<String> = spec
        .image_pull_secrets
        .unwrap_or_default()
        .into_iter()
        .map(|r| r.name)
        .collect();
    assert_eq!(names, vec![pull_secret.clone()]);
    assert_eq!(
        spec.containers[0].image_pull_policy.as_deref(),
        Some("Always")
    );
    let copy = Api::<Secret>::namespaced(client().await, &w.pods_ns)
        .get(&pull_secret)
        .await
        .expect("the per-sandbox pull Secret");
    assert_eq!(
        copy.type_.as_deref(),
        Some("kubernetes.io/dockerconfigjson")
    );
    let doc: Value =
        serde_json::from_slice(&copy.data.expect("data")[".dockerconfigjson"].0).expect("json");
    let registries: Vec<&String> = doc["auths"].as_object().expect("auths").keys().collect();
    assert_eq!(
        registries,
        vec![&registry.addr],
        "only the image's registry"
    );
    let digest = reference.rsplit('@').next().expect("digest").to_string();
    let status = pod.status.expect("status");
    let image_id = status.container_statuses.expect("container statuses")[0]
        .image_id
        .clone();
    assert!(
        image_id.ends_with(&digest),
        "the pushed image runs: {image_id} vs {reference}"
    );
    let gets: BTreeMap<String, usize> = registry.blob_gets(&repository).into_iter().collect();
    assert!(
        !gets.is_empty(),
        "the kubelet pulled from the registry (with auth)"
    );

    w.delete_and_wait_gone("private").await;
    let left = Api::<Secret>::namespaced(client().await, &w.pods_ns)
        .get_opt(&pull_secret)
        .await
        .expect("get");
    assert!(left.is_none(), "the pull Secret goes with the sandbox");
    harness::registry::remove_image(&docker, &reference).await;
    harness::node::remove_image(&format!("{}/{repository}:v1", registry.addr));
    harness::node::remove_image(&reference);
}

#[tokio::test(flavor = "multi_thread")]
async fn never_started_pods_are_wreckage_and_swept_even_with_a_live_owner() {
    let w = World::new("e2e-k8s-wreck").await;
    // A live owner whose provider does not exist: the controller makes nothing for it.
    let mut spec = sleeper();
    spec["provider"] = json!("nowhere");
    w.apply("keeper", spec);
    let uid = w
        .api
        .get("keeper")
        .await
        .expect("get")
        .metadata
        .uid
        .expect("uid");
    let labels = json!({
        "sandboxes.dev/managed-by": w.ns,
        "sandboxes.dev/owner-uid": uid,
        "sandboxes.dev/owner": format!("{}.keeper", w.ns),
        "sandboxes.dev/kind": "Sandbox",
    });
    // Started (kept), never scheduled (no node matches), scheduled but never started (an
    // image the node does not have, never pulled).
    let started = w.plant(labels.clone()).await;
    let pods = w.pods().await;
    let never = format!("never-{}", harness::unique("p"));
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": never, "labels": labels},
        "spec": {"nodeSelector": {"sandboxes.dev/no-such-node": "true"},
                 "containers": [{"name": CONTAINER, "image": harness::docker::base_image(),
                                 "imagePullPolicy": "IfNotPresent"}]},
    }))
    .expect("pod");
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("plant unschedulable");
    let missing = format!("noimage-{}", harness::unique("p"));
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": missing, "labels": labels},
        "spec": {"containers": [{"name": CONTAINER, "image": "sandbox-operator/absent:never",
                                 "imagePullPolicy": "Never"}]},
    }))
    .expect("pod");
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("plant unstartable");

    // The provider reports both as never started, and the started one as started — once the
    // unstartable Pod is scheduled (before that it is never-started for the plain reason that
    // it has no node, which is the other planted Pod's case).
    let provider = w.provider().await;
    wait_for(
        "the unstartable Pod scheduled, and the planted Pods as the provider sees them",
        READY_TIMEOUT,
        || async {
            let node = pods.get(&missing).await.map_err(|e| e.to_string())?;
            if node.spec.and_then(|s| s.node_name).is_none() {
                return Err(format!("{missing} is not scheduled yet"));
            }
            let mut by_name = BTreeMap::new();
            for id in [&never, &missing, &started] {
                let d = provider.describe(id).await.map_err(|e| e.to_string())?;
                by_name.insert(id.clone(), d.is_some_and(|d| d.started_at.has_run()));
            }
            let want = BTreeMap::from([
                (never.clone(), false),
                (missing.clone(), false),
                (started.clone(), true),
            ]);
            (by_name == want)
                .then_some(())
                .ok_or(format!("{by_name:?}"))
        },
    )
    .await;

    let op = w.operator(SWEEPER, vec![]);
    for gone in [&never, &missing] {
        wait_for(
            &format!("wreckage {gone} swept (log {})", op.log.display()),
            READY_TIMEOUT,
            || async {
                match pods.get_opt(gone).await {
                    Ok(None) => Ok(()),
                    Ok(Some(_)) => Err("still there".to_string()),
                    Err(e) => Err(e.to_string()),
                }
            },
        )
        .await;
    }
    assert!(
        pods.get_opt(&started).await.expect("get").is_some(),
        "a started Pod of a live owner is kept"
    );
}
