//! The sweeper: reclaims what a provider holds that no object owns any more — orphaned
//! sandboxes, never-started wreckage of interrupted creates, unattached volumes and unused
//! templates — without ever deleting a user's data on a wrong guess.
//!
//! Interrupted creates, operator crashes, finalizers removed by hand and namespaces deleted
//! while the operator was down all leave provider resources behind, and left alone they fill
//! disks. One pass over one provider is a pipeline like a reconcile:
//!
//! 1. **enumerate** ([`observe::enumerate`]): the provider's `inventory` (by default
//!    `find`, `list_volumes` and `list_templates`; Docker lists its containers once for all
//!    three) of resources labelled `sandboxes.dev/managed-by=<this instance>` — anything
//!    without that label (another instance's, unlabelled, foreign) is never even a candidate;
//! 2. **read the owners** ([`owners::OwnerSource`]; in the operator [`observe::owner_facts`]):
//!    one paginated metadata list per kind and namespace, straight from the API server (the
//!    sweeper has no cache);
//! 3. **decide** ([`decide::decide`], pure and table-tested): which resources are orphans,
//!    wreckage, reclaimable volumes or templates, which are kept and why, and which are
//!    deferred by the per-pass cap;
//! 4. **prove, then act** (`prove`): right before each deletion a sandbox is described
//!    again by itself ([`observe::reread`]) and judged again — a listing may omit what a
//!    description shows, so if the description does not make it deletable too, or the
//!    describe fails, it is kept and its row says why — and its owner is read
//!    again directly by namespace/name and compared by UID: it must still be gone, or, for
//!    never-started wreckage, must not name the resource as its current sandbox
//!    (`status.sandboxId`). A dry run proves too, so it lists exactly what a real pass
//!    deletes. Then the provider deletes (its own checks still apply: an attached volume or
//!    an in-use template is refused), and every deletion is an Event (on the owner, which
//!    the labels name even when it is gone) and a metric by category and outcome.
//!
//! A failure in step 1 or 2 aborts the pass before anything is deleted: it is logged,
//! counted in `sandbox_operator_sweep_aborted_total{reason}`, and reported. A pass never
//! deletes on a partial picture.
//!
//! Volumes labelled `sandboxes.dev/reclaim-policy=Retain` are **never** swept: `Retain`
//! means the user keeps the data after its SandboxVolume is gone. A volume without the
//! label is treated as `Retain` too (the controller's default for a SandboxVolume without
//! `reclaimPolicy`), so only volumes explicitly labelled `Delete` are ever reclaimed.
//!
//! The leader runs [`run_periodic`]; `sandbox-operator sweep` ([`cli`]) runs one pass on
//! demand and prints the [`report::PassReport`] as a table.

pub mod cli;
pub mod decide;
pub mod observe;
pub mod owners;
pub mod report;

use std::pin::pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Reporter};

use super::recorder::Recorder;
use kube::{Client, Resource};

use self::decide::{
    Candidate, Category, Decision, Keep, OwnerFacts, OwnerKey, OwnerKind, Plan, Policy,
    ResourceKind, Verdict,
};
use self::owners::{ApiServerOwners, OwnerSource};
use self::report::{Action, Outcome, PassReport, Row};
use crate::api::Sandbox;
use crate::config::SweeperConfig;
use crate::metrics::Metrics;
use crate::provider::labels::Owner;
use crate::provider::{ErrorKind, ProviderError};
use crate::registry::{ProviderHandle, ProviderRegistry};

/// The longest wait before the leader's first pass: long enough for the controllers' first
/// reconciles (which adopt what a crash left half-done) to run before the sweeper judges
/// the provider, short enough that a restarted operator reclaims promptly.
pub const FIRST_PASS_DELAY: Duration = Duration::from_secs(30);

/// How many deletions of one pass run at once: removing a running container takes a few
/// hundred milliseconds, so a backlog of orphans is worth overlapping, while a small bound
/// leaves most of the provider's concurrency to the controllers.
pub const DELETE_CONCURRENCY: usize = 4;

