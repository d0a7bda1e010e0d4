//! Chaos: 50 Sandbox create/delete cycles while the operator is SIGKILLed at random moments
//! and restarted; then one sweep must leave zero provider resources without a live owner and
//! exactly one sandbox per live Sandbox.
//!
//! Each cycle creates a Sandbox and then, after a random delay, keeps it, deletes it, or
//! force-deletes it (delete, then strip the finalizer — what a user does when the operator is
//! down, and what leaves orphans behind). A killer task SIGKILLs the operator every 1.5–5 s
//! and starts a new one, which must win the Lease (3 s) before it reconciles. The random
//! delays are the experiment's schedule, not synchronisation: every wait on an outcome polls
//! with a deadline. `CHAOS_SEED` replays a schedule.

mod harness;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bollard::models::ContainerSummary;
use futures::{StreamExt, stream};
use harness::cluster::*;
use harness::docker::*;
use harness::objects::is_ready;
use harness::operator::*;
use harness::{repo, wait_for};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use sandbox_operator::api::Sandbox;
use sandbox_operator::provider::labels::MANAGED_BY;

const CYCLES: usize = 50;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Keep,
    Delete,
    ForceDelete,
}

/// Every container labelled with `instance`, in every state.
async fn containers(instance: &str) -> Vec<ContainerSummary> {
    containers_labelled(&engine().await, MANAGED_BY, instance).await
}

fn label<'a>(c: &'a ContainerSummary, key: &str) -> Option<&'a str> {
    c.labels.as_ref()?.get(key).map(String::as_str)
}

fn name_of(c: &ContainerSummary) -> String {
    c.names
        .iter()
        .flatten()
        .next()
        .map(|n| n.trim_start_matches('/').to_string())
        .unwrap_or_default()
}

