//! Leader election on a `coordination.k8s.io/v1` Lease.
//!
//! Only the leader reconciles and sweeps; other replicas are hot standbys that take over when
//! the leader stops renewing. The algorithm is client-go's:
//!
//! - A replica may take the Lease when it is absent, vacant (no holder), expired
//!   (`renewTime + leaseDurationSeconds < now`) or already names this replica.
//! - The leader renews every `renew_interval`. Every write is a `replace` carrying the
//!   `resourceVersion` that was read, so two replicas racing for the same Lease cannot both
//!   win: the loser gets 409 Conflict, re-reads, and sees the winner.
//! - A leader that has not renewed successfully for `renew_deadline` steps down *before* its
//!   Lease can expire for the others (`renew_deadline < lease_duration`), so two replicas never
//!   both believe they lead. (Stepping down only once the lease duration had passed would
//!   overlap with the next leader.)
//! - On graceful shutdown the leader releases the Lease (empties `holderIdentity`), so a
//!   standby takes over within one retry interval instead of waiting out the lease duration.
//!
//! The decision is the pure function [`decide`] (table-tested below); [`LeaderElector::run`]
//! only observes, calls it and acts.
//!
//! Why not a crate: `kube-lease-manager` 0.13 builds against kube 5 / k8s-openapi 0.29, but
//! it gives weaker guarantees than the ones above. Its leadership flag changes only on a
//! successful read, so while the API server does not answer a leader keeps reporting `true`
//! past the Lease's expiry (no renew deadline, and no timeout of its own on any call);
//! renewals are unguarded patches rather than resourceVersion-guarded replaces; a follower
//! takes an expired Lease in two writes (force-release, then apply), counting a transition
//! even when the Lease was released rather than taken; its release on shutdown has no
//! bound; and its timings are whole seconds (renewal `grace` ≥ 1 s). `kube-leader-election`
//! requires kube 4. So it is written here: about 470 lines of code (with their doc comments,
//! some 620 lines) and a table-test module of about 300 more.

use std::future::Future;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::PostParams;
use tokio::sync::watch;

use crate::metrics::Metrics;

/// Environment variable with the pod's namespace (downward API); the Lease lives there.
pub const ENV_POD_NAMESPACE: &str = "POD_NAMESPACE";
/// Environment variable with the pod's name (downward API); the base of the identity.
pub const ENV_POD_NAME: &str = "POD_NAME";

/// Invalid leader-election settings.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    /// Timings or names that cannot work together.
    #[error("invalid leader election settings: {0}")]
    Config(String),
}

/// Leader-election settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderConfig {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease (`sandbox-operator-<instance>`).
    pub lease_name: String,
    /// This replica's identity, written to `holderIdentity`; unique per process.
    pub identity: String,
    /// How long a Lease stays valid after its last renewal (`leaseDurationSeconds`; whole
    /// seconds, at least 1).
    pub lease_duration: Duration,
    /// The leader steps down when it has not renewed for this long. Must be below
    /// `lease_duration`; the difference is the safety margin against clock skew and slow
    /// requests.
    pub renew_deadline: Duration,
    /// Time between renewals while leading.
    pub renew_interval: Duration,
    /// Time between attempts while following, or after a failed renewal.
    pub retry_interval: Duration,
}

impl LeaderConfig {
    /// Settings for operator instance `instance` with a lease of `lease_secs` (at least 3;
    /// the operator's default is 15) and timings that scale with it: renew deadline 2/3 of
    /// the lease, renewal every 1/3, followers retry every 1/7 (at least 0.5 s). The namespace
    /// comes from [`ENV_POD_NAMESPACE`] (else `default`), the identity is a fresh
    /// [`default_identity`].
    pub fn for_instance(instance: &str, lease_secs: u64) -> Self {
        let lease = lease_secs.max(3);
        LeaderConfig {
            namespace: std::env::var(ENV_POD_NAMESPACE)
                .ok()
                .filter(|ns| !ns.is_empty())
                .unwrap_or_else(|| "default".into()),
            lease_name: lease_name(instance),
            identity: default_identity(),
            lease_duration: Duration::from_secs(lease),
            renew_deadline: Duration::from_millis(lease * 2000 / 3),
            renew_interval: Duration::from_millis(lease * 1000 / 3),
            retry_interval: Duration::from_millis((lease * 1000 / 7).max(500)),
        }
    }

