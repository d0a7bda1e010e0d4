//! Tenancy, images: one Docker engine's image cache is shared by every namespace, and a
//! Sandbox may run a cached image only if it could have pulled that image itself. Two tenants
//! `a` and `b` (each a namespace with its own operator instance on the same engine and API
//! server) and the real test registry (htpasswd auth):
//!
//! - a template image (the provider's `templateRepository`) is never bootable through
//!   `spec.image`, by name or by image id, even with `imagePullPolicy: Never`;
//! - an image `a` pulled with its pull Secret is refused for `b` without a credential and with
//!   a wrong one, and works for `b` once `b` presents a credential the registry accepts;
//! - the images of the operator's `openImages` setting work in every namespace, and a local
//!   image not listed there is refused.

mod harness;

use std::time::Duration;

use bollard::query_parameters::TagImageOptionsBuilder;
use harness::docker::{Images, base_image, engine};
use harness::objects::{Reconciled, describe_conditions, wait_object, wait_ready_within};
use harness::operator::*;
use harness::registry::{commit_marked_image, create_pull_secret, push_fresh_image, registry};
use harness::tenant::{Tenant, apply_sandboxes, image_sandbox};
use harness::unique;
use sandbox_operator::api::{Sandbox, condition};

const TIMEOUT: Duration = Duration::from_secs(120);
/// The reason of every refusal of an image.
const REFUSED: &str = "ImageNotAllowed";

/// A tenant whose operator's configuration ends with `extra` (top-level keys).
async fn tenant(prefix: &str, extra: &str) -> Tenant {
    let options = OperatorOptions {
        config_extra: format!("providers:\n  - name: docker\n    type: docker\n{extra}"),
        ..OperatorOptions::default()
    };
    harness::tenant::tenant(prefix, &options).await
}

/// Waits until `name` is either Ready or Stalled (whichever comes first) and returns it, so
/// a refusal that does not happen shows as the Sandbox going Ready, at once.
async fn settled(t: &Tenant, name: &str) -> Sandbox {
    wait_object(&t.api, name, &t.op, "Ready or Stalled", TIMEOUT, |s| {
        let on = |kind| condition(s.conditions(), kind).is_some_and(|c| c.status == "True");
        if on("Ready") || on("Stalled") {
            Ok(())
        } else {
            Err(describe_conditions(s))
        }
    })
    .await
}

/// Asserts `name` in `t` is refused: Stalled with [`REFUSED`], a message naming `spec.image`
/// and each of `fixes`. Returns the message.
async fn assert_refused(t: &Tenant, name: &str, fixes: &[&str]) -> String {
    let s = settled(t, name).await;
    let stalled = condition(s.conditions(), "Stalled").filter(|c| c.status == "True");
    let Some(stalled) = stalled else {
        panic!(
            "{}/{name} must be refused ({REFUSED}), but: {}",
            t.ns,
            describe_conditions(&s)
        );
    };
    assert_eq!(stalled.reason, REFUSED, "{}", stalled.message);
    assert!(
        stalled.message.contains("spec.image"),
        "{}",
        stalled.message
    );
    for fix in fixes {
        assert!(stalled.message.contains(fix), "{fix}: {}", stalled.message);
    }
    assert!(
        s.status
            .as_ref()
            .and_then(|st| st.sandbox_id.clone())
            .is_none(),
        "a refused Sandbox creates nothing"
    );
    stalled.message.clone()
}

