//! Refill pacing (pure). A pool refills as soon as a claim takes a member, and a refill is a
//! sandbox create and start on the engine the claimed member runs on: right after a claim
//! it competes with the claimant's first commands (measured on Docker: an E2B
//! `commands.run("true")` right after a warm claim took ~75 ms beside the refill, ~50 ms
//! without one). So while the pool still has a free running member for the next claim,
//! creates wait until [`GRACE`] after the pool's last claim, and while its claims are
//! being served (as below).
//!
//! A pool with none free refills at once — unless claims of it are still being served: a
//! burst that takes the whole pool is then finishing its env deliveries on the same engine,
//! and 200 refill creates started beside them made the burst's claims wait behind the
//! creates (the provider's concurrency limit and the engine are shared). Creates wait for
//! those claims, for at most [`BURST`] from when claims started being served without a
//! pause, so a stream of claims that never pauses still gets its refill. A pause shorter
//! than [`GRACE`] does not end the burst: 200 claims reconciled 32 at a time leave moments
//! with none in a pass, and a refill that looked at such a moment started 200 creates
//! beside the rest of the burst (measured: 200 claims in 15.8 s instead of ~4 s).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::api::SandboxWarmPool;

/// How long after a claim a pool with a free member holds its creates.
pub const GRACE: Duration = Duration::from_millis(300);

/// The longest creates wait for claims being served without a pause. Long enough for a
/// burst that takes a whole pool of 200 on a busy host (~6 s at 35 claims/s): with 3 s,
/// the refill's 130 creates took the provider's call slots from the burst's last 70
/// claims, which then waited behind them (200 claims in 13–19 s instead of ~5 s).
pub const BURST: Duration = Duration::from_secs(10);

/// How soon a pool whose creates wait for claims being served looks again: no sooner than
/// the pool's own debounce, since each look may write the pool's status, and every such
/// write sends the claims' ledger writes of that moment back to read the pool again.
const RECHECK: Duration = Duration::from_millis(250);
const _: () = assert!(RECHECK.as_millis() > super::SETTLE.as_millis());

/// How long the time of a pool's last claim is kept.
const KEPT: Duration = Duration::from_secs(60);

/// The claims of one pool, as this process serves them.
#[derive(Debug, Clone, Copy)]
struct Claims {
    /// When the last one started.
    last: Instant,
    /// How many are being served now.
    serving: usize,
    /// Since when claims have been served without a pause of [`GRACE`] or more.
    busy_since: Option<Instant>,
    /// When the last one served ended, while none is.
    idle_since: Option<Instant>,
}

impl Claims {
    /// Since when the pool's claims have been served at `now`, pauses shorter than
    /// [`GRACE`] included; `None` when none is served and none ended that recently.
    fn busy_at(&self, now: Instant) -> Option<Instant> {
        let pausing = self
            .idle_since
            .is_some_and(|t| now.saturating_duration_since(t) >= GRACE);
        if self.serving == 0 && (pausing || self.idle_since.is_none()) {
            return None;
        }
        self.busy_since
    }
}

/// When each pool last had a claim in this process, and the claims being served: written
/// by the Sandbox controller as a claim starts (before its ledger write wakes the pool's
/// own reconcile) and ends, read by the pool controller. A pool is its
/// [`super::identity`]; idle entries older than a minute are dropped as others come.
#[derive(Default)]
pub struct ClaimTimes(Mutex<HashMap<String, Claims>>);

/// What the pool controller's pacing reads of a pool's claims ([`ClaimTimes::of`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Seen {
    /// When the last claim started.
    pub last: Option<Instant>,
    /// Since when claims have been served without a pause, while one is.
    pub busy_since: Option<Instant>,
}

/// A claim being served: it counts until dropped (a claim's pass ends, or is cancelled).
pub struct Serving {
    times: Arc<ClaimTimes>,
    key: String,
}

impl ClaimTimes {
    /// A claim on `pool` starts now; it is being served until the returned guard is dropped.
    pub fn begin(self: &Arc<Self>, pool: &SandboxWarmPool) -> Serving {
        let now = Instant::now();
        let key = super::identity(pool);
        let mut claims = self.lock();
        claims.retain(|_, c| c.serving > 0 || now.saturating_duration_since(c.last) < KEPT);
        let c = claims.entry(key.clone()).or_insert(Claims {
            last: now,
            serving: 0,
            busy_since: None,
            idle_since: None,
        });
        c.busy_since = c.busy_at(now).or(Some(now));
        c.last = now;
        c.serving += 1;
        c.idle_since = None;
        Serving {
            times: Arc::clone(self),
            key,
        }
    }

    /// What is known of `pool`'s claims.
    pub fn of(&self, pool: &SandboxWarmPool) -> Seen {
        let claims = self.lock();
        claims
            .get(&super::identity(pool))
            .map(|c| Seen {
                last: Some(c.last),
                busy_since: c.busy_at(Instant::now()),
            })
            .unwrap_or_default()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Claims>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        let mut claims = self.times.lock();
        if let Some(c) = claims.get_mut(&self.key) {
            c.serving = c.serving.saturating_sub(1);
            if c.serving == 0 {
                c.idle_since = Some(Instant::now());
            }
        }
    }
}

