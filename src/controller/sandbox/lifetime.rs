//! Lifetime (pure): when a Sandbox's shutdown time has come, and what then happens.

use chrono::{DateTime, Utc};

use crate::api::{Lifetime, LifetimeAction};

/// Where a Sandbox stands against its lifetime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Deadline {
    /// No lifetime set.
    None,
    /// Not yet: requeue at this time.
    At(DateTime<Utc>),
    /// Passed: stop the sandbox (it stays, stopped).
    Stop,
    /// Passed: delete the Sandbox object (cleanup destroys the sandbox).
    Delete,
    /// Passed: suspend the sandbox (it stays, sleeping, until the lifetime moves).
    Sleep,
}

impl Deadline {
    /// This deadline, looked at again by `at` at the latest (another timer's time).
    pub fn earliest(self, at: DateTime<Utc>) -> Deadline {
        match self {
            Deadline::None => Deadline::At(at),
            Deadline::At(mine) => Deadline::At(mine.min(at)),
            passed => passed,
        }
    }

    /// Whether it leaves the spec's power state alone (nothing has passed).
    pub fn keeps_running(&self) -> bool {
        matches!(self, Deadline::None | Deadline::At(_))
    }
}

/// Evaluates `spec.lifetime` against `now`; `created` is the object's creationTimestamp.
pub fn evaluate(
    lifetime: Option<&Lifetime>,
    created: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> Result<Deadline, String> {
    let Some(l) = lifetime else {
        return Ok(Deadline::None);
    };
    let at = match (&l.shutdown_at, l.ttl_seconds) {
        (Some(t), _) => DateTime::parse_from_rfc3339(t)
            .map_err(|e| format!("spec.lifetime.shutdownAt {t:?} is not an RFC 3339 time: {e}"))?
            .with_timezone(&Utc),
        (None, Some(ttl)) => {
            let Some(created) = created else {
                return Ok(Deadline::None);
            };
            created + chrono::Duration::seconds(ttl.max(0))
        }
        (None, None) => return Ok(Deadline::None),
    };
    if now < at {
        return Ok(Deadline::At(at));
    }
    Ok(match l.action {
        Some(LifetimeAction::Delete) => Deadline::Delete,
        Some(LifetimeAction::Sleep) => Deadline::Sleep,
        Some(LifetimeAction::Stop) | None => Deadline::Stop,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn ttl_counts_from_creation_and_action_defaults_to_stop() {
        let l = Lifetime {
            shutdown_at: None,
            ttl_seconds: Some(60),
            action: None,
        };
        let created = Some(t("2026-01-01T00:00:00Z"));
        assert_eq!(
            evaluate(Some(&l), created, t("2026-01-01T00:00:30Z")),
            Ok(Deadline::At(t("2026-01-01T00:01:00Z")))
        );
        assert_eq!(
            evaluate(Some(&l), created, t("2026-01-01T00:01:00Z")),
            Ok(Deadline::Stop)
        );
    }

    #[test]
    fn shutdown_at_with_delete() {
        let l = Lifetime {
            shutdown_at: Some("2026-01-01T00:00:00Z".into()),
            ttl_seconds: None,
            action: Some(LifetimeAction::Delete),
        };
        assert_eq!(
            evaluate(Some(&l), None, t("2026-02-01T00:00:00Z")),
            Ok(Deadline::Delete)
        );
        let bad = Lifetime {
            shutdown_at: Some("tomorrow".into()),
            ttl_seconds: None,
            action: None,
        };
        assert!(
            evaluate(Some(&bad), None, t("2026-02-01T00:00:00Z"))
                .unwrap_err()
                .contains("spec.lifetime.shutdownAt")
        );
        assert_eq!(
            evaluate(None, None, t("2026-02-01T00:00:00Z")),
            Ok(Deadline::None)
        );
    }

    #[test]
    fn another_timer_brings_the_next_look_forward_only() {
        let (early, late) = (t("2026-01-01T00:00:00Z"), t("2026-02-01T00:00:00Z"));
        assert_eq!(Deadline::None.earliest(late), Deadline::At(late));
        assert_eq!(Deadline::At(early).earliest(late), Deadline::At(early));
        assert_eq!(Deadline::At(late).earliest(early), Deadline::At(early));
        assert_eq!(Deadline::Stop.earliest(early), Deadline::Stop);
        assert!(!Deadline::Sleep.keeps_running() && Deadline::At(early).keeps_running());
    }

    #[test]
    fn sleep_suspends_once_passed_and_a_later_time_wakes() {
        let at = |s: &str| Lifetime {
            shutdown_at: Some(s.into()),
            ttl_seconds: None,
            action: Some(LifetimeAction::Sleep),
        };
        let now = t("2026-02-01T00:00:00Z");
        assert_eq!(
            evaluate(Some(&at("2026-01-01T00:00:00Z")), None, now),
            Ok(Deadline::Sleep)
        );
        assert_eq!(
            evaluate(Some(&at("2026-03-01T00:00:00Z")), None, now),
            Ok(Deadline::At(t("2026-03-01T00:00:00Z")))
        );
    }
}
