//! End to end: Sandboxes whose images come from a real registry (Debian's distribution
//! registry on loopback with htpasswd auth), through the operator binary and a real
//! kube-apiserver: pull Secrets, pull progress, digests pinned in status, failures sorted by
//! what fixes them, and one pull for many Sandboxes of one image.

mod harness;

use std::time::Duration;

use harness::cluster::*;
use harness::docker::{Images, base_image, container_ids_owned_by, engine};
use harness::objects::{Reconciled, describe_conditions, wait_object, wait_ready_within};
use harness::operator::*;
use harness::registry::{OwnRegistry, create_pull_secret, push_fresh_image, registry};
use harness::tenant::{Tenant, apply_sandboxes as apply, image_sandbox, tenant};
use harness::unique;
use kube::Api;
use kube::api::{Patch, PatchParams};
use sandbox_operator::api::{Sandbox, condition};

/// Pulls from the test registry come on top of a create.
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// Sets up a [`Tenant`] with the default operator configuration.
async fn setup(prefix: &str) -> Tenant {
    tenant(prefix, &OperatorOptions::default()).await
}

/// Waits until `name` has condition `kind` True with `reason`; returns the object.
async fn wait_condition(
    api: &Api<Sandbox>,
    name: &str,
    kind: &str,
    reason: &str,
    op: &Operator,
) -> Sandbox {
    let what = format!("{kind}={reason}");
    wait_object(api, name, op, &what, READY_TIMEOUT, |s| {
        match condition(s.conditions(), kind) {
            Some(c) if c.reason == reason && c.status == "True" => Ok(()),
            _ => Err(describe_conditions(s)),
        }
    })
    .await
}

/// Asserts `secret` appears nowhere the operator writes: status, Events, its log, and the
/// container's configuration.
async fn assert_secret_nowhere(secret: &str, ns: &str, s: &Sandbox, op: &Operator) {
    let status = serde_json::to_string(&s.status).expect("status json");
    assert!(!status.contains(secret), "credential in status: {status}");
    let name = s.metadata.name.clone().unwrap_or_default();
    for (_, reason, note) in events_about(ns, &name).await {
        assert!(
            !note.contains(secret),
            "credential in Event {reason}: {note}"
        );
    }
    let log = std::fs::read_to_string(&op.log).unwrap_or_default();
    assert!(!log.contains(secret), "credential in {}", op.log.display());
    if let Some(id) = s.status.as_ref().and_then(|st| st.sandbox_id.clone()) {
        let inspect = std::process::Command::new("docker")
            .args(["inspect", &id])
            .output()
            .expect("docker inspect");
        let text = String::from_utf8_lossy(&inspect.stdout);
        assert!(!text.contains(secret), "credential in the container config");
    }
}