/// Why a pass could not build its picture (and so deleted nothing).
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    /// A provider enumeration failed.
    #[error("enumerating {what} failed: {source}")]
    Enumeration {
        /// Which enumeration.
        what: &'static str,
        /// The provider's error.
        #[source]
        source: ProviderError,
    },
    /// Listing the owning objects failed.
    #[error("listing {kind} objects in namespace {namespace} failed: {message}")]
    OwnerLookup {
        /// Kind listed.
        kind: OwnerKind,
        /// Namespace listed.
        namespace: String,
        /// The API error.
        message: String,
    },
}

impl SweepError {
    /// The `reason` label of `sandbox_operator_sweep_aborted_total`.
    pub fn metric_reason(&self) -> &'static str {
        match self {
            SweepError::Enumeration { .. } => "enumeration_failed",
            SweepError::OwnerLookup { .. } => "owner_lookup_failed",
        }
    }
}

/// Every outcome of a sweeper deletion, as counted (`sweep_deletions_total{outcome}`).
pub const DELETION_OUTCOMES: &[&str] = &[
    "deleted", "failed", "refused", "skipped", "dry_run", "deferred",
];
/// Every reason a pass aborts (`sweep_aborted_total{reason}`).
pub const ABORT_REASONS: &[&str] = &["enumeration_failed", "owner_lookup_failed", "deletion_cap"];

/// Runs sweep passes for one operator instance.
#[derive(Clone)]
pub struct Sweeper {
    owners: Arc<dyn OwnerSource>,
    /// Where deletions are told as Events; `None` for a sweeper without an API server,
    /// which logs them instead.
    recorder: Option<Recorder>,
    metrics: Metrics,
    instance: String,
    grace: Duration,
    dry_run: bool,
    max_deletions: usize,
    /// Where an Event goes when its owner's namespace is gone: the operator's Lease.
    fallback: ObjectReference,
}

