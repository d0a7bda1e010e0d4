//! Status is never authority: whoever may write a Sandbox's `/status` in namespace `b` (what
//! a wildcard role grants) points its id at namespace `a`'s sandbox. Nothing of `a`'s is touched: the object in `b` stalls with
//! `OwnershipMismatch`, and deleting it destroys only what its owner labels prove is `b`'s.
//! Two operators on the local Docker engine, one per namespace, as two tenants' objects.

mod harness;

use std::time::Duration;

use harness::cluster::*;
use harness::docker::container_ids_owned_by;
use harness::objects::*;
use harness::operator::*;
use kube::Api;
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use sandbox_operator::api::{Sandbox, condition};
use serde_json::{Value, json};

const TIMEOUT: Duration = Duration::from_secs(90);

/// A namespace with its own operator.
async fn tenant(prefix: &str) -> (String, Operator) {
    let ns = namespace(prefix).await;
    let op = Operator::start(&ns, &ns, &OperatorOptions::default());
    (ns, op)
}

fn sandbox(name: &str) -> String {
    let image = harness::docker::base_image();
    let spec = json!({"image": image, "command": ["sleep", "3600"]});
    let manifest = json!({
        "apiVersion": "sandboxes.dev/v1alpha1",
        "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": spec,
    });
    serde_yaml::to_string(&manifest).expect("yaml")
}

/// Patches `status` of `name` as a holder of `<kind>/status` write would (merge patch).
async fn patch_status<K: Reconciled>(api: &Api<K>, name: &str, status: Value) {
    let patch = Patch::Merge(json!({ "status": status }));
    api.patch_status(name, &PatchParams::default(), &patch)
        .await
        .unwrap_or_else(|e| panic!("patching the status of {name}: {e}"));
}

/// Asks for a reconcile now (a status patch alone wakes nothing).
async fn nudge<K: Reconciled>(api: &Api<K>, name: &str) {
    let patch = Patch::Merge(json!({"metadata": {"annotations": {
        "sandboxes.dev/reconcile-requested-at": harness::unique("now"),
    }}}));
    api.patch(name, &PatchParams::default(), &patch)
        .await
        .expect("annotate");
}

/// Waits until `name` is Ready=False with `reason`; returns the message.
async fn wait_reason<K: Reconciled>(
    api: &Api<K>,
    name: &str,
    by: &Operator,
    reason: &str,
) -> String {
    let got = wait_object(api, name, by, reason, TIMEOUT, |o| {
        match condition(o.conditions(), "Ready") {
            Some(c) if c.status == "False" && c.reason == reason => Ok(()),
            _ => Err(describe_conditions(o)),
        }
    })
    .await;
    condition(got.conditions(), "Ready")
        .map(|c| c.message.clone())
        .unwrap_or_default()
}

#[tokio::test]
async fn a_sandbox_status_naming_another_tenants_sandbox_touches_nothing_of_it() {
    let (ns_a, op_a) = tenant("tenancy-status-a").await;
    let (ns_b, op_b) = tenant("tenancy-status-b").await;
    apply_yaml_ok(&sandbox("victim"), &ns_a);
    apply_yaml_ok(&sandbox("thief"), &ns_b);
    let api_a: Api<Sandbox> = Api::namespaced(client().await, &ns_a);
    let api_b: Api<Sandbox> = Api::namespaced(client().await, &ns_b);
    let victim = wait_ready(&api_a, "victim", &op_a).await;
    let thief = wait_ready(&api_b, "thief", &op_b).await;
    let victim_id = sandbox_id(&victim);
    let victim_uid = victim.uid().expect("uid").to_string();
    let thief_uid = thief.uid().expect("uid").to_string();

    patch_status(&api_b, "thief", json!({"sandboxId": victim_id})).await;
    nudge(&api_b, "thief").await;
    let message = wait_reason(&api_b, "thief", &op_b, "OwnershipMismatch").await;
    assert!(
        message.contains("status.sandboxId") && message.contains("nothing was changed"),
        "names the field and that nothing was done: {message}"
    );
    assert_eq!(
        container_ids_owned_by(&victim_uid).len(),
        1,
        "a's container is untouched"
    );

    delete_and_wait_gone(&api_b, "thief").await;
    assert!(
        container_ids_owned_by(&thief_uid).is_empty(),
        "b's own container went with b's Sandbox"
    );
    assert_eq!(
        container_ids_owned_by(&victim_uid).len(),
        1,
        "deleting b's Sandbox left a's container alone"
    );
    let events = events_about(&ns_b, "thief").await;
    assert!(
        events
            .iter()
            .any(|(_, reason, _)| reason == "OwnershipMismatch"),
        "a Warning says why a's sandbox was left alone: {events:?}"
    );
    nudge(&api_a, "victim").await;
    let victim = wait_ready(&api_a, "victim", &op_a).await;
    assert_eq!(
        sandbox_id(&victim),
        victim_id,
        "a's Sandbox still Ready on its own sandbox"
    );
    delete_and_wait_gone(&api_a, "victim").await;
}