    /// Check that the timings make sense together.
    pub fn validate(&self) -> Result<(), LeaderError> {
        let fail = |m: String| Err(LeaderError::Config(m));
        if self.lease_name.is_empty() || self.namespace.is_empty() || self.identity.is_empty() {
            return fail("lease name, namespace and identity must not be empty".into());
        }
        if self.lease_duration < Duration::from_secs(1) || self.lease_duration.subsec_nanos() != 0 {
            return fail(format!(
                "lease duration {:?} must be a whole number of seconds, at least 1 (the Lease \
                 stores seconds)",
                self.lease_duration
            ));
        }
        if self.renew_deadline >= self.lease_duration {
            return fail(format!(
                "renew deadline {:?} must be shorter than the lease duration {:?}, or two \
                 replicas could lead at once",
                self.renew_deadline, self.lease_duration
            ));
        }
        if self.renew_interval.is_zero() || self.renew_interval >= self.renew_deadline {
            return fail(format!(
                "renew interval {:?} must be above zero and shorter than the renew deadline {:?}",
                self.renew_interval, self.renew_deadline
            ));
        }
        if self.retry_interval.is_zero() {
            return fail("retry interval must be above zero".into());
        }
        Ok(())
    }
}

/// The Lease name for an operator instance.
pub fn lease_name(instance: &str) -> String {
    format!("sandbox-operator-{instance}")
}

/// `<POD_NAME or hostname>_<8 random hex digits>`. The suffix keeps a restarted container
/// (same pod name) from mistaking the dead process's Lease for its own.
pub fn default_identity() -> String {
    let base = std::env::var(ENV_POD_NAME)
        .ok()
        .filter(|n| !n.is_empty())
        .or_else(|| {
            hostname::get()
                .ok()
                .map(|h| h.to_string_lossy().into_owned())
        })
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "sandbox-operator".into());
    format!("{base}_{:08x}", fastrand::u32(..))
}

/// The parts of a Lease the decision needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseView {
    /// `spec.holderIdentity`; `None` or empty = vacant.
    pub holder: Option<String>,
    /// `spec.renewTime`; `None` = never renewed (treated as expired).
    pub renew_time: Option<Timestamp>,
    /// `spec.leaseDurationSeconds`; `None` = use our own setting.
    pub lease_duration: Option<Duration>,
}

impl From<&Lease> for LeaseView {
    fn from(lease: &Lease) -> Self {
        let spec = lease.spec.as_ref();
        LeaseView {
            holder: spec.and_then(|s| s.holder_identity.clone()),
            renew_time: spec.and_then(|s| s.renew_time.as_ref()).map(|t| t.0),
            lease_duration: spec
                .and_then(|s| s.lease_duration_seconds)
                .map(|s| Duration::from_secs(u64::try_from(s).unwrap_or(0))),
        }
    }
}

impl LeaseView {
    /// The holder, if there is a non-empty one.
    pub fn holder(&self) -> Option<&str> {
        self.holder.as_deref().filter(|h| !h.is_empty())
    }

    /// Whether the Lease has run out at `now` (`renewTime + duration < now`).
    pub fn expired(&self, now: Timestamp, default_duration: Duration) -> bool {
        let Some(renewed) = self.renew_time else {
            return true;
        };
        let duration = self.lease_duration.unwrap_or(default_duration);
        let elapsed_us = i128::from(now.as_microsecond()) - i128::from(renewed.as_microsecond());
        elapsed_us > i128::try_from(duration.as_micros()).unwrap_or(i128::MAX)
    }
}

