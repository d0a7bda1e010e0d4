//! A deletion that cannot finish says why on the object: the operator binary with a
//! `type: sprites` provider → the Sprites double. While the double fails every request, a
//! deleted Sandbox keeps its finalizer (its cleanup cannot list the sprites it owns to
//! confirm none is left) and carries `CleanupBlocked` — condition and Warning Event — naming
//! what could not be confirmed; once the double answers again the deletion finishes.

mod harness;

use std::io::Write;
use std::time::Duration;

use harness::cluster::*;
use harness::operator::*;
use harness::wait_for;
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::{DeleteParams, ListParams};
use sandbox_doubles::sprites::{self, SpritesOptions};
use sandbox_operator::api::{Sandbox, condition};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(90);

#[tokio::test]
async fn a_deletion_whose_cleanup_cannot_list_says_cleanup_blocked_until_it_can() {
    let double = sprites::spawn(SpritesOptions::new(harness::docker::base_image())).await;
    let mut token = tempfile::NamedTempFile::new().expect("token file");
    writeln!(token, "{}", double.token).expect("write token");
    let ns = namespace("e2e-cleanup-blocked").await;
    let config = format!(
        "providers:\n  - name: sprites\n    type: sprites\n    sprites:\n      apiUrl: {}\n      \
         org: e2e\n      token: {{file: {}}}\n",
        double.base_url,
        token.path().display(),
    );
    let options = OperatorOptions {
        config_extra: config,
        ..Default::default()
    };
    let op = Operator::start(&ns, &ns, &options);
    let manifest = json!({
        "apiVersion": "sandboxes.dev/v1alpha1",
        "kind": "Sandbox",
        "metadata": {"name": "held"},
        "spec": {"provider": "sprites"},
    });
    let out = apply_yaml(&serde_yaml::to_string(&manifest).unwrap(), &ns);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let api: Api<Sandbox> = Api::namespaced(client().await, &ns);
    let what = format!("Sandbox held Ready (operator log: {})", op.log.display());
    wait_for(&what, TIMEOUT, || async {
        let s = api.get("held").await.map_err(|e| e.to_string())?;
        let st = s.status.unwrap_or_default();
        match condition(&st.conditions, "Ready") {
            Some(c) if c.status == "True" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;

    double.faults().set_fail_all(true);
    api.delete("held", &DeleteParams::default())
        .await
        .expect("delete");
    let message = wait_for("CleanupBlocked on the deleted Sandbox", TIMEOUT, || async {
        let s = api.get("held").await.map_err(|e| e.to_string())?;
        let st = s.status.unwrap_or_default();
        let ready = condition(&st.conditions, "Ready").map(|c| c.reason.clone());
        match condition(&st.conditions, "CleanupBlocked") {
            Some(c) if c.status == "True" && ready.as_deref() == Some("CleanupBlocked") => {
                Ok(c.message.clone())
            }
            other => Err(format!("ready={ready:?} blocked={other:?}")),
        }
    })
    .await;
    assert!(
        message.contains("list the sandboxes labelled owner-uid="),
        "names what could not be confirmed: {message}"
    );
    assert!(message.contains("retrying"), "names the fix: {message}");
    let events: Api<Event> = Api::namespaced(client().await, &ns);
    let listed = events.list(&ListParams::default()).await.expect("events");
    assert!(
        listed.items.iter().any(|e| {
            e.type_.as_deref() == Some("Warning")
                && e.reason.as_deref() == Some("CleanupBlocked")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("held")
        }),
        "a CleanupBlocked Warning"
    );
    assert!(
        api.get_opt("held").await.expect("get").is_some(),
        "the finalizer is held"
    );

    double.faults().set_fail_all(false);
    wait_for("the deletion to finish", TIMEOUT, || async {
        match api.get_opt("held").await {
            Ok(None) => Ok(()),
            Ok(Some(_)) => Err("still there".to_string()),
            Err(e) => Err(e.to_string()),
        }
    })
    .await;
    assert!(double.sprite_names().await.is_empty(), "the sprite is gone");
}
