//! Idle suspend and resume on demand (`spec.idleAction` with `spec.idleTimeoutSeconds`),
//! through the real aggregation layer: a Sandbox that sees no traffic through the operator
//! for its timeout is parked (`status.lastIdle`, phase Sleeping), and a `kubectl sandbox
//! exec` to it wakes it and is answered within that one request — on Docker with its
//! processes preserved (PID 1's start time unchanged), on the Kubernetes provider restarted
//! (a Pod cannot be suspended: its sleep is a stop, which its `lastHibernation` says).

mod harness;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::process::Stdio;
use std::time::{Duration, Instant};

use harness::aggregated::{AccessWorld, On};
use harness::cluster::{apply_yaml_ok, client};
use harness::objects::wait_object;
use harness::plugin::{plugin, run};
use kube::{Api, ResourceExt};
use sandbox_operator::api::{IdleAction, Sandbox};
use sandbox_operator::idle::LAST_ACTIVITY;

/// How long without traffic before the test sandbox is parked.
const IDLE_SECS: u64 = 3;

#[tokio::test(flavor = "multi_thread")]
async fn docker_an_idle_sandbox_sleeps_and_an_exec_wakes_it_with_its_processes() {
    let (w, api, before) = parked(On::Docker, "idle-docker").await;
    let after = pid1_start(&w.ns);
    assert_eq!(after, before, "PID 1 restarted across the idle suspend");
    let s = running_again(&w, &api).await;
    let h = s.status.unwrap().last_hibernation.expect("lastHibernation");
    assert!(h.processes_preserved, "{h:?}");
    an_open_session_keeps_it_awake(&w, &api).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn kubernetes_an_idle_sandbox_stops_and_an_exec_wakes_it() {
    let (w, api, _) = parked(On::Kubernetes, "idle-k8s").await;
    let (code, out, err) = run(&w.ns, &["exec", "box", "--", "echo", "awake"], b"");
    assert_eq!((code, out.trim()), (0, "awake"), "{err}");
    let s = running_again(&w, &api).await;
    let h = s.status.unwrap().last_hibernation.expect("lastHibernation");
    assert!(!h.processes_preserved, "a Pod stop keeps no process: {h:?}");
}

/// A world with the Sandbox `box` (idle after [`IDLE_SECS`]) Ready, then parked by
/// idleness; PID 1's start time from before.
async fn parked(on: On, prefix: &str) -> (AccessWorld, Api<Sandbox>, String) {
    harness::tenant::ensure_crd();
    let w = AccessWorld::start(on, prefix).await;
    let yaml = format!(
        "{}  idleAction: suspend\n  idleTimeoutSeconds: {IDLE_SECS}\n",
        harness::aggregated::sandbox_yaml_on("box", on)
    );
    apply_yaml_ok(&yaml, &w.ns);
    w.wait_ready("box").await;
    let before = pid1_start(&w.ns);
    let api: Api<Sandbox> = Api::namespaced(client().await, &w.ns);
    let parked = wait_object(
        &api,
        "box",
        &w.api.operator,
        "parked for idleness",
        timeout(on),
        |s: &Sandbox| {
            let st = s.status.as_ref().ok_or("no status")?;
            let idle = st.last_idle.as_ref().ok_or("no status.lastIdle")?;
            match st.phase.as_deref() {
                Some("Sleeping") => Ok(()),
                other => Err(format!("phase {other:?}, lastIdle {idle:?}")),
            }
        },
    )
    .await;
    let idle = parked.status.unwrap().last_idle.unwrap();
    assert_eq!(idle.action, IdleAction::Suspend);
    assert!(
        idle.reason.contains(&format!("for {IDLE_SECS}s")),
        "{}",
        idle.reason
    );
    (w, api, before)
}

/// `kubectl sandbox exec` of PID 1's start time (field 22 of /proc/1/stat), answered.
fn pid1_start(ns: &str) -> String {
    let (code, out, err) = run(
        ns,
        &[
            "exec",
            "box",
            "--",
            "cut",
            "-d",
            " ",
            "-f22",
            "/proc/1/stat",
        ],
        b"",
    );
    assert_eq!(code, 0, "exec: {err}");
    assert!(!out.trim().is_empty(), "no start time: {err}");
    out.trim().to_string()
}

/// An exec session open for twice the timeout keeps the sandbox running: while it lasts,
/// traffic is recorded every quarter of the timeout (at least 4 records in that time).
async fn an_open_session_keeps_it_awake(w: &AccessWorld, api: &Api<Sandbox>) {
    let mut session = plugin(&w.ns, &["exec", "-i", "box", "--", "cat"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("kubectl sandbox exec");
    let mut stdin = session.stdin.take().expect("stdin");
    let mut stdout = BufReader::new(session.stdout.take().expect("stdout"));
    stdin.write_all(b"open\n").expect("write");
    let mut line = String::new();
    stdout.read_line(&mut line).expect("read");
    assert_eq!(line, "open\n", "the session answers");
    let open_for = Duration::from_secs(IDLE_SECS * 2);
    let started = Instant::now();
    let mut records = BTreeSet::new();
    let mut poll = tokio::time::interval(Duration::from_millis(200));
    while started.elapsed() < open_for {
        poll.tick().await;
        let s = api.get("box").await.expect("get box");
        let phase = s.status.as_ref().and_then(|st| st.phase.clone());
        assert_eq!(
            phase.as_deref(),
            Some("Running"),
            "parked while a session was open"
        );
        if let Some(at) = s.annotations().get(LAST_ACTIVITY) {
            records.insert(at.clone());
        }
    }
    drop(stdin);
    let status = session.wait().expect("exec ends");
    assert!(status.success(), "exec: {status}");
    assert!(
        records.len() >= 4,
        "{} traffic records in {open_for:?} of an open session: {records:?}",
        records.len()
    );
}

/// The Sandbox runs again, with the traffic record that woke it.
async fn running_again(w: &AccessWorld, api: &Api<Sandbox>) -> Sandbox {
    let s = wait_object(
        api,
        "box",
        &w.api.operator,
        "running again",
        Duration::from_secs(30),
        |s: &Sandbox| match s.status.as_ref().and_then(|st| st.phase.as_deref()) {
            Some("Running") => Ok(()),
            other => Err(format!("phase {other:?}")),
        },
    )
    .await;
    let annotations = s.metadata.annotations.clone().unwrap_or_default();
    assert!(annotations.contains_key(LAST_ACTIVITY), "{annotations:?}");
    s
}

fn timeout(on: On) -> Duration {
    on.ready_timeout() + Duration::from_secs(IDLE_SECS * 4)
}
