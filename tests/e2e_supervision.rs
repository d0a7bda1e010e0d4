//! End to end, supervision: a leader whose controller dies, or whose API server stalls past
//! the renew deadline, stops within a bound and exits non-zero, and the standby replica takes
//! over and reconciles. Real API server, real Docker, the operator as its built binary (two
//! replicas of one instance in a namespace of their own).
//!
//! The API-server freeze (SIGSTOP/SIGCONT of the shared test kube-apiserver) disturbs every
//! other client of that server while it lasts, so it is kept as short as proves the point:
//! it ends as soon as the leader has been seen stepping down (renew deadline 4 s of a 6 s
//! lease). A guard resumes the server when dropped, even on a panic, and a detached watchdog
//! resumes it if this process dies first. The tests of this binary run one at a time.

mod harness;

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use harness::cluster::*;
use harness::docker::*;
use harness::metrics::{leader_gauge, sample};
use harness::objects::{READY_TIMEOUT, delete_and_wait_gone, wait_ready};
use harness::operator::*;
use harness::{cache, wait_for};
use kube::Api;
use sandbox_operator::api::Sandbox;

/// A short lease, so a freeze longer than its renew deadline (2/3 of it) stays short.
const LEASE_SECS: u64 = 6;
/// "A few seconds" on a busy two-core machine shared with other test runs.
const MARGIN: Duration = Duration::from_secs(6);

/// The tests of this binary run one at a time: a freeze would disturb the other one.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn lease() -> Duration {
    Duration::from_secs(LEASE_SECS)
}

fn opts(env: &[(&str, &str)]) -> OperatorOptions {
    OperatorOptions {
        lease_secs: Some(LEASE_SECS),
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    }
}

/// Waits until `op` reports `sandbox_operator_leader` = `want`.
async fn wait_gauge(op: &Operator, want: f64, timeout: Duration, what: &str) {
    let desc = format!("{what} (log: {})", op.log.display());
    wait_for(&desc, timeout, || async {
        match leader_gauge(op) {
            Some(g) if g == want => Ok(()),
            other => Err(format!("leader gauge {other:?}")),
        }
    })
    .await;
}

fn sandbox_yaml(name: &str) -> String {
    format!(
        "apiVersion: sandboxes.dev/v1alpha1\nkind: Sandbox\nmetadata:\n  name: {name}\nspec:\n  image: {}\n",
        base_image()
    )
}

fn log_of(op: &Operator) -> String {
    std::fs::read_to_string(&op.log).unwrap_or_default()
}

fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

/// Starts replica `a` (with `a_env`) and waits until it leads, then a standby `b` and waits
/// until it follows. Starting them one after the other makes `a` the leader.
async fn leader_and_standby(ns: &str, a_env: &[(&str, &str)]) -> (Operator, Operator) {
    let a = Operator::start(ns, ns, &opts(a_env));
    wait_gauge(&a, 1.0, READY_TIMEOUT, "the first replica to lead").await;
    let b = Operator::start(ns, ns, &opts(&[]));
    wait_gauge(&b, 0.0, READY_TIMEOUT, "the second replica to follow").await;
    (a, b)
}

// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn a_panicking_controller_makes_the_leader_exit_and_the_standby_reconcile() {
    let _serial = SERIAL.lock().await;
    let ns = namespace("e2e-supervise").await;
    let _purge = Purge(ns.clone());
    // The first Sandbox reconcile of replica `a` panics inside the Sandbox controller.
    let (mut a, b) = leader_and_standby(
        &ns,
        &[("SANDBOX_OPERATOR_FAILPOINT", "sandbox-reconcile=panic")],
    )
    .await;
    let api: Api<Sandbox> = Api::namespaced(client().await, &ns);

    let applied = Instant::now();
    apply_yaml_ok(&sandbox_yaml("orphan"), &ns);
    let status = a.wait_exit(Duration::from_secs(30)).await;
    let exited = applied.elapsed();
    let log = log_of(&a);
    assert_eq!(
        status.code(),
        Some(1),
        "the leader exits non-zero through its own stop path (not a crash); log:\n{log}"
    );
    assert!(
        log.contains("unhealthy") && log.contains("the Sandbox controller panicked"),
        "/healthz was failed with the reason; log:\n{log}"
    );
    assert!(
        log.contains("released the leader Lease"),
        "the Lease was released on the way out; log:\n{log}"
    );

    // The standby leads within the lease duration plus a few seconds of the exit, and
    // reconciles the Sandbox the dead controller never got to.
    let exit_at = Instant::now();
    wait_gauge(&b, 1.0, lease() + MARGIN, "the standby to take over").await;
    let took_over = exit_at.elapsed();
    wait_ready(&api, "orphan", &b).await;
    assert!(
        sample(&b, "sandbox_operator_reconciles_total{kind=\"Sandbox\"}").unwrap_or(0.0) >= 1.0,
        "the new leader reconciled"
    );
    eprintln!(
        "controller panic: leader exited {} after the apply; standby leading {} after the exit; \
         Ready {} after the apply (lease {LEASE_SECS} s)",
        secs(exited),
        secs(took_over),
        secs(applied.elapsed())
    );
    delete_and_wait_gone(&api, "orphan").await;
}