/// What could be seen of the Lease this round.
#[derive(Debug, Clone, Copy)]
pub enum Observed<'a> {
    /// The Lease does not exist.
    Absent,
    /// Reading it failed (timeout, API error): nothing is known.
    Unreadable,
    /// The Lease as read.
    Present(&'a LeaseView),
}

/// This replica's own view of itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalState {
    /// Whether we currently consider ourselves the leader.
    pub leading: bool,
    /// Time since our last successful acquire/renew (`None` = never).
    pub since_last_renew: Option<Duration>,
}

/// Why a leader stops leading.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepDownReason {
    /// Another replica holds a valid Lease.
    Lost {
        /// The new holder.
        holder: String,
    },
    /// No successful renewal within the renew deadline.
    RenewDeadlineExceeded,
}

/// The next action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Take the Lease: create it when absent, else write ourselves as holder.
    Acquire,
    /// We hold it: refresh `renewTime`.
    Renew,
    /// Someone else holds a valid Lease (or we cannot see it while following): stay a
    /// follower and look again after the retry interval.
    Wait {
        /// Current holder, when known.
        holder: Option<String>,
    },
    /// We lead but could not read the Lease; keep leading (the deadline has not passed) and
    /// retry soon.
    Hold,
    /// Stop leading now.
    StepDown(StepDownReason),
}

/// Decide the next action from what was observed, our own state, our identity and the time.
/// Pure: no I/O, no clock.
pub fn decide(
    observed: Observed<'_>,
    local: LocalState,
    me: &str,
    now: Timestamp,
    lease_duration: Duration,
    renew_deadline: Duration,
) -> Decision {
    if local.leading
        && local
            .since_last_renew
            .is_none_or(|since| since > renew_deadline)
    {
        return Decision::StepDown(StepDownReason::RenewDeadlineExceeded);
    }
    let view = match observed {
        Observed::Absent => return Decision::Acquire,
        Observed::Unreadable if local.leading => return Decision::Hold,
        Observed::Unreadable => return Decision::Wait { holder: None },
        Observed::Present(view) => view,
    };
    match view.holder() {
        Some(holder) if holder == me => Decision::Renew,
        None => Decision::Acquire,
        Some(_) if view.expired(now, lease_duration) => Decision::Acquire,
        Some(holder) if local.leading => Decision::StepDown(StepDownReason::Lost {
            holder: holder.to_string(),
        }),
        Some(holder) => Decision::Wait {
            holder: Some(holder.to_string()),
        },
    }
}

/// The Lease to write for `decision` (Acquire or Renew), given the current object (`None` =
/// create). Pure, so the field bookkeeping (transitions, acquire time) is testable.
pub fn lease_to_write(
    current: Option<&Lease>,
    decision: &Decision,
    config: &LeaderConfig,
    now: Timestamp,
) -> Lease {
    let mut lease = current.cloned().unwrap_or_else(|| Lease {
        metadata: ObjectMeta {
            name: Some(config.lease_name.clone()),
            namespace: Some(config.namespace.clone()),
            ..ObjectMeta::default()
        },
        spec: None,
    });
    let mut spec = lease.spec.take().unwrap_or_default();
    let previous = spec.holder_identity.clone().filter(|h| !h.is_empty());
    let duration_secs = i32::try_from(config.lease_duration.as_secs()).unwrap_or(i32::MAX);
    let taking_over =
        *decision == Decision::Acquire && previous.as_deref() != Some(&config.identity);
    if taking_over || spec.acquire_time.is_none() {
        spec.acquire_time = Some(MicroTime(now));
    }
    if taking_over && previous.is_some() {
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
    }
    spec.lease_transitions.get_or_insert(0);
    spec.holder_identity = Some(config.identity.clone());
    spec.lease_duration_seconds = Some(duration_secs);
    spec.renew_time = Some(MicroTime(now));
    lease.spec = Some(spec);
    lease
}

