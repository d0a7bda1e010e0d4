//! End to end on E2B: Sandbox objects in a real kube-apiserver → the operator binary with a
//! `type: e2b` provider → the E2B double (its sandboxes real containers). Each test has its
//! own namespace, operator instance and double.
//!
//! The double enforces E2B's timeout (3 s in the keep-alive test, 30 s elsewhere), so the
//! tests also show that the provider's keep-alive holds: nothing the operator manages is
//! ended by the double.

mod harness;

use std::time::{Duration, Instant};

use harness::cluster::*;
use harness::e2b::E2b;
use harness::objects::{READY_TIMEOUT, sandbox_id};
use harness::wait_for;
use harness::world::foreign_labels;
use kube::api::{Patch, PatchParams};
use sandbox_doubles::e2b::{self as double, E2bDouble, Power};
use sandbox_operator::api::{Sandbox, condition};
use serde_json::{Value, json};

/// The short E2B timeout of the keep-alive test, in seconds: several pass within a test.
const E2B_TIMEOUT: u64 = 3;
/// The E2B timeout of the other tests: still enforced by the double, but long enough that a
/// loaded machine's slow pass never races it.
const RELAXED_TIMEOUT: u64 = 30;

/// One test's world: a namespace (= operator instance) and an E2B double.
type World = harness::world::World<E2b>;

impl World {
    async fn new(prefix: &str) -> World {
        World::e2b(prefix, RELAXED_TIMEOUT).await
    }

    async fn get(&self, name: &str) -> Result<Sandbox, String> {
        self.api.get(name).await.map_err(|e| e.to_string())
    }
}

/// A Sandbox on the `e2b` provider with E2B's `base` template, and `extra` (YAML lines
/// indented by two spaces) added to its spec.
fn e2b_spec(extra: &str) -> Value {
    let doc = format!("spec:\n  provider: e2b\n  image: base\n{extra}");
    let mut manifest: Value = serde_yaml::from_str(&doc).expect("a spec");
    manifest["spec"].take()
}

impl E2b {
    /// The double's sandboxes carrying `uid` as their owner.
    async fn sandboxes_of(&self, uid: &str) -> Vec<double::Sandbox> {
        self.double
            .sandboxes()
            .await
            .into_iter()
            .filter(|s| {
                s.metadata
                    .get("sandboxes.dev/owner-uid")
                    .map(String::as_str)
                    == Some(uid)
            })
            .collect()
    }
}

fn uid(s: &Sandbox) -> String {
    s.metadata.uid.clone().expect("uid")
}

/// `spec.provider: e2b` → Ready on an E2B sandbox carrying the owner labels; it then outlives
/// several E2B timeouts (the double really ends sandboxes) without a pause or a new id.
#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_becomes_ready_and_outlives_several_e2b_timeouts() {
    let w = World::e2b("e2e-e2b-ready", E2B_TIMEOUT).await;
    let op = w.operator("sweeper:\n  enabled: false\n", vec![]);
    w.apply(
        "kept",
        e2b_spec("  env:\n    - {name: GREETING, value: hello}\n"),
    );
    let s = w.wait_ready("kept", &op).await;
    let id = sandbox_id(&s);
    let status = s.status.clone().expect("status");
    assert_eq!(status.provider.as_deref(), Some("e2b"));
    assert!(status.started_at.is_some());
    let record = w
        .double
        .sandbox(&id)
        .await
        .expect("the double holds the sandbox");
    assert_eq!(
        record.metadata.get("sandboxes.dev/owner-uid"),
        Some(&uid(&s))
    );
    assert_eq!(record.metadata.get("sandboxes.dev/managed-by"), Some(&w.ns));
    assert_eq!(
        record.metadata.get("sandboxes.dev/owner"),
        Some(&format!("{}.kept", w.ns))
    );

    let since = Instant::now();
    let outlived = Duration::from_secs(3 * E2B_TIMEOUT + 1);
    wait_for(
        "three E2B timeouts to pass",
        outlived + READY_TIMEOUT,
        || async {
            let record = w.double.sandbox(&id).await.ok_or("the sandbox was ended")?;
            if record.power != Power::Running || record.pauses > 0 {
                return Ok(Err(format!("the sandbox was paused: {record:?}")));
            }
            if since.elapsed() < outlived {
                return Err(format!("{:?} so far", since.elapsed()));
            }
            Ok(Ok(record))
        },
    )
    .await
    .expect("kept running");
    assert!(
        w.double.expired().is_empty(),
        "nothing timed out: {:?}",
        w.double.expired()
    );
    let again = w.get("kept").await.expect("get");
    assert_eq!(sandbox_id(&again), id, "the same sandbox all along");
    w.delete_and_wait_gone("kept").await;
    assert!(
        w.double.sandbox(&id).await.is_none(),
        "delete killed the E2B sandbox"
    );
    drop(op);
    w.shutdown().await;
}

