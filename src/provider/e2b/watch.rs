//! The watch: one paginated list of each operator instance's sandboxes per interval, which
//! keeps the running ones alive and reports what changed (see the module docs of `e2b`).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Weak};

use chrono::Utc;
use futures::stream::{self, BoxStream, StreamExt};
use tokio::sync::broadcast::error::RecvError;

use super::api::{Listed, metadata_filter};
use super::{E2bProvider, Inner, lock};
use crate::provider::labels::{MANAGED_BY, Owner};
use crate::provider::{ErrorKind, ProviderError, ProviderEvent, ProviderEvents, ProviderResult};

/// Timeout refreshes in flight at once.
const REFRESH_CONCURRENCY: usize = 8;

/// Starts the watch when a Tokio runtime is running. It holds only a weak reference, so it
/// ends with the last clone of the provider.
pub(super) fn spawn(inner: &Arc<Inner>) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let weak: Weak<Inner> = Arc::downgrade(inner);
    let interval = inner.settings.watch_interval();
    runtime.spawn(async move {
        let mut seen: HashMap<String, Look> = HashMap::new();
        loop {
            tokio::time::sleep(interval).await;
            let Some(inner) = weak.upgrade() else { return };
            inner.watch_pass(&mut seen).await;
        }
    });
}

/// When to refresh: when less than this is left of the timeout.
fn refresh_threshold(timeout_secs: u64, interval_secs: u64) -> chrono::Duration {
    let secs = (timeout_secs / 2).max(3 * interval_secs).min(timeout_secs);
    chrono::Duration::seconds(secs as i64)
}

/// One look at an instance's sandboxes: id → (state, owner read from its labels).
type Look = BTreeMap<String, (String, Option<Owner>)>;

/// What changed between two looks: (owner, new state or `killed`). Sandboxes without owner
/// labels concern no object and are left out.
fn changes(before: &Look, now: &Look) -> Vec<(Owner, String)> {
    let changed = now
        .iter()
        .filter(|(id, (state, _))| before.get(*id).map(|b| &b.0) != Some(state))
        .filter_map(|(_, (state, owner))| Some((owner.clone()?, state.clone())));
    let gone = before
        .iter()
        .filter(|(id, _)| !now.contains_key(*id))
        .filter_map(|(_, (_, owner))| Some((owner.clone()?, "killed".to_string())));
    changed.chain(gone).collect()
}

impl Inner {
    /// One pass over every known instance.
    async fn watch_pass(&self, seen: &mut HashMap<String, Look>) {
        let instances: Vec<String> = lock(&self.instances).iter().cloned().collect();
        for instance in instances {
            let filter = metadata_filter(&BTreeMap::from([(MANAGED_BY.into(), instance.clone())]));
            let listed = match self.api.list(&filter, &[]).await {
                Ok(listed) => listed,
                Err(e) => {
                    tracing::warn!(provider = %self.name, %instance, error = %e, "E2B watch could not list sandboxes");
                    let _ = self.events.send((instance, Err(e.to_string())));
                    continue;
                }
            };
            for l in &listed {
                self.own(&l.sandbox_id, l.metadata.as_ref());
            }
            self.keep_alive(&listed).await;
            self.report(&instance, &listed, seen);
        }
    }

    /// Refreshes the timeout of every running sandbox nearing it.
    async fn keep_alive(&self, listed: &[Listed]) {
        let threshold = refresh_threshold(
            self.settings.timeout_secs,
            self.settings.watch_interval_secs,
        );
        let now = Utc::now();
        let due: Vec<String> = listed
            .iter()
            // A listing that omits `endAt` gets the refresh: a needless one costs a call, a
            // missed one a sandbox.
            .filter(|l| l.state == "running" && l.end_at.is_none_or(|end| end - now < threshold))
            .map(|l| l.sandbox_id.clone())
            .collect();
        let secs = self.settings.timeout_secs;
        let results: Vec<(String, ProviderResult<()>)> = stream::iter(due)
            .map(|id| {
                let api = self.api.clone();
                async move {
                    let result = api.set_timeout(&id, secs).await;
                    (id, result)
                }
            })
            .buffer_unordered(REFRESH_CONCURRENCY)
            .collect()
            .await;
        for (id, result) in results {
            match result {
                Ok(()) => {}
                // Killed or paused since the list: nothing to keep alive.
                Err(e) if e.is(ErrorKind::NotFound) => {}
                Err(e) => {
                    tracing::warn!(provider = %self.name, sandbox = %id, error = %e, "E2B keep-alive could not refresh a sandbox's timeout");
                }
            }
        }
    }

