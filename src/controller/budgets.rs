//! The controller side of `SandboxBudget`s: admission before a Sandbox's first provider call,
//! the budgets' status, and waking waiting Sandboxes when room may have freed up. The rules
//! themselves are pure, in [`super::sandbox::budget`].
//!
//! - **Consistency.** Reconciles run concurrently, and the watch cache shows an admission only
//!   after its status write comes back. Each decision is therefore taken under one lock, over
//!   the cache *and* the set of Sandboxes this process admitted whose record the cache may not
//!   show yet; the decision itself awaits nothing, so the lock is held for microseconds.
//! - **Waking.** Every watch event of a Sandbox or SandboxBudget marks its namespace; a
//!   refresher recomputes that namespace from the caches, writes each budget's status when it
//!   changed, and queues a reconcile of every waiting Sandbox there. At idle there are no
//!   events, so nothing runs: no polling, no provider call.
//! - **Fail closed.** Until the budgets have been listed, no Sandbox is admitted.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

use futures::channel::mpsc;
use futures::{Stream, StreamExt};
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};

use super::outcome::Outcome;
use super::sandbox::budget::{self, Entry, Limit, Size, Standing, Verdict};
use super::{Context, Error};
use crate::api::{
    BudgetAmounts, BudgetUsage, Sandbox, SandboxBudget, SandboxBudgetStatus, condition,
};
use crate::controller::status::READY;
use crate::registry::ProviderRegistry;

/// How long an admission waits for the first listing of the budgets.
const SYNC_WAIT: Duration = Duration::from_secs(10);

/// The budgets' cache, the Sandboxes' cache, and the admissions not yet in the cache.
pub struct Budgets {
    sandboxes: Store<Sandbox>,
    budgets: Store<SandboxBudget>,
    /// UIDs admitted by this process; dropped once the cache shows their record.
    admitted: Mutex<HashSet<String>>,
    wake: mpsc::UnboundedSender<ObjectRef<Sandbox>>,
}

/// The namespace a watch event concerns, if any.
pub fn touched<K: ResourceExt>(event: &watcher::Event<K>) -> Option<String> {
    match event {
        watcher::Event::Apply(o) | watcher::Event::Delete(o) | watcher::Event::InitApply(o) => {
            o.namespace()
        }
        watcher::Event::Init | watcher::Event::InitDone => None,
    }
}

/// The SandboxBudget watch (in `namespace`, or everywhere) into a cache; the stream marks
/// the namespace of each change in `dirty` and must be driven.
pub fn watch(
    ctx: &Context,
    namespace: &Option<String>,
    dirty: mpsc::UnboundedSender<String>,
) -> (
    Store<SandboxBudget>,
    impl Stream<Item = ()> + Send + 'static,
) {
    let api: Api<SandboxBudget> = match namespace {
        Some(ns) => Api::namespaced(ctx.client.clone(), ns),
        None => Api::all(ctx.client.clone()),
    };
    let (reader, writer) = reflector::store();
    let stream = watcher(api, watcher::Config::default().any_semantic())
        .default_backoff()
        .reflect(writer)
        .map(move |event| match event {
            Ok(e) => {
                if let Some(ns) = touched(&e) {
                    let _ = dirty.unbounded_send(ns);
                }
            }
            Err(err) => tracing::warn!(%err, "SandboxBudget watch failed; retrying"),
        });
    (reader, stream)
}

impl Budgets {
    /// Admission over these caches; waiting Sandboxes are woken through `wake`.
    pub fn new(
        sandboxes: Store<Sandbox>,
        budgets: Store<SandboxBudget>,
        wake: mpsc::UnboundedSender<ObjectRef<Sandbox>>,
    ) -> Self {
        Budgets {
            sandboxes,
            budgets,
            admitted: Mutex::default(),
            wake,
        }
    }