impl Sweeper {
    /// A sweeper for `instance` with the configured grace, dry-run and cap.
    pub fn new(client: Client, metrics: Metrics, instance: &str, config: &SweeperConfig) -> Self {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: "sandbox-operator".into(),
                instance: std::env::var(crate::leader::ENV_POD_NAME).ok(),
            },
        );
        let namespace = std::env::var(crate::leader::ENV_POD_NAMESPACE)
            .ok()
            .filter(|ns| !ns.is_empty())
            .unwrap_or_else(|| "default".into());
        Sweeper {
            owners: Arc::new(ApiServerOwners::new(client)),
            recorder: Some(recorder),
            metrics,
            instance: instance.to_string(),
            grace: config.grace(),
            dry_run: config.dry_run,
            max_deletions: config.max_deletions_per_pass,
            fallback: ObjectReference {
                api_version: Some("coordination.k8s.io/v1".into()),
                kind: Some("Lease".into()),
                namespace: Some(namespace),
                name: Some(crate::leader::lease_name(instance)),
                ..ObjectReference::default()
            },
        }
    }

    /// A sweeper that learns about owners from `owners` and has no API server to publish
    /// Events on (each deletion's Event is logged instead): for running a whole pass
    /// against a provider by itself, as the conformance suite does.
    pub fn with_owner_source(
        owners: Arc<dyn OwnerSource>,
        metrics: Metrics,
        instance: &str,
        config: &SweeperConfig,
    ) -> Self {
        Sweeper {
            owners,
            recorder: None,
            metrics,
            instance: instance.to_string(),
            grace: config.grace(),
            dry_run: config.dry_run,
            max_deletions: config.max_deletions_per_pass,
            fallback: ObjectReference::default(),
        }
    }

    /// Report instead of deleting (also when the configuration says otherwise).
    pub fn with_dry_run(mut self, dry_run: bool) -> Self {
        self.dry_run = dry_run;
        self
    }

    /// Overrides the grace period.
    pub fn with_grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// Overrides the per-pass cap.
    pub fn with_max_deletions(mut self, max: usize) -> Self {
        self.max_deletions = max;
        self
    }

    /// The policy passes decide with.
    pub fn policy(&self) -> Policy {
        Policy {
            instance: self.instance.clone(),
            grace: self.grace,
            max_deletions: self.max_deletions,
        }
    }

    /// One pass over every configured provider, concurrently: one slow or failing provider
    /// neither delays nor aborts the others' passes.
    pub async fn pass_all(&self, providers: &ProviderRegistry) -> Vec<PassReport> {
        futures::future::join_all(providers.iter().map(|handle| self.pass(handle))).await
    }

    /// One pass over one provider, now.
    pub async fn pass(&self, handle: &ProviderHandle) -> PassReport {
        self.pass_at(handle, Utc::now()).await
    }

    /// One pass over one provider, judging ages at `now` (tests pin it; see the module docs
    /// for the steps).
    pub async fn pass_at(&self, handle: &ProviderHandle, now: DateTime<Utc>) -> PassReport {
        let started = Instant::now();
        let (candidates, owners) = match self.picture(handle).await {
            Ok(picture) => picture,
            Err(err) => return self.aborted(handle, &err, started),
        };
        let plan = decide::decide(&candidates, &owners, now, &self.policy());
        for category in Category::ALL {
            self.metrics
                .sweep_candidates(category.as_str(), plan.eligible(category));
        }
        let actions = self.act(handle, &plan, &owners, now).await;
        let report = self.report(handle.name(), &candidates, &plan, actions, started);
        tracing::info!(provider = %report.provider, "{}", report.summary());
        report
    }

    /// Steps 1 and 2: the provider's picture, then the owners of what it holds.
    async fn picture(
        &self,
        handle: &ProviderHandle,
    ) -> Result<(Vec<Candidate>, OwnerFacts), SweepError> {
        let candidates = observe::enumerate(handle, &self.instance).await?;
        let owners = self.owners.facts(&candidates, &self.instance).await?;
        Ok((candidates, owners))
    }

    /// The report of a pass whose picture could not be built: nothing was deleted.
    fn aborted(&self, handle: &ProviderHandle, err: &SweepError, started: Instant) -> PassReport {
        let provider = handle.name();
        tracing::error!(provider, error = %err, "sweep pass aborted before deleting anything");
        self.metrics.sweep_aborted(err.metric_reason());
        PassReport::aborted(
            provider,
            &self.instance,
            self.dry_run,
            err.to_string(),
            started.elapsed(),
        )
    }

    /// Step 4: every deletion of the plan, a few at a time (each still proven and recorded
    /// on its own); the actions come back in plan order, so the report reads oldest first.
    /// (The futures are built first and only then streamed: a closure inside the stream
    /// would make the whole pass future too generic for `tokio::spawn`.)
    async fn act(
        &self,
        handle: &ProviderHandle,
        plan: &Plan,
        owners: &OwnerFacts,
        now: DateTime<Utc>,
    ) -> Vec<Action> {
        let jobs: Vec<_> = plan
            .deletions()
            .filter_map(|decision| match decision.verdict {
                Verdict::Delete(category) => {
                    Some(self.reclaim(handle, decision, category, owners, now))
                }
                _ => None,
            })
            .collect();
        stream::iter(jobs)
            .buffered(DELETE_CONCURRENCY)
            .collect()
            .await
    }

    /// The pass's report: one row per decision worth a look, the quiet ones counted.
    fn report(
        &self,
        provider: &str,
        candidates: &[Candidate],
        plan: &Plan,
        actions: Vec<Action>,
        started: Instant,
    ) -> PassReport {
        let mut enumerated = [0usize; 3];
        for candidate in candidates {
            enumerated[kind_index(candidate.kind())] += 1;
        }
        let (rows, owner_alive) = self.rows(plan, actions);
        let deferred = plan.deferred();
        let outcome = if deferred > 0 {
            self.metrics.sweep_aborted("deletion_cap");
            Outcome::CapReached { deferred }
        } else {
            self.metrics.sweep_completed();
            Outcome::Completed
        };
        PassReport {
            provider: provider.to_string(),
            instance: self.instance.clone(),
            dry_run: self.dry_run,
            outcome,
            rows,
            enumerated,
            owner_alive,
            elapsed: started.elapsed(),
        }
    }

    /// The table rows of `plan` with the actions taken on its deletions (in plan order),
    /// and how many resources were kept quietly because their owner lives.
    fn rows(&self, plan: &Plan, actions: Vec<Action>) -> (Vec<Row>, usize) {
        let mut actions = actions.into_iter();
        let mut rows = Vec::new();
        let mut owner_alive = 0;
        for decision in &plan.decisions {
            let (category, action) = match &decision.verdict {
                Verdict::Delete(category) => {
                    (Some(*category), actions.next().unwrap_or(Action::Kept))
                }
                Verdict::Deferred(category) => {
                    self.metrics.sweep_deleted(category.as_str(), "deferred");
                    (Some(*category), Action::Deferred)
                }
                Verdict::Keep(keep) if keep.is_quiet() => {
                    owner_alive += usize::from(*keep == Keep::OwnerLive);
                    continue;
                }
                Verdict::Keep(_) => (None, Action::Kept),
            };
            rows.push(Row {
                kind: decision.candidate.kind(),
                id: decision.candidate.id.clone(),
                owner: decision.owner.as_ref().map(owner_text),
                category,
                why: decision.why.clone(),
                age: decision.age,
                action,
            });
        }
        (rows, owner_alive)
    }

    /// Proves, then deletes one resource, with its Event and metric. Both a dry run and a
    /// real pass prove first, so a dry run lists exactly what a real pass deletes.
    async fn reclaim(
        &self,
        handle: &ProviderHandle,
        decision: &Decision,
        category: Category,
        owners: &OwnerFacts,
        now: DateTime<Utc>,
    ) -> Action {
        let Some(owner) = decision.owner.as_ref() else {
            // `decide` never marks a resource without owner labels for deletion.
            return Action::Skipped("no owner labels".into());
        };
        if let Err(why) = self.prove(handle, decision, owners, now).await {
            self.metrics.sweep_deleted(category.as_str(), "skipped");
            tracing::info!(resource = %decision.candidate.id, why, "sweeper: not deleting");
            return Action::Skipped(why);
        }
        if self.dry_run {
            self.metrics.sweep_deleted(category.as_str(), "dry_run");
            return Action::WouldDelete;
        }
        let result = delete(handle, &decision.candidate).await;
        self.record(handle, decision, category, owner, result).await
    }

    /// Right before a deletion: the candidate described again by itself must still be
    /// judged deletable (a listing may omit what a description shows), and its owner,
    /// read directly, must still be gone — or, for wreckage, must not name it as its
    /// current sandbox. `Err` says why it is kept.
    async fn prove(
        &self,
        handle: &ProviderHandle,
        decision: &Decision,
        owners: &OwnerFacts,
        now: DateTime<Utc>,
    ) -> Result<(), String> {
        let listed = &decision.candidate;
        let mut fresh = match observe::reread(handle, listed).await {
            Ok(Some(fresh)) => fresh,
            Ok(None) => return Err("gone when described again before deleting".into()),
            Err(e) => return Err(format!("could not be described again before deleting: {e}")),
        };
        // A listing may round creation times to whole seconds where a description does not:
        // within that, the age the plan was decided on stands; beyond it, this is another
        // resource under the same id.
        match (listed.created_at, fresh.created_at) {
            (Some(was), Some(is)) if (was - is).num_seconds().abs() > 1 => {
                return Err(format!(
                    "described again before deleting, it was created at {is}, not at {was} as \
                     listed: another resource under the same id"
                ));
            }
            (was, is) => fresh.created_at = was.or(is),
        }
        // The category may change (a listing that could not tell whether a sandbox ran
        // makes it an orphan, its description wreckage): what must hold is that it is still
        // to be deleted, and what its own description makes it is what is checked next.
        let again = decide::decision_of(&fresh, owners, now, &self.policy());
        let Verdict::Delete(category) = again.verdict else {
            return Err(format!(
                "described again before deleting, it disagrees with the listing: {}",
                again.why
            ));
        };
        let Some(key) = decision.owner.as_ref().and_then(OwnerKey::of) else {
            return Err("its owner kind cannot be looked up".into());
        };
        let owner_uid = decision.owner.as_ref().map(|o| o.uid.as_str());
        match self.owners.read(&key).await {
            Err(e) => Err(format!("{key} could not be read before deleting: {e}")),
            Ok(Some(read)) if Some(read.uid.as_str()) == owner_uid => {
                if category.needs_owner_gone() {
                    Err(format!("{key} exists (direct read before deleting)"))
                } else if read.current_sandbox.as_deref() == Some(listed.id.as_str()) {
                    Err(format!(
                        "{key} names it as its current sandbox (status.sandboxId)"
                    ))
                } else {
                    Ok(())
                }
            }
            Ok(_) => Ok(()),
        }
    }

    /// The metric, log line and Event of one deletion's result.
    async fn record(
        &self,
        handle: &ProviderHandle,
        decision: &Decision,
        category: Category,
        owner: &Owner,
        result: Result<(), ProviderError>,
    ) -> Action {
        let candidate = &decision.candidate;
        let id = candidate.id.as_str();
        let age = decision
            .age
            .map_or_else(|| "unknown".into(), report::human_age);
        match result {
            Ok(()) => {
                self.metrics.sweep_deleted(category.as_str(), "deleted");
                tracing::info!(provider = handle.name(), kind = %candidate.kind(), resource = id, %category, why = %decision.why, "sweeper deleted");
                let note = format!(
                    "sweeper deleted {} {id} on provider {} ({category}: {}; age {age})",
                    candidate.kind(),
                    handle.name(),
                    decision.why
                );
                self.event(owner, EventType::Normal, event_reason(category), note)
                    .await;
                Action::Deleted
            }
            Err(err) => {
                // A refusal (an attached volume, an in-use template) is the provider's own
                // safety check winning a race against the picture: counted apart.
                let outcome = if err.is(ErrorKind::Conflict) {
                    "refused"
                } else {
                    "failed"
                };
                self.metrics.sweep_deleted(category.as_str(), outcome);
                tracing::warn!(provider = handle.name(), resource = id, %category, error = %err, "sweeper deletion failed");
                let note = format!(
                    "sweeper could not delete {} {id} on provider {} ({category}: {}): {err}",
                    candidate.kind(),
                    handle.name(),
                    decision.why
                );
                self.event(owner, EventType::Warning, "SweepFailed", note)
                    .await;
                Action::Failed(err.to_string())
            }
        }
    }

    /// Publishes an Event on the owner the labels name (by UID, so it lands on that object
    /// even when it is gone or recreated under the same name); when that cannot be stored
    /// (its namespace is gone), on the operator's Lease instead. Never fails the pass: an
    /// Event is a notification.
    async fn event(&self, owner: &Owner, type_: EventType, reason: &str, note: String) {
        let regarding = ObjectReference {
            api_version: Some(Sandbox::api_version(&()).into_owned()),
            kind: Some(owner.kind.clone()),
            namespace: Some(owner.namespace.clone()),
            name: Some(owner.name.clone()),
            uid: Some(owner.uid.clone()),
            ..ObjectReference::default()
        };
        let event = |note: String| Event {
            type_,
            reason: reason.to_string(),
            note: Some(truncate(note, 1000)),
            action: "Sweep".into(),
            secondary: None,
        };
        let Some(recorder) = &self.recorder else {
            tracing::info!(reason, owner = %owner_text(owner), "{note}");
            return;
        };
        let first = tokio::time::timeout(
            observe::KUBE_TIMEOUT,
            recorder.publish(&event(note.clone()), &regarding),
        )
        .await;
        let err = match first {
            Ok(Ok(())) => return,
            Ok(Err(e)) => e.to_string(),
            Err(_) => "timed out".to_string(),
        };
        let note = format!(
            "{note} [owner {} {}/{} (UID {}); the Event could not be stored there: {err}]",
            owner.kind, owner.namespace, owner.name, owner.uid
        );
        match tokio::time::timeout(
            observe::KUBE_TIMEOUT,
            recorder.publish(&event(note), &self.fallback),
        )
        .await
        {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, reason, "could not publish sweeper event"),
            Err(_) => tracing::warn!(reason, "publishing sweeper event timed out"),
        }
    }
}