/// Merge-patches `spec` of Sandbox `name`.
async fn patch(api: &Api<Sandbox>, name: &str, spec: serde_json::Value) {
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({ "spec": spec })),
    )
    .await
    .expect("patch");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_private_image_is_pulled_with_its_secret_and_its_digest_recorded() {
    let r = registry();
    let docker = engine().await;
    let repo = unique("e2e/private");
    let digest = push_fresh_image(&docker, &base_image(), &r, &repo, "1", "private").await;
    let image = format!("{}/{repo}:1", r.addr);
    let _images = Images(vec![image.clone(), digest.clone()]);
    let w = setup("e2e-pull").await;
    let (ns, op, api) = (&w.ns, &w.op, &w.api);
    create_pull_secret(ns, "regcred", &r, &r.password).await;

    apply(
        &image_sandbox("app", &image, "IfNotPresent", Some("regcred")),
        ns,
    );
    let s = wait_ready_within(api, "app", op, READY_TIMEOUT).await;
    let status = s.status.clone().expect("status");
    assert_eq!(status.image.as_deref(), Some(image.as_str()));
    assert_eq!(status.image_digest.as_deref(), Some(digest.as_str()));

    let events = events_about(ns, "app").await;
    let pulling = events.iter().find(|(_, reason, _)| reason == "Pulling");
    assert!(
        pulling.is_some_and(|(t, _, note)| t == "Normal" && note.contains(&image)),
        "{events:?}"
    );
    let pulled = events
        .iter()
        .find(|(_, reason, _)| reason == "Pulled")
        .unwrap_or_else(|| panic!("no Pulled event: {events:?}"));
    assert!(
        pulled.2.contains(&digest) && pulled.2.contains(" bytes") && pulled.2.contains(" s;"),
        "the Pulled event gives digest, size and duration: {pulled:?}"
    );
    assert_secret_nowhere(&r.password, ns, &s, op).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wrong_password_stalls_naming_the_secret_and_creates_nothing() {
    let r = registry();
    let docker = engine().await;
    let repo = unique("e2e/denied");
    let digest = push_fresh_image(&docker, &base_image(), &r, &repo, "1", "denied").await;
    let image = format!("{}/{repo}:1", r.addr);
    let _images = Images(vec![image.clone(), digest]);
    let w = setup("e2e-pull-denied").await;
    let (ns, op, api) = (&w.ns, &w.op, &w.api);
    let wrong = "wrong-password-do-not-leak";
    create_pull_secret(ns, "regcred", &r, wrong).await;

    apply(
        &image_sandbox("app", &image, "IfNotPresent", Some("regcred")),
        ns,
    );
    let s = wait_condition(api, "app", "Stalled", "ImagePullUnauthorized", op).await;
    let stalled = condition(&s.status.as_ref().unwrap().conditions, "Stalled").unwrap();
    assert!(
        stalled.message.contains("\"regcred\""),
        "{}",
        stalled.message
    );
    let uid = s.metadata.uid.clone().unwrap();
    assert_eq!(
        container_ids_owned_by(&uid),
        Vec::<String>::new(),
        "nothing created"
    );
    assert_secret_nowhere(wrong, ns, &s, op).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_tag_stalls_naming_the_reference() {
    let r = registry();
    let w = setup("e2e-pull-missing").await;
    let (ns, op, api) = (&w.ns, &w.op, &w.api);
    create_pull_secret(ns, "regcred", &r, &r.password).await;
    let image = format!("{}/{}:missing", r.addr, unique("e2e/missing"));

    apply(
        &image_sandbox("app", &image, "IfNotPresent", Some("regcred")),
        ns,
    );
    let s = wait_condition(api, "app", "Stalled", "ImageNotFound", op).await;
    let stalled = condition(&s.status.as_ref().unwrap().conditions, "Stalled").unwrap();
    assert!(stalled.message.contains(&image), "{}", stalled.message);
    assert_eq!(
        container_ids_owned_by(&s.metadata.uid.clone().unwrap()),
        Vec::<String>::new()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stopped_registry_is_transient_and_the_sandbox_recovers_by_itself() {
    let shared = registry();
    let mut own = OwnRegistry::start(&shared);
    let r = own.as_registry(&shared);
    let docker = engine().await;
    let repo = unique("e2e/outage");
    let digest = push_fresh_image(&docker, &base_image(), &r, &repo, "1", "outage").await;
    let image = format!("{}/{repo}:1", r.addr);
    let _images = Images(vec![image.clone(), digest.clone()]);
    let w = setup("e2e-pull-outage").await;
    let (ns, op, api) = (&w.ns, &w.op, &w.api);
    create_pull_secret(ns, "regcred", &r, &r.password).await;

    own.stop();
    apply(
        &image_sandbox("app", &image, "IfNotPresent", Some("regcred")),
        ns,
    );
    let s = wait_condition(api, "app", "Reconciling", "RegistryUnavailable", op).await;
    let st = s.status.clone().unwrap();
    assert!(
        condition(&st.conditions, "Stalled").is_none(),
        "an outage is not a stall"
    );
    assert_eq!(
        condition(&st.conditions, "Ready").map(|c| c.status.as_str()),
        Some("False")
    );

    own.resume();
    let s = wait_ready_within(api, "app", op, READY_TIMEOUT).await;
    assert_eq!(
        s.status.unwrap().image_digest.as_deref(),
        Some(digest.as_str())
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn always_picks_up_a_new_digest_only_on_recreate_and_if_not_present_keeps_its_pin() {
    let r = registry();
    let docker = engine().await;
    let repo = unique("e2e/moving");
    let first = push_fresh_image(&docker, &base_image(), &r, &repo, "1", "first").await;
    let image = format!("{}/{repo}:1", r.addr);
    let mut images = Images(vec![image.clone(), first.clone()]);
    let w = setup("e2e-pull-always").await;
    let (ns, op, api) = (&w.ns, &w.op, &w.api);
    create_pull_secret(ns, "regcred", &r, &r.password).await;

    apply(
        &image_sandbox("always", &image, "Always", Some("regcred")),
        ns,
    );
    apply(
        &image_sandbox("pinned", &image, "IfNotPresent", Some("regcred")),
        ns,
    );
    let a = wait_ready_within(api, "always", op, READY_TIMEOUT).await;
    let b = wait_ready_within(api, "pinned", op, READY_TIMEOUT).await;
    let digest = |s: &Sandbox| s.status.as_ref().and_then(|st| st.image_digest.clone());
    // The engine's container id: the provider id (the container name) survives a recreate.
    let id = |s: &Sandbox| {
        let name = s.status.as_ref().and_then(|st| st.sandbox_id.clone())?;
        let out = std::process::Command::new("docker")
            .args(["inspect", "-f", "{{.Id}}", &name])
            .output()
            .ok()?;
        Some(String::from_utf8_lossy(&out.stdout).trim().to_string()).filter(|i| !i.is_empty())
    };
    assert_eq!(digest(&a).as_deref(), Some(first.as_str()));
    assert_eq!(digest(&b).as_deref(), Some(first.as_str()));
    let first_container = id(&a);
    assert!(first_container.is_some());

    // The tag moves at the registry.
    let second = push_fresh_image(&docker, &base_image(), &r, &repo, "1", "second").await;
    images.0.push(second.clone());
    assert_ne!(first, second);

    // A change applied in place leaves the running sandbox on its digest.
    patch(
        api,
        "always",
        serde_json::json!({"resources": {"cpu": "500m"}}),
    )
    .await;
    let a2 = wait_ready_within(api, "always", op, READY_TIMEOUT).await;
    assert_eq!(id(&a2), first_container, "not recreated");
    assert_eq!(digest(&a2).as_deref(), Some(first.as_str()));

    // A recreate under Always resolves the tag again.
    let slower = |secs: u32| serde_json::json!({"command": ["sh", "-c", format!("trap 'exit 0' TERM; while :; do sleep {secs}; done")]});
    patch(api, "always", slower(2)).await;
    let a3 = wait_ready_within(api, "always", op, READY_TIMEOUT).await;
    assert_ne!(id(&a3), first_container, "recreated");
    assert_eq!(
        digest(&a3).as_deref(),
        Some(second.as_str()),
        "new digest on recreate"
    );

    // A recreate under IfNotPresent boots its recorded digest, although the engine's tag
    // now names the new one.
    patch(api, "pinned", slower(3)).await;
    let b2 = wait_ready_within(api, "pinned", op, READY_TIMEOUT).await;
    assert_eq!(digest(&b2).as_deref(), Some(first.as_str()), "pinned");
    let container = b2
        .status
        .as_ref()
        .and_then(|s| s.sandbox_id.clone())
        .unwrap();
    let inspect = std::process::Command::new("docker")
        .args(["inspect", "-f", "{{.Config.Image}}", &container])
        .output()
        .expect("docker inspect");
    assert_eq!(String::from_utf8_lossy(&inspect.stdout).trim(), first);
}

#[tokio::test(flavor = "multi_thread")]
async fn twenty_sandboxes_of_one_new_image_cause_one_pull() {
    let r = registry();
    let docker = engine().await;
    let repo = unique("e2e/many");
    let digest = push_fresh_image(&docker, &base_image(), &r, &repo, "1", "many").await;
    let image = format!("{}/{repo}:1", r.addr);
    let _images = Images(vec![image.clone(), digest.clone()]);
    assert!(r.blob_gets(&repo).is_empty());
    let w = setup("e2e-pull-many").await;
    let (ns, op, api) = (&w.ns, &w.op, &w.api);
    create_pull_secret(ns, "regcred", &r, &r.password).await;

    let manifests: Vec<String> = (0..20)
        .map(|i| image_sandbox(&format!("app-{i}"), &image, "IfNotPresent", Some("regcred")))
        .collect();
    apply(&manifests.join("---\n"), ns);
    for i in 0..20 {
        let s = wait_ready_within(api, &format!("app-{i}"), op, READY_TIMEOUT).await;
        assert_eq!(
            s.status.unwrap().image_digest.as_deref(),
            Some(digest.as_str())
        );
    }
    let gets = r.blob_gets(&repo);
    assert!(!gets.is_empty(), "the image was pulled");
    assert!(
        gets.values().all(|n| *n == 1),
        "20 Sandboxes, one pull: every blob fetched once: {gets:?}"
    );
}
