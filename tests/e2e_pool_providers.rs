//! Warm pools beyond Docker: one body ([`pools_on`]) runs against the Kubernetes provider
//! (Pods on the test nodes) and the E2B double (a remote provider that can sleep), each with
//! one operator and a pool of 2: the pool fills, a claim is served warm with its env visible
//! in the running member without a restart, an empty pool serves a claim cold, and deleting
//! the pool removes its unclaimed members and keeps the claimed one.

mod harness;

use std::collections::BTreeMap;
use std::time::Duration;

use harness::cluster::{apply_yaml_ok, kubectl_ok};
use harness::e2b::E2b;
use harness::kubernetes::Kubernetes;
use harness::objects::{is_ready, sandbox_id, wait_pool_within};
use harness::operator::Operator;
use harness::wait_for;
use harness::world::{Backend, World};
use kube::Api;
use kube::api::ListParams;
use sandbox_operator::api::SandboxWarmPool;
use sandbox_operator::provider::labels::OWNER_UID;
use sandbox_operator::provider::{ExecRequest, Provider};
use serde_json::{Value, json};

/// What the body needs from a provider's far side beyond the world.
trait Members {
    /// Whether the provider can add labels to a running sandbox (a warm claim's).
    const RELABELS: bool;
    /// The provider labels (E2B: metadata) of sandbox `id`.
    async fn labels(&self, id: &str) -> BTreeMap<String, String>;
    /// The ids of the provider sandboxes labelled with owner `uid`.
    async fn owned_by(&self, uid: &str) -> Vec<String>;
    /// `sh -c script` in sandbox `id`: its stdout.
    async fn sh(&self, id: &str, script: &str) -> String;
}

impl Members for World<Kubernetes> {
    const RELABELS: bool = true;

    async fn labels(&self, id: &str) -> BTreeMap<String, String> {
        let pod = self.pods().await.get(id).await.expect("the Pod");
        pod.metadata.labels.unwrap_or_default()
    }

    async fn owned_by(&self, uid: &str) -> Vec<String> {
        let selector = format!("{OWNER_UID}={uid}");
        let pods = self.pods().await;
        let list = pods.list(&ListParams::default().labels(&selector)).await;
        let pods = list.expect("list pods").items;
        pods.into_iter().filter_map(|p| p.metadata.name).collect()
    }