/// The Lease as a release writes it: no holder, so anyone may take it at once.
fn released(mut lease: Lease, now: Timestamp) -> Lease {
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    spec.holder_identity = None;
    spec.lease_duration_seconds = Some(1);
    spec.renew_time = Some(MicroTime(now));
    lease
}

/// Runs the election for one replica. See the module docs.
pub struct LeaderElector {
    api: Api<Lease>,
    config: LeaderConfig,
    tx: watch::Sender<bool>,
    metrics: Option<Metrics>,
}

/// Loop bookkeeping of [`LeaderElector::run`].
struct LoopState {
    leading: bool,
    last_renew: Option<Instant>,
    /// Consecutive 409s; the first re-reads at once, later ones wait the retry interval.
    conflicts: u32,
}

/// Why a bounded API call failed.
#[derive(Debug, thiserror::Error)]
enum CallError {
    /// 409: the Lease changed since it was read.
    #[error("the Lease changed since it was read")]
    Conflict,
    /// Anything else, including the timeout, as one line.
    #[error("{0}")]
    Other(String),
}

/// `call` with a timeout, its failure reduced to what the election acts on.
async fn bounded<T>(
    timeout: Duration,
    call: impl Future<Output = kube::Result<T>>,
) -> Result<T, CallError> {
    match tokio::time::timeout(timeout, call).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(kube::Error::Api(status))) if status.code == 409 => Err(CallError::Conflict),
        Ok(Err(e)) => Err(CallError::Other(e.to_string())),
        Err(_) => Err(CallError::Other(format!("timed out after {timeout:?}"))),
    }
}

impl LeaderElector {
    /// An elector for `config` (validated) using `client`.
    pub fn new(client: kube::Client, config: LeaderConfig) -> Result<Self, LeaderError> {
        config.validate()?;
        let api = Api::namespaced(client, &config.namespace);
        let (tx, _) = watch::channel(false);
        Ok(LeaderElector {
            api,
            config,
            tx,
            metrics: None,
        })
    }

