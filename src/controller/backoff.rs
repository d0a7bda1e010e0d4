//! Per-object exponential backoff for transient failures.
//!
//! kube-runtime's `error_policy` is told the error but not how often it happened, so the
//! count lives here, keyed by object, and is cleared by the next success.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// Retry counters by object key (`kind/namespace/name`).
#[derive(Default)]
pub struct Backoff {
    attempts: Mutex<HashMap<String, u32>>,
}

/// First retry delay.
const BASE: Duration = Duration::from_millis(500);
/// Longest delay between retries, and how often a stalled object whose provider refused our
/// credentials is looked at again.
pub const CAP: Duration = Duration::from_secs(300);

impl Backoff {
    /// Records a failure and returns how long to wait before the next attempt:
    /// 0.5 s, 1 s, 2 s, … capped at 5 minutes.
    pub fn next_delay(&self, key: &str) -> Duration {
        let mut map = self.attempts.lock().unwrap_or_else(|p| p.into_inner());
        let n = map.entry(key.to_string()).or_insert(0);
        *n = n.saturating_add(1);
        delay_for(*n)
    }

    /// Forgets an object's failures after a success.
    pub fn reset(&self, key: &str) {
        let mut map = self.attempts.lock().unwrap_or_else(|p| p.into_inner());
        map.remove(key);
    }
}

/// The delay after the `attempt`-th consecutive failure (1-based).
pub fn delay_for(attempt: u32) -> Duration {
    let factor = 2u32.saturating_pow(attempt.saturating_sub(1).min(20));
    BASE.saturating_mul(factor).min(CAP)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_and_cap() {
        assert_eq!(delay_for(1), Duration::from_millis(500));
        assert_eq!(delay_for(2), Duration::from_secs(1));
        assert_eq!(delay_for(4), Duration::from_secs(4));
        assert_eq!(delay_for(30), CAP);
    }

    #[test]
    fn success_resets_the_count() {
        let b = Backoff::default();
        b.next_delay("k");
        assert_eq!(b.next_delay("k"), Duration::from_secs(1));
        b.reset("k");
        assert_eq!(b.next_delay("k"), Duration::from_millis(500));
    }
}
