//! Warm pools end to end: a SandboxWarmPool applied to the real API server, the operator
//! binary keeping its members as real Docker containers, and Sandboxes claiming them.

mod harness;

use std::time::Duration;

use harness::cluster::*;
use harness::docker::*;
use harness::objects::{READY_TIMEOUT, wait_object, wait_ready};
use harness::operator::*;
use kube::Api;
use kube::api::PostParams;
use sandbox_operator::api::{Sandbox, SandboxWarmPool};
use sandbox_operator::provider::labels::{OWNER_UID, POOL_TEMPLATE_HASH};
use serde_json::{Value, json};

/// A pool of `replicas` idle members of the base image.
fn pool(name: &str, replicas: i32, extra_env: &str) -> Value {
    json!({
        "apiVersion": "sandboxes.dev/v1alpha1",
        "kind": "SandboxWarmPool",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "template": {
                "image": base_image(),
                "command": idle(),
                "env": [{"name": "POOL_VERSION", "value": extra_env}],
            },
        },
    })
}

/// The pool's member containers, running or not: `(name, running, template hash)`.
async fn members(pool_uid: &str) -> Vec<(String, bool, String)> {
    let mut out: Vec<_> = containers_labelled(&engine().await, OWNER_UID, pool_uid)
        .await
        .into_iter()
        .map(|c| {
            let name = c
                .names
                .unwrap_or_default()
                .join("")
                .trim_start_matches('/')
                .to_string();
            let running = c.state.map(|s| s.to_string()) == Some("running".to_string());
            let hash = c
                .labels
                .unwrap_or_default()
                .remove(POOL_TEMPLATE_HASH)
                .unwrap_or_default();
            (name, running, hash)
        })
        .collect();
    out.sort();
    out
}

/// Waits until the pool reports `ready` Ready members and is Ready at its generation.
async fn wait_pool(
    api: &Api<SandboxWarmPool>,
    name: &str,
    ready: i32,
    op: &Operator,
) -> SandboxWarmPool {
    harness::objects::wait_pool_within(api, name, ready, op, READY_TIMEOUT).await
}

/// One test's world: its namespace and operator, a pool `p` filled to its replicas, and
/// the APIs of both kinds.
struct World {
    ns: String,
    op: Operator,
    pools: Api<SandboxWarmPool>,
    sandboxes: Api<Sandbox>,
    pool_uid: String,
    _purge: Purge,
}