/// Runs passes over every provider until `shutdown` resolves (the leader stops it with the
/// controllers): the first after [`FIRST_PASS_DELAY`] (or the interval, when shorter), then
/// every `interval` with ±10 % jitter so several operators sharing an engine do not sweep in
/// lockstep. A pass in progress is abandoned at shutdown: every deletion is idempotent, and a
/// replica that lost the Lease must stop deleting at once.
pub async fn run_periodic(
    sweeper: Sweeper,
    providers: ProviderRegistry,
    config: SweeperConfig,
    shutdown: impl std::future::Future<Output = ()>,
) {
    if !config.enabled {
        tracing::info!("sweeper disabled (sweeper.enabled: false)");
        return;
    }
    tracing::info!(
        interval_secs = config.interval_secs,
        grace_secs = config.grace_secs,
        dry_run = config.dry_run,
        max_deletions_per_pass = config.max_deletions_per_pass,
        "sweeper started"
    );
    let mut shutdown = pin!(shutdown);
    let mut wait = config.interval().min(FIRST_PASS_DELAY);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            () = tokio::time::sleep(wait) => {}
        }
        tokio::select! {
            () = &mut shutdown => break,
            _ = sweeper.pass_all(&providers) => {}
        }
        wait = crate::jitter::random(config.interval());
    }
    tracing::info!("sweeper stopped");
}

