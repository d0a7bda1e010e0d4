//! Publishing events.k8s.io Events with de-duplication in bounded memory.
//!
//! A repeat of an Event (same type, reason, action and object) within [`TTL`] is not a new
//! object: the first one's `series` is patched (count, last time), as kube-runtime's recorder
//! does. That recorder, though, keeps a whole Event per key for minutes with no bound — at
//! thousands of objects, one Event each, that is megabytes held for nothing. This one keeps
//! only what a repeat needs (the Event's name and namespace, the count, when it was last
//! seen) for at most [`CAPACITY`] keys; past that the least recently seen key is forgotten,
//! and its next repeat simply starts a new Event.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Reporter};

/// How long a repeat still joins the earlier Event's series.
pub const TTL: Duration = Duration::from_secs(360);
/// How many Event keys are remembered at most.
pub const CAPACITY: usize = 2048;

/// What a repeat of an Event needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// The Event object's name.
    pub name: String,
    /// How many times it happened (1 for a new Event).
    pub count: i32,
}

/// Recently published Events by key, bounded in number and age.
#[derive(Debug, Default)]
pub struct Recent {
    entries: HashMap<u64, (Seen, Instant)>,
}

impl Recent {
    /// Records one occurrence of `key` at `now`: `Some` with the earlier Event (its count
    /// raised) when this is a repeat within the TTL, `None` for a new Event — which the caller
    /// then names and records with [`Recent::insert`].
    pub fn repeat(&mut self, key: u64, now: Instant) -> Option<Seen> {
        self.entries
            .retain(|_, (_, last)| now.duration_since(*last) < TTL);
        let (seen, last) = self.entries.get_mut(&key)?;
        seen.count = seen.count.saturating_add(1);
        *last = now;
        Some(seen.clone())
    }

    /// Remembers a new Event, forgetting the least recently seen one beyond [`CAPACITY`].
    pub fn insert(&mut self, key: u64, name: String, now: Instant) {
        if self.entries.len() >= CAPACITY
            && !self.entries.contains_key(&key)
            && let Some(oldest) = self
                .entries
                .iter()
                .min_by_key(|(_, (_, last))| *last)
                .map(|(k, _)| *k)
        {
            self.entries.remove(&oldest);
        }
        self.entries.insert(key, (Seen { name, count: 1 }, now));
    }

    /// How many keys are remembered.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Publishes Events as one reporter (clones share what they remember).
#[derive(Clone)]
pub struct Recorder {
    client: Client,
    reporter: Reporter,
    recent: Arc<Mutex<Recent>>,
}

impl Recorder {
    /// A recorder publishing as `reporter`.
    pub fn new(client: Client, reporter: Reporter) -> Self {
        Recorder {
            client,
            reporter,
            recent: Arc::default(),
        }
    }

    /// Publishes `ev` about `regarding`: a new Event, or a repeat patched into the series of
    /// the earlier one.
    pub async fn publish(
        &self,
        ev: &Event,
        regarding: &ObjectReference,
    ) -> Result<(), kube::Error> {
        let key = key(ev, regarding);
        let now = Instant::now();
        let repeat = self
            .recent
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .repeat(key, now);
        let namespace = regarding
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let api: Api<K8sEvent> = Api::namespaced(self.client.clone(), &namespace);
        let time = MicroTime(Timestamp::now());
        match repeat {
            Some(seen) => {
                let patch = K8sEvent {
                    series: Some(EventSeries {
                        count: seen.count,
                        last_observed_time: time,
                    }),
                    ..K8sEvent::default()
                };
                api.patch(&seen.name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
            }
            None => {
                let event = self.new_event(ev, regarding, time);
                let name = event.metadata.name.clone().unwrap_or_default();
                api.create(&PostParams::default(), &event).await?;
                self.recent
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(key, name, now);
            }
        }
        Ok(())
    }

    fn new_event(&self, ev: &Event, regarding: &ObjectReference, time: MicroTime) -> K8sEvent {
        let controller = self.reporter.controller.clone();
        K8sEvent {
            action: Some(ev.action.clone()),
            reason: Some(ev.reason.clone()),
            note: ev.note.clone(),
            event_time: Some(time.clone()),
            regarding: Some(regarding.clone()),
            related: ev.secondary.clone(),
            metadata: ObjectMeta {
                namespace: regarding.namespace.clone(),
                name: Some(format!(
                    "{}.{:x}",
                    regarding.name.as_deref().unwrap_or(&controller),
                    time.0.as_nanosecond()
                )),
                ..ObjectMeta::default()
            },
            reporting_instance: Some(
                self.reporter
                    .instance
                    .clone()
                    .unwrap_or_else(|| controller.clone()),
            ),
            reporting_controller: Some(controller),
            type_: Some(
                match ev.type_ {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                }
                .into(),
            ),
            ..K8sEvent::default()
        }
    }
}

/// An Event's identity for de-duplication: type, reason, action and the object.
fn key(ev: &Event, regarding: &ObjectReference) -> u64 {
    let mut h = DefaultHasher::new();
    matches!(ev.type_, EventType::Warning).hash(&mut h);
    ev.reason.hash(&mut h);
    ev.action.hash(&mut h);
    regarding.kind.hash(&mut h);
    regarding.namespace.hash(&mut h);
    regarding.name.hash(&mut h);
    regarding.uid.hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeats_join_the_series_within_the_ttl() {
        let mut r = Recent::default();
        let t0 = Instant::now();
        assert_eq!(r.repeat(1, t0), None);
        r.insert(1, "e1".into(), t0);
        assert_eq!(
            r.repeat(1, t0 + Duration::from_secs(10)),
            Some(Seen {
                name: "e1".into(),
                count: 2
            })
        );
        assert_eq!(
            r.repeat(1, t0 + Duration::from_secs(11)).map(|s| s.count),
            Some(3)
        );
        assert_eq!(
            r.repeat(1, t0 + Duration::from_secs(11) + TTL),
            None,
            "expired"
        );
        assert!(r.is_empty(), "expired keys are dropped");
    }

    #[test]
    fn memory_is_bounded_and_the_least_recently_seen_key_goes_first() {
        let mut r = Recent::default();
        let t0 = Instant::now();
        for k in 0..CAPACITY as u64 {
            r.insert(k, format!("e{k}"), t0 + Duration::from_millis(k));
        }
        // Key 0 is seen again: now the most recent.
        let later = t0 + Duration::from_secs(5);
        assert!(r.repeat(0, later).is_some());
        r.insert(u64::MAX, "new".into(), later);
        assert_eq!(r.len(), CAPACITY, "never more than the capacity");
        assert!(r.repeat(0, later).is_some(), "a recent key is kept");
        assert!(
            r.repeat(1, later).is_none(),
            "the least recently seen one went"
        );
        assert!(r.repeat(u64::MAX, later).is_some());
    }
}