/// The test kube-apiserver, stopped with SIGSTOP until this guard is dropped.
struct ApiFreeze {
    pid: u32,
    watchdog: Option<Child>,
}

impl ApiFreeze {
    /// Stops the API server. A detached watchdog resumes it after `at_most` in case this
    /// process dies before the guard is dropped.
    fn start(at_most: Duration) -> ApiFreeze {
        let pidfile = cache().join("cluster/kube-apiserver.pid");
        let pid: u32 = std::fs::read_to_string(&pidfile)
            .unwrap_or_else(|e| panic!("read {}: {e}", pidfile.display()))
            .trim()
            .parse()
            .expect("pid");
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        assert_eq!(
            comm.trim(),
            "kube-apiserver",
            "pid {pid} is not the API server"
        );
        let script = format!(
            "sleep {}; [ \"$(cat /proc/{pid}/comm 2>/dev/null)\" = kube-apiserver ] && kill -CONT {pid}",
            at_most.as_secs().max(1)
        );
        let watchdog = Command::new("setsid")
            .args(["sh", "-c", &script])
            .spawn()
            .expect("start the resume watchdog");
        signal("STOP", pid);
        ApiFreeze {
            pid,
            watchdog: Some(watchdog),
        }
    }
}

impl Drop for ApiFreeze {
    fn drop(&mut self) {
        signal("CONT", self.pid);
        if let Some(mut w) = self.watchdog.take() {
            let _ = w.kill();
            let _ = w.wait();
        }
    }
}

fn signal(name: &str, pid: u32) {
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{name} {pid} failed");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_api_server_stall_ends_leadership_in_bounded_time_and_the_standby_resumes() {
    let _serial = SERIAL.lock().await;
    let ns = namespace("e2e-stall").await;
    let _purge = Purge(ns.clone());
    let (mut a, b) = leader_and_standby(&ns, &[]).await;
    let api: Api<Sandbox> = Api::namespaced(client().await, &ns);
    apply_yaml_ok(&sandbox_yaml("before"), &ns);
    wait_ready(&api, "before", &a).await;

    // Freeze the API server until the leader has stepped down: past its renew deadline
    // (4 s), it must fail /healthz and stop leading, with nothing to talk to.
    let renew_deadline = lease() * 2 / 3;
    let freeze = ApiFreeze::start(Duration::from_secs(30));
    let frozen_at = Instant::now();
    let body = wait_for(
        "the leader to fail /healthz",
        renew_deadline + MARGIN,
        || async {
            match a.http_get("/healthz") {
                Some(r) if r.split(' ').nth(1) == Some("503") => Ok(r),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    let stepped_down = frozen_at.elapsed();
    assert!(body.contains("lost leadership"), "{body}");
    assert_eq!(
        leader_gauge(&a),
        Some(0.0),
        "the gauge says it no longer leads"
    );
    assert_eq!(
        leader_gauge(&b),
        Some(0.0),
        "the standby cannot lead while frozen"
    );
    drop(freeze);
    let resumed_at = Instant::now();
    let frozen_for = frozen_at.elapsed();

    // The old leader exits non-zero (a kubelet would restart it); the standby leads within
    // the lease duration plus a few seconds, and reconciles what is applied now.
    let status = a.wait_exit(lease() + MARGIN).await;
    let exited = resumed_at.elapsed();
    assert_eq!(status.code(), Some(1), "log:\n{}", a.log_tail());
    wait_gauge(&b, 1.0, lease() + MARGIN, "the standby to take over").await;
    let took_over = resumed_at.elapsed();
    apply_yaml_ok(&sandbox_yaml("after"), &ns);
    wait_ready(&api, "after", &b).await;
    let after_ready = resumed_at.elapsed();

    // Restarted as a kubelet would, the old leader rejoins as a standby.
    let a2 = Operator::start(&ns, &ns, &opts(&[]));
    wait_gauge(&a2, 0.0, READY_TIMEOUT, "the restarted replica to follow").await;
    assert_eq!(leader_gauge(&b), Some(1.0), "the new leader keeps leading");
    eprintln!(
        "API stall: frozen {}; leader failed /healthz {} into the freeze; after resume: old \
         leader exited in {}, standby leading in {}, new Sandbox Ready in {} (lease {LEASE_SECS} s)",
        secs(frozen_for),
        secs(stepped_down),
        secs(exited),
        secs(took_over),
        secs(after_ready)
    );
    delete_and_wait_gone(&api, "before").await;
    delete_and_wait_gone(&api, "after").await;
}
