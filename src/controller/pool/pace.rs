//! Refill pacing (pure). A pool refills as soon as a claim takes a member, and a refill is a
//! sandbox create and start on the engine the claimed member runs on: right after a claim
//! it competes with the claimant's first commands (measured on Docker: an E2B
//! `commands.run("true")` right after a warm claim took ~75 ms beside the refill, ~50 ms
//! without one). So while the pool still has a free running member for the next claim,
//! creates wait until [`GRACE`] after the pool's last claim; a pool with none free
//! refills at once, and a burst of claims is not slowed by the creates it causes.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::api::SandboxWarmPool;

/// How long after a claim a pool with a free member holds its creates.
pub const GRACE: Duration = Duration::from_millis(300);

/// How long the time of a pool's last claim is kept.
const KEPT: Duration = Duration::from_secs(60);

/// When each pool last had a claim in this process: written by the Sandbox controller as a
/// claim starts (before its ledger write wakes the pool's own reconcile), read by the pool
/// controller. A pool is its [`super::identity`]; entries older than a minute are dropped
/// as others come.
#[derive(Default)]
pub struct ClaimTimes(Mutex<HashMap<String, Instant>>);

impl ClaimTimes {
    /// A claim on `pool` starts now.
    pub fn record(&self, pool: &SandboxWarmPool) {
        let now = Instant::now();
        let mut times = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        times.retain(|_, at| now.saturating_duration_since(*at) < KEPT);
        times.insert(super::identity(pool), now);
    }

    /// When a claim on `pool` last started, if one did lately.
    pub fn last(&self, pool: &SandboxWarmPool) -> Option<Instant> {
        let times = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        times.get(&super::identity(pool)).copied()
    }
}

/// How long creates wait from `now`: `None` to create now. `last_claim`: when the pool's
/// last claim started ([`ClaimTimes`]); `free_ready`: its unclaimed running current members.
pub fn hold(last_claim: Option<Instant>, free_ready: usize, now: Instant) -> Option<Duration> {
    if free_ready == 0 {
        return None;
    }
    let since = now.saturating_duration_since(last_claim?);
    GRACE.checked_sub(since).filter(|left| !left.is_zero())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creates_wait_after_a_claim_only_while_a_member_is_free() {
        let now = Instant::now();
        let just = now.checked_sub(Duration::from_millis(100));
        assert_eq!(hold(just, 2, now), Some(Duration::from_millis(200)));
        assert_eq!(hold(just, 0, now), None, "an empty pool refills at once");
        assert_eq!(hold(None, 2, now), None, "no claim: nothing to wait for");
        let long_ago = now.checked_sub(GRACE * 2);
        assert_eq!(hold(long_ago, 2, now), None);
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
        let times = ClaimTimes::default();
        let (a, b) = (pool("a", "1"), pool("b", "2"));
        times.record(&a);
        assert!(times.last(&a).is_some());
        assert_eq!(times.last(&b), None);
        assert_eq!(
            times.last(&pool("a", "3")),
            None,
            "a pool made again is another"
        );
    }
}
