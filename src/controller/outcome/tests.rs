//! Table tests of [`decide`]: the same decisions for every kind.

use super::*;

fn provider(e: ProviderError) -> Error {
    Error::Provider(e)
}

/// `(outcome, Ready reason before) → (condition state, finishes, event, hold, then)`.
#[test]
fn every_outcome_decides_its_status_event_and_requeue() {
    use EventType::{Normal, Warning};
    let wait = Some(Duration::from_secs(5));
    type Row = (
        Outcome,
        Option<&'static str>,
        &'static str,
        bool,
        Option<(EventType, &'static str)>,
        Option<&'static str>,
        Then,
    );
    let rows: Vec<Row> = vec![
        (
            Outcome::ready("Running", "ok"),
            None,
            "Ready",
            true,
            None,
            None,
            Then::Resync,
        ),
        (
            Outcome::Ready {
                reason: "Running".into(),
                message: "ok".into(),
                recheck: wait,
            },
            None,
            "Ready",
            true,
            None,
            None,
            Then::Requeue(Duration::from_secs(5)),
        ),
        (
            Outcome::waiting("TemplateNotReady", "w", None),
            None,
            "Progressing",
            true,
            None,
            None,
            Then::Resync,
        ),
        (
            Outcome::waiting("SecretNotFound", "w", wait),
            None,
            "Progressing",
            true,
            None,
            None,
            Then::Requeue(Duration::from_secs(5)),
        ),
        // A stall warns once per reason.
        (
            Outcome::stalled("InvalidSpec", "bad"),
            Some("Running"),
            "Stalled",
            true,
            Some((Warning, "InvalidSpec")),
            None,
            Then::Resync,
        ),
        (
            Outcome::stalled("InvalidSpec", "bad"),
            Some("InvalidSpec"),
            "Stalled",
            true,
            None,
            None,
            Then::Resync,
        ),
        // A pull does not finish the generation; announced when it starts.
        (
            Outcome::InProgress {
                reason: "PullingImage".into(),
                message: "pulling".into(),
                recheck: Duration::from_secs(2),
                announce: "Pulling",
            },
            Some("Creating"),
            "Progressing",
            false,
            Some((Normal, "Pulling")),
            None,
            Then::Requeue(Duration::from_secs(2)),
        ),
        (
            Outcome::InProgress {
                reason: "PullingImage".into(),
                message: "pulling".into(),
                recheck: Duration::from_secs(2),
                announce: "Pulling",
            },
            Some("PullingImage"),
            "Progressing",
            false,
            None,
            None,
            Then::Requeue(Duration::from_secs(2)),
        ),
        // Every retryable failure warns and backs off, the generation unfinished.
        (
            Outcome::failed(provider(ProviderError::transient("500"))),
            Some("ProviderUnavailable"),
            "Progressing",
            false,
            Some((Warning, "ProviderUnavailable")),
            None,
            Then::Retry,
        ),
        (
            Outcome::failed(Error::Kube(kube::Error::LinesCodecMaxLineLengthExceeded)),
            None,
            "Progressing",
            false,
            Some((Warning, "KubeApiError")),
            None,
            Then::Retry,
        ),
        // Anything else stalls, warning once per reason.
        (
            Outcome::failed(provider(ProviderError::invalid("no"))),
            Some("Running"),
            "Stalled",
            true,
            Some((Warning, "ProviderRejected")),
            None,
            Then::Resync,
        ),
        (
            Outcome::failed(provider(ProviderError::invalid("no"))),
            Some("ProviderRejected"),
            "Stalled",
            true,
            None,
            None,
            Then::Resync,
        ),
        // Refused credentials: stalled, looked at again at the backoff ceiling, every kind.
        (
            Outcome::failed(provider(ProviderError::unauthorized("401"))),
            None,
            "Stalled",
            true,
            Some((Warning, "ProviderUnauthorized")),
            None,
            Then::Requeue(CAP),
        ),
        (
            Outcome::failed(provider(ProviderError::unauthorized("401"))),
            Some("ProviderUnauthorized"),
            "Stalled",
            true,
            None,
            None,
            Then::Requeue(CAP),
        ),
        // A held deletion: its condition, one Warning per reason, the error's backoff.
        (
            Outcome::cleanup_blocked("list", provider(ProviderError::invalid("HTTP 405"))),
            Some("ProviderRejected"),
            "Progressing",
            true,
            Some((Warning, CLEANUP_BLOCKED)),
            Some(CLEANUP_BLOCKED),
            Then::Retry,
        ),
        (
            Outcome::cleanup_blocked("list", provider(ProviderError::invalid("HTTP 405"))),
            Some(CLEANUP_BLOCKED),
            "Progressing",
            true,
            None,
            Some(CLEANUP_BLOCKED),
            Then::Retry,
        ),
        (
            Outcome::ObjectGone,
            None,
            "Progressing",
            false,
            None,
            None,
            Then::AwaitChange,
        ),
    ];
    for (outcome, previous, state, finishes, event, hold, then) in rows {
        let d = decide(&outcome, previous);
        let got_state = match d.health {
            Health::Ready { .. } => "Ready",
            Health::Progressing { .. } => "Progressing",
            Health::Stalled { .. } => "Stalled",
            Health::NotReady { .. } => "NotReady",
        };
        let got_event = d.event.as_ref().map(|(t, r, _)| (t.clone(), r.as_str()));
        let want_event = event.map(|(t, r)| (t, r));
        assert_eq!(got_state, state, "{outcome:?}");
        assert_eq!(d.finishes_generation, finishes, "{outcome:?}");
        assert_eq!(
            format!("{got_event:?}"),
            format!("{want_event:?}"),
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
    assert_eq!(d.health.message(), "boom");
    let (_, _, note) = d.event.expect("a failure is an Event");
    assert_eq!(note, "Start failed: boom");
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