    /// Admits `sandbox` (whose status is the reconcile's latest) or says why it waits.
    pub async fn admit(
        &self,
        sandbox: &Sandbox,
        providers: &ProviderRegistry,
    ) -> Result<(), Outcome> {
        let ready = tokio::time::timeout(SYNC_WAIT, async {
            self.budgets.wait_until_ready().await?;
            self.sandboxes.wait_until_ready().await
        })
        .await;
        if !matches!(ready, Ok(Ok(()))) {
            return Err(Outcome::waiting(
                budget::OVER_BUDGET,
                "the SandboxBudgets of this namespace have not been listed yet (is the \
                 sandboxbudgets.sandboxes.dev CRD installed?); no Sandbox starts before they are",
                super::sandbox::apply::WAIT,
            ));
        }
        let ns = sandbox.namespace().unwrap_or_default();
        let limits = self.limits(&ns);
        let uid = sandbox.uid().unwrap_or_default();
        let mut admitted = self.admitted.lock().map_err(|_| poisoned())?;
        if limits.is_empty() || !budget::needs_admission(sandbox, admitted.contains(&uid)) {
            return Ok(());
        }
        let candidate = Entry {
            size: size_strict(sandbox, providers)
                .map_err(|msg| Outcome::stalled("InvalidSpec", msg))?,
            ..self.entry(sandbox, &admitted, providers)
        };
        let others = self.entries(&ns, &admitted, providers, Some(&sandbox.name_any()));
        match budget::admit(&candidate, &others, &limits) {
            Verdict::Admit => {
                admitted.insert(uid);
                Ok(())
            }
            Verdict::Wait(why) => Err(Outcome::waiting(budget::OVER_BUDGET, why, None)),
            Verdict::Unsized(why) => Err(Outcome::stalled(budget::UNSIZED, why)),
        }
    }

    /// The ceilings of every SandboxBudget in `ns`, by name.
    fn limits(&self, ns: &str) -> Vec<Limit> {
        let mut limits: Vec<Limit> = self
            .budgets
            .state()
            .iter()
            .filter(|b| b.namespace().as_deref() == Some(ns))
            .map(|b| limit(&b.name_any(), &b.spec.hard))
            .collect();
        limits.sort_by(|a, b| a.budget.cmp(&b.budget));
        limits
    }

    /// Every Sandbox of `ns` but `except`, as admission sees it (and prunes the admissions the
    /// cache now shows, or whose Sandbox is gone).
    fn entries(
        &self,
        ns: &str,
        admitted: &HashSet<String>,
        providers: &ProviderRegistry,
        except: Option<&str>,
    ) -> Vec<Entry> {
        self.sandboxes
            .state()
            .iter()
            .filter(|s| s.namespace().as_deref() == Some(ns))
            .filter(|s| except != Some(s.name_any().as_str()))
            .map(|s| self.entry(s, admitted, providers))
            .collect()
    }

    fn entry(
        &self,
        s: &Sandbox,
        admitted: &HashSet<String>,
        providers: &ProviderRegistry,
    ) -> Entry {
        let here = s.uid().is_some_and(|u| admitted.contains(&u));
        Entry {
            name: s.name_any(),
            created: s
                .metadata
                .creation_timestamp
                .as_ref()
                .map_or(0, |t| t.0.as_second()),
            size: size_strict(s, providers).unwrap_or_default(),
            standing: budget::standing(s, here),
        }
    }

    /// Forgets admissions the cache now shows (or whose Sandbox is gone).
    fn prune(&self) {
        let Ok(mut admitted) = self.admitted.lock() else {
            return;
        };
        let cached = self.sandboxes.state();
        admitted.retain(|uid| {
            cached
                .iter()
                .find(|s| s.uid().as_deref() == Some(uid.as_str()))
                .is_some_and(|s| budget::needs_admission(s, false))
        });
    }