/// How long creates wait from `now`: `None` to create now. `seen`: the pool's claims
/// ([`ClaimTimes::of`]); `free_ready`: its unclaimed running current members.
///
/// Claims being served hold the creates whether or not a member is free: a burst that
/// pauses for [`GRACE`] between claim starts (every pass slot busy delivering env on a
/// loaded engine) while members were still free started the refill beside it, which
/// slowed the deliveries, which made longer pauses (measured on Docker, 200 claims at once:
/// the last 50 Ready at 10–18 s instead of all by ~3 s).
pub fn hold(seen: Seen, free_ready: usize, now: Instant) -> Option<Duration> {
    let burst = seen.busy_since.and_then(|since| {
        let busy = now.saturating_duration_since(since);
        BURST
            .checked_sub(busy)
            .filter(|left| !left.is_zero())
            .map(|left| left.min(RECHECK))
    });
    if free_ready == 0 {
        return burst;
    }
    let grace = seen
        .last
        .and_then(|last| GRACE.checked_sub(now.saturating_duration_since(last)))
        .filter(|left| !left.is_zero());
    grace.max(burst)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creates_wait_after_a_claim_while_a_member_is_free() {
        let now = Instant::now();
        let seen = |ago: u64| Seen {
            last: now.checked_sub(Duration::from_millis(ago)),
            busy_since: None,
        };
        assert_eq!(hold(seen(100), 2, now), Some(Duration::from_millis(200)));
        assert_eq!(
            hold(seen(100), 0, now),
            None,
            "an empty pool refills at once"
        );
        assert_eq!(
            hold(Seen::default(), 2, now),
            None,
            "no claim: nothing to wait for"
        );
        assert_eq!(hold(seen(600), 2, now), None);
    }

    #[test]
    fn claims_being_served_hold_creates_while_a_member_is_free() {
        let now = Instant::now();
        let serving = Seen {
            last: now.checked_sub(Duration::from_millis(600)),
            busy_since: now.checked_sub(Duration::from_millis(1_000)),
        };
        assert_eq!(
            hold(serving, 50, now),
            Some(RECHECK),
            "a pause in claim starts longer than GRACE, claims still served: wait"
        );
        let long = Seen {
            busy_since: now.checked_sub(BURST),
            ..serving
        };
        assert_eq!(hold(long, 50, now), None, "never past BURST");
    }

    #[test]
    fn an_empty_pool_waits_for_claims_being_served_for_a_bounded_time() {
        let now = Instant::now();
        let busy = |ago: u64| Seen {
            last: Some(now),
            busy_since: now.checked_sub(Duration::from_millis(ago)),
        };
        assert_eq!(hold(busy(0), 0, now), Some(RECHECK), "looks again soon");
        assert_eq!(
            hold(busy(9_950), 0, now),
            Some(Duration::from_millis(50)),
            "never past BURST"
        );
        assert_eq!(
            hold(busy(10_000), 0, now),
            None,
            "a stream that never pauses refills"
        );
    }

    fn pool(name: &str, uid: &str) -> SandboxWarmPool {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "sandboxes.dev/v1alpha1", "kind": "SandboxWarmPool",
            "metadata": {"name": name, "namespace": "ns", "uid": uid},
            "spec": {"replicas": 1, "template": {}}
        }))
        .expect("a pool")
    }

    #[test]
    fn a_claim_is_remembered_for_its_pool_only() {
        let times = Arc::new(ClaimTimes::default());
        let (a, b) = (pool("a", "1"), pool("b", "2"));
        drop(times.begin(&a));
        assert!(times.of(&a).last.is_some());
        assert_eq!(times.of(&b).last, None);
        assert_eq!(
            times.of(&pool("a", "3")).last,
            None,
            "a pool made again is another"
        );
    }

    #[test]
    fn a_pool_is_busy_while_any_of_its_claims_is_served() {
        let times = Arc::new(ClaimTimes::default());
        let a = pool("a", "1");
        let first = times.begin(&a);
        let since = times.of(&a).busy_since;
        assert!(since.is_some());
        let second = times.begin(&a);
        drop(first);
        assert_eq!(
            times.of(&a).busy_since,
            since,
            "one still served: busy since the first"
        );
        drop(second);
        assert_eq!(
            times.of(&a).busy_since,
            since,
            "a pause shorter than GRACE is still the same burst"
        );
        let third = times.begin(&a);
        assert_eq!(times.of(&a).busy_since, since, "and continues it");
        drop(third);
        assert!(times.of(&a).last.is_some());
    }

    #[test]
    fn a_pause_of_grace_ends_the_burst() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut c = Claims {
            last: t0,
            serving: 0,
            busy_since: Some(t0),
            idle_since: Some(at(1_000)),
        };
        assert_eq!(c.busy_at(at(1_100)), Some(t0), "a short pause");
        assert_eq!(c.busy_at(at(1_000) + GRACE), None, "a pause of GRACE");
        c.serving = 1;
        c.idle_since = None;
        assert_eq!(c.busy_at(at(9_000)), Some(t0), "served: busy");
        c.serving = 0;
        assert_eq!(c.busy_at(at(9_000)), None, "never ended: never busy");
    }
}