    /// Also publish leadership on the `sandbox_operator_leader` gauge.
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        metrics.set_leader(false);
        self.metrics = Some(metrics);
        self
    }

    /// A receiver that is `true` while this replica leads. It sees `false` and then the
    /// channel closing when [`run`](Self::run) returns.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.tx.subscribe()
    }

    /// Elect until `shutdown` resolves; then publish `false` and release the Lease if we hold
    /// it. Never returns early: API errors are logged and retried. After `shutdown` it returns
    /// within the renew deadline, whether or not the API server answers the release.
    ///
    /// Stop leader-only work (controllers, sweeper) before resolving `shutdown`, or at least
    /// on seeing `false`: once the Lease is released another replica starts at once.
    /// Dropping or aborting the future instead (a crash) does not release: the others then
    /// wait out the lease duration, as they would for a dead process.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let mut shutdown = std::pin::pin!(shutdown);
        let mut state = LoopState {
            leading: false,
            last_renew: None,
            conflicts: 0,
        };
        tracing::info!(
            identity = %self.config.identity,
            lease = %self.config.lease_name,
            namespace = %self.config.namespace,
            "starting leader election"
        );
        loop {
            let delay = tokio::select! {
                biased;
                () = &mut shutdown => break,
                delay = self.step(&mut state) => delay,
            };
            if !delay.is_zero() {
                tokio::select! {
                    biased;
                    () = &mut shutdown => break,
                    () = tokio::time::sleep(delay) => {}
                }
            }
        }
        self.set_leading(&mut state, false, "shutting down");
        let name = &self.config.lease_name;
        match tokio::time::timeout(self.config.renew_deadline, self.release()).await {
            Ok(Ok(true)) => {
                tracing::info!(lease = %name, identity = %self.config.identity, "released the leader Lease");
            }
            Ok(Ok(false)) => {}
            Ok(Err(e)) => {
                tracing::warn!(lease = %name, error = %e, "cannot release the Lease; it will expire");
            }
            Err(_) => {
                tracing::warn!(lease = %name, timeout = ?self.config.renew_deadline, "timed out releasing the Lease; it will expire");
            }
        }
    }

    fn set_leading(&self, state: &mut LoopState, leading: bool, why: &str) {
        if state.leading != leading {
            if leading {
                tracing::info!(identity = %self.config.identity, lease = %self.config.lease_name, "became leader");
            } else {
                tracing::info!(identity = %self.config.identity, lease = %self.config.lease_name, reason = why, "stopped leading");
            }
        }
        state.leading = leading;
        self.tx.send_if_modified(|current| {
            let changed = *current != leading;
            *current = leading;
            changed
        });
        if let Some(metrics) = &self.metrics {
            metrics.set_leader(leading);
        }
    }

    /// Time a single API call may take: a leader must not wait past its renew deadline; a
    /// follower has nothing to lose and gets the whole deadline.
    fn call_timeout(&self, state: &LoopState) -> Duration {
        match (state.leading, state.last_renew) {
            (true, Some(at)) => self
                .config
                .renew_deadline
                .saturating_sub(at.elapsed())
                .max(Duration::from_millis(1)),
            _ => self.config.renew_deadline,
        }
    }

    /// Delay after a failure: the retry interval, cut short so a leader re-evaluates (and
    /// steps down) right at its deadline.
    fn retry_delay(&self, state: &LoopState) -> Duration {
        match (state.leading, state.last_renew) {
            (true, Some(at)) => self.config.retry_interval.min(
                self.config.renew_deadline.saturating_sub(at.elapsed()) + Duration::from_millis(1),
            ),
            _ => self.config.retry_interval,
        }
    }

    /// One observe → decide → act round; returns how long to wait before the next.
    async fn step(&self, state: &mut LoopState) -> Duration {
        let name = &self.config.lease_name;
        let current = bounded(self.call_timeout(state), self.api.get_opt(name)).await;
        if let Err(e) = &current {
            tracing::warn!(lease = %name, error = %e, "cannot read the leader Lease");
        }
        let view = current
            .as_ref()
            .ok()
            .and_then(|l| l.as_ref().map(LeaseView::from));
        let observed = match (&current, &view) {
            (Ok(Some(_)), Some(view)) => Observed::Present(view),
            (Ok(None), _) => Observed::Absent,
            _ => Observed::Unreadable,
        };
        let now = Timestamp::now();
        let local = LocalState {
            leading: state.leading,
            since_last_renew: state.last_renew.map(|at| at.elapsed()),
        };
        let decision = decide(
            observed,
            local,
            &self.config.identity,
            now,
            self.config.lease_duration,
            self.config.renew_deadline,
        );
        match decision {
            Decision::Acquire | Decision::Renew => {
                let started = Instant::now();
                let existing = current.ok().flatten();
                let lease = lease_to_write(existing.as_ref(), &decision, &self.config, now);
                self.write(existing.is_some(), &lease, state, started, &decision)
                    .await
            }
            Decision::Hold => {
                state.conflicts = 0;
                self.retry_delay(state)
            }
            Decision::Wait { holder } => {
                state.conflicts = 0;
                tracing::trace!(lease = %name, ?holder, "following");
                self.config.retry_interval
            }
            Decision::StepDown(reason) => {
                let why = match &reason {
                    StepDownReason::Lost { holder } => format!("lease taken by {holder}"),
                    StepDownReason::RenewDeadlineExceeded => format!(
                        "no successful renewal within {:?}",
                        self.config.renew_deadline
                    ),
                };
                self.set_leading(state, false, &why);
                Duration::ZERO
            }
        }
    }

    /// Create (`exists == false`) or replace with the resourceVersion that was read, and
    /// account for the outcome; returns the delay before the next round.
    async fn write(
        &self,
        exists: bool,
        lease: &Lease,
        state: &mut LoopState,
        started: Instant,
        decision: &Decision,
    ) -> Duration {
        let pp = PostParams::default();
        let name = &self.config.lease_name;
        let call = async {
            if exists {
                self.api.replace(name, &pp, lease).await.map(drop)
            } else {
                self.api.create(&pp, lease).await.map(drop)
            }
        };
        match bounded(self.call_timeout(state), call).await {
            Ok(()) => {
                state.last_renew = Some(started);
                state.conflicts = 0;
                self.set_leading(state, true, "");
                tracing::debug!(lease = %name, ?decision, "lease written");
                self.config.renew_interval
            }
            Err(CallError::Conflict) => {
                // Someone else wrote the Lease since we read it: most likely another replica
                // won. Re-read at once to find out, then back off.
                state.conflicts = state.conflicts.saturating_add(1);
                tracing::debug!(lease = %name, ?decision, "lease changed concurrently");
                if state.conflicts == 1 {
                    Duration::ZERO
                } else {
                    self.retry_delay(state)
                }
            }
            Err(CallError::Other(e)) => {
                state.conflicts = 0;
                tracing::warn!(lease = %name, ?decision, error = %e, "cannot write the leader Lease");
                self.retry_delay(state)
            }
        }
    }

    /// Empty `holderIdentity` if we still hold the Lease, so a standby takes over at once.
    /// `Ok(true)` when released, `Ok(false)` when not ours (or gone). Best effort: on failure
    /// the Lease simply expires. The caller bounds the whole of it.
    async fn release(&self) -> Result<bool, String> {
        let name = &self.config.lease_name;
        let timeout = self.config.renew_deadline;
        let pp = PostParams::default();
        loop {
            let lease = match bounded(timeout, self.api.get_opt(name)).await {
                Ok(Some(lease)) => lease,
                Ok(None) => return Ok(false),
                Err(e) => return Err(format!("reading it: {e}")),
            };
            if LeaseView::from(&lease).holder() != Some(self.config.identity.as_str()) {
                return Ok(false);
            }
            let lease = released(lease, Timestamp::now());
            match bounded(timeout, self.api.replace(name, &pp, &lease)).await {
                Ok(_) => return Ok(true),
                // Renewed or taken since we read it: look again.
                Err(CallError::Conflict) => continue,
                Err(e) => return Err(format!("writing it: {e}")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(15);
    const DEADLINE: Duration = Duration::from_secs(10);

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).unwrap()
    }

    fn view(holder: Option<&str>, renewed: Option<i64>, secs: Option<u64>) -> LeaseView {
        LeaseView {
            holder: holder.map(str::to_string),
            renew_time: renewed.map(t),
            lease_duration: secs.map(Duration::from_secs),
        }
    }

    fn follower() -> LocalState {
        LocalState {
            leading: false,
            since_last_renew: None,
        }
    }

    fn leader(since: u64) -> LocalState {
        LocalState {
            leading: true,
            since_last_renew: Some(Duration::from_secs(since)),
        }
    }

    #[test]
    fn decide_table() {
        let wait = |h: &str| Decision::Wait {
            holder: Some(h.to_string()),
        };
        let lost = |h: &str| {
            Decision::StepDown(StepDownReason::Lost {
                holder: h.to_string(),
            })
        };
        // (case, observed lease: None = absent, local, now, expected)
        let cases: Vec<(&str, Option<LeaseView>, LocalState, i64, Decision)> = vec![
            ("absent: create it", None, follower(), 0, Decision::Acquire),
            (
                "vacant (no holder)",
                Some(view(None, Some(0), Some(15))),
                follower(),
                1,
                Decision::Acquire,
            ),
            (
                "vacant (empty holder, as released)",
                Some(view(Some(""), Some(0), Some(1))),
                follower(),
                0,
                Decision::Acquire,
            ),
            (
                "held by other, valid",
                Some(view(Some("b"), Some(0), Some(15))),
                follower(),
                10,
                wait("b"),
            ),
            (
                "held by other, exactly at expiry: still valid",
                Some(view(Some("b"), Some(0), Some(15))),
                follower(),
                15,
                wait("b"),
            ),
            (
                "held by other, expired",
                Some(view(Some("b"), Some(0), Some(15))),
                follower(),
                16,
                Decision::Acquire,
            ),
            (
                "held by other, their duration wins over ours",
                Some(view(Some("b"), Some(0), Some(60))),
                follower(),
                30,
                wait("b"),
            ),
            (
                "held by other, no duration: ours applies",
                Some(view(Some("b"), Some(0), None)),
                follower(),
                16,
                Decision::Acquire,
            ),
            (
                "held by other, never renewed: expired",
                Some(view(Some("b"), None, Some(15))),
                follower(),
                0,
                Decision::Acquire,
            ),
            (
                "held by other, renew time in the future (skew): valid",
                Some(view(Some("b"), Some(100), Some(15))),
                follower(),
                0,
                wait("b"),
            ),
            (
                "ours, we lead: renew",
                Some(view(Some("me"), Some(0), Some(15))),
                leader(5),
                5,
                Decision::Renew,
            ),
            (
                "ours but we are not leading (e.g. after stepping down): renew takes it back",
                Some(view(Some("me"), Some(0), Some(15))),
                follower(),
                20,
                Decision::Renew,
            ),
            (
                "we lead but another holds a valid lease: step down",
                Some(view(Some("b"), Some(4), Some(15))),
                leader(5),
                5,
                lost("b"),
            ),
            (
                "we lead, another's lease expired: take it",
                Some(view(Some("b"), Some(0), Some(15))),
                leader(5),
                20,
                Decision::Acquire,
            ),
            (
                "we lead, lease deleted: recreate",
                None,
                leader(5),
                5,
                Decision::Acquire,
            ),
            (
                "we lead, past renew deadline: step down even if lease says us",
                Some(view(Some("me"), Some(0), Some(15))),
                leader(11),
                11,
                Decision::StepDown(StepDownReason::RenewDeadlineExceeded),
            ),
            (
                "we lead, exactly at renew deadline: still ours",
                Some(view(Some("me"), Some(0), Some(15))),
                leader(10),
                10,
                Decision::Renew,
            ),
            (
                "leading without any renewal recorded: step down",
                Some(view(Some("me"), Some(0), Some(15))),
                LocalState {
                    leading: true,
                    since_last_renew: None,
                },
                0,
                Decision::StepDown(StepDownReason::RenewDeadlineExceeded),
            ),
        ];
        for (case, lease, local, now, expected) in cases {
            let observed = match &lease {
                None => Observed::Absent,
                Some(v) => Observed::Present(v),
            };
            let got = decide(observed, local, "me", t(now), LEASE, DEADLINE);
            assert_eq!(got, expected, "case: {case}");
        }
    }

    #[test]
    fn decide_when_unreadable() {
        let got = decide(
            Observed::Unreadable,
            follower(),
            "me",
            t(0),
            LEASE,
            DEADLINE,
        );
        assert_eq!(got, Decision::Wait { holder: None });
        let got = decide(Observed::Unreadable, leader(3), "me", t(0), LEASE, DEADLINE);
        assert_eq!(got, Decision::Hold);
        let got = decide(
            Observed::Unreadable,
            leader(11),
            "me",
            t(0),
            LEASE,
            DEADLINE,
        );
        assert_eq!(
            got,
            Decision::StepDown(StepDownReason::RenewDeadlineExceeded)
        );
    }

    fn config() -> LeaderConfig {
        LeaderConfig {
            namespace: "ns".into(),
            lease_name: lease_name("default"),
            identity: "me".into(),
            lease_duration: LEASE,
            renew_deadline: DEADLINE,
            renew_interval: Duration::from_secs(5),
            retry_interval: Duration::from_secs(2),
        }
    }

    #[test]
    fn lease_bookkeeping() {
        let c = config();
        // Create.
        let created = lease_to_write(None, &Decision::Acquire, &c, t(0));
        assert_eq!(
            created.metadata.name.as_deref(),
            Some("sandbox-operator-default")
        );
        assert_eq!(created.metadata.namespace.as_deref(), Some("ns"));
        let spec = created.spec.clone().unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some("me"));
        assert_eq!(spec.lease_duration_seconds, Some(15));
        assert_eq!(spec.acquire_time, Some(MicroTime(t(0))));
        assert_eq!(spec.renew_time, Some(MicroTime(t(0))));
        assert_eq!(spec.lease_transitions, Some(0));

        // Renew keeps acquire time and transitions.
        let mut with_rv = created.clone();
        with_rv.metadata.resource_version = Some("42".into());
        let renewed = lease_to_write(Some(&with_rv), &Decision::Renew, &c, t(5));
        let spec = renewed.spec.clone().unwrap();
        assert_eq!(renewed.metadata.resource_version.as_deref(), Some("42"));
        assert_eq!(spec.acquire_time, Some(MicroTime(t(0))));
        assert_eq!(spec.renew_time, Some(MicroTime(t(5))));
        assert_eq!(spec.lease_transitions, Some(0));

        // Taking over from another holder counts a transition.
        let mut theirs = with_rv.clone();
        theirs.spec.as_mut().unwrap().holder_identity = Some("b".into());
        let taken = lease_to_write(Some(&theirs), &Decision::Acquire, &c, t(30));
        let spec = taken.spec.unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some("me"));
        assert_eq!(spec.acquire_time, Some(MicroTime(t(30))));
        assert_eq!(spec.lease_transitions, Some(1));
        assert_eq!(taken.metadata.resource_version.as_deref(), Some("42"));

        // Taking a released (vacant) lease does not count a transition.
        let vacant = released(with_rv, t(40));
        assert_eq!(LeaseView::from(&vacant).holder(), None);
        assert_eq!(
            vacant.spec.as_ref().unwrap().lease_duration_seconds,
            Some(1)
        );
        let taken = lease_to_write(Some(&vacant), &Decision::Acquire, &c, t(41));
        assert_eq!(taken.spec.unwrap().lease_transitions, Some(0));
    }

    #[test]
    fn config_validation() {
        config().validate().unwrap();
        let mut c = config();
        c.renew_deadline = LEASE;
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("renew deadline")
        );
        let mut c = config();
        c.renew_interval = DEADLINE;
        assert!(c.validate().is_err());
        let mut c = config();
        c.lease_duration = Duration::from_millis(2500);
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("whole number")
        );
        let mut c = config();
        c.retry_interval = Duration::ZERO;
        assert!(c.validate().is_err());
    }

    #[test]
    fn defaults() {
        let c = LeaderConfig::for_instance("blue", 15);
        assert_eq!(c.lease_name, "sandbox-operator-blue");
        assert_eq!(c.lease_duration, Duration::from_secs(15));
        assert_eq!(c.renew_deadline, Duration::from_secs(10));
        assert_eq!(c.renew_interval, Duration::from_secs(5));
        assert_eq!(c.retry_interval, Duration::from_millis(2142));
        c.validate().unwrap();
        let short = LeaderConfig::for_instance("blue", 1);
        assert_eq!(short.lease_duration, Duration::from_secs(3), "at least 3 s");
        assert_eq!(short.renew_deadline, Duration::from_secs(2));
        assert_eq!(short.retry_interval, Duration::from_millis(500));
        short.validate().unwrap();
        let a = default_identity();
        let b = default_identity();
        assert_ne!(a, b, "identities must differ per call");
        let (base, suffix) = a.rsplit_once('_').unwrap();
        assert!(!base.is_empty());
        assert_eq!(suffix.len(), 8);
    }
}