    /// Recomputes namespace `ns`: writes its budgets' status where it changed and wakes its
    /// waiting Sandboxes.
    async fn refresh_namespace(&self, ctx: &Context, ns: &str) {
        self.prune();
        // No budget, no queue: only Sandboxes that waited on a budget now gone are woken (a
        // new Sandbox's own watch event reconciles it once, as without budgets).
        if self.limits(ns).is_empty() {
            self.wake_over_budget(ns);
            return;
        }
        let entries = match self.admitted.lock() {
            Ok(admitted) => self.entries(ns, &admitted, &ctx.providers, None),
            Err(_) => return,
        };
        let used = budget::used(&entries);
        let waiting = entries.iter().filter(|e| e.standing == Standing::Waiting);
        for e in waiting.clone() {
            let _ = self.wake.unbounded_send(ObjectRef::new(&e.name).within(ns));
        }
        let waiting = i64::try_from(waiting.count()).unwrap_or(i64::MAX);
        let api: Api<SandboxBudget> = Api::namespaced(ctx.client.clone(), ns);
        for b in self
            .budgets
            .state()
            .iter()
            .filter(|b| b.namespace().as_deref() == Some(ns))
        {
            let next = status_of(b, &used, waiting);
            let current = b.status.as_ref();
            if let Err(err) =
                super::status::write_returning(&api, &b.name_any(), current, &next).await
            {
                tracing::warn!(%err, budget = %b.name_any(), namespace = ns, "cannot write SandboxBudget status");
            }
        }
    }

    /// Wakes the Sandboxes of `ns` whose Ready condition says they wait for a budget.
    fn wake_over_budget(&self, ns: &str) {
        let waiting = self.sandboxes.state().into_iter().filter(|s| {
            let status = s.status.as_ref();
            let ready = status.and_then(|st| condition(&st.conditions, READY));
            s.namespace().as_deref() == Some(ns)
                && ready.is_some_and(|c| c.reason == budget::OVER_BUDGET)
        });
        for s in waiting {
            let _ = self
                .wake
                .unbounded_send(ObjectRef::new(&s.name_any()).within(ns));
        }
    }

    /// Runs until `dirty` ends: each batch of marked namespaces is recomputed once.
    pub async fn refresh(&self, ctx: &Context, mut dirty: mpsc::UnboundedReceiver<String>) {
        while let Some(first) = dirty.next().await {
            let mut batch = HashSet::from([first]);
            while let Ok(ns) = dirty.try_recv() {
                batch.insert(ns);
            }
            if self.sandboxes.wait_until_ready().await.is_err() {
                return;
            }
            for ns in batch {
                self.refresh_namespace(ctx, &ns).await;
            }
        }
    }
}

fn poisoned() -> Outcome {
    Outcome::failed(Error::Dependency(
        "the budget admission lock is poisoned".into(),
    ))
}

/// `s`'s size: its spec, each missing field from its provider's default; `Err` names a
/// field that does not parse.
fn size_strict(s: &Sandbox, providers: &ProviderRegistry) -> Result<Size, String> {
    let spec = super::sandbox::build::resources(&s.spec)?;
    let provider = s
        .status
        .as_ref()
        .and_then(|st| st.provider.as_deref())
        .or(s.spec.provider.as_deref());
    let default = providers
        .resolve(provider)
        .map(|h| h.provider.default_resources())
        .unwrap_or_default();
    Ok(Size::of(&spec, &default))
}

/// A budget's ceilings in admission's units (a ceiling that does not parse limits nothing:
/// the schema's pattern keeps that from reaching here).
fn limit(name: &str, hard: &BudgetAmounts) -> Limit {
    Limit {
        budget: name.to_string(),
        cpu_millis: hard.cpu.as_ref().and_then(|q| q.to_millis().ok()),
        memory_bytes: hard.memory.as_ref().and_then(|q| q.to_bytes().ok()),
        sandboxes: hard.sandboxes.and_then(|n| u64::try_from(n).ok()),
    }
}

