//! Leader election against a real kube-apiserver (the harness starts it with
//! `tests/cluster/up.sh`, which reuses a running one).
//!
//! Timings are short (lease 3 s, renew 1 s) so failover is observable quickly; every wait is a
//! deadline on an observed event (the electors' watch channels, the Lease object), never a
//! sleep used for synchronisation. Each test uses its own randomly suffixed Lease.

mod harness;

use std::future::Future;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use sandbox_operator::leader::{LeaderConfig, LeaderElector};
use sandbox_operator::metrics::Metrics;
use sandbox_operator::server::probe_api;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use harness::cluster::client;
use harness::unique;

const NAMESPACE: &str = "default";

fn unique_lease(test: &str) -> String {
    unique(&format!("leader-test-{test}"))
}

/// Short timings: lease `lease_secs`, renew deadline 2 s, renew 1 s, retry 250 ms.
fn config(lease: &str, identity: &str, lease_secs: u64) -> LeaderConfig {
    LeaderConfig {
        namespace: NAMESPACE.into(),
        lease_name: lease.into(),
        identity: identity.into(),
        lease_duration: Duration::from_secs(lease_secs),
        renew_deadline: Duration::from_secs(2),
        renew_interval: Duration::from_secs(1),
        retry_interval: Duration::from_millis(250),
    }
}

/// A running elector: its leadership channel, a graceful-shutdown trigger and its task.
struct Running {
    identity: String,
    leading: watch::Receiver<bool>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl Running {
    fn is_leader(&self) -> bool {
        *self.leading.borrow()
    }

    /// Graceful shutdown: resolve the shutdown future and wait for `run` to return
    /// (which releases the Lease).
    async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(Duration::from_secs(10), &mut self.task)
            .await
            .expect("run() did not return after shutdown")
            .unwrap();
    }

