//! Tenants' share of the machine (issue 22, item 5), on the real Docker engine and the real
//! API server: provider defaults that bound a Sandbox whose spec is silent, a per-namespace
//! `SandboxBudget` that queues Sandboxes in creation order, and a Kubernetes ResourceQuota
//! counting Sandboxes.

mod harness;

use std::time::Duration;

use bollard::query_parameters::InspectContainerOptions;
use harness::cluster::*;
use harness::docker::*;
use harness::objects::{READY_TIMEOUT, delete_and_wait_gone, wait_object, wait_ready};
use harness::operator::*;
use harness::wait_for;
use kube::Api;
use kube::api::PostParams;
use sandbox_operator::api::{Sandbox, condition};
use serde_json::json;

/// Applies the Sandbox `name` (the base image, idling) in `ns`.
fn apply_idle(ns: &str, name: &str) {
    let manifest = json!({
        "apiVersion": "sandboxes.dev/v1alpha1",
        "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": {"provider": "docker", "image": base_image(), "command": idle()},
    });
    apply_yaml_ok(&serde_yaml::to_string(&manifest).expect("yaml"), ns);
}

/// `Ok` when `s`'s Ready condition is False with reason `OverBudget`; the message is returned
/// through the error otherwise, so a timeout shows what the object says.
fn over_budget(s: &Sandbox) -> Result<(), String> {
    let conditions = s.status.as_ref().map(|st| st.conditions.clone());
    let ready = conditions
        .as_deref()
        .and_then(|c| condition(c, "Ready").cloned());
    match ready {
        Some(c) if c.status == "False" && c.reason == "OverBudget" => Ok(()),
        other => Err(format!("Ready is {other:?}")),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_silent_spec_gets_the_provider_ceilings_and_capped_logs() {
    let ns = namespace("budget-defaults").await;
    let _purge = Purge(ns.clone());
    let op = Operator::start(&ns, &ns, &OperatorOptions::default());
    apply_idle(&ns, "plain");
    let api: Api<Sandbox> = Api::namespaced(client().await, &ns);
    let s = wait_ready(&api, "plain", &op).await;
    let id = s
        .status
        .as_ref()
        .and_then(|st| st.sandbox_id.clone())
        .expect("sandboxId");
    let c = engine()
        .await
        .inspect_container(&id, None::<InspectContainerOptions>)
        .await
        .expect("inspect");
    let host = c.host_config.expect("HostConfig");
    assert!(host.memory.unwrap_or(0) > 0, "Memory is {:?}", host.memory);
    assert!(
        host.nano_cpus.unwrap_or(0) > 0,
        "NanoCpus is {:?}",
        host.nano_cpus
    );
    assert!(
        host.pids_limit.unwrap_or(0) > 0,
        "PidsLimit is {:?}",
        host.pids_limit
    );
    let log = host.log_config.expect("LogConfig");
    let config = log.config.unwrap_or_default();
    assert!(
        config.get("max-size").is_some_and(|v| !v.is_empty()),
        "LogConfig {:?} has no max-size",
        config
    );
    // Status reports what the engine applied, read back.
    let applied = s
        .status
        .and_then(|st| st.resources)
        .expect("status.resources");
    assert!(applied.cpu.is_some(), "status.resources.cpu: {applied:?}");
    assert!(
        applied.memory.is_some(),
        "status.resources.memory: {applied:?}"
    );
    assert_eq!(applied.pids, host.pids_limit, "status.resources.pids");
}

/// Creates the SandboxBudget `name` in `ns` allowing `sandboxes` running Sandboxes.
fn apply_budget(ns: &str, name: &str, sandboxes: u32) {
    let manifest = json!({
        "apiVersion": "sandboxes.dev/v1alpha1",
        "kind": "SandboxBudget",
        "metadata": {"name": name},
        "spec": {"hard": {"sandboxes": sandboxes}},
    });
    apply_yaml_ok(&serde_yaml::to_string(&manifest).expect("yaml"), ns);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_budget_queues_sandboxes_and_starts_them_in_creation_order() {
    let ns = namespace("budget-queue").await;
    let _purge = Purge(ns.clone());
    apply_budget(&ns, "team", 2);
    let op = Operator::start(&ns, &ns, &OperatorOptions::default());
    let api: Api<Sandbox> = Api::namespaced(client().await, &ns);
    for name in ["s1", "s2"] {
        apply_idle(&ns, name);
        wait_ready(&api, name, &op).await;
    }
    apply_idle(&ns, "s3");
    let third = wait_object(&api, "s3", &op, "OverBudget", READY_TIMEOUT, over_budget).await;
    let message = third
        .status
        .as_ref()
        .and_then(|st| condition(&st.conditions, "Ready").map(|c| c.message.clone()))
        .unwrap_or_default();
    assert!(
        message.contains("SandboxBudget team") && message.contains("sandboxes"),
        "the condition names the budget and the resource: {message}"
    );
    apply_idle(&ns, "s4");
    wait_object(&api, "s4", &op, "OverBudget", READY_TIMEOUT, over_budget).await;
    assert!(
        api.get("s3")
            .await
            .expect("get s3")
            .status
            .and_then(|s| s.sandbox_id)
            .is_none(),
        "a waiting Sandbox has no provider sandbox"
    );

    delete_and_wait_gone(&api, "s1").await;
    wait_ready(&api, "s3", &op).await;
    // s4 came later than s3: with s3 started the budget is full again, and s4 still waits.
    let fourth = api.get("s4").await.expect("get s4");
    over_budget(&fourth).expect("s4 still waits");
    assert!(
        fourth.status.and_then(|s| s.sandbox_id).is_none(),
        "s4 was not created"
    );
    let budget = wait_for("the budget's status", Duration::from_secs(30), || async {
        let text = get_json("sandboxbudget", "team", &ns)?;
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        let used = &v["status"]["used"]["sandboxes"];
        (used == 2 && v["status"]["hard"]["sandboxes"] == 2)
            .then_some(v.clone())
            .ok_or_else(|| format!("status: {}", v["status"]))
    })
    .await;
    assert_eq!(budget["status"]["waiting"], 1, "{}", budget["status"]);

    delete_and_wait_gone(&api, "s2").await;
    wait_ready(&api, "s4", &op).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_resource_quota_counts_sandboxes() {
    use k8s_openapi::api::core::v1::ResourceQuota;
    let ns = namespace("budget-quota").await;
    let quotas: Api<ResourceQuota> = Api::namespaced(client().await, &ns);
    let quota: ResourceQuota = serde_json::from_value(json!({
        "metadata": {"name": "sandboxes"},
        "spec": {"hard": {"count/sandboxes.sandboxes.dev": "1"}},
    }))
    .expect("quota");
    quotas
        .create(&PostParams::default(), &quota)
        .await
        .expect("create the quota");
    // Admission enforces a quota only once the controller-manager has computed its status.
    wait_for(
        "the controller-manager to compute the quota (kube-controller-manager runs on the \
         test cluster: tests/setup/node.sh)",
        Duration::from_secs(60),
        || async {
            let q = quotas.get("sandboxes").await.map_err(|e| e.to_string())?;
            let hard = q
                .status
                .as_ref()
                .and_then(|s| s.hard.clone())
                .unwrap_or_default();
            hard.contains_key("count/sandboxes.sandboxes.dev")
                .then_some(())
                .ok_or_else(|| format!("status: {:?}", q.status))
        },
    )
    .await;
    apply_idle(&ns, "first");
    let manifest = json!({
        "apiVersion": "sandboxes.dev/v1alpha1",
        "kind": "Sandbox",
        "metadata": {"name": "second"},
        "spec": {"provider": "docker", "image": base_image(), "command": idle()},
    });
    let out = apply_yaml(&serde_yaml::to_string(&manifest).expect("yaml"), &ns);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("exceeded quota"),
        "the second Sandbox is refused by the quota: {stderr}"
    );
}