/// `state: Sleeping` pauses the E2B sandbox with its memory, and `lastHibernation` reports
/// what the resume then showed; `selfDeliveredEnv` arrives through envd's files endpoint and
/// is never part of the create request (neither the sandbox's env nor its metadata).
#[tokio::test(flavor = "multi_thread")]
async fn sleeping_pauses_truthfully_and_self_delivered_env_stays_out_of_the_create() {
    const VALUE: &str = "e2b-s3cr3t";
    let w = World::new("e2e-e2b-sleep").await;
    create_secret(&w.ns, "app-secrets", None, json!({"DB_PASSWORD": VALUE})).await;
    let op = w.operator("sweeper:\n  enabled: false\n", vec![]);
    w.apply(
        "sleepy",
        e2b_spec("  selfDeliveredEnv: {name: app-secrets}\n"),
    );
    let s = w.wait_ready("sleepy", &op).await;
    let id = sandbox_id(&s);
    let record = w.double.sandbox(&id).await.expect("sandbox");
    let env_file = docker_exec(&record.container, "cat /run/sandboxes.dev/env");
    assert!(
        env_file.contains(VALUE),
        "delivered into the file: {env_file:?}"
    );
    let inspect = docker_cli(&["inspect", &record.container]);
    assert!(
        !inspect.contains(VALUE),
        "not in the sandbox's create-time env"
    );
    assert!(
        !format!("{:?}", record.metadata).contains(VALUE),
        "not in its metadata"
    );
    assert_eq!(w.double.envd_counters().get("POST /files"), 1, "one upload");

    w.patch_spec("sleepy", json!({"state": "Sleeping"})).await;
    let slept = wait_for("lastHibernation after Sleeping", READY_TIMEOUT, || async {
        let s = w.get("sleepy").await?;
        let h = s.status.as_ref().and_then(|st| st.last_hibernation.clone());
        let paused = w
            .double
            .sandbox(&id)
            .await
            .is_some_and(|r| r.power == Power::Paused { memory: true });
        match h {
            Some(h) if paused => Ok(h),
            other => Err(format!("hibernation {other:?}, paused {paused}")),
        }
    })
    .await;
    assert!(
        slept.processes_preserved,
        "a memory pause keeps processes: {slept:?}"
    );

    w.patch_spec("sleepy", json!({"state": "Running"})).await;
    let woke = wait_for("lastHibernation after waking", READY_TIMEOUT, || async {
        let s = w.get("sleepy").await?;
        let h = s
            .status
            .as_ref()
            .and_then(|st| st.last_hibernation.clone())
            .ok_or("none")?;
        let record = w.double.sandbox(&id).await.ok_or("the sandbox is gone")?;
        let running = record.power == Power::Running;
        // Times have one-second resolution: tell the resume's report by its mechanism.
        (running && h.mechanism != slept.mechanism)
            .then_some(h.clone())
            .ok_or_else(|| {
                format!(
                    "not resumed yet: {h:?}, {:?}, status {:?}",
                    record.power, s.status
                )
            })
    })
    .await;
    assert!(
        woke.processes_preserved,
        "the boot fingerprint matched after the resume: {woke:?}"
    );
    assert_eq!(
        sandbox_id(&w.get("sleepy").await.expect("get")),
        id,
        "same sandbox"
    );
    w.delete_and_wait_gone("sleepy").await;
    drop(op);
    w.shutdown().await;
}

