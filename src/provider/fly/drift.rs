//! Drift without per-object polling: one listing of the app per interval.
//!
//! The Machines API has no event stream. So the subscription lists the app's machines that
//! carry this operator instance's `managed-by` metadata (`GET /apps/{app}/machines?
//! metadata.sandboxes.dev/managed-by=<instance>`, every page) every `driftIntervalSeconds`
//! (30 s by default), compares each machine's `state`, `instance_id` and latest activity (its
//! `updated_at` and newest event, so a start and a stop between two scans are not missed)
//! with the previous scan, and yields one event per machine that changed, appeared or
//! disappeared — mapped to its owning object through the owner labels in its metadata.
//! Nothing is read per object.
//!
//! Cost: one scan is `ceil(n / 500)` requests for `n` machines (one, where the API answers the
//! whole list at once); at 10,000 machines that is 20 requests every 30 s (0.67 requests/s)
//! moving roughly 20-40 MB of JSON (a machine with its
//! config and recent events is 2-4 KB), independent of how many objects changed. A longer
//! interval trades drift latency for that traffic; the controllers' periodic resync remains
//! the safety net either way.
//!
//! The first scan only records the baseline. A failed scan ends the stream with the error;
//! the caller resubscribes with backoff (and a fresh baseline).

use std::collections::HashMap;
use std::time::Duration;

use futures::stream::{self, BoxStream, StreamExt};

use super::FlyProvider;
use super::wire::Machine;
use crate::provider::labels::{MANAGED_BY, Owner};
use crate::provider::{Change, ProviderEvent, ProviderEvents, ProviderResult};

/// What a scan remembers of one machine.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    state: String,
    instance_id: String,
    /// `updated_at` and the newest event's timestamp: moves with any activity.
    activity: (Option<String>, i64),
    owner: Option<Owner>,
}

fn seen(machine: &Machine) -> Seen {
    Seen {
        state: machine.state.clone(),
        instance_id: machine.instance_id.clone(),
        activity: (
            machine.updated_at.clone(),
            machine
                .events
                .iter()
                .map(|e| e.timestamp)
                .max()
                .unwrap_or(0),
        ),
        owner: Owner::from_labels(&machine.read().metadata),
    }
}

/// The words the scan reports (before any `:`) when the operator itself makes `change` (see
/// [`ProviderKind::echo_words`](crate::provider::ProviderKind::echo_words)): a new machine
/// `appeared`, a changed one by its new state, a replaced one `updated`, a gone one
/// `destroyed`.
pub(crate) fn echo_words(change: Change) -> &'static [&'static str] {
    match change {
        Change::Create => &["appeared"],
        Change::Start | Change::Resume => &["started"],
        Change::Stop => &["stopped"],
        Change::Destroy => &["destroyed"],
        Change::Hibernate => &["stopped", "suspended"],
        Change::SetResources => &["updated"],
    }
}

/// The events between two scans.
fn changes(before: &HashMap<String, Seen>, now: &HashMap<String, Seen>) -> Vec<ProviderEvent> {
    let mut events = Vec::new();
    for (id, current) in now {
        let action = match before.get(id) {
            None => format!("appeared:{}", current.state),
            Some(old) if old.instance_id != current.instance_id => "updated".to_string(),
            Some(old) if old.state != current.state || old.activity != current.activity => {
                current.state.clone()
            }
            Some(_) => continue,
        };
        if let Some(owner) = &current.owner {
            events.push(ProviderEvent {
                owner: owner.clone(),
                action,
            });
        }
    }
    for (id, old) in before {
        if !now.contains_key(id)
            && let Some(owner) = &old.owner
        {
            events.push(ProviderEvent {
                owner: owner.clone(),
                action: "destroyed".into(),
            });
        }
    }
    events
}

/// The subscription's state between two scans.
enum Step {
    /// Scan next (after the interval, unless this is the first scan).
    Scan {
        provider: Box<FlyProvider>,
        instance: String,
        baseline: Option<HashMap<String, Seen>>,
    },
    /// A scan failed: the stream ends.
    Done,
}

async fn step(step: Step) -> Option<(Vec<ProviderResult<ProviderEvent>>, Step)> {
    let Step::Scan {
        provider,
        instance,
        baseline,
    } = step
    else {
        return None;
    };
    if baseline.is_some() {
        tokio::time::sleep(Duration::from_secs(
            provider.settings.drift_interval_seconds,
        ))
        .await;
    }
    let filter = [(MANAGED_BY.to_string(), instance.clone())];
    let machines = match provider.list_machines(&filter).await {
        Ok(m) => m,
        Err(e) => return Some((vec![Err(e)], Step::Done)),
    };
    let now: HashMap<String, Seen> = machines
        .iter()
        .filter(|m| m.state != "destroyed")
        .map(|m| (m.id.clone(), seen(m)))
        .collect();
    let events = match &baseline {
        None => Vec::new(),
        Some(before) => changes(before, &now).into_iter().map(Ok).collect(),
    };
    Some((
        events,
        Step::Scan {
            provider,
            instance,
            baseline: Some(now),
        },
    ))
}

impl ProviderEvents for FlyProvider {
    /// See the module docs.
    fn subscribe(&self, instance: &str) -> BoxStream<'static, ProviderResult<ProviderEvent>> {
        let first = Step::Scan {
            provider: Box::new(self.clone()),
            instance: instance.to_string(),
            baseline: None,
        };
        stream::unfold(first, step).flat_map(stream::iter).boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(uid: &str) -> Owner {
        Owner {
            instance: "ops".into(),
            kind: "Sandbox".into(),
            namespace: "ns".into(),
            name: "s".into(),
            uid: uid.into(),
        }
    }

    fn at(state: &str, instance: &str, uid: &str) -> Seen {
        Seen {
            state: state.into(),
            instance_id: instance.into(),
            activity: (None, 1),
            owner: Some(owner(uid)),
        }
    }

    #[test]
    fn only_changed_appeared_and_vanished_machines_yield_events_even_after_a_round_trip() {
        let before = HashMap::from([
            ("a".to_string(), at("started", "1", "ua")),
            ("b".to_string(), at("started", "1", "ub")),
            ("c".to_string(), at("stopped", "1", "uc")),
            ("d".to_string(), at("started", "1", "ud")),
            ("f".to_string(), at("stopped", "1", "uf")),
        ]);
        let now = HashMap::from([
            ("a".to_string(), at("started", "1", "ua")),
            ("b".to_string(), at("stopped", "1", "ub")),
            ("c".to_string(), at("stopped", "2", "uc")),
            ("e".to_string(), at("created", "1", "ue")),
            (
                "f".to_string(),
                Seen {
                    activity: (None, 2),
                    ..at("stopped", "1", "uf")
                },
            ),
        ]);
        let mut got: Vec<(String, String)> = changes(&before, &now)
            .into_iter()
            .map(|e| (e.owner.uid, e.action))
            .collect();
        got.sort();
        assert_eq!(
            got,
            [
                ("ub".to_string(), "stopped".to_string()),
                ("uc".into(), "updated".into()),
                ("ud".into(), "destroyed".into()),
                ("ue".into(), "appeared:created".into()),
                ("uf".into(), "stopped".into()),
            ]
        );
    }
}