fn never_started(c: &ContainerSummary) -> bool {
    c.state
        .map(|s| format!("{s:?}").eq_ignore_ascii_case("created"))
        .unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread")]
async fn sigkill_chaos_then_one_sweep_leaves_one_sandbox_per_live_object_and_nothing_else() {
    let started = Instant::now();
    let seed: u64 = std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    println!("chaos seed {seed} (CHAOS_SEED={seed} replays this schedule)");
    let ns = namespace("chaos").await;
    let _purge = Purge(ns.clone());
    let opts = OperatorOptions {
        lease_secs: Some(3),
        // The leader's own sweeper stays off, so the one sweep at the end accounts for
        // everything the chaos left behind.
        config_extra:
            "providers:\n  - name: docker\n    type: docker\nsweeper:\n  enabled: false\n".into(),
        env: vec![],
    };
    let operator = Arc::new(Mutex::new(Operator::start(&ns, &ns, &opts)));
    let client = client().await;
    let api: Api<Sandbox> = Api::namespaced(client.clone(), &ns);

    // The killer.
    let stop = Arc::new(AtomicBool::new(false));
    let kills = Arc::new(AtomicUsize::new(0));
    let killer = {
        let (operator, stop, kills, ns, opts) = (
            operator.clone(),
            stop.clone(),
            kills.clone(),
            ns.clone(),
            opts.clone(),
        );
        tokio::spawn(async move {
            let mut rng = fastrand::Rng::with_seed(seed ^ 0x5eed);
            loop {
                tokio::time::sleep(Duration::from_millis(rng.u64(1500..5000))).await;
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let mut op = operator.lock().expect("operator lock");
                op.kill();
                *op = Operator::start(&ns, &ns, &opts);
                kills.fetch_add(1, Ordering::SeqCst);
            }
        })
    };

    // The cycles, three at a time.
    let mut rng = fastrand::Rng::with_seed(seed);
    let plan: Vec<(usize, Fate, u64)> = (0..CYCLES)
        .map(|i| {
            let fate = match rng.u32(0..100) {
                0..20 => Fate::Keep,
                20..45 => Fate::ForceDelete,
                _ => Fate::Delete,
            };
            (i, fate, rng.u64(0..2000))
        })
        .collect();
    let image = base_image();
    let fates: BTreeMap<String, Fate> = stream::iter(plan)
        .map(|(i, fate, delay_ms)| {
            let api = api.clone();
            let image = image.clone();
            let instance = ns.clone();
            async move {
                let name = format!("c{i:02}");
                let obj: Sandbox = serde_json::from_value(serde_json::json!({
                    "apiVersion": "sandboxes.dev/v1alpha1", "kind": "Sandbox",
                    "metadata": {"name": name}, "spec": {"image": image}
                }))
                .expect("sandbox");
                let uid = api
                    .create(&PostParams::default(), &obj)
                    .await
                    .expect("create Sandbox")
                    .metadata
                    .uid
                    .expect("uid");
                tokio::time::sleep(Duration::from_millis(delay_ms)).await;
                match fate {
                    Fate::Keep => {}
                    Fate::Delete => {
                        let _ = api.delete(&name, &DeleteParams::default()).await;
                    }
                    Fate::ForceDelete => {
                        // Give the (possibly just restarted) operator the chance to create
                        // the container first, so stripping the finalizer leaves an orphan.
                        let deadline = Instant::now() + Duration::from_secs(20);
                        while Instant::now() < deadline
                            && !containers(&instance)
                                .await
                                .iter()
                                .any(|c| label(c, "sandboxes.dev/owner-uid") == Some(uid.as_str()))
                        {
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                        let _ = api.delete(&name, &DeleteParams::default()).await;
                        let strip = serde_json::json!({"metadata": {"finalizers": null}});
                        let _ = api
                            .patch(&name, &PatchParams::default(), &Patch::Merge(&strip))
                            .await;
                    }
                }
                (name, fate)
            }
        })
        .buffer_unordered(3)
        .collect()
        .await;
    stop.store(true, Ordering::SeqCst);
    killer.await.expect("killer task");
    let chaos_secs = started.elapsed().as_secs_f64();
    let kills = kills.load(Ordering::SeqCst);
    let count = |f: Fate| fates.values().filter(|x| **x == f).count();
    let kept: BTreeSet<String> = fates
        .iter()
        .filter(|(_, f)| **f == Fate::Keep)
        .map(|(n, _)| n.clone())
        .collect();

    // Converge: the last operator runs undisturbed; deleted objects go, kept ones get Ready.
    let log = operator.lock().expect("lock").log.display().to_string();
    let live_uids: BTreeMap<String, String> = wait_for(
        &format!("the operator to converge after the chaos (log {log})"),
        Duration::from_secs(150),
        || async {
            let list = api
                .list(&Default::default())
                .await
                .map_err(|e| e.to_string())?;
            let names: BTreeSet<String> = list
                .items
                .iter()
                .filter_map(|s| s.metadata.name.clone())
                .collect();
            if names != kept {
                return Err(format!("objects {names:?}, want {kept:?}"));
            }
            let mut uids = BTreeMap::new();
            for s in &list.items {
                if let Err(why) = is_ready(s) {
                    return Err(format!("{:?} not Ready: {why}", s.metadata.name));
                }
                uids.insert(
                    s.metadata.uid.clone().unwrap_or_default(),
                    s.metadata.name.clone().unwrap_or_default(),
                );
            }
            Ok(uids)
        },
    )
    .await;
    // Nothing may race the sweep: stop the operator gracefully (it releases the Lease).
    let exit = operator.lock().expect("lock").terminate();
    assert!(exit.is_some(), "the operator was running");

    let before = containers(&ns).await;
    let owned_before: BTreeMap<String, String> = before
        .iter()
        .filter(|c| live_uids.contains_key(label(c, "sandboxes.dev/owner-uid").unwrap_or("")))
        .map(|c| (name_of(c), c.id.clone().unwrap_or_default()))
        .collect();
    let wreckage_before = before.iter().filter(|c| never_started(c)).count();
    let ownerless_before = before.len() - owned_before.len();
    assert!(
        ownerless_before >= 1,
        "the chaos left no ownerless container to sweep ({} force deletes): the sweep would prove nothing",
        count(Fate::ForceDelete)
    );

    // One sweep.
    let config = repo().join(format!("target/e2e/{ns}.yaml"));
    let sweep_started = Instant::now();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sandbox-operator"))
        .args([
            "sweep",
            "--grace-secs",
            "0",
            "--max-deletions",
            "1000",
            "--config",
        ])
        .arg(&config)
        .env("KUBECONFIG", kubeconfig())
        .env("POD_NAMESPACE", &ns)
        .env_remove("RUST_LOG")
        .output()
        .expect("run sweep");
    let sweep_secs = sweep_started.elapsed().as_secs_f64();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    println!("{stdout}");
    assert_eq!(
        out.status.code(),
        Some(0),
        "sweep failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let swept = stdout
        .lines()
        .filter(|l| l.starts_with("sandbox ") && l.ends_with(" deleted"))
        .count();

    // Zero without a live owner, exactly one per live Sandbox, and those untouched.
    let after = containers(&ns).await;
    let mut per_owner: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for c in &after {
        let uid = label(c, "sandboxes.dev/owner-uid")
            .unwrap_or("")
            .to_string();
        assert!(
            live_uids.contains_key(&uid),
            "{} has no live owner after the sweep (owner uid {uid:?})",
            name_of(c)
        );
        assert!(!never_started(c), "{} was never started", name_of(c));
        per_owner.entry(uid).or_default().push(name_of(c));
    }
    for (uid, name) in &live_uids {
        assert_eq!(
            per_owner.get(uid),
            Some(&vec![format!("sbx-{uid}")]),
            "Sandbox {name} must have exactly its one sandbox"
        );
    }
    let owned_after: BTreeMap<String, String> = after
        .iter()
        .map(|c| (name_of(c), c.id.clone().unwrap_or_default()))
        .collect();
    assert_eq!(
        owned_after, owned_before,
        "the sweep touched a live Sandbox's container"
    );
    assert_eq!(
        swept, ownerless_before,
        "the sweep reclaimed exactly the ownerless ones"
    );
    let volumes = engine()
        .await
        .list_volumes(Some(bollard::query_parameters::ListVolumesOptions {
            filters: Some(std::collections::HashMap::from([(
                "label".to_string(),
                vec![format!("sandboxes.dev/managed-by={ns}")],
            )])),
        }))
        .await
        .expect("list volumes");
    assert!(volumes.volumes.unwrap_or_default().is_empty());

    println!(
        "CHAOS seed={seed} cycles={CYCLES} kills={kills} kept={} deleted={} force-deleted={} \
         chaos={chaos_secs:.1}s | before sweep: {} containers = {} with a live owner + {ownerless_before} \
         without ({wreckage_before} never started) | sweep deleted {swept} in {sweep_secs:.2}s | after: {} \
         containers, one per live Sandbox | total {:.1}s",
        count(Fate::Keep),
        count(Fate::Delete),
        count(Fate::ForceDelete),
        before.len(),
        owned_before.len(),
        after.len(),
        started.elapsed().as_secs_f64()
    );
}