    async fn sh(&self, id: &str, script: &str) -> String {
        let request = ExecRequest::shell(script, Duration::from_secs(30));
        let out = self
            .provider()
            .await
            .exec(id, &request)
            .await
            .expect("exec");
        assert_eq!(out.exit_code, 0, "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Members for World<E2b> {
    const RELABELS: bool = false;

    async fn labels(&self, id: &str) -> BTreeMap<String, String> {
        let record = self.double.sandbox(id).await.expect("the E2B sandbox");
        record.metadata
    }

    async fn owned_by(&self, uid: &str) -> Vec<String> {
        let all = self.double.sandboxes().await.into_iter();
        let owned = all.filter(|s| s.metadata.get(OWNER_UID).map(String::as_str) == Some(uid));
        owned.map(|s| s.id).collect()
    }

    async fn sh(&self, id: &str, script: &str) -> String {
        let record = self.double.sandbox(id).await.expect("the E2B sandbox");
        harness::docker::docker_sh(&record.container, script).expect("exec")
    }
}

/// Pool `name` of `replicas` members shaped `template`.
fn pool(name: &str, replicas: i32, template: &Value) -> String {
    let pool = json!({
        "apiVersion": "sandboxes.dev/v1alpha1",
        "kind": "SandboxWarmPool",
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "template": template},
    });
    serde_yaml::to_string(&pool).expect("YAML")
}

/// Waits until pool `name` has `ready` unclaimed Ready members; its UID.
async fn wait_pool<B: Backend>(w: &World<B>, name: &str, ready: i32, op: &Operator) -> String {
    let api: Api<SandboxWarmPool> = Api::namespaced(harness::cluster::client().await, &w.ns);
    let p = wait_pool_within(&api, name, ready, op, B::TIMEOUT).await;
    p.metadata.uid.expect("uid")
}

/// PID 1's start time (field 22 of /proc/1/stat) in sandbox `id`.
async fn pid1_start(w: &impl Members, id: &str) -> String {
    let stat = w.sh(id, "cat /proc/1/stat").await;
    let after = &stat[stat.rfind(')').expect("comm") + 2..];
    after
        .split_whitespace()
        .nth(22 - 3)
        .expect("field 22")
        .into()
}

/// A claim of pool `pool` with a per-task env var and label.
fn claim(pool: &str, greeting: &str) -> Value {
    json!({
        "warmPoolRef": {"name": pool},
        "env": [{"name": "GREETING", "value": greeting}],
        "labels": {"task": greeting},
    })
}

/// The `task` label of sandbox `id`.
async fn task_label(w: &impl Members, id: &str) -> Option<String> {
    w.labels(id).await.remove("task")
}

/// The body: fill, warm claim, cold claim, pool deletion.
async fn pools_on<B: Backend>(w: &World<B>, op: &Operator, template: Value)
where
    World<B>: Members,
{
    apply_yaml_ok(&pool("p", 2, &template), &w.ns);
    let pool_uid = wait_pool(w, "p", 2, op).await;
    let mut before = BTreeMap::new();
    for id in w.owned_by(&pool_uid).await {
        before.insert(id.clone(), pid1_start(w, &id).await);
    }
    assert_eq!(before.len(), 2, "{before:?}");

    w.apply("warm", claim("p", "warm-hi"));
    let s = w.wait_ready("warm", op).await;
    let status = s.status.clone().unwrap_or_default();
    assert_eq!(status.claim.as_deref(), Some("warm"), "{status:?}");
    let member = sandbox_id(&s);
    let started = before.get(&member).expect("a member of the filled pool");
    let seen = w
        .sh(&member, ". /run/sandboxes.dev/env; echo \"$GREETING\"")
        .await;
    assert_eq!(seen.trim(), "warm-hi");
    assert_eq!(&pid1_start(w, &member).await, started, "not restarted");
    let wanted = World::<B>::RELABELS.then(|| "warm-hi".to_string());
    assert_eq!(
        task_label(w, &member).await,
        wanted,
        "the claim's label, where it can be"
    );

    apply_yaml_ok(&pool("empty", 0, &template), &w.ns);
    wait_pool(w, "empty", 0, op).await;
    w.apply("cold", claim("empty", "cold-hi"));
    let c = w.wait_ready("cold", op).await;
    let status = c.status.clone().unwrap_or_default();
    assert_eq!(status.claim.as_deref(), Some("cold"), "{status:?}");
    let seen = w
        .sh(
            &sandbox_id(&c),
            ". /run/sandboxes.dev/env; echo \"$GREETING\"",
        )
        .await;
    assert_eq!(seen.trim(), "cold-hi");
    let label = task_label(w, &sandbox_id(&c)).await;
    assert_eq!(
        label.as_deref(),
        Some("cold-hi"),
        "a cold claim is labelled at create"
    );

    wait_pool(w, "p", 2, op).await;
    kubectl_ok(&["delete", "sbxwp", "p", "-n", &w.ns, "--wait=false"], None);
    wait_for("unclaimed members removed", B::TIMEOUT, || async {
        match w.owned_by(&pool_uid).await.as_slice() {
            [only] if only == &member => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    is_ready(&w.api.get("warm").await.expect("get")).expect("the claim is still Ready");
    assert_eq!(w.sh(&member, "echo alive").await.trim(), "alive");
}

#[tokio::test(flavor = "multi_thread")]
async fn pools_on_the_kubernetes_provider() {
    let w = World::kubernetes("pool-k8s").await;
    let op = w.operator("", vec![]);
    let template = json!({
        "provider": "k8s",
        "image": harness::docker::base_image(),
        "command": ["sleep", "infinity"],
    });
    pools_on(&w, &op, template).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn pools_on_the_e2b_double() {
    let w = World::e2b("pool-e2b", 600).await;
    let op = w.operator("sweeper:\n  enabled: false\n", vec![]);
    let template = json!({"provider": "e2b", "image": "base"});
    pools_on(&w, &op, template).await;
    drop(op);
    w.shutdown().await;
}