impl World {
    async fn start(prefix: &str, replicas: i32, opts: &OperatorOptions) -> World {
        let ns = namespace(prefix).await;
        let purge = Purge(ns.clone());
        let op = Operator::start(&ns, &ns, opts);
        apply_yaml_ok(&pool("p", replicas, "1").to_string(), &ns);
        let pools: Api<SandboxWarmPool> = Api::namespaced(client().await, &ns);
        let p = wait_pool(&pools, "p", replicas, &op).await;
        World {
            sandboxes: Api::namespaced(client().await, &ns),
            pool_uid: p.metadata.uid.clone().expect("uid"),
            ns,
            op,
            pools,
            _purge: purge,
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pool_fills_and_kubectl_scale_resizes_it() {
    let w = World::start("pool-scale", 2, &OperatorOptions::default()).await;
    let (ns, op, api, uid) = (&w.ns, &w.op, &w.pools, &w.pool_uid);
    let found = members(uid).await;
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found.iter().all(|(_, running, _)| *running), "{found:?}");

    kubectl_ok(&["scale", "sbxwp/p", "--replicas=3", "-n", ns], None);
    wait_pool(api, "p", 3, op).await;
    assert_eq!(members(uid).await.len(), 3);
    let columns = kubectl_ok(&["get", "sbxwp", "p", "-n", ns], None);
    assert!(
        columns.contains("DESIRED") && columns.contains("READY"),
        "{columns}"
    );

    kubectl_ok(&["scale", "sbxwp/p", "--replicas=1", "-n", ns], None);
    wait_pool(api, "p", 1, op).await;
    harness::wait_for("members removed", Duration::from_secs(30), || async {
        let n = members(uid).await.len();
        if n == 1 {
            Ok(())
        } else {
            Err(format!("{n} members"))
        }
    })
    .await;
}

/// A Sandbox claiming from pool `pool`, with `extra` merged into its spec.
fn claim(name: &str, pool: &str, extra: Value) -> Value {
    let mut spec = json!({"warmPoolRef": {"name": pool}});
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
        s.extend(e.clone());
    }
    json!({
        "apiVersion": "sandboxes.dev/v1alpha1",
        "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": spec,
    })
}

/// PID 1's start time (field 22 of /proc/1/stat, clock ticks since boot) in `container`.
fn pid1_start(container: &str) -> String {
    let stat = docker_sh(container, "cat /proc/1/stat").expect("read /proc/1/stat");
    // The command field (2) is parenthesised and may hold spaces: count after its ')'.
    let after = &stat[stat.rfind(')').expect("stat has a comm field") + 2..];
    after
        .split_whitespace()
        .nth(22 - 3)
        .expect("field 22")
        .to_string()
}

/// The ledger's claimed count and the pool's unclaimed ready count.
async fn wait_counts(
    api: &Api<SandboxWarmPool>,
    name: &str,
    ready: i32,
    claimed: i32,
    op: &Operator,
) {
    let what = format!("{ready} ready, {claimed} claimed");
    wait_object(api, name, op, &what, READY_TIMEOUT, |p| {
        let s = p.status.clone().unwrap_or_default();
        if s.ready_replicas == ready && s.claimed_replicas == claimed && s.replicas == ready {
            Ok(())
        } else {
            Err(format!("{s:?}"))
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_claim_takes_a_running_member_delivers_env_and_the_pool_refills() {
    let w = World::start("pool-claim", 1, &OperatorOptions::default()).await;
    let (ns, op, pools, pool_uid) = (&w.ns, &w.op, &w.pools, &w.pool_uid);
    let (member, _, _) = members(pool_uid).await.remove(0);
    let started = pid1_start(&member);
    create_secret(ns, "creds", None, json!({"TOKEN": "s3cret"})).await;

    let extra = json!({
        "env": [{"name": "GREETING", "value": "hi"}],
        "envFrom": [{"secretRef": {"name": "creds"}}],
    });
    apply_yaml_ok(&claim("s", "p", extra).to_string(), ns);
    let sandboxes = &w.sandboxes;
    let s = wait_ready(sandboxes, "s", op).await;
    let status = s.status.clone().expect("status");
    assert_eq!(status.claim.as_deref(), Some("warm"));
    assert_eq!(status.sandbox_id.as_deref(), Some(member.as_str()));
    let seen = docker_sh(
        &member,
        ". /run/sandboxes.dev/env; echo \"$GREETING $TOKEN\"",
    );
    assert_eq!(seen.expect("exec").trim(), "hi s3cret");
    assert_eq!(pid1_start(&member), started, "the member was not restarted");
    let metrics = op.http_get("/metrics").expect("metrics");
    assert!(
        metrics.contains("sandbox_operator_warm_pool_claims_total{mode=\"warm\"} 1"),
        "{metrics}"
    );
    // The env file was staged in the member during the ledger write and committed after.
    let staged = "operation=\"stage_write\",outcome=\"ok\"} 1";
    assert!(metrics.contains(staged), "{metrics}");

    // The pool refills in the background; the claimed member is not counted as its own.
    wait_counts(pools, "p", 1, 1, op).await;
    assert_eq!(members(pool_uid).await.len(), 2);

    // Deleting the Sandbox removes its member, and the ledger forgets it.
    harness::objects::delete_and_wait_gone(sandboxes, "s").await;
    wait_counts(pools, "p", 1, 0, op).await;
    let left = members(pool_uid).await;
    assert!(left.iter().all(|(n, _, _)| n != &member), "{left:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_empty_pool_serves_a_claim_cold_and_admission_refuses_restart_fields() {
    let w = World::start("pool-cold", 0, &OperatorOptions::default()).await;
    let (ns, op) = (&w.ns, &w.op);

    let refused = apply_yaml(&claim("bad", "p", json!({"image": "x"})).to_string(), ns);
    let stderr = String::from_utf8_lossy(&refused.stderr).into_owned();
    assert!(
        !refused.status.success(),
        "an image with warmPoolRef was admitted"
    );
    assert!(
        stderr.contains("spec.image cannot be set with spec.warmPoolRef"),
        "{stderr}"
    );

    let extra = json!({
        "env": [{"name": "GREETING", "value": "cold"}],
        "labels": {"task": "t-cold"},
    });
    apply_yaml_ok(&claim("s", "p", extra).to_string(), ns);
    let sandboxes = &w.sandboxes;
    let s = wait_ready(sandboxes, "s", op).await;
    let status = s.status.clone().expect("status");
    assert_eq!(status.claim.as_deref(), Some("cold"));
    let id = status.sandbox_id.expect("id");
    let uid = s.metadata.uid.clone().expect("uid");
    assert_eq!(id, format!("sbx-{uid}"));
    let seen = docker_sh(
        &id,
        ". /run/sandboxes.dev/env; echo \"$GREETING $POOL_VERSION\"",
    );
    assert_eq!(seen.expect("exec").trim(), "cold 1");
    let label = std::process::Command::new("docker")
        .args(["inspect", "-f", "{{index .Config.Labels \"task\"}}", &id])
        .output()
        .expect("docker inspect");
    let label = String::from_utf8_lossy(&label.stdout);
    assert_eq!(label.trim(), "t-cold", "a cold claim is labelled at create");
    let metrics = op.http_get("/metrics").expect("metrics");
    assert!(
        metrics.contains("sandbox_operator_warm_pool_claims_total{mode=\"cold\"} 1"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_template_change_rolls_only_unclaimed_members() {
    let w = World::start("pool-roll", 2, &OperatorOptions::default()).await;
    let (ns, op, pools, pool_uid) = (&w.ns, &w.op, &w.pools, &w.pool_uid);
    let p = pools.get("p").await.expect("pool");
    let old_hash = p
        .status
        .clone()
        .and_then(|s| s.template_hash)
        .expect("hash");
    apply_yaml_ok(&claim("s", "p", json!({})).to_string(), ns);
    let sandboxes = &w.sandboxes;
    let s = wait_ready(sandboxes, "s", op).await;
    let claimed = s.status.and_then(|s| s.sandbox_id).expect("claimed member");
    let claimed_start = pid1_start(&claimed);
    wait_counts(pools, "p", 2, 1, op).await;

    apply_yaml_ok(&pool("p", 2, "2").to_string(), ns);
    let rolled = wait_pool(pools, "p", 2, op).await;
    let new_hash = rolled.status.and_then(|s| s.template_hash).expect("hash");
    assert_ne!(new_hash, old_hash);
    harness::wait_for(
        "old unclaimed members removed",
        Duration::from_secs(30),
        || async {
            let found = members(pool_uid).await;
            let old: Vec<_> = found.iter().filter(|(_, _, h)| h == &old_hash).collect();
            let new = found
                .iter()
                .filter(|(_, r, h)| *r && h == &new_hash)
                .count();
            match (old.as_slice(), new) {
                ([(name, true, _)], 2) if name == &claimed => Ok(()),
                _ => Err(format!("{found:?}")),
            }
        },
    )
    .await;
    assert_eq!(
        pid1_start(&claimed),
        claimed_start,
        "the claimed member was not touched"
    );
    harness::objects::is_ready(&sandboxes.get("s").await.expect("get")).expect("still Ready");
}

#[tokio::test(flavor = "multi_thread")]
async fn deleting_a_pool_removes_unclaimed_members_only() {
    let w = World::start("pool-delete", 2, &OperatorOptions::default()).await;
    let (ns, op, pools, pool_uid) = (&w.ns, &w.op, &w.pools, &w.pool_uid);
    apply_yaml_ok(&claim("s", "p", json!({})).to_string(), ns);
    let sandboxes = &w.sandboxes;
    let s = wait_ready(sandboxes, "s", op).await;
    let claimed = s.status.and_then(|s| s.sandbox_id).expect("claimed member");

    kubectl_ok(&["delete", "sbxwp", "p", "-n", ns, "--wait=false"], None);
    harness::wait_for(
        "unclaimed members removed",
        Duration::from_secs(60),
        || async {
            let found = members(pool_uid).await;
            match found.as_slice() {
                [(name, true, _)] if name == &claimed => Ok(()),
                _ => Err(format!("{found:?}")),
            }
        },
    )
    .await;
    wait_object(
        pools,
        "p",
        op,
        "held by its claimed member",
        READY_TIMEOUT,
        |p| {
            let held = sandbox_operator::api::condition(
                p.status.as_ref().map_or(&[], |s| s.conditions.as_slice()),
                "MembersClaimed",
            );
            held.map(|_| ())
                .ok_or_else(|| "no MembersClaimed condition".to_string())
        },
    )
    .await;
    harness::objects::is_ready(&sandboxes.get("s").await.expect("get")).expect("still Ready");
    assert!(
        docker_sh(&claimed, "true").is_ok(),
        "the claimed member still runs"
    );

    harness::objects::delete_and_wait_gone(sandboxes, "s").await;
    harness::objects::wait_gone(pools, "p", READY_TIMEOUT).await;
    assert!(members(pool_uid).await.is_empty());
}

/// How many Sandboxes claim at once in the crash test.
const CLAIMS: usize = 50;

#[tokio::test(flavor = "multi_thread")]
async fn a_member_that_died_after_the_pool_last_looked_is_never_claimed() {
    let w = World::start("pool-dead", 2, &OperatorOptions::default()).await;
    let (op, pools, sandboxes) = (&w.op, &w.pools, &w.sandboxes);
    let found = members(&w.pool_uid).await;
    let (dead, _, _) = found.first().expect("a member").clone();
    // Killed, then claimed at once: the pool's last listing (what claims pick from) still
    // shows it running, as the pool waits for its triggers to settle before it looks again.
    engine()
        .await
        .kill_container(&dead, None)
        .await
        .expect("kill");
    let params = PostParams::default();
    for name in ["a", "b"] {
        let object: Sandbox = serde_json::from_value(claim(name, "p", json!({}))).expect("claim");
        sandboxes.create(&params, &object).await.expect("create");
    }
    let mut got = Vec::new();
    for name in ["a", "b"] {
        let s = wait_ready(sandboxes, name, op).await;
        got.push(harness::objects::sandbox_id(&s));
    }
    assert!(
        !got.contains(&dead),
        "a claim got the dead member {dead}: {got:?}"
    );
    let running: Vec<String> = members(&w.pool_uid)
        .await
        .into_iter()
        .filter(|(_, running, _)| *running)
        .map(|(name, _, _)| name)
        .collect();
    let warm: Vec<&String> = got.iter().filter(|id| running.contains(id)).collect();
    assert!(
        !warm.is_empty(),
        "the live member serves a claim: {got:?} {running:?}"
    );
    let p = pools.get("p").await.expect("pool");
    let ledger = p.status.unwrap_or_default().ledger;
    assert!(
        ledger
            .iter()
            .all(|e| e.member != dead || e.claimed_by.is_none()),
        "the ledger gives the dead member to a claimant: {ledger:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn kill_9_during_50_claims_claims_no_member_twice_and_leaks_none() {
    // A lease long enough for a loaded machine's renewals, short enough for quick takeovers.
    let opts = OperatorOptions {
        lease_secs: Some(10),
        ..OperatorOptions::default()
    };
    let mut w = World::start("pool-kill", 10, &opts).await;
    w.op.kill();
    let (ns, pools, pool_uid) = (w.ns.clone(), w.pools.clone(), w.pool_uid.clone());

    // The first operator aborts right after its first ledger write, before the Sandbox's
    // status records the member: the worst moment of a claim.
    let crashing = OperatorOptions {
        env: vec![(
            "SANDBOX_OPERATOR_FAILPOINT".into(),
            "claim-after-ledger".into(),
        )],
        ..opts.clone()
    };
    let mut op = Operator::start(&ns, &ns, &crashing);
    // Each claim carries its own env, delivered (or, for a claim that arrives alone, staged
    // during its ledger write) around the kills: each member must show only its claimant's.
    let task = |i: usize| json!({"env": [{"name": "TASK", "value": format!("s{i}")}]});
    let docs: Vec<String> = (0..CLAIMS)
        .map(|i| claim(&format!("s{i}"), "p", task(i)).to_string())
        .collect();
    apply_yaml_ok(&docs.join("\n---\n"), &ns);
    op.wait_exit(Duration::from_secs(60)).await;

    // The second is killed (SIGKILL) once claims are under way.
    let mut op = Operator::start(&ns, &ns, &opts);
    let sandboxes = &w.sandboxes;
    harness::wait_for("claims under way", Duration::from_secs(60), || async {
        let list = sandboxes
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?;
        let n = list
            .items
            .iter()
            .filter(|s| s.status.as_ref().is_some_and(|s| s.claim.is_some()))
            .count();
        if n >= 5 {
            Ok(())
        } else {
            Err(format!("{n} settled"))
        }
    })
    .await;
    op.kill();

    let op = Operator::start(&ns, &ns, &opts);
    let all = harness::wait_for("every claim Ready", Duration::from_secs(300), || async {
        let list = sandboxes
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?;
        let ready = list
            .items
            .iter()
            .filter(|s| harness::objects::is_ready(*s).is_ok())
            .count();
        if ready == CLAIMS {
            Ok(list.items)
        } else {
            Err(format!("{ready} of {CLAIMS} Ready"))
        }
    })
    .await;
    assert_each_member_claimed_once(&all, &pools).await;
    assert_each_warm_member_has_its_own_env(&all);

    // Nothing leaked: once every Sandbox is gone, only the pool's own members are left.
    // (The full resource name: `sandboxes` alone is also the category of every kind.)
    kubectl_ok(
        &[
            "delete",
            "sandboxes.sandboxes.dev",
            "--all",
            "-n",
            &ns,
            "--wait=true",
            "--timeout=240s",
        ],
        None,
    );
    wait_counts(&pools, "p", 10, 0, &op).await;
    harness::wait_for(
        "only the pool's members left",
        Duration::from_secs(60),
        || async {
            let left = containers_labelled(&engine().await, "sandboxes.dev/managed-by", &ns).await;
            let members = members(&pool_uid).await.len();
            if left.len() == 10 && members == 10 {
                Ok(())
            } else {
                Err(format!("{} containers, {members} members", left.len()))
            }
        },
    )
    .await;
    // No env staged for an interrupted claim is left in a free member, staged or in place.
    for (member, _, _) in members(&pool_uid).await {
        let files = docker_sh(&member, "ls -A /run/sandboxes.dev 2>/dev/null; true");
        assert_eq!(files.as_deref(), Ok(""), "files in free member {member}");
    }
}

/// Every Sandbox served warm finds its own `TASK` (its name) in its member's env file.
fn assert_each_warm_member_has_its_own_env(all: &[Sandbox]) {
    for s in all {
        let status = s.status.clone().unwrap_or_default();
        if status.claim.as_deref() != Some("warm") {
            continue;
        }
        let member = harness::objects::sandbox_id(s);
        let seen = docker_sh(&member, ". /run/sandboxes.dev/env; echo \"$TASK\"");
        let name = s.metadata.name.clone().unwrap_or_default();
        assert_eq!(seen.map(|t| t.trim().to_string()), Ok(name), "{member}");
    }
}

/// No member serves two Sandboxes, and each warm one is its Sandbox's by the ledger.
async fn assert_each_member_claimed_once(all: &[Sandbox], pools: &Api<SandboxWarmPool>) {
    let ids: Vec<String> = all.iter().map(harness::objects::sandbox_id).collect();
    let unique: std::collections::BTreeSet<&String> = ids.iter().collect();
    assert_eq!(
        unique.len(),
        CLAIMS,
        "a member serves two Sandboxes: {ids:?}"
    );
    let ledger = pools
        .get("p")
        .await
        .expect("pool")
        .status
        .unwrap_or_default()
        .ledger;
    let mut claimed = 0;
    for s in all {
        let status = s.status.clone().unwrap_or_default();
        if status.claim.as_deref() != Some("warm") {
            continue;
        }
        claimed += 1;
        let uid = s.metadata.uid.clone().unwrap_or_default();
        let entry = ledger
            .iter()
            .find(|e| Some(&e.member) == status.sandbox_id.as_ref());
        let by = entry.and_then(|e| e.claimed_by.clone()).map(|c| c.uid);
        assert_eq!(by, Some(uid), "ledger entry of {:?}", status.sandbox_id);
    }
    assert!(claimed > 0, "no claim was served warm");
    assert_eq!(
        ledger.iter().filter(|e| e.claimed_by.is_some()).count(),
        claimed,
        "{ledger:?}"
    );
}

/// The ledger write against the real API server: a write decided on a stale ledger is
/// refused (and reported as a lost race, not an error), a write over a pool whose other
/// status fields changed meanwhile is not, and a pool of the same name made again is
/// another pool.
#[tokio::test]
async fn a_ledger_write_loses_only_to_a_changed_ledger() {
    use kube::api::{Patch, PatchParams};
    use sandbox_operator::api::{LedgerEntry, SandboxWarmPoolStatus};
    use sandbox_operator::controller::pool::ledger;

    let ns = namespace("ledger").await;
    let api: Api<SandboxWarmPool> = Api::namespaced(client().await, &ns);
    let object: SandboxWarmPool = serde_json::from_value(pool("p", 0, "v1")).unwrap();
    let created = api.create(&PostParams::default(), &object).await.unwrap();
    let entry = |m: &str| LedgerEntry {
        member: m.into(),
        claimed_by: None,
    };
    // The first entry goes by resourceVersion (there is no ledger to test yet).
    let one = ledger::write(&api, &created, &[entry("a")]).await.unwrap();
    let one = one.expect("the first write lands");
    assert!(
        ledger::write(&api, &created, &[entry("b")])
            .await
            .unwrap()
            .is_none(),
        "a write decided before the first one loses"
    );
    // Another manager changes the rest of status: the ledger read is still the ledger.
    let ssa = PatchParams::apply("someone-else").force();
    let status = json!({"apiVersion": "sandboxes.dev/v1alpha1", "kind": "SandboxWarmPool",
        "status": {"replicas": 3, "readyReplicas": 0}});
    api.patch_status("p", &ssa, &Patch::Apply(&status))
        .await
        .unwrap();
    let two = ledger::write(&api, &one, &[entry("a"), entry("b")])
        .await
        .unwrap();
    let two = two.expect("a change of other status fields does not refuse the write");
    assert_eq!(two.status.as_ref().map(|s| s.replicas), Some(3));
    // Decided on `one`'s ledger, which `two` changed: refused.
    assert!(ledger::write(&api, &one, &[]).await.unwrap().is_none());
    // Emptied from the fresh read.
    let empty = ledger::write(&api, &two, &[])
        .await
        .unwrap()
        .expect("lands");
    let ledger_of = |p: &SandboxWarmPool| p.status.clone().map(|s: SandboxWarmPoolStatus| s.ledger);
    assert_eq!(
        ledger_of(&empty).unwrap_or_default(),
        Vec::<LedgerEntry>::new()
    );
    // The same name made again is another pool: `two`'s read does not write into it.
    // No operator runs here, so nothing holds the pool: it goes at once.
    api.delete("p", &Default::default()).await.unwrap();
    let again = api.create(&PostParams::default(), &object).await.unwrap();
    ledger::write(&api, &again, &[entry("x")])
        .await
        .unwrap()
        .expect("lands");
    assert!(
        ledger::write(&api, &two, &[entry("y")])
            .await
            .unwrap()
            .is_none()
    );
    let now = api.get("p").await.unwrap();
    assert_eq!(ledger_of(&now).unwrap(), vec![entry("x")]);
}