    /// Sends an event for each sandbox whose state changed since the last pass (none on the
    /// first pass: the controllers list everything once when they start).
    fn report(&self, instance: &str, listed: &[Listed], seen: &mut HashMap<String, Look>) {
        let now: Look = listed
            .iter()
            .map(|l| {
                let owner = l.metadata.as_ref().and_then(Owner::from_labels);
                (l.sandbox_id.clone(), (l.state.clone(), owner))
            })
            .collect();
        if let Some(before) = seen.get(instance) {
            // Forget the owners of sandboxes that vanished between the two lists.
            lock(&self.owners).retain(|id, _| now.contains_key(id) || !before.contains_key(id));
            for (owner, action) in changes(before, &now) {
                let event = ProviderEvent { owner, action };
                let _ = self.events.send((instance.to_string(), Ok(event)));
            }
        }
        seen.insert(instance.to_string(), now);
    }
}

impl ProviderEvents for E2bProvider {
    /// What this provider did itself (`create`, `resume`, `stop`, `pause`, `destroy`) as it
    /// does it, and drift as the watch sees it: `running`, `paused` or `killed` for each
    /// sandbox of `instance` whose state changed between two lists; an `Err` when a list
    /// failed.
    fn subscribe(&self, instance: &str) -> BoxStream<'static, ProviderResult<ProviderEvent>> {
        self.inner.learn(instance);
        let rx = self.inner.events.subscribe();
        let instance = instance.to_string();
        stream::unfold((rx, instance), |(mut rx, instance)| async move {
            loop {
                match rx.recv().await {
                    Ok((for_instance, notice)) if for_instance == instance => {
                        let item = notice.map_err(|e| {
                            ProviderError::transient(format!("E2B watch could not look: {e}"))
                        });
                        return Some((item, (rx, instance)));
                    }
                    Ok(_) => {}
                    Err(RecvError::Lagged(missed)) => {
                        let err = ProviderError::transient(format!(
                            "E2B watch events were dropped ({missed} missed); resubscribe"
                        ));
                        return Some((Err(err), (rx, instance)));
                    }
                    Err(RecvError::Closed) => return None,
                }
            }
        })
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refresh_when_half_the_timeout_or_three_passes_are_left() {
        assert_eq!(refresh_threshold(300, 30), chrono::Duration::seconds(150));
        assert_eq!(refresh_threshold(6, 2), chrono::Duration::seconds(6));
        assert_eq!(refresh_threshold(3600, 30), chrono::Duration::seconds(1800));
    }

    #[test]
    fn changes_report_new_states_and_disappearances_of_owned_sandboxes() {
        let owner = |n: &str| Owner {
            instance: "i".into(),
            kind: "Sandbox".into(),
            namespace: "ns".into(),
            name: n.into(),
            uid: n.into(),
        };
        let look = |pairs: &[(&str, &str, bool)]| -> Look {
            pairs
                .iter()
                .map(|(id, state, owned)| {
                    (
                        id.to_string(),
                        (state.to_string(), owned.then(|| owner(id))),
                    )
                })
                .collect()
        };
        let before = look(&[
            ("a", "running", true),
            ("b", "running", true),
            ("c", "paused", true),
            ("x", "running", false),
        ]);
        let now = look(&[
            ("a", "running", true),
            ("b", "paused", true),
            ("d", "running", true),
        ]);
        let mut got: Vec<(String, String)> = changes(&before, &now)
            .into_iter()
            .map(|(o, a)| (o.name, a))
            .collect();
        got.sort();
        assert_eq!(
            got,
            vec![
                ("b".to_string(), "paused".to_string()),
                ("c".to_string(), "killed".to_string()),
                ("d".to_string(), "running".to_string())
            ]
        );
    }
}
