//! Walls between tenants on the Kubernetes provider, on the real test node(s): Secret values
//! stay out of the Pod spec (a per-sandbox Secret owned by the Pod carries them), the
//! sandboxes namespace has a default-deny NetworkPolicy, and a Sandbox that says nothing
//! about resources still gets requests, limits and an ephemeral-storage limit.
//!
//! The test nodes' bridge CNI does not enforce NetworkPolicy, so the policy's shape is what
//! is checked here, against the real API server (which validates it); what it blocks depends
//! on the cluster's CNI.

mod harness;

use std::collections::BTreeMap;
use std::time::Duration;

use harness::cluster::{client, create_secret, get_json};
use harness::kubernetes::Kubernetes;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::Api;
use sandbox_operator::provider::{ExecRequest, Provider};
use serde_json::{Value, json};

type World = harness::world::World<Kubernetes>;

/// The provider's one NetworkPolicy in its namespace.
const POLICY: &str = "sandboxes-default-deny";

fn sleeper() -> Value {
    json!({
        "provider": "k8s",
        "image": harness::docker::base_image(),
        "command": ["sleep", "infinity"],
    })
}

/// What `printenv NAME` prints inside sandbox `id`.
async fn printenv(w: &World, id: &str, name: &str) -> String {
    let out = w
        .provider()
        .await
        .exec(
            id,
            &ExecRequest::shell(format!("printenv {name}"), Duration::from_secs(30)),
        )
        .await
        .expect("exec");
    assert_eq!(out.exit_code, 0, "printenv {name}: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim_end().to_string()
}

/// The sandbox's env Secret, `None` when there is none.
async fn env_secret(w: &World, id: &str) -> Option<Secret> {
    Api::<Secret>::namespaced(client().await, &w.pods_ns)
        .get_opt(&format!("{id}-env"))
        .await
        .expect("get the env Secret")
}

/// Asserts that the env Secret of `id` is owned by the Pod `id` as it is now.
async fn assert_owned_by_pod(w: &World, id: &str) {
    let pod = w.pods().await.get(id).await.expect("the Pod");
    let secret = env_secret(w, id).await.expect("the per-sandbox env Secret");
    let owners = secret.metadata.owner_references.unwrap_or_default();
    let to_pod: Vec<_> = owners
        .iter()
        .map(|o| (o.kind.as_str(), o.name.as_str(), Some(o.uid.clone())))
        .collect();
    assert_eq!(
        to_pod,
        vec![("Pod", id, pod.metadata.uid.clone())],
        "owned by the Pod, so the API server's garbage collector removes it with the Pod"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn env_from_values_reach_the_pod_through_an_owned_secret_never_its_spec() {
    let w = World::kubernetes("ten-k8s-env").await;
    let value = harness::unique("team-a-secret-value");
    create_secret(&w.ns, "team-token", None, json!({"TOKEN": value})).await;
    let op = w.operator("", vec![]);
    let mut spec = sleeper();
    spec["envFrom"] = json!([{"secretRef": {"name": "team-token"}}]);
    spec["env"] = json!([{"name": "PLAIN", "value": "visible"}]);
    w.apply("env", spec);
    let s = w.wait_ready("env", &op).await;
    let uid = s.metadata.uid.clone().expect("uid");
    let id = s.status.and_then(|st| st.sandbox_id).expect("sandboxId");

    // Whoever can `get pods` in the sandboxes namespace does not see the value.
    let pod_json = get_json("pod", &id, &w.pods_ns).expect("the Pod as JSON");
    assert!(
        !pod_json.contains(&value),
        "the Secret's value is in the Pod: {pod_json}"
    );
    let pod: Value = serde_json::from_str(&pod_json).expect("json");
    let env = &pod["spec"]["containers"][0]["env"];
    let by_name: BTreeMap<&str, &Value> = env
        .as_array()
        .expect("env")
        .iter()
        .map(|e| (e["name"].as_str().unwrap_or_default(), e))
        .collect();
    assert_eq!(
        by_name["PLAIN"]["value"], "visible",
        "plain env stays inline"
    );
    assert_eq!(
        by_name["TOKEN"]["valueFrom"]["secretKeyRef"],
        json!({"name": format!("{id}-env"), "key": "TOKEN"}),
    );
    let secret = env_secret(&w, &id).await.expect("the env Secret");
    let labels = secret.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get("sandboxes.dev/owner-uid"), Some(&uid));
    assert_eq!(labels.get("sandboxes.dev/managed-by"), Some(&w.ns));
    assert_owned_by_pod(&w, &id).await;
    assert_eq!(
        printenv(&w, &id, "TOKEN").await,
        value,
        "the sandbox sees it"
    );

    // A stop replaces the Pod: the Secret follows the new Pod instead of going with the old.
    w.patch_spec("env", json!({"state": "Stopped"})).await;
    w.wait_ready("env", &op).await;
    w.patch_spec("env", json!({"state": "Running"})).await;
    w.wait_ready("env", &op).await;
    assert_owned_by_pod(&w, &id).await;
    assert_eq!(printenv(&w, &id, "TOKEN").await, value, "after a restart");

    w.delete_and_wait_gone("env").await;
    assert!(
        env_secret(&w, &id).await.is_none(),
        "the env Secret goes with the sandbox"
    );
}

/// The egress exceptions every sandbox Pod gets: loopback, RFC 1918, CGNAT, link-local (the
/// metadata endpoint included), Azure's wire server, and IPv6 loopback, link-local and ULA.
fn expected_policy_spec() -> Value {
    json!({
        "podSelector": {"matchExpressions": [
            {"key": "sandboxes.dev/owner-uid", "operator": "Exists"}
        ]},
        "policyTypes": ["Ingress", "Egress"],
        "egress": [
            {"to": [
                {"ipBlock": {"cidr": "0.0.0.0/0", "except": [
                    "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8",
                    "169.254.0.0/16", "172.16.0.0/12", "192.168.0.0/16", "168.63.129.16/32"
                ]}},
                {"ipBlock": {"cidr": "::/0", "except": ["::1/128", "fe80::/10", "fc00::/7"]}}
            ]},
            {"to": [{
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}
            }], "ports": [
                {"protocol": "UDP", "port": 53},
                {"protocol": "TCP", "port": 53}
            ]}
        ],
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn the_sandboxes_namespace_has_one_default_deny_network_policy() {
    let w = World::kubernetes("ten-k8s-netpol").await;
    let op = w.operator("", vec![]);
    w.apply("one", sleeper());
    w.wait_ready("one", &op).await;
    let policies = Api::<NetworkPolicy>::namespaced(client().await, &w.pods_ns);
    let policy = policies
        .get_opt(POLICY)
        .await
        .expect("get")
        .unwrap_or_else(|| panic!("no NetworkPolicy {POLICY} in {}", w.pods_ns));
    let labels = policy.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels
            .get("app.kubernetes.io/managed-by")
            .map(String::as_str),
        Some("sandbox-operator")
    );
    let spec = serde_json::to_value(policy.spec.clone().expect("spec")).expect("json");
    assert_eq!(
        spec,
        expected_policy_spec(),
        "no ingress rule: no Pod (another tenant's sandbox included) reaches a sandbox"
    );

    // Ensured once: a second sandbox leaves the policy as it was.
    w.apply("two", sleeper());
    w.wait_ready("two", &op).await;
    let again = policies.get(POLICY).await.expect("get");
    assert_eq!(
        again.metadata.resource_version, policy.metadata.resource_version,
        "not rewritten per create"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_silent_spec_gets_default_requests_limits_and_ephemeral_storage() {
    let w = World::kubernetes("ten-k8s-res").await;
    let op = w.operator("", vec![]);
    w.apply("plain", sleeper());
    let s = w.wait_ready("plain", &op).await;
    let status = s.status.expect("status");
    let id = status.sandbox_id.clone().expect("sandboxId");
    let pod = w.pods().await.get(&id).await.expect("the Pod");
    let resources = pod.spec.expect("spec").containers[0]
        .resources
        .clone()
        .expect("resources");
    let quantities =
        |m: Option<BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>| {
            m.unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.0))
                .collect::<BTreeMap<_, _>>()
        };
    let pairs = |p: &[(&str, &str)]| {
        p.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>()
    };
    assert_eq!(
        quantities(resources.limits),
        pairs(&[
            ("cpu", "1"),
            ("memory", "1Gi"),
            ("ephemeral-storage", "2Gi")
        ])
    );
    assert_eq!(
        quantities(resources.requests),
        pairs(&[
            ("cpu", "100m"),
            ("memory", "128Mi"),
            ("ephemeral-storage", "128Mi")
        ])
    );
    let applied = status.resources.expect("status.resources");
    assert_eq!(applied.cpu.as_deref(), Some("1000m"));
    assert_eq!(applied.memory.as_deref(), Some("1073741824"));
    assert_eq!(applied.disk.as_deref(), Some("2147483648"));
}
