//! Warm pools through the E2B-compatible API: a `templateID` naming a SandboxWarmPool in the
//! key's namespace makes `Sandbox.create()` (the official Python SDK,
//! tests/e2b/scenarios_pool.py) a claim of one of its running members, served cold once the
//! pool is empty; on the Docker provider against the real API server.

mod harness;

use harness::cluster::{apply_yaml_ok, kubectl_ok};
use harness::docker::{base_image, idle};
use harness::e2b_sdk::{Sdk, api_up, ensure_sleep_crd, key_for, options};
use harness::objects::{READY_TIMEOUT, wait_pool_within};
use harness::tenant::tenant;
use kube::Api;
use sandbox_doubles::ports::quiet_port;
use sandbox_operator::api::{Sandbox, SandboxWarmPool};
use sandbox_operator::e2bapi::id;
use serde_json::{Value, json};

/// Pool `name` of `replicas` idle members of the base image.
fn pool(name: &str, replicas: i32) -> String {
    json!({
        "apiVersion": "sandboxes.dev/v1alpha1",
        "kind": "SandboxWarmPool",
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "template": {"image": base_image(), "command": idle()}},
    })
    .to_string()
}

/// `Sandbox.create(template=pool)` with a per-task env var and metadata, then a command
/// that reads the env var where a claim delivers it; the Sandbox the create made.
async fn create_from(sdk: &Sdk, key: &str, api: &Api<Sandbox>, pool: &str) -> Sandbox {
    let args = json!({
        "template": pool, "timeout": 600,
        "envs": {"GREETING": "from-the-task"}, "metadata": {"task": "t1"},
        "cmd": ". /run/sandboxes.dev/env; echo \"$GREETING\"",
    });
    let r = sdk.ok(key, "pool_create_and_run", args);
    assert_eq!(r["stdout"], "from-the-task\n", "{r}");
    assert_eq!(r["exit_code"], 0, "{r}");
    let sid = r["sandbox_id"].as_str().expect("id");
    let name = id::parse(sid).expect("an id of this API").name;
    let s = api.get(&name).await.expect("the Sandbox the create made");
    let pool_ref = s.spec.warm_pool_ref.as_ref().map(|p| p.name.as_str());
    assert_eq!(pool_ref, Some(pool), "{:?}", s.spec);
    assert!(s.spec.image.is_none() && s.spec.template_ref.is_none());
    assert!(s.spec.lifetime.is_some(), "timeout → lifetime");
    let env = s.spec.env.clone().unwrap_or_default();
    assert!(env.iter().any(|e| e.name == "GREETING"), "{env:?}");
    s
}

#[tokio::test(flavor = "multi_thread")]
async fn sdk_create_from_a_pool_is_a_warm_claim_then_cold_when_empty() {
    ensure_sleep_crd();
    let port = quiet_port();
    let t = tenant("e2b-pool", &options(port)).await;
    let key = key_for(&t.ns);
    api_up(port).await;
    let sdk = Sdk::python(port);
    let pools: Api<SandboxWarmPool> = Api::namespaced(harness::cluster::client().await, &t.ns);
    apply_yaml_ok(&pool("warm", 2), &t.ns);
    wait_pool_within(&pools, "warm", 2, &t.op, READY_TIMEOUT).await;

    let warm = create_from(&sdk, &key, &t.api, "warm").await;
    let status = warm.status.clone().unwrap_or_default();
    assert_eq!(status.claim.as_deref(), Some("warm"), "{status:?}");

    // What a claim cannot take into a running member is refused by name.
    let network = json!({"deny_out": ["0.0.0.0/0"], "allow_out": ["example.com"]});
    let args = json!({"template": "warm", "timeout": 60, "network": network, "cmd": "true"});
    let refused: Value = sdk.run(&key, "pool_create_and_run", args);
    let message = refused["message"].as_str().unwrap_or_default();
    assert!(message.contains("network"), "{refused}");
    assert!(message.contains("warm"), "{refused}");

    kubectl_ok(&["scale", "sbxwp/warm", "--replicas=0", "-n", &t.ns], None);
    wait_pool_within(&pools, "warm", 0, &t.op, READY_TIMEOUT).await;
    let cold = create_from(&sdk, &key, &t.api, "warm").await;
    let status = cold.status.clone().unwrap_or_default();
    assert_eq!(status.claim.as_deref(), Some("cold"), "{status:?}");
}