/// Deletes one resource by its kind's call.
async fn delete(handle: &ProviderHandle, candidate: &Candidate) -> Result<(), ProviderError> {
    let id = candidate.id.as_str();
    match candidate.kind() {
        ResourceKind::Sandbox => handle.call("destroy", handle.provider.destroy(id)).await,
        ResourceKind::Volume => match handle.provider.volumes() {
            Some(volumes) => {
                handle
                    .call("remove_volume", volumes.remove_volume(id))
                    .await
            }
            None => Err(observe::absent_capability(handle, "volumes")),
        },
        ResourceKind::Template => match handle.provider.templates() {
            Some(templates) => {
                handle
                    .call("remove_template", templates.remove_template(id))
                    .await
            }
            None => Err(observe::absent_capability(handle, "templates")),
        },
    }
}

fn kind_index(kind: ResourceKind) -> usize {
    match kind {
        ResourceKind::Sandbox => 0,
        ResourceKind::Volume => 1,
        ResourceKind::Template => 2,
    }
}

fn owner_text(owner: &Owner) -> String {
    format!("{} {}/{}", owner.kind, owner.namespace, owner.name)
}

/// The Event reason of a deletion, by category.
pub fn event_reason(category: Category) -> &'static str {
    match category {
        Category::Orphan => "SweptOrphan",
        Category::Wreckage => "SweptWreckage",
        Category::Volume => "SweptVolume",
        Category::Template => "SweptTemplate",
    }
}

fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_reasons_are_distinct_camel_case() {
        let reasons: std::collections::BTreeSet<&str> =
            Category::ALL.iter().map(|c| event_reason(*c)).collect();
        assert_eq!(reasons.len(), 4);
        assert!(reasons.iter().all(|r| r.starts_with("Swept")));
    }

    #[test]
    fn truncation_respects_char_boundaries() {
        assert_eq!(truncate("héllo".into(), 2), "h");
        assert_eq!(truncate("hello".into(), 10), "hello");
    }

    #[test]
    fn abort_reasons_are_metric_words() {
        let e = SweepError::Enumeration {
            what: "volumes",
            source: ProviderError::transient("engine down"),
        };
        assert_eq!(e.metric_reason(), "enumeration_failed");
        assert!(e.to_string().contains("engine down"));
        let e = SweepError::OwnerLookup {
            kind: OwnerKind::Sandbox,
            namespace: "ns".into(),
            message: "forbidden".into(),
        };
        assert_eq!(e.metric_reason(), "owner_lookup_failed");
        assert_eq!(
            e.to_string(),
            "listing Sandbox objects in namespace ns failed: forbidden"
        );
    }
}
