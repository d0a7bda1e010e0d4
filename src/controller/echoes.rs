//! Provider events the controller caused itself, so they do not trigger another reconcile.
//!
//! Every step that changes a sandbox at the provider (create, start, stop, …) makes the
//! provider emit events for it (Docker: `create`, `start`, `kill`/`die`/`stop`, …; each
//! provider names its own words). The
//! reconcile that acted already observes the result after acting, so reconciling again for
//! those events only repeats work: before a step runs, its owner's UID is recorded here with
//! the event words the step produces, and the trigger stream drops an event that matches one
//! of them (each expectation is consumed once). Any other event — a crash, a `docker stop`
//! by hand — still reconciles at once.
//!
//! The price: an event of the same word as one we expect, arriving within [`TTL`] of our own
//! step (a crash's `die` while our own stop is in flight), is taken for ours; the observe
//! after the step, and the periodic resync, still see the real state. Expectations left by a
//! step whose events never came (stopping a sandbox that had already stopped) are dropped
//! when the next reconcile of the same object starts acting, or after [`TTL`].

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::sandbox::decide::Step;
use crate::provider::Change;
use crate::provider::factory::echo_words;

/// How long an expected event stays expected.
pub const TTL: Duration = Duration::from_secs(30);

/// Expected provider event words by owner UID.
#[derive(Default)]
pub struct Echoes {
    expected: Mutex<HashMap<String, Vec<(&'static str, Instant)>>>,
}

/// The event words a step makes the providers with event streams emit. Each provider names
/// its own ([`ProviderKind::echo_words`](crate::provider::ProviderKind::echo_words)); this
/// only says which provider-side change a step is.
pub fn words(step: Step) -> Vec<&'static str> {
    let change = match step {
        Step::Create => Change::Create,
        Step::Start => Change::Start,
        Step::Stop => Change::Stop,
        Step::Destroy => Change::Destroy,
        Step::Hibernate => Change::Hibernate,
        Step::Resume => Change::Resume,
        Step::SetResources => Change::SetResources,
        Step::DeliverEnv | Step::SetEgress | Step::Restore => return Vec::new(),
    };
    echo_words(change)
}

impl Echoes {
    /// Forgets what earlier reconciles of `uid` still expected: a new pass starts acting.
    pub fn begin(&self, uid: &str) {
        self.lock().remove(uid);
    }

    /// Records that `step` is about to run on the sandbox of `uid`.
    pub fn expect(&self, uid: &str, step: Step) {
        let words = words(step);
        if words.is_empty() {
            return;
        }
        let now = Instant::now();
        let mut map = self.lock();
        // Bound the map: expectations older than the TTL go whenever one is added.
        map.retain(|_, v| {
            v.retain(|(_, at)| now.duration_since(*at) < TTL);
            !v.is_empty()
        });
        map.entry(uid.to_string())
            .or_default()
            .extend(words.iter().map(|w| (*w, now)));
    }

    /// Whether `action` on the sandbox of `uid` is one we caused (and consumes it).
    pub fn is_echo(&self, uid: &str, action: &str) -> bool {
        let word = action.split(':').next().unwrap_or(action);
        let now = Instant::now();
        let mut map = self.lock();
        let Some(list) = map.get_mut(uid) else {
            return false;
        };
        list.retain(|(_, at)| now.duration_since(*at) < TTL);
        let found = list.iter().position(|(w, _)| *w == word);
        if let Some(i) = found {
            list.swap_remove(i);
        }
        if list.is_empty() {
            map.remove(uid);
        }
        found.is_some()
    }

    /// How many objects have expectations (for tests and the memory bound).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether nothing is expected.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<(&'static str, Instant)>>> {
        self.expected.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_own_events_are_consumed_once_and_others_pass() {
        let e = Echoes::default();
        e.expect("u1", Step::Create);
        e.expect("u1", Step::Start);
        assert!(e.is_echo("u1", "create"));
        assert!(!e.is_echo("u1", "create"), "consumed once");
        assert!(!e.is_echo("u1", "die"), "a crash is not ours");
        assert!(!e.is_echo("u2", "start"), "another object");
        assert!(e.is_echo("u1", "start"));
        assert!(!e.is_echo("u1", "start"), "a second start is not ours");
    }

    #[test]
    fn fly_words_match_before_the_colon_and_a_new_pass_forgets_leftovers() {
        let e = Echoes::default();
        e.expect("u", Step::Create);
        assert!(e.is_echo("u", "appeared:created"));
        e.expect("u", Step::Stop);
        e.begin("u");
        assert!(
            !e.is_echo("u", "die"),
            "leftovers of an earlier pass are gone"
        );
        assert!(e.is_empty());
    }
}
