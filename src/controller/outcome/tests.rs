//! Table tests of [`decide`]: the same decisions for every kind.

use super::*;

fn provider(e: ProviderError) -> Error {
    Error::Provider(e)
}

fn in_progress(reason: &str) -> Outcome {
    Outcome::InProgress {
        reason: reason.into(),
        message: "pulling".into(),
        recheck: Duration::from_secs(2),
        announce: "Pulling",
    }
}

fn ready_until(after: u64) -> Outcome {
    Outcome::Ready {
        reason: "Running".into(),
        message: "ok".into(),
        recheck: Some(Duration::from_secs(after)),
    }
}

fn blocked() -> Outcome {
    Outcome::cleanup_blocked("list", provider(ProviderError::invalid("HTTP 405")))
}

/// One row: the outcome, the Ready reason written before, and what is decided — the
/// conditions' state, whether the generation finishes, the Event, the hold, the requeue.
type Row = (
    Outcome,
    Option<&'static str>,
    (&'static str, bool),
    Option<(EventType, &'static str)>,
    Option<&'static str>,
    Then,
);

#[rustfmt::skip]
fn rows() -> Vec<Row> {
    use EventType::{Normal, Warning};
    use Then::{Requeue, Resync, Retry};
    let secs = Duration::from_secs;
    let transient = || provider(ProviderError::transient("500"));
    let invalid = || provider(ProviderError::invalid("no"));
    let refused = || provider(ProviderError::unauthorized("401"));
    let kube = || Error::Kube(kube::Error::LinesCodecMaxLineLengthExceeded);
    let progressing = ("Progressing", true);
    let unfinished = ("Progressing", false);
    let stalled = ("Stalled", true);
    vec![
        (Outcome::ready("Running", "ok"), None, ("Ready", true), None, None, Resync),
        (ready_until(5), None, ("Ready", true), None, None, Requeue(secs(5))),
        (Outcome::waiting("TemplateNotReady", "w", None), None, progressing, None, None, Resync),
        (Outcome::waiting("SecretNotFound", "w", secs(5)), None, progressing, None, None, Requeue(secs(5))),
        // A stall warns once per reason.
        (Outcome::stalled("InvalidSpec", "x"), Some("Running"), stalled, Some((Warning, "InvalidSpec")), None, Resync),
        (Outcome::stalled("InvalidSpec", "x"), Some("InvalidSpec"), stalled, None, None, Resync),
        // A pull does not finish the generation, and is announced when it starts.
        (in_progress("PullingImage"), Some("Creating"), unfinished, Some((Normal, "Pulling")), None, Requeue(secs(2))),
        (in_progress("PullingImage"), Some("PullingImage"), unfinished, None, None, Requeue(secs(2))),
        // Every retryable failure warns and backs off, the generation unfinished.
        (Outcome::failed(transient()), Some("ProviderUnavailable"), unfinished, Some((Warning, "ProviderUnavailable")), None, Retry),
        (Outcome::failed(kube()), None, unfinished, Some((Warning, "KubeApiError")), None, Retry),
        // Anything else stalls, warning once per reason.
        (Outcome::failed(invalid()), Some("Running"), stalled, Some((Warning, "ProviderRejected")), None, Resync),
        (Outcome::failed(invalid()), Some("ProviderRejected"), stalled, None, None, Resync),
        // Refused credentials: stalled, looked at again at the backoff ceiling — every kind.
        (Outcome::failed(refused()), None, stalled, Some((Warning, "ProviderUnauthorized")), None, Requeue(CAP)),
        (Outcome::failed(refused()), Some("ProviderUnauthorized"), stalled, None, None, Requeue(CAP)),
        // A held deletion: its condition, one Warning per reason, the error's backoff.
        (blocked(), Some("ProviderRejected"), progressing, Some((Warning, CLEANUP_BLOCKED)), Some(CLEANUP_BLOCKED), Retry),
        (blocked(), Some(CLEANUP_BLOCKED), progressing, None, Some(CLEANUP_BLOCKED), Retry),
        (Outcome::ObjectGone, None, unfinished, None, None, Then::AwaitChange),
    ]
}

#[test]
fn every_outcome_decides_its_status_event_and_requeue() {
    for (outcome, previous, (state, finishes), event, hold, then) in rows() {
        let d = decide(&outcome, previous);
        let got_state = match d.health {
            Health::Ready { .. } => "Ready",
            Health::Progressing { .. } => "Progressing",
            Health::Stalled { .. } => "Stalled",
            Health::NotReady { .. } => "NotReady",
        };
        let got_event = d.event.as_ref().map(|(t, r, _)| (*t, r.as_str()));
        assert_eq!(got_state, state, "{outcome:?}");
        assert_eq!(d.finishes_generation, finishes, "{outcome:?}");
        assert_eq!(
            format!("{got_event:?}"),
            format!("{event:?}"),
            "{outcome:?} after {previous:?}"
        );
        assert_eq!(d.hold, hold, "{outcome:?}");
        assert_eq!(d.then, then, "{outcome:?}");
    }
}

#[test]
fn a_step_failure_names_the_step_in_its_event_only() {
    let outcome = Outcome::Failed {
        error: provider(ProviderError::transient("boom")),
        during: Some("Start".into()),
    };
    let d = decide(&outcome, None);
    let message = provider(ProviderError::transient("boom")).to_string();
    assert_eq!(d.health.message(), message);
    let (_, _, note) = d.event.expect("a failure is an Event");
    assert_eq!(note, format!("Start failed: {message}"));
}

#[test]
fn cleanup_blocked_names_what_and_the_fix() {
    let rows = [
        (ProviderError::invalid("HTTP 405"), "endpoint or API"),
        (
            ProviderError::unsupported("no listing"),
            "remove the finalizer",
        ),
        (ProviderError::unauthorized("401"), "credentials"),
        (ProviderError::transient("500"), "retrying"),
    ];
    for (err, fix) in rows {
        let Outcome::Held {
            reason, message, ..
        } = Outcome::cleanup_blocked("list sprites labelled owner-uid=u", provider(err))
        else {
            panic!("a held deletion");
        };
        assert_eq!(reason, CLEANUP_BLOCKED);
        assert!(
            message.contains("list sprites labelled owner-uid=u"),
            "{message}"
        );
        assert!(message.contains(fix), "{message}");
    }
    let Outcome::Held { message, .. } =
        Outcome::cleanup_blocked("resolve its provider", Error::Dependency("gone".into()))
    else {
        panic!("a held deletion");
    };
    assert!(message.contains("configure the provider"), "{message}");
}

#[test]
fn holds_are_set_while_held_and_cleared_after() {
    let mut s = SandboxVolumeStatus::default();
    let held = decide(
        &Outcome::Held {
            reason: VOLUME_ATTACHED,
            message: "attached".into(),
            error: Error::Dependency("x".into()),
        },
        None,
    );
    apply(&mut s, &held.health, held.hold, Some(3));
    let types: Vec<_> = s.conditions.iter().map(|c| c.type_.as_str()).collect();
    assert_eq!(types, ["Ready", "Reconciling", VOLUME_ATTACHED]);
    assert_eq!(s.observed_generation, Some(3));
    let blocked = decide(
        &Outcome::cleanup_blocked("confirm", Error::Dependency("x".into())),
        None,
    );
    apply(&mut s, &blocked.health, blocked.hold, Some(3));
    let types: Vec<_> = s.conditions.iter().map(|c| c.type_.as_str()).collect();
    assert_eq!(types, [CLEANUP_BLOCKED, "Ready", "Reconciling"]);
    let ready = decide(&Outcome::ready("VolumeReady", "ok"), None);
    apply(&mut s, &ready.health, ready.hold, Some(4));
    let types: Vec<_> = s.conditions.iter().map(|c| c.type_.as_str()).collect();
    assert_eq!(types, ["Ready"]);
}

#[test]
fn only_a_stalled_sandbox_gets_the_stalled_phase() {
    let mut s = SandboxStatus::default();
    let d = decide(&Outcome::stalled("InvalidSpec", "x"), None);
    apply(&mut s, &d.health, d.hold, Some(1));
    assert_eq!(s.phase.as_deref(), Some("Stalled"));
    let mut s = SandboxStatus {
        phase: Some("Exited".into()),
        ..SandboxStatus::default()
    };
    apply(&mut s, &d.health, d.hold, Some(1));
    assert_eq!(
        s.phase.as_deref(),
        Some("Exited"),
        "a phase already set is kept"
    );
}
