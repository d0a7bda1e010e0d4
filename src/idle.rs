//! Idleness (pure): when a Sandbox with `spec.idleTimeoutSeconds` counts as idle, and when a
//! request through the operator must record traffic or wake it.
//!
//! Traffic is recorded on the object, as the annotation [`LAST_ACTIVITY`], by whichever
//! replica serves the request (the aggregated API, the E2B-compatible API): every replica
//! serves those, and only the leader reconciles, so the record must live where both see
//! it. It is written at most once per quarter of the timeout per sandbox, not per request.
//! The controller reads it: past `last activity + timeout` the sandbox is parked with
//! `spec.idleAction`; a later record wakes it.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::api::{IdleAction, Sandbox};

/// The annotation holding the last traffic through the operator (RFC 3339).
pub const LAST_ACTIVITY: &str = "sandboxes.dev/last-activity";

/// What a Sandbox asks for when idle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// How long without traffic.
    pub timeout: Duration,
    /// Then what: `Suspend` or `Stop`.
    pub action: IdleAction,
}

/// The Sandbox's idle policy; `None` when the operator does not decide its idleness.
pub fn policy(sandbox: &Sandbox) -> Option<Policy> {
    let secs = sandbox.spec.idle_timeout_seconds?;
    let action = sandbox.spec.idle_action?;
    if secs < 1 || action == IdleAction::Off {
        return None;
    }
    Some(Policy {
        timeout: Duration::from_secs(secs.unsigned_abs()),
        action,
    })
}

/// The last traffic: the recorded one, else the object's creation (a new sandbox is not
/// idle yet).
pub fn last_activity(sandbox: &Sandbox) -> Option<DateTime<Utc>> {
    let recorded = sandbox
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(LAST_ACTIVITY))
        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
        .map(|t| t.with_timezone(&Utc));
    let created = sandbox
        .metadata
        .creation_timestamp
        .as_ref()
        .and_then(|t| DateTime::<Utc>::from_timestamp(t.0.as_second(), 0));
    recorded.max(created)
}

/// Where a Sandbox stands against its idle policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// No idle policy (or nothing to count from).
    Unmanaged,
    /// In use: idle at this time unless traffic comes first.
    Busy(DateTime<Utc>),
    /// Idle since this time: apply the action.
    Idle(DateTime<Utc>, IdleAction),
}

/// Evaluates the Sandbox's idleness at `now`.
pub fn evaluate(sandbox: &Sandbox, now: DateTime<Utc>) -> Verdict {
    let (Some(p), Some(last)) = (policy(sandbox), last_activity(sandbox)) else {
        return Verdict::Unmanaged;
    };
    let timeout = chrono::Duration::from_std(p.timeout).unwrap_or(chrono::Duration::MAX);
    let at = last
        .checked_add_signed(timeout)
        .unwrap_or(DateTime::<Utc>::MAX_UTC);
    if now < at {
        Verdict::Busy(at)
    } else {
        Verdict::Idle(at, p.action)
    }
}

/// What a request through the operator does about idleness before it is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnRequest {
    /// Nothing: no policy, or traffic was recorded recently enough.
    Nothing,
    /// Record the traffic; the request need not wait for the write.
    Record,
    /// The sandbox is (or is about to be) parked: record the traffic, then wait for it to
    /// run again before serving.
    Wake,
}

/// What a request at `now` does: wake an idle sandbox, else record traffic once the record
/// is older than a quarter of the timeout (so a sandbox is never parked while requests
/// keep coming, at one write per quarter, not one per request).
pub fn on_request(sandbox: &Sandbox, now: DateTime<Utc>) -> OnRequest {
    let Some(p) = policy(sandbox) else {
        return OnRequest::Nothing;
    };
    let Some(last) = last_activity(sandbox) else {
        return OnRequest::Record;
    };
    let quarter = chrono::Duration::from_std(p.timeout / 4).unwrap_or(chrono::Duration::MAX);
    match evaluate(sandbox, now) {
        Verdict::Idle(..) => OnRequest::Wake,
        _ if now - last >= quarter => OnRequest::Record,
        _ => OnRequest::Nothing,
    }
}

/// `time` as the annotation's value.
pub fn stamp(time: DateTime<Utc>) -> String {
    time.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::SandboxSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn t(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn sandbox(timeout: Option<i64>, action: Option<IdleAction>, last: Option<&str>) -> Sandbox {
        let mut s = Sandbox::new(
            "s",
            SandboxSpec {
                idle_timeout_seconds: timeout,
                idle_action: action,
                ..SandboxSpec::default()
            },
        );
        let created =
            k8s_openapi::jiff::Timestamp::from_second(t("2026-01-01T00:00:00Z").timestamp());
        s.metadata.creation_timestamp = Some(Time(created.unwrap()));
        if let Some(last) = last {
            s.metadata.annotations = Some([(LAST_ACTIVITY.to_string(), last.to_string())].into());
        }
        s
    }

    #[test]
    fn idle_counts_from_the_last_traffic_else_from_creation() {
        let s = sandbox(Some(60), Some(IdleAction::Suspend), None);
        assert_eq!(
            evaluate(&s, t("2026-01-01T00:00:30Z")),
            Verdict::Busy(t("2026-01-01T00:01:00Z"))
        );
        assert_eq!(
            evaluate(&s, t("2026-01-01T00:01:00Z")),
            Verdict::Idle(t("2026-01-01T00:01:00Z"), IdleAction::Suspend)
        );
        let s = sandbox(
            Some(60),
            Some(IdleAction::Stop),
            Some("2026-01-01T00:05:00.250Z"),
        );
        assert_eq!(
            evaluate(&s, t("2026-01-01T00:05:30Z")),
            Verdict::Busy(t("2026-01-01T00:06:00.250Z"))
        );
    }

    #[test]
    fn without_a_timeout_or_with_off_the_operator_does_not_decide() {
        let now = t("2027-01-01T00:00:00Z");
        assert_eq!(
            evaluate(&sandbox(None, Some(IdleAction::Stop), None), now),
            Verdict::Unmanaged
        );
        assert_eq!(
            evaluate(&sandbox(Some(5), Some(IdleAction::Off), None), now),
            Verdict::Unmanaged
        );
        assert_eq!(
            evaluate(&sandbox(Some(5), None, None), now),
            Verdict::Unmanaged
        );
        assert_eq!(
            on_request(&sandbox(None, None, None), now),
            OnRequest::Nothing
        );
    }

    #[test]
    fn requests_record_once_per_quarter_and_wake_an_idle_sandbox() {
        let s = sandbox(
            Some(40),
            Some(IdleAction::Suspend),
            Some("2026-01-01T00:00:00Z"),
        );
        assert_eq!(
            on_request(&s, t("2026-01-01T00:00:09Z")),
            OnRequest::Nothing
        );
        assert_eq!(on_request(&s, t("2026-01-01T00:00:10Z")), OnRequest::Record);
        assert_eq!(on_request(&s, t("2026-01-01T00:00:40Z")), OnRequest::Wake);
        let garbled = sandbox(Some(40), Some(IdleAction::Suspend), Some("yesterday"));
        assert_eq!(
            on_request(&garbled, t("2026-01-01T00:00:10Z")),
            OnRequest::Record
        );
    }

    #[test]
    fn the_stamp_reads_back() {
        let now = t("2026-03-04T05:06:07.089Z");
        let s = sandbox(Some(1), Some(IdleAction::Stop), Some(&stamp(now)));
        assert_eq!(last_activity(&s), Some(now));
    }
}