#[tokio::test(flavor = "multi_thread")]
async fn another_namespace_cannot_boot_a_template_image_by_name_or_by_id() {
    let id = unique("tpl");
    let template = format!("sandbox-operator/template:{id}");
    let docker = engine().await;
    let repository = "sandbox-operator/template";
    let image_id = commit_marked_image(&docker, &base_image(), repository, &id, "a-data").await;
    let _images = Images(vec![template.clone()]);
    let b = tenant("img-tpl-b", "").await;
    let named = image_sandbox("named", &template, "Never", None);
    let by_id = image_sandbox("by-id", &image_id, "Never", None);
    let hub = format!("docker.io/{template}");
    let aliased = image_sandbox("aliased", &hub, "IfNotPresent", None);
    apply_sandboxes(&[named, by_id, aliased].join("---\n"), &b.ns);
    for name in ["named", "by-id", "aliased"] {
        assert_refused(&b, name, &["templateRef"]).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_image_pulled_with_a_secret_is_reused_only_with_a_credential_the_registry_accepts() {
    let r = registry();
    let docker = engine().await;
    let repo = unique("tenancy/private");
    let digest = push_fresh_image(&docker, &base_image(), &r, &repo, "1", "tenant-a").await;
    let image = format!("{}/{repo}:1", r.addr);
    let _images = Images(vec![image.clone(), digest.clone()]);
    let (a, b) = (
        tenant("img-pull-a", "").await,
        tenant("img-pull-b", "").await,
    );

    create_pull_secret(&a.ns, "regcred", &r, &r.password).await;
    apply_sandboxes(
        &image_sandbox("app", &image, "IfNotPresent", Some("regcred")),
        &a.ns,
    );
    wait_ready_within(&a.api, "app", &a.op, TIMEOUT).await;

    // The engine holds the image now; b has no credential, or a wrong one.
    create_pull_secret(&b.ns, "wrong", &r, "not-the-password").await;
    let none = image_sandbox("none", &image, "IfNotPresent", None);
    let never = image_sandbox("never", &image, "Never", None);
    let pinned = image_sandbox("pinned", &digest, "Never", None);
    let wrong = image_sandbox("wrong", &image, "IfNotPresent", Some("wrong"));
    apply_sandboxes(&[none, never, pinned, wrong].join("---\n"), &b.ns);
    for name in ["none", "never", "pinned", "wrong"] {
        assert_refused(&b, name, &["imagePullSecrets", "openImages"]).await;
    }

    // With a credential the registry accepts, b could have pulled it: it runs the cached copy.
    let gets_before = r.blob_gets(&repo);
    create_pull_secret(&b.ns, "regcred", &r, &r.password).await;
    apply_sandboxes(
        &image_sandbox("right", &image, "Never", Some("regcred")),
        &b.ns,
    );
    let s = wait_ready_within(&b.api, "right", &b.op, TIMEOUT).await;
    assert_eq!(
        s.status.and_then(|st| st.image_digest).as_deref(),
        Some(digest.as_str())
    );
    assert_eq!(
        r.blob_gets(&repo),
        gets_before,
        "verified, not pulled again"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn open_images_run_in_every_namespace_and_unlisted_local_images_nowhere() {
    let docker = engine().await;
    let listed = format!("{}:1", unique("tenancy-open/listed"));
    let unlisted = format!("{}:1", unique("tenancy-local/unlisted"));
    for reference in [&listed, &unlisted] {
        let (repo, tag) = reference.rsplit_once(':').expect("repo:tag");
        let options = TagImageOptionsBuilder::default()
            .repo(repo)
            .tag(tag)
            .build();
        docker
            .tag_image(&base_image(), Some(options))
            .await
            .expect("tag");
    }
    let _images = Images(vec![listed.clone(), unlisted.clone()]);
    let open = format!(
        "openImages:\n  - {:?}\n  - \"tenancy-open/*\"\n",
        base_image()
    );
    let (a, b) = (
        tenant("img-open-a", &open).await,
        tenant("img-open-b", &open).await,
    );
    for t in [&a, &b] {
        let base = image_sandbox("base", &base_image(), "Never", None);
        let listed = image_sandbox("listed", &listed, "IfNotPresent", None);
        let unlisted = image_sandbox("unlisted", &unlisted, "Never", None);
        apply_sandboxes(&[base, listed, unlisted].join("---\n"), &t.ns);
    }
    for t in [&a, &b] {
        wait_ready_within(&t.api, "base", &t.op, TIMEOUT).await;
        wait_ready_within(&t.api, "listed", &t.op, TIMEOUT).await;
        let message = assert_refused(t, "unlisted", &["openImages"]).await;
        assert!(message.contains(&unlisted), "{message}");
    }
}