    /// A crash: abort the task, so nothing is released.
    async fn crash(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

async fn start(client: &Client, config: LeaderConfig, metrics: Option<Metrics>) -> Running {
    let identity = config.identity.clone();
    let mut elector = LeaderElector::new(client.clone(), config).unwrap();
    if let Some(m) = metrics {
        elector = elector.with_metrics(m);
    }
    let leading = elector.subscribe();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(elector.run(async {
        let _ = stopped.await;
    }));
    Running {
        identity,
        leading,
        stop: Some(stop),
        task,
    }
}

/// Wait (with a deadline) until `rx` reads `want`.
async fn wait_leading(rx: &mut watch::Receiver<bool>, want: bool, within: Duration, what: &str) {
    tokio::time::timeout(within, rx.wait_for(|l| *l == want))
        .await
        .unwrap_or_else(|_| panic!("{what}: not leading={want} within {within:?}"))
        .unwrap_or_else(|_| panic!("{what}: elector stopped"));
}

/// Poll the Lease (a real read each time) until `check` holds, with a deadline.
async fn wait_lease<F: Fn(&Lease) -> bool>(
    api: &Api<Lease>,
    name: &str,
    within: Duration,
    what: &str,
    check: F,
) -> Lease {
    let deadline = Instant::now() + within;
    loop {
        if let Some(lease) = api.get_opt(name).await.unwrap()
            && check(&lease)
        {
            return lease;
        }
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn holder(lease: &Lease) -> Option<String> {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.clone())
        .filter(|h| !h.is_empty())
}

fn renew_time(lease: &Lease) -> Timestamp {
    lease.spec.as_ref().unwrap().renew_time.as_ref().unwrap().0
}

fn acquire_time(lease: &Lease) -> Timestamp {
    lease
        .spec
        .as_ref()
        .unwrap()
        .acquire_time
        .as_ref()
        .unwrap()
        .0
}

async fn cleanup(api: &Api<Lease>, name: &str) {
    let _ = api.delete(name, &DeleteParams::default()).await;
}

/// Watch both electors for `window`, failing if they ever both lead at once.
async fn never_both_lead(a: &mut Running, b: &mut Running, window: Duration) {
    let end = tokio::time::sleep(window);
    tokio::pin!(end);
    loop {
        assert!(
            !(a.is_leader() && b.is_leader()),
            "{} and {} lead at the same time",
            a.identity,
            b.identity
        );
        tokio::select! {
            () = &mut end => return,
            r = a.leading.changed() => r.unwrap(),
            r = b.leading.changed() => r.unwrap(),
        }
    }
}

fn within<T>(
    d: Duration,
    f: impl Future<Output = T>,
) -> tokio::time::Timeout<impl Future<Output = T>> {
    tokio::time::timeout(d, f)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_electors_exactly_one_leader() {
    let client = client().await;
    let name = unique_lease("one");
    let api: Api<Lease> = Api::namespaced(client.clone(), NAMESPACE);
    let metrics_a = Metrics::new();
    let metrics_b = Metrics::new();

    // Both start together and race for the (absent) Lease.
    let mut a = start(
        &client,
        config(&name, "elector-a", 3),
        Some(metrics_a.clone()),
    )
    .await;
    let mut b = start(
        &client,
        config(&name, "elector-b", 3),
        Some(metrics_b.clone()),
    )
    .await;

    within(Duration::from_secs(15), async {
        loop {
            if a.is_leader() || b.is_leader() {
                return;
            }
            tokio::select! {
                r = a.leading.changed() => r.unwrap(),
                r = b.leading.changed() => r.unwrap(),
            }
        }
    })
    .await
    .expect("nobody became leader within 15 s");

    // Over more than a lease duration (several renewals), never two leaders, and the leader
    // stays the leader.
    let first = if a.is_leader() {
        a.identity.clone()
    } else {
        b.identity.clone()
    };
    never_both_lead(&mut a, &mut b, Duration::from_secs(5)).await;
    assert_eq!(
        [a.is_leader(), b.is_leader()]
            .iter()
            .filter(|l| **l)
            .count(),
        1,
        "exactly one leader"
    );
    let current = if a.is_leader() {
        &a.identity
    } else {
        &b.identity
    };
    assert_eq!(
        current, &first,
        "leadership moved while the leader was healthy"
    );

    // The Lease on the server names the leader, and has been renewed recently.
    let lease = api.get(&name).await.unwrap();
    assert_eq!(holder(&lease).as_deref(), Some(first.as_str()));
    assert_eq!(lease.spec.as_ref().unwrap().lease_duration_seconds, Some(3));
    let age = Timestamp::now().duration_since(renew_time(&lease));
    assert!(
        age.as_secs_f64() < 3.0,
        "lease not renewed recently: {age:?}"
    );

    // The leader gauge follows.
    let (leader_metrics, follower_metrics) = if a.is_leader() {
        (&metrics_a, &metrics_b)
    } else {
        (&metrics_b, &metrics_a)
    };
    assert!(
        leader_metrics
            .render()
            .contains("sandbox_operator_leader 1")
    );
    assert!(
        follower_metrics
            .render()
            .contains("sandbox_operator_leader 0")
    );

    a.shutdown().await;
    b.shutdown().await;
    cleanup(&api, &name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashed_leader_is_replaced_after_lease_expiry() {
    let client = client().await;
    let name = unique_lease("crash");
    let api: Api<Lease> = Api::namespaced(client.clone(), NAMESPACE);

    let mut a = start(&client, config(&name, "elector-a", 3), None).await;
    wait_leading(&mut a.leading, true, Duration::from_secs(15), "a").await;
    let mut b = start(&client, config(&name, "elector-b", 3), None).await;
    // b sees a valid Lease held by a and follows (it has observed it at least once when its
    // first read returns; give it a couple of renewals to prove it stays a follower).
    never_both_lead(&mut a, &mut b, Duration::from_secs(2)).await;
    assert!(a.is_leader() && !b.is_leader());

    // Crash a: no release.
    a.crash().await;
    let crashed_at = Instant::now();
    let last = api.get(&name).await.unwrap();
    assert_eq!(
        holder(&last).as_deref(),
        Some("elector-a"),
        "a crash must not release"
    );
    let a_last_renew = renew_time(&last);

    // b takes over within lease duration + margin.
    wait_leading(
        &mut b.leading,
        true,
        Duration::from_secs(3 + 7),
        "b after crash",
    )
    .await;
    let took = crashed_at.elapsed();
    let lease = api.get(&name).await.unwrap();
    assert_eq!(holder(&lease).as_deref(), Some("elector-b"));
    assert_eq!(lease.spec.as_ref().unwrap().lease_transitions, Some(1));
    // ... and not before a's Lease had expired.
    let waited = acquire_time(&lease).duration_since(a_last_renew);
    assert!(
        waited.as_secs_f64() >= 3.0,
        "b acquired {waited:?} after a's last renewal, before the 3 s lease expired"
    );
    eprintln!("failover after crash: {took:?} (lease 3 s)");

    b.shutdown().await;
    cleanup(&api, &name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_releases_for_fast_takeover() {
    let client = client().await;
    let name = unique_lease("release");
    let api: Api<Lease> = Api::namespaced(client.clone(), NAMESPACE);
    // A long lease: if b takes over well before it would have expired, only the release can
    // explain it.
    let lease_secs = 30;

    let mut a = start(&client, config(&name, "elector-a", lease_secs), None).await;
    wait_leading(&mut a.leading, true, Duration::from_secs(15), "a").await;
    let mut b = start(&client, config(&name, "elector-b", lease_secs), None).await;
    never_both_lead(&mut a, &mut b, Duration::from_secs(2)).await;
    assert!(a.is_leader() && !b.is_leader());

    let mut a_rx = a.leading.clone();
    let before = api.get(&name).await.unwrap();
    let a_last_renew_bound = renew_time(&before);
    a.shutdown().await;
    // a published `false` before returning, then the channel closed.
    assert!(!*a_rx.borrow_and_update());

    wait_leading(
        &mut b.leading,
        true,
        Duration::from_secs(10),
        "b after release",
    )
    .await;
    let lease = api.get(&name).await.unwrap();
    assert_eq!(holder(&lease).as_deref(), Some("elector-b"));
    let after_renew = acquire_time(&lease).duration_since(a_last_renew_bound);
    assert!(
        after_renew.as_secs_f64() < lease_secs as f64 - 5.0,
        "b acquired {after_renew:?} after a's renewal: that is expiry, not release"
    );
    // A released Lease is a vacancy, not a transition from a to b.
    assert_eq!(lease.spec.as_ref().unwrap().lease_transitions, Some(0));

    b.shutdown().await;
    // b released too.
    let lease = api.get(&name).await.unwrap();
    assert_eq!(holder(&lease), None);
    cleanup(&api, &name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_steps_down_when_lease_is_taken() {
    let client = client().await;
    let name = unique_lease("stolen");
    let api: Api<Lease> = Api::namespaced(client.clone(), NAMESPACE);

    let mut a = start(&client, config(&name, "elector-a", 3), None).await;
    wait_leading(&mut a.leading, true, Duration::from_secs(15), "a").await;

    // Someone else writes itself into the Lease (resourceVersion-guarded, like an elector),
    // with a long duration so it stays valid.
    let mut lease = api.get(&name).await.unwrap();
    let spec = lease.spec.as_mut().unwrap();
    spec.holder_identity = Some("intruder".into());
    spec.lease_duration_seconds = Some(60);
    spec.renew_time = Some(MicroTime(Timestamp::now()));
    loop {
        match api.replace(&name, &PostParams::default(), &lease).await {
            Ok(_) => break,
            Err(kube::Error::Api(s)) if s.code == 409 => {
                // a renewed in between: take the fresh version.
                let fresh = api.get(&name).await.unwrap();
                lease.metadata.resource_version = fresh.metadata.resource_version;
            }
            Err(e) => panic!("{e}"),
        }
    }

    // a notices at its next renewal (409 or the foreign holder) and steps down.
    wait_leading(
        &mut a.leading,
        false,
        Duration::from_secs(5),
        "a after theft",
    )
    .await;
    // It does not take the valid Lease back.
    let lease = wait_lease(&api, &name, Duration::from_secs(1), "intruder", |l| {
        holder(l).as_deref() == Some("intruder")
    })
    .await;
    assert_eq!(holder(&lease).as_deref(), Some("intruder"));

    a.shutdown().await;
    // Not the holder: shutdown must not release someone else's Lease.
    let lease = api.get(&name).await.unwrap();
    assert_eq!(holder(&lease).as_deref(), Some("intruder"));
    cleanup(&api, &name).await;
}

#[tokio::test]
async fn readiness_probe_of_served_and_missing_apis() {
    let client = client().await;
    probe_api(&client, "coordination.k8s.io/v1", &["Lease"])
        .await
        .unwrap();
    let err = probe_api(&client, "coordination.k8s.io/v1", &["Lease", "Nope"])
        .await
        .unwrap_err();
    assert!(err.contains("Nope") && err.contains("CRDs"), "{err}");
    let err = probe_api(&client, "nonexistent.sandboxes.dev/v1", &["Sandbox"])
        .await
        .unwrap_err();
    assert!(err.contains("not served"), "{err}");
}
