//! End to end, when things go wrong: the Docker engine goes away and comes back, the leader
//! dies or steps down, a container is removed behind the operator's back, Secrets must not leak,
//! and sandboxes reach the end of their lifetime. Real API server, real Docker, the operator as
//! its built binary; each test has its own namespace and operator instance.
//!
//! The harness configures a resync of 600 s, so every recovery that happens within the bounded
//! deadlines below was driven by events (Kubernetes watches, the Docker event stream, the
//! engine coming back), not by the periodic safety net.

mod harness;

use std::process::Command;
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::query_parameters::InspectContainerOptions;
use harness::cluster::*;
use harness::docker::*;
use harness::metrics::{leader_gauge, sample};
use harness::objects::{
    READY_TIMEOUT, delete_and_wait_gone, is_ready, wait_gone, wait_object, wait_ready,
};
use harness::operator::*;
use harness::{cache, repo, wait_for};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use sandbox_operator::api::{Condition, Sandbox, condition};
use sandbox_operator::provider::labels::OWNER_UID;

/// Long enough for an event-driven reaction on a busy machine, far below the 600 s resync.
const EVENT_TIMEOUT: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------------------------
// Helpers

fn cond<'a>(s: &'a Sandbox, type_: &str) -> Option<&'a Condition> {
    condition(&s.status.as_ref()?.conditions, type_)
}

fn ready_of(s: &Sandbox) -> Option<(String, String)> {
    cond(s, "Ready").map(|c| (c.status.clone(), c.reason.clone()))
}

/// A Sandbox manifest running the base image with `extra` spec lines (indented two spaces).
fn sandbox_yaml(name: &str, extra: &str) -> String {
    format!(
        "apiVersion: sandboxes.dev/v1alpha1\nkind: Sandbox\nmetadata:\n  name: {name}\nspec:\n  image: {}\n{extra}",
        base_image()
    )
}

async fn containers_on(docker: &Docker, uid: &str) -> Vec<bollard::models::ContainerSummary> {
    containers_labelled(docker, OWNER_UID, uid).await
}

async fn inspect_on(docker: &Docker, name: &str) -> bollard::models::ContainerInspectResponse {
    docker
        .inspect_container(name, None::<InspectContainerOptions>)
        .await
        .expect("inspect")
}

fn uid_of(s: &Sandbox) -> String {
    s.metadata.uid.clone().expect("uid")
}

fn external_of(s: &Sandbox) -> String {
    s.status
        .as_ref()
        .and_then(|st| st.external_name.clone())
        .expect("status.externalName")
}