/// SIGKILL between the E2B create and the status write (the `after-create` failpoint): the
/// restarted operator adopts the sandbox by its owner metadata — exactly one exists.
#[tokio::test(flavor = "multi_thread")]
async fn a_crash_between_create_and_status_write_adopts_instead_of_duplicating() {
    let w = World::new("e2e-e2b-crash").await;
    let s = w
        .crash_after_create("crashy", e2b_spec(""), "sweeper:\n  enabled: false\n")
        .await;
    assert_eq!(w.sandboxes_of(&uid(&s)).await.len(), 1, "but created");

    let op = w.operator("sweeper:\n  enabled: false\n", vec![]);
    let s = w.wait_ready("crashy", &op).await;
    let ours = w.sandboxes_of(&uid(&s)).await;
    assert_eq!(ours.len(), 1, "exactly one sandbox after the restart");
    assert_eq!(ours[0].id, sandbox_id(&s), "the created one was adopted");
    w.delete_and_wait_gone("crashy").await;
    drop(op);
    w.shutdown().await;
}

/// The sweeper destroys a planted orphan of this instance (its owner never existed) and keeps
/// another instance's sandbox and an unlabelled one.
#[tokio::test(flavor = "multi_thread")]
async fn the_sweeper_removes_planted_orphans_and_keeps_foreign_ones() {
    let w = World::new("e2e-e2b-sweep").await;
    let orphan = plant(&w.double, w.orphan_labels()).await;
    let kept_foreign = plant(&w.double, foreign_labels()).await;
    let bare = plant(&w.double, json!({})).await;
    let op = w.operator("sweeper:\n  intervalSecs: 1\n  graceSecs: 0\n", vec![]);
    wait_for(
        &format!("the orphan swept (operator log: {})", op.log.display()),
        READY_TIMEOUT,
        || async {
            match w.double.sandbox(&orphan).await {
                None => Ok(()),
                Some(_) => Err("still there".to_string()),
            }
        },
    )
    .await;
    assert!(
        w.double.sandbox(&kept_foreign).await.is_some(),
        "another instance's is kept"
    );
    assert!(
        w.double.sandbox(&bare).await.is_some(),
        "an unlabelled one is kept"
    );
    assert_eq!(
        w.double.api_counters().get("DELETE /sandboxes/{sandboxID}"),
        1,
        "one deletion"
    );
    drop(op);
    w.shutdown().await;
}

/// A revoked API key: every Sandbox gets one clear condition naming the credentials, and
/// nothing is deleted — not by the controllers, not by the sweeper.
#[tokio::test(flavor = "multi_thread")]
async fn a_revoked_key_is_one_clear_condition_per_object_and_deletes_nothing() {
    let w = World::new("e2e-e2b-revoked").await;
    let op = w.operator("sweeper:\n  intervalSecs: 1\n  graceSecs: 0\n", vec![]);
    w.apply("one", e2b_spec(""));
    w.apply("two", e2b_spec(""));
    let ids = [
        sandbox_id(&w.wait_ready("one", &op).await),
        sandbox_id(&w.wait_ready("two", &op).await),
    ];
    w.double.revoke_api_key(w.double.api_key());
    for name in ["one", "two"] {
        // The reconcile-request annotation makes the controller look again (the spec is left
        // alone).
        w.api
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {"sandboxes.dev/reconcile-requested-at": "1"}}})),
            )
            .await
            .expect("annotate");
    }
    for name in ["one", "two"] {
        let what = format!(
            "Sandbox {name} to report the refused key (log: {})",
            op.log.display()
        );
        let ready = wait_for(&what, READY_TIMEOUT, || async {
            let s = w.get(name).await?;
            let status = s.status.ok_or("no status")?;
            let ready = condition(&status.conditions, "Ready")
                .cloned()
                .ok_or("no Ready")?;
            (ready.status == "False" && ready.reason.ends_with("Unauthorized"))
                .then_some(ready.clone())
                .ok_or_else(|| format!("{ready:?}"))
        })
        .await;
        assert!(
            ready.message.contains("apiKey"),
            "the condition names the setting: {ready:?}"
        );
        assert!(
            !ready.message.contains(w.double.api_key()),
            "never the key itself"
        );
    }
    // Give the sweeper several passes on the refused key.
    let swept_before = w.double.api_counters().get("GET /v2/sandboxes");
    wait_for(
        "sweeper passes with the refused key",
        READY_TIMEOUT,
        || async {
            let now = w.double.api_counters().get("GET /v2/sandboxes");
            (now >= swept_before + 3)
                .then_some(())
                .ok_or_else(|| format!("{now} lists"))
        },
    )
    .await;
    for id in &ids {
        assert!(
            w.double.sandbox(id).await.is_some(),
            "sandbox {id} was not deleted"
        );
    }
    assert_eq!(
        w.double.api_counters().get("DELETE /sandboxes/{sandboxID}"),
        0,
        "zero deletions"
    );
    drop(op);
    w.shutdown().await;
}

