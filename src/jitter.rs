//! The one jitter for everything periodic (resyncs, requeues, sweeps): a period scaled into
//! ±10 %, so that many objects, and many replicas after a restart, do not act in lockstep.

use std::time::Duration;

/// Relative spread around the base period.
pub const SPREAD: f64 = 0.10;

/// `base` scaled by a factor in `[1 - SPREAD, 1 + SPREAD]` chosen by `unit` (in `[0, 1]`).
pub fn scale(base: Duration, unit: f64) -> Duration {
    base.mul_f64(1.0 - SPREAD + 2.0 * SPREAD * unit.clamp(0.0, 1.0))
}

/// `base` with a random spread, drawn anew on every call.
pub fn random(base: Duration) -> Duration {
    scale(base, fastrand::f64())
}

/// `base` with a spread fixed by `key` (an object's UID): stable for one object, spread
/// across objects, so 5,000 objects created together do not all resync in the same second.
pub fn by_key(base: Duration, key: &str) -> Duration {
    let spread = key
        .bytes()
        .fold(0u64, |a, b| a.wrapping_mul(31).wrapping_add(u64::from(b)))
        % 1001;
    scale(base, spread as f64 / 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_jitter_stays_within_ten_percent() {
        let base = Duration::from_secs(300);
        assert_eq!(scale(base, 0.0), Duration::from_secs(270));
        assert_eq!(scale(base, 1.0), Duration::from_secs(330));
        assert_eq!(scale(base, 7.0), Duration::from_secs(330), "clamped");
        for i in 0..200 {
            let r = random(base);
            assert!((270..=330).contains(&r.as_secs()), "{r:?}");
            let k = by_key(base, &format!("uid-{i}"));
            assert!((270..=330).contains(&k.as_secs()), "{k:?}");
        }
    }

    #[test]
    fn the_key_spread_is_stable_per_key_and_differs_across_keys() {
        let base = Duration::from_secs(600);
        assert_eq!(by_key(base, "a-uid"), by_key(base, "a-uid"));
        let distinct: std::collections::BTreeSet<_> =
            (0..50).map(|i| by_key(base, &format!("uid-{i}"))).collect();
        assert!(distinct.len() > 25, "spread: {}", distinct.len());
    }
}