/// `docker [-H host] args…`, asserting success; stdout.
fn docker_cli(host: Option<&str>, args: &[&str]) -> String {
    let mut cmd = Command::new("docker");
    if let Some(h) = host {
        cmd.arg("-H").arg(h);
    }
    let out = cmd.args(args).output().expect("run docker");
    assert!(
        out.status.success(),
        "docker {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn sandbox_reconciles(op: &Operator) -> Option<f64> {
    sample(op, "sandbox_operator_reconciles_total{kind=\"Sandbox\"}")
}

async fn lease_holder(ns: &str, instance: &str) -> Option<String> {
    let api: Api<Lease> = Api::namespaced(client().await, ns);
    let lease = api
        .get_opt(&format!("sandbox-operator-{instance}"))
        .await
        .expect("read lease")?;
    lease.spec?.holder_identity.filter(|h| !h.is_empty())
}

/// Waits until exactly one of `ops` reports `sandbox_operator_leader 1` while every other one
/// answers `0`; returns the leader's index.
async fn wait_single_leader(ops: &[&Operator], timeout: Duration) -> usize {
    wait_for("exactly one leader", timeout, || async {
        let gauges: Vec<Option<f64>> = ops.iter().map(|o| leader_gauge(o)).collect();
        let leaders: Vec<usize> = gauges
            .iter()
            .enumerate()
            .filter(|(_, g)| **g == Some(1.0))
            .map(|(i, _)| i)
            .collect();
        let followers = gauges.iter().filter(|g| **g == Some(0.0)).count();
        if leaders.len() == 1 && followers == ops.len() - 1 {
            Ok(leaders[0])
        } else {
            Err(format!("leader gauges {gauges:?}"))
        }
    })
    .await
}

fn took(start: Instant) -> String {
    format!("{:.1} s", start.elapsed().as_secs_f64())
}

// ---------------------------------------------------------------------------------------------
// 1. The engine goes away and comes back.

/// A private engine (tests/setup/isolated-docker.sh), held under an exclusive lock for the
/// test's duration and taken down (containers removed, daemon stopped) when dropped.
struct IsolatedEngine {
    name: String,
    host: String,
    _lock: nix::fcntl::Flock<std::fs::File>,
}

impl IsolatedEngine {
    fn script(cmd: &str, name: &str) -> String {
        let out = Command::new("bash")
            .arg(repo().join("tests/setup/isolated-docker.sh"))
            .args([cmd, name])
            .output()
            .expect("run tests/setup/isolated-docker.sh");
        assert!(
            out.status.success(),
            "isolated-docker.sh {cmd} {name} failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    fn up(name: &str) -> IsolatedEngine {
        let dir = cache().join(format!("docker-{name}"));
        std::fs::create_dir_all(&dir).expect("engine state dir");
        let file = std::fs::File::create(dir.join("test.lock")).expect("lock file");
        let lock = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| e)
            .expect("lock the engine");
        let host = Self::script("start", name);
        assert!(host.starts_with("unix:///"), "socket {host}");
        IsolatedEngine {
            name: name.into(),
            host,
            _lock: lock,
        }
    }

    fn start(&self) {
        Self::script("start", &self.name);
    }

    fn stop(&self) {
        Self::script("stop", &self.name);
    }

    async fn client(&self) -> Docker {
        let path = self.host.trim_start_matches("unix://");
        Docker::connect_with_unix(path, 60, bollard::API_DEFAULT_VERSION)
            .expect("isolated docker")
            .negotiate_version()
            .await
            .expect("negotiate with the isolated engine")
    }
}

impl Drop for IsolatedEngine {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(repo().join("tests/setup/isolated-docker.sh"))
            .args(["down", &self.name])
            .output();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn engine_outage_reports_provider_unavailable_and_recovers_the_same_container() {
    let t0 = Instant::now();
    let engine = IsolatedEngine::up("resilience");
    let docker = engine.client().await;
    let ns = namespace("e2e-outage").await;
    let opts = OperatorOptions {
        config_extra: format!(
            "providers:\n  - name: docker\n    type: docker\n    docker:\n      endpoint: {}\n",
            engine.host
        ),
        ..Default::default()
    };
    let op = Operator::start(&ns, &ns, &opts);
    let api: Api<Sandbox> = Api::namespaced(client().await, &ns);
    apply_yaml_ok(&sandbox_yaml("steady", "  restartPolicy: Always\n"), &ns);
    let s = wait_ready(&api, "steady", &op).await;
    let uid = uid_of(&s);
    let external = external_of(&s);
    let before = inspect_on(&docker, &external).await;
    assert!(
        docker_cli(
            None,
            &[
                "ps",
                "-aq",
                "--filter",
                &format!("label=sandboxes.dev/owner-uid={uid}")
            ]
        )
        .trim()
        .is_empty(),
        "created on the isolated engine, not the shared one"
    );

    // Engine gone: Ready=False with the provider's reason, nothing deleted.
    let stopped_at = Instant::now();
    engine.stop();
    let s = wait_object(
        &api,
        "steady",
        &op,
        "Ready=False ProviderUnavailable",
        EVENT_TIMEOUT,
        |s| match ready_of(s) {
            Some((st, reason)) if st == "False" && reason == "ProviderUnavailable" => Ok(()),
            other => Err(format!("ready={other:?}")),
        },
    )
    .await;
    eprintln!(
        "outage noticed {} after the engine stopped",
        took(stopped_at)
    );
    let msg = cond(&s, "Ready")
        .map(|c| c.message.clone())
        .unwrap_or_default();
    assert!(
        msg.to_lowercase().contains("docker"),
        "the message names the engine: {msg}"
    );
    assert_eq!(
        cond(&s, "Reconciling").map(|c| c.status.as_str()),
        Some("True"),
        "an outage is retried, not stalled"
    );
    assert!(cond(&s, "Stalled").is_none(), "an outage is not Stalled");
    assert!(s.metadata.deletion_timestamp.is_none());
    assert!(
        s.metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == "sandboxes.dev/cleanup"),
        "finalizer kept"
    );
    assert_eq!(
        s.status.as_ref().and_then(|st| st.sandbox_id.clone()),
        Some(external.clone()),
        "status keeps the sandbox id"
    );
    // A longer outage: several retries, each failing, backing off, and destroying nothing.
    let series = "sandbox_operator_reconcile_errors_total{kind=\"Sandbox\",category=\"ProviderUnavailable\"}";
    wait_for(
        "four failed retries during the outage",
        READY_TIMEOUT,
        || async {
            match sample(&op, series) {
                Some(n) if n >= 4.0 => Ok(()),
                other => Err(format!("{series} = {other:?}")),
            }
        },
    )
    .await;
    eprintln!(
        "outage lasted {} before the engine was started again",
        took(stopped_at)
    );
    let s = api.get("steady").await.expect("still there");
    assert_eq!(
        ready_of(&s).map(|r| r.1).as_deref(),
        Some("ProviderUnavailable")
    );
    assert!(s.metadata.deletion_timestamp.is_none());

    // Engine back (live-restore: the container survived): Ready again on the same container.
    let restarted_at = Instant::now();
    engine.start();
    wait_object(
        &api,
        "steady",
        &op,
        "Ready again after the engine returned",
        READY_TIMEOUT,
        is_ready,
    )
    .await;
    eprintln!(
        "recovered {} after the engine started again",
        took(restarted_at)
    );
    let docker = engine.client().await;
    let after = inspect_on(&docker, &external).await;
    assert_eq!(after.id, before.id, "the same container");
    assert_eq!(
        after.state.as_ref().and_then(|s| s.started_at.clone()),
        before.state.as_ref().and_then(|s| s.started_at.clone()),
        "never restarted"
    );
    assert_eq!(after.state.as_ref().and_then(|s| s.running), Some(true));
    let all = containers_on(&docker, &uid).await;
    assert_eq!(all.len(), 1, "nothing duplicated: {all:?}");
    let events = events_about(&ns, "steady").await;
    let count = |reason: &str| events.iter().filter(|(_, r, _)| r == reason).count();
    assert_eq!(count("Created"), 1, "created once: {events:?}");
    assert_eq!(
        count("SandboxVanished") + count("Destroyed") + count("Recreating"),
        0,
        "an outage is not a vanished sandbox: {events:?}"
    );

    // The Docker event stream was resubscribed: a container removed behind the operator's back
    // on the restarted engine is noticed (and recreated, restartPolicy Always) by its event.
    let old_id = after.id.clone().expect("id");
    let removed_at = Instant::now();
    docker_cli(Some(&engine.host), &["rm", "-f", &external]);
    wait_for(
        "the removed container to be recreated on the restarted engine",
        EVENT_TIMEOUT,
        || async {
            match docker
                .inspect_container(&external, None::<InspectContainerOptions>)
                .await
            {
                Ok(c) if c.id.as_deref() != Some(old_id.as_str()) => Ok(()),
                Ok(_) => Err("still the old container".to_string()),
                Err(e) => Err(e.to_string()),
            }
        },
    )
    .await;
    eprintln!(
        "event stream after the restart: recreated {} after docker rm -f",
        took(removed_at)
    );
    wait_object(
        &api,
        "steady",
        &op,
        "Ready on the recreated container",
        READY_TIMEOUT,
        is_ready,
    )
    .await;

    delete_and_wait_gone(&api, "steady").await;
    assert!(
        containers_on(&docker, &uid).await.is_empty(),
        "delete still removes the container"
    );
    drop(op);
    eprintln!("engine_outage test took {}", took(t0));
}

// ---------------------------------------------------------------------------------------------
// 2. Leader election.

#[tokio::test(flavor = "multi_thread")]
async fn only_the_leader_acts_and_a_killed_leader_is_replaced_within_the_lease() {
    let t0 = Instant::now();
    let ns = namespace("e2e-leader").await;
    let _purge = Purge(ns.clone());
    let opts = OperatorOptions {
        lease_secs: Some(4),
        ..Default::default()
    };
    let mut ops = [
        Operator::start(&ns, &ns, &opts),
        Operator::start(&ns, &ns, &opts),
    ];
    let leader = wait_single_leader(&[&ops[0], &ops[1]], READY_TIMEOUT).await;
    let follower = 1 - leader;
    let api: Api<Sandbox> = Api::namespaced(client().await, &ns);

    // Only the leader acts.
    apply_yaml_ok(&sandbox_yaml("first", ""), &ns);
    let first = wait_ready(&api, "first", &ops[leader]).await;
    // The counter moves when the reconcile returns, just after its status write made the
    // object Ready: wait for it rather than read it once.
    wait_for(
        "the leader to count its reconcile",
        EVENT_TIMEOUT,
        || async {
            match sandbox_reconciles(&ops[leader]) {
                Some(n) if n >= 1.0 => Ok(()),
                other => Err(format!("leader's reconciles: {other:?}")),
            }
        },
    )
    .await;
    assert_eq!(leader_gauge(&ops[follower]), Some(0.0), "still following");
    assert_eq!(leader_gauge(&ops[leader]), Some(1.0), "still leading");
    assert_eq!(
        sandbox_reconciles(&ops[follower]).unwrap_or(0.0),
        0.0,
        "the follower never reconciles"
    );
    let follower_log = std::fs::read_to_string(&ops[follower].log).unwrap_or_default();
    assert!(
        !follower_log.contains("starting controllers"),
        "the follower started controllers:\n{follower_log}"
    );
    let holder = lease_holder(&ns, &ns).await.expect("a holder");

    // SIGKILL the leader: the follower takes over once the Lease expires (4 s) plus a margin.
    let killed_at = Instant::now();
    ops[leader].kill();
    wait_for(
        "the follower to take over",
        Duration::from_secs(4 + 8),
        || async {
            match leader_gauge(&ops[follower]) {
                Some(1.0) => Ok(()),
                other => Err(format!("gauge {other:?}")),
            }
        },
    )
    .await;
    eprintln!("failover after SIGKILL took {}", took(killed_at));
    let new_holder = lease_holder(&ns, &ns).await.expect("a holder");
    assert_ne!(new_holder, holder, "the Lease changed hands");

    // The new leader acts: a Sandbox applied after the kill becomes Ready, and deletes work.
    apply_yaml_ok(&sandbox_yaml("second", ""), &ns);
    let second = wait_ready(&api, "second", &ops[follower]).await;
    let docker = engine().await;
    assert_eq!(containers_on(&docker, &uid_of(&second)).await.len(), 1);
    assert_eq!(
        containers_on(&docker, &uid_of(&first)).await.len(),
        1,
        "the first sandbox is adopted, not duplicated"
    );
    delete_and_wait_gone(&api, "first").await;
    delete_and_wait_gone(&api, "second").await;
    assert!(containers_on(&docker, &uid_of(&first)).await.is_empty());
    assert!(containers_on(&docker, &uid_of(&second)).await.is_empty());
    eprintln!("leader SIGKILL test took {}", took(t0));
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_releases_the_lease_so_the_standby_takes_over_at_once() {
    let t0 = Instant::now();
    let ns = namespace("e2e-handover").await;
    let _purge = Purge(ns.clone());
    // A long lease: without the release on SIGTERM the standby would wait ~20 s.
    let lease = 20u64;
    let opts = OperatorOptions {
        lease_secs: Some(lease),
        ..Default::default()
    };
    let mut ops = [
        Operator::start(&ns, &ns, &opts),
        Operator::start(&ns, &ns, &opts),
    ];
    let leader = wait_single_leader(&[&ops[0], &ops[1]], READY_TIMEOUT).await;
    let standby = 1 - leader;
    let api: Api<Sandbox> = Api::namespaced(client().await, &ns);
    apply_yaml_ok(&sandbox_yaml("before", ""), &ns);
    let before = wait_ready(&api, "before", &ops[leader]).await;
    let holder = lease_holder(&ns, &ns).await.expect("a holder");

    let term_at = Instant::now();
    let status = ops[leader].terminate().expect("the leader was running");
    assert!(status.success(), "SIGTERM exits 0, got {status:?}");
    let exited = took(term_at);
    assert_ne!(
        lease_holder(&ns, &ns).await.as_deref(),
        Some(holder.as_str()),
        "the Lease is released on exit"
    );
    wait_for(
        "the standby to take over",
        Duration::from_secs(lease / 2),
        || async {
            match leader_gauge(&ops[standby]) {
                Some(1.0) => Ok(()),
                other => Err(format!("gauge {other:?}")),
            }
        },
    )
    .await;
    eprintln!(
        "SIGTERM: leader exited after {exited}, standby leading {} after the signal (lease {lease} s)",
        took(term_at)
    );

    apply_yaml_ok(&sandbox_yaml("after", ""), &ns);
    let after = wait_ready(&api, "after", &ops[standby]).await;
    delete_and_wait_gone(&api, "before").await;
    delete_and_wait_gone(&api, "after").await;
    let docker = engine().await;
    assert!(containers_on(&docker, &uid_of(&before)).await.is_empty());
    assert!(containers_on(&docker, &uid_of(&after)).await.is_empty());
    eprintln!("leader SIGTERM test took {}", took(t0));
}

// ---------------------------------------------------------------------------------------------
// 3. Drift noticed by events: the dead-machine signal.

#[tokio::test(flavor = "multi_thread")]
async fn a_removed_container_is_recreated_or_reported_per_restart_policy() {
    let t0 = Instant::now();
    let ns = namespace("e2e-vanish").await;
    let _purge = Purge(ns.clone());
    let op = Operator::start(&ns, &ns, &OperatorOptions::default());
    let api: Api<Sandbox> = Api::namespaced(client().await, &ns);
    apply_yaml_ok(&sandbox_yaml("phoenix", "  restartPolicy: Always\n"), &ns);
    apply_yaml_ok(&sandbox_yaml("mortal", "  restartPolicy: Never\n"), &ns);
    let phoenix = wait_ready(&api, "phoenix", &op).await;
    let mortal = wait_ready(&api, "mortal", &op).await;
    let docker = engine().await;
    let phoenix_name = external_of(&phoenix);
    let old_id = inspect_on(&docker, &phoenix_name).await.id.expect("id");

    // Always: recreated under the same name, with a new id, and a Warning says why.
    let removed_at = Instant::now();
    docker_cli(None, &["rm", "-f", &phoenix_name]);
    let new = wait_for(
        "a new, running container under the same name",
        EVENT_TIMEOUT,
        || async {
            match docker
                .inspect_container(&phoenix_name, None::<InspectContainerOptions>)
                .await
            {
                Ok(c)
                    if c.id.as_deref() != Some(old_id.as_str())
                        && c.state.as_ref().and_then(|s| s.running) == Some(true) =>
                {
                    Ok(c)
                }
                Ok(c) => Err(format!(
                    "id {:?} running {:?}",
                    c.id,
                    c.state.and_then(|s| s.running)
                )),
                Err(e) => Err(e.to_string()),
            }
        },
    )
    .await;
    eprintln!("Always: recreated {} after docker rm -f", took(removed_at));
    let started = new
        .state
        .as_ref()
        .and_then(|s| s.started_at.clone())
        .expect("startedAt");
    let s = wait_object(
        &api,
        "phoenix",
        &op,
        "Ready on the new container",
        EVENT_TIMEOUT,
        |s| {
            is_ready(s)?;
            // status.startedAt is the new container's (seconds precision).
            match s.status.as_ref().and_then(|st| st.started_at.clone()) {
                Some(at) if started.starts_with(at.trim_end_matches('Z')) => Ok(()),
                other => Err(format!("startedAt {other:?}, container started {started}")),
            }
        },
    )
    .await;
    assert_eq!(
        new.name.as_deref(),
        Some(format!("/{phoenix_name}").as_str()),
        "same name"
    );
    assert_eq!(
        containers_on(&docker, &uid_of(&s)).await.len(),
        1,
        "exactly one container"
    );
    let events = wait_for(
        "a SandboxVanished Warning on phoenix",
        EVENT_TIMEOUT,
        || async {
            let ev = events_about(&ns, "phoenix").await;
            if ev
                .iter()
                .any(|(t, r, _)| t == "Warning" && r == "SandboxVanished")
            {
                Ok(ev)
            } else {
                Err(format!("{ev:?}"))
            }
        },
    )
    .await;
    assert!(events.iter().any(|(_, r, _)| r == "Created"), "{events:?}");

    // Never: reported gone, Stalled, and nothing is created.
    let mortal_name = external_of(&mortal);
    let removed_at = Instant::now();
    docker_cli(None, &["rm", "-f", &mortal_name]);
    let s = wait_object(
        &api,
        "mortal",
        &op,
        "Stalled SandboxGone",
        EVENT_TIMEOUT,
        |s| match (
            ready_of(s),
            cond(s, "Stalled").map(|c| (c.status.as_str(), c.reason.as_str())),
        ) {
            (Some((r, _)), Some(("True", "SandboxGone"))) if r == "False" => Ok(()),
            (r, st) => Err(format!("ready={r:?} stalled={st:?}")),
        },
    )
    .await;
    eprintln!(
        "Never: reported gone {} after docker rm -f",
        took(removed_at)
    );
    assert_eq!(ready_of(&s).map(|r| r.1).as_deref(), Some("SandboxGone"));
    assert!(
        containers_on(&docker, &uid_of(&s)).await.is_empty(),
        "restartPolicy Never creates nothing"
    );
    let events = events_about(&ns, "mortal").await;
    assert!(
        events
            .iter()
            .any(|(t, r, _)| t == "Warning" && (r == "SandboxVanished" || r == "SandboxGone")),
        "{events:?}"
    );
    // Still nothing after the operator has seen the object again (a spec-neutral touch: the
    // reconcile-request annotation).
    // The baseline is read BEFORE the touch: the reconcile it causes can finish before a
    // scrape taken afterwards.
    let reconciles = sandbox_reconciles(&op).unwrap_or(0.0);
    let out = kubectl(
        &[
            "annotate",
            "-n",
            &ns,
            "sandbox/mortal",
            "sandboxes.dev/reconcile-requested-at=1",
        ],
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_for(
        "the operator to reconcile the touched Sandbox",
        EVENT_TIMEOUT,
        || async {
            let now = sandbox_reconciles(&op).unwrap_or(0.0);
            if now > reconciles {
                Ok(())
            } else {
                Err(format!("reconciles {now}"))
            }
        },
    )
    .await;
    let s = api.get("mortal").await.expect("mortal");
    assert_eq!(
        cond(&s, "Stalled").map(|c| c.reason.as_str()),
        Some("SandboxGone")
    );
    assert!(
        containers_on(&docker, &uid_of(&s)).await.is_empty(),
        "restartPolicy Never creates nothing"
    );

    delete_and_wait_gone(&api, "phoenix").await;
    delete_and_wait_gone(&api, "mortal").await;
    eprintln!("vanish test took {}", took(t0));
}

// ---------------------------------------------------------------------------------------------
// 4. Secrets: envFrom and self-delivered env.

#[tokio::test(flavor = "multi_thread")]
async fn env_from_reaches_the_container_and_self_delivered_env_leaks_nowhere() {
    let t0 = Instant::now();
    let ns = namespace("e2e-secrets").await;
    let _purge = Purge(ns.clone());
    const VALUE: &str = "s3cr3t 'quoted'";
    let client = client().await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let secret = serde_json::json!({"DB_PASSWORD": VALUE});
    create_secret(&ns, "app-secrets", None, secret).await;
    let op = Operator::start(&ns, &ns, &OperatorOptions::default());
    let api: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    apply_yaml_ok(
        &sandbox_yaml(
            "plain",
            "  envFrom:\n    - secretRef: {name: app-secrets}\n",
        ),
        &ns,
    );
    // The main process records whether the env file was there when it started.
    apply_yaml_ok(
        &sandbox_yaml(
            "private",
            "  selfDeliveredEnv: {name: app-secrets}\n  command: [\"sh\", \"-c\", \"test -f /run/sandboxes.dev/env && touch /tmp/env-was-there; exec sleep infinity\"]\n",
        ),
        &ns,
    );
    let plain = wait_ready(&api, "plain", &op).await;
    let private = wait_ready(&api, "private", &op).await;
    let docker = engine().await;

    // envFrom: in the container's environment.
    let c = inspect_on(&docker, &external_of(&plain)).await;
    let env = c.config.and_then(|c| c.env).unwrap_or_default();
    assert!(env.contains(&format!("DB_PASSWORD={VALUE}")), "env {env:?}");

    // selfDeliveredEnv: in the file, exactly, mode 600, before the main process started.
    let name = external_of(&private);
    let printed = docker_cli(
        None,
        &[
            "exec",
            &name,
            "sh",
            "-c",
            "set -a; . /run/sandboxes.dev/env; printf %s \"$DB_PASSWORD\"",
        ],
    );
    assert_eq!(printed, VALUE);
    assert_eq!(
        docker_cli(
            None,
            &["exec", &name, "stat", "-c", "%a", "/run/sandboxes.dev/env"]
        )
        .trim(),
        "600"
    );
    docker_cli(None, &["exec", &name, "test", "-f", "/tmp/env-was-there"]);

    // ... and nowhere else: not in the container's configuration, the Sandbox, its Events or
    // the operator's log, in any of the forms it passed through.
    let b64 =
        serde_json::to_value(k8s_openapi::ByteString(VALUE.as_bytes().to_vec())).expect("base64");
    let b64 = b64.as_str().expect("a string").to_string();
    let needles = ["s3cr3t", b64.as_str(), &b64[..12]];
    let inspect = docker_cli(None, &["inspect", &name]);
    let object = serde_json::to_string(&api.get("private").await.expect("get")).expect("json");
    let events = format!("{:?}", events_about(&ns, "private").await);
    let log = std::fs::read_to_string(&op.log).expect("operator log");
    for (what, text) in [
        ("docker inspect", &inspect),
        ("the Sandbox", &object),
        ("its Events", &events),
        ("the operator log", &log),
    ] {
        for needle in needles {
            assert!(
                !text.contains(needle),
                "the self-delivered secret leaked into {what} ({needle:?})"
            );
        }
    }
    assert!(
        !inspect.contains("DB_PASSWORD"),
        "not even the key is in the container config"
    );
    let st = private.status.clone().expect("status");
    let version = secrets
        .get("app-secrets")
        .await
        .expect("secret")
        .metadata
        .resource_version;
    assert_eq!(
        st.self_delivered_env_hash, version,
        "status records only the Secret's resourceVersion"
    );
    // The plain sandbox's log lines do not carry it either (its value is in its config by design).
    assert!(
        !log.contains(VALUE),
        "the operator never logs Secret values"
    );

    delete_and_wait_gone(&api, "plain").await;
    delete_and_wait_gone(&api, "private").await;
    eprintln!("secrets test took {}", took(t0));
}

// ---------------------------------------------------------------------------------------------
// 5. Lifetime.

#[tokio::test(flavor = "multi_thread")]
async fn lifetime_deletes_or_stops_when_the_ttl_runs_out() {
    let t0 = Instant::now();
    let ns = namespace("e2e-lifetime").await;
    let _purge = Purge(ns.clone());
    let op = Operator::start(&ns, &ns, &OperatorOptions::default());
    let api: Api<Sandbox> = Api::namespaced(client().await, &ns);
    apply_yaml_ok(
        &sandbox_yaml("ephemeral", "  lifetime: {ttlSeconds: 5, action: Delete}\n"),
        &ns,
    );
    apply_yaml_ok(
        &sandbox_yaml("napper", "  lifetime: {ttlSeconds: 5}\n"),
        &ns,
    );
    let docker = engine().await;

    // Delete: the object goes away by itself, and its container with it. Its uid is read
    // right after the apply: on a loaded machine the five seconds can run out before a poll
    // sees the container recorded in status.
    let uid = uid_of(&api.get("ephemeral").await.expect("the applied Sandbox"));
    wait_gone(&api, "ephemeral", Duration::from_secs(5) + READY_TIMEOUT).await;
    eprintln!("Delete: gone {} after the test began", took(t0));
    assert!(
        containers_on(&docker, &uid).await.is_empty(),
        "the container went with it"
    );
    let events = events_about(&ns, "ephemeral").await;
    assert!(
        events.iter().any(|(_, r, _)| r == "LifetimeExpired"),
        "{events:?}"
    );

    // Stop (the default action): the object stays, Ready with reason Stopped, container stopped.
    let s = wait_object(
        &api,
        "napper",
        &op,
        "Ready=True Stopped",
        READY_TIMEOUT,
        |s| {
            is_ready(s)?;
            match ready_of(s) {
                Some((_, reason)) if reason == "Stopped" => Ok(()),
                other => Err(format!("ready={other:?}")),
            }
        },
    )
    .await;
    eprintln!("Stop: stopped {} after the test began", took(t0));
    let c = inspect_on(&docker, &external_of(&s)).await;
    let state = c.state.expect("state");
    assert_eq!(state.running, Some(false), "stopped");
    assert!(
        state.started_at.is_some_and(|t| !t.starts_with("0001")),
        "it ran before its lifetime ended"
    );
    assert_eq!(
        containers_on(&docker, &uid_of(&s)).await.len(),
        1,
        "stopped, not removed"
    );

    delete_and_wait_gone(&api, "napper").await;
    eprintln!("lifetime test took {}", took(t0));
}