/// The status of budget `b`: its ceilings, and the use of the ones it sets.
fn status_of(b: &SandboxBudget, used: &budget::Used, waiting: i64) -> SandboxBudgetStatus {
    let hard = &b.spec.hard;
    SandboxBudgetStatus {
        observed_generation: b.metadata.generation,
        hard: Some(hard.clone()),
        used: Some(BudgetUsage {
            cpu: hard.cpu.as_ref().map(|_| format!("{}m", used.cpu_millis)),
            memory: hard.memory.as_ref().map(|_| used.memory_bytes.to_string()),
            sandboxes: hard
                .sandboxes
                .map(|_| i64::try_from(used.sandboxes).unwrap_or(i64::MAX)),
        }),
        waiting,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{SandboxBudgetSpec, SandboxSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn sandbox(name: &str, second: i64) -> Sandbox {
        let mut s = Sandbox::new(name, SandboxSpec::default());
        s.metadata.namespace = Some("a".into());
        s.metadata.uid = Some(format!("uid-{name}"));
        s.metadata.creation_timestamp = Some(Time(
            k8s_openapi::jiff::Timestamp::from_second(second).unwrap(),
        ));
        s
    }

    /// A gate over caches holding `sandboxes` and one budget of `max` Sandboxes in `a`.
    fn gate(sandboxes: &[Sandbox], max: i64) -> Budgets {
        let (cache, mut writer) = reflector::store();
        writer.apply_watcher_event(&watcher::Event::Init);
        for s in sandboxes {
            writer.apply_watcher_event(&watcher::Event::InitApply(s.clone()));
        }
        writer.apply_watcher_event(&watcher::Event::InitDone);
        let (budgets, mut bw) = reflector::store();
        let mut b = SandboxBudget::new(
            "team",
            SandboxBudgetSpec {
                hard: BudgetAmounts {
                    sandboxes: Some(max),
                    ..BudgetAmounts::default()
                },
            },
        );
        b.metadata.namespace = Some("a".into());
        bw.apply_watcher_event(&watcher::Event::Init);
        bw.apply_watcher_event(&watcher::Event::InitApply(b));
        bw.apply_watcher_event(&watcher::Event::InitDone);
        let (wake, _) = mpsc::unbounded();
        Budgets::new(cache, budgets, wake)
    }

    #[tokio::test]
    async fn an_admission_the_cache_does_not_show_yet_still_takes_its_place() {
        let (one, two) = (sandbox("one", 1), sandbox("two", 2));
        let gate = gate(&[one.clone(), two.clone()], 1);
        let providers = ProviderRegistry::new();
        // `two` came later: it waits behind `one`, which is not reconciled yet.
        assert!(gate.admit(&two, &providers).await.is_err());
        assert!(gate.admit(&one, &providers).await.is_ok());
        // The cache still shows `one` unrecorded; the admission in memory counts it.
        let Err(Outcome::Waiting {
            reason, message, ..
        }) = gate.admit(&two, &providers).await
        else {
            panic!("the budget is full");
        };
        assert_eq!(reason, budget::OVER_BUDGET);
        assert!(message.contains("sandboxes 1 of 1"), "{message}");
        // Admitted once is admitted: its next pass goes on.
        assert!(gate.admit(&one, &providers).await.is_ok());
    }

    #[test]
    fn status_reports_only_what_the_budget_limits() {
        let b = SandboxBudget::new(
            "team",
            SandboxBudgetSpec {
                hard: BudgetAmounts {
                    cpu: Some("2".into()),
                    ..BudgetAmounts::default()
                },
            },
        );
        let used = budget::Used {
            cpu_millis: 1500,
            memory_bytes: 1 << 30,
            sandboxes: 2,
        };
        let status = status_of(&b, &used, 3);
        let u = status.used.unwrap();
        assert_eq!(u.cpu.as_deref(), Some("1500m"));
        assert_eq!((u.memory, u.sandboxes, status.waiting), (None, None, 3));
    }
}