/// Creates a sandbox straight at the double with `metadata`, as a crashed operator (or
/// someone else) would have left it.
async fn plant(d: &E2bDouble, metadata: serde_json::Value) -> String {
    let created: serde_json::Value = reqwest::Client::new()
        .post(format!("{}/sandboxes", d.api_url()))
        .header("X-API-Key", d.api_key())
        .json(&json!({"templateID": "base", "timeout": 300, "metadata": metadata}))
        .send()
        .await
        .expect("plant")
        .json()
        .await
        .expect("planted");
    created["sandboxID"].as_str().expect("id").to_string()
}

fn docker_cli(args: &[&str]) -> String {
    let out = std::process::Command::new("docker")
        .args(args)
        .output()
        .expect("docker");
    assert!(
        out.status.success(),
        "docker {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn docker_exec(container: &str, script: &str) -> String {
    docker_cli(&["exec", container, "sh", "-c", script])
}

/// A changed `spec.egress.allowedDomains` is replaced in place through E2B's network update:
/// the same sandbox id, the new rules at the double, `status.egressApplied` saying what was
/// applied — and a resume from `Sleeping` applies it again (resume replaces the policy).
#[tokio::test(flavor = "multi_thread")]
async fn a_changed_allow_list_is_replaced_in_place_and_again_on_resume() {
    let w = World::new("e2e-e2b-egress").await;
    let op = w.operator("sweeper:\n  enabled: false\n", vec![]);
    w.apply(
        "walled",
        e2b_spec("  egress:\n    allowedDomains: [pypi.org]\n"),
    );
    let s = w.wait_ready("walled", &op).await;
    let id = sandbox_id(&s);
    let record = w.double.sandbox(&id).await.expect("held by the double");
    assert_eq!(record.network.allow_out, Some(vec!["pypi.org".to_string()]));
    let updates_at_create = record.network_updates;

    w.patch_spec(
        "walled",
        json!({"egress": {"allowedDomains": ["github.com", "*.githubusercontent.com"]}}),
    )
    .await;
    let what = format!(
        "the new allow-list applied (operator log: {})",
        op.log.display()
    );
    wait_for(&what, READY_TIMEOUT, || async {
        let s = w.get("walled").await?;
        let applied = s
            .status
            .as_ref()
            .and_then(|st| st.egress_applied.clone())
            .ok_or("no egressApplied")?;
        let record = w.double.sandbox(&id).await.ok_or("the sandbox is gone")?;
        let want = vec![
            "github.com".to_string(),
            "*.githubusercontent.com".to_string(),
        ];
        if applied.allowed_domains == want && record.network.allow_out == Some(want) {
            Ok(())
        } else {
            Err(format!("status {applied:?}, double {:?}", record.network))
        }
    })
    .await;
    let s = w.wait_ready("walled", &op).await;
    assert_eq!(sandbox_id(&s), id, "replaced in place, not recreated");
    assert_eq!(w.sandboxes_of(&uid(&s)).await.len(), 1, "one sandbox");
    let updated = w.double.sandbox(&id).await.expect("held").network_updates;
    assert_eq!(updated, updates_at_create + 1, "one network update");

    // Sleep, then wake: the resume replaces the policy once more.
    w.patch_spec("walled", json!({"state": "Sleeping"})).await;
    wait_for("paused", READY_TIMEOUT, || async {
        let r = w.double.sandbox(&id).await.ok_or("gone")?;
        if r.power == Power::Running {
            Err("still running".to_string())
        } else {
            Ok(())
        }
    })
    .await;
    w.patch_spec("walled", json!({"state": "Running"})).await;
    wait_for(
        "the policy re-applied after the resume",
        READY_TIMEOUT,
        || async {
            let r = w.double.sandbox(&id).await.ok_or("gone")?;
            if r.power == Power::Running && r.network_updates > updated {
                Ok(())
            } else {
                Err(format!(
                    "power {:?}, updates {}",
                    r.power, r.network_updates
                ))
            }
        },
    )
    .await;
    let s = w.wait_ready("walled", &op).await;
    assert_eq!(sandbox_id(&s), id, "the same sandbox after the resume");
    w.delete_and_wait_gone("walled").await;
    drop(op);
    w.shutdown().await;
}
