//! How a reconcile ends, for every kind: each pass ends in one [`Outcome`], and one
//! [`Report::conclude`] turns it into the status (conditions, `observedGeneration`), the
//! Event and the requeue.
//!
//! The rules, the same for Sandboxes, SandboxTemplates and SandboxVolumes:
//! - **Ready**, **Waiting**: the conditions say so at this generation; no Event; looked at
//!   again after the outcome's recheck, else at the jittered resync.
//! - **InProgress** (an image pull): `Reconciling` without finishing the generation; a Normal
//!   Event when it starts (the Ready reason is new); polled at its own pace.
//! - **Stalled**: `Stalled` at this generation and one Warning when the reason is new (a
//!   stall is looked at again at every resync; an Event each time would be noise).
//! - **Failed**: every failure is a Warning. A retryable one keeps the last finished
//!   generation, says `Reconciling` and backs off (the error goes to the scaffold's
//!   backoff); any other stalls as above. Refused credentials stall every object on the
//!   provider and are looked at again only at the backoff ceiling, so a revoked token never
//!   becomes a hot retry loop and a fixed one is picked up without a spec change.
//! - **Held**: a deletion that cannot finish (the finalizer stays): a condition of the hold's
//!   own type (`TemplateInUse`, `VolumeAttached`, [`CLEANUP_BLOCKED`]) beside `Reconciling`,
//!   one Warning when the reason is new, and the error's backoff.
//! - **ObjectGone**: the object went (or this pass deleted it): nothing to write.

use std::time::Duration;

use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;

use crate::api::{Condition, SandboxStatus, SandboxTemplateStatus, SandboxVolumeStatus, condition};
use crate::provider::{ErrorKind, ProviderError};

use super::backoff::CAP;
use super::events::publish;
use super::freshness::Written;
use super::status::{self, Health, READY};
use super::{Context, Error, Result};

/// Condition type (and reason) of a template whose deletion waits for its users.
pub const TEMPLATE_IN_USE: &str = "TemplateInUse";
/// Condition type (and reason) of a volume whose deletion waits for it to be detached.
pub const VOLUME_ATTACHED: &str = "VolumeAttached";
/// Condition type (and reason) of a deletion whose cleanup cannot confirm that the
/// provider's resources are gone.
pub const CLEANUP_BLOCKED: &str = "CleanupBlocked";
/// Condition type (and reason) of a warm pool whose deletion waits for the Sandboxes that
/// hold its claimed members.
pub const MEMBERS_CLAIMED: &str = "MembersClaimed";
/// Every hold's condition type: set only while a deletion waits, cleared otherwise.
const HOLDS: [&str; 4] = [
    TEMPLATE_IN_USE,
    VOLUME_ATTACHED,
    CLEANUP_BLOCKED,
    MEMBERS_CLAIMED,
];

/// How one reconcile ended (see the module docs for what each one writes and when).
#[derive(Debug)]
pub enum Outcome {
    /// Converged. `recheck`: a time the object must be looked at (a lifetime deadline).
    Ready {
        reason: String,
        message: String,
        recheck: Option<Duration>,
    },
    /// Waiting for something that comes by itself; `None` = a watch wakes it.
    Waiting {
        reason: String,
        message: String,
        recheck: Option<Duration>,
    },
    /// Work in flight that does not finish the generation; `announce` is the Normal Event's
    /// reason when it starts.
    InProgress {
        reason: String,
        message: String,
        recheck: Duration,
        announce: &'static str,
    },
    /// Needs a change from the user (or the environment).
    Stalled {
        reason: String,
        message: String,
        recheck: Option<Duration>,
    },
    /// A failure; `during` names the step that failed, for the Event.
    Failed {
        error: Error,
        during: Option<String>,
    },
    /// A deletion that waits: `reason` is the hold's condition type.
    Held {
        reason: &'static str,
        message: String,
        error: Error,
    },
    /// The object is gone or going: nothing to report.
    ObjectGone,
}

impl Outcome {
    /// Ready shorthand.
    pub fn ready(reason: &str, message: impl Into<String>) -> Self {
        Outcome::Ready {
            reason: reason.into(),
            message: message.into(),
            recheck: None,
        }
    }

    /// Waiting shorthand.
    pub fn waiting(
        reason: &str,
        message: impl Into<String>,
        recheck: impl Into<Option<Duration>>,
    ) -> Self {
        Outcome::Waiting {
            reason: reason.into(),
            message: message.into(),
            recheck: recheck.into(),
        }
    }

    /// Stalled shorthand.
    pub fn stalled(reason: &str, message: impl Into<String>) -> Self {
        Outcome::Stalled {
            reason: reason.into(),
            message: message.into(),
            recheck: None,
        }
    }

    /// This outcome, looked at again within `d` at the latest (work held back for `d`).
    pub fn look_again_within(self, d: Duration) -> Self {
        let sooner = |r: Option<Duration>| Some(r.map_or(d, |r| r.min(d)));
        match self {
            Outcome::Ready {
                reason,
                message,
                recheck,
            } => Outcome::Ready {
                reason,
                message,
                recheck: sooner(recheck),
            },
            Outcome::Waiting {
                reason,
                message,
                recheck,
            } => Outcome::Waiting {
                reason,
                message,
                recheck: sooner(recheck),
            },
            Outcome::InProgress {
                reason,
                message,
                recheck,
                announce,
            } => Outcome::InProgress {
                reason,
                message,
                recheck: recheck.min(d),
                announce,
            },
            Outcome::Stalled {
                reason,
                message,
                recheck,
            } => Outcome::Stalled {
                reason,
                message,
                recheck: sooner(recheck),
            },
            other => other,
        }
    }

    /// A failure outside any step.
    pub fn failed(error: impl Into<Error>) -> Self {
        Outcome::Failed {
            error: error.into(),
            during: None,
        }
    }

    /// A deletion held because cleanup could not `what` (confirm the provider's resources
    /// are gone): the message names what and the fix.
    pub fn cleanup_blocked(what: &str, error: impl Into<Error>) -> Self {
        let error = error.into();
        let message = format!(
            "deletion waits: could not {what}: {error}; {}",
            cleanup_fix(&error)
        );
        Outcome::Held {
            reason: CLEANUP_BLOCKED,
            message,
            error,
        }
    }
}

impl From<Error> for Outcome {
    fn from(e: Error) -> Self {
        Outcome::failed(e)
    }
}

impl From<ProviderError> for Outcome {
    fn from(e: ProviderError) -> Self {
        Outcome::failed(e)
    }
}

impl From<kube::Error> for Outcome {
    fn from(e: kube::Error) -> Self {
        Outcome::failed(e)
    }
}

/// What a user can do about a cleanup that failed with `error`.
fn cleanup_fix(error: &Error) -> String {
    const BY_HAND: &str = "or, once you have removed it at the provider yourself, remove the \
        finalizer sandboxes.dev/cleanup from this object";
    match error {
        Error::Provider(p) if p.is(ErrorKind::Unauthorized) => "fix the provider's credentials \
            in the operator's configuration; the deletion finishes by itself once they are \
            accepted"
            .into(),
        Error::Provider(p) if p.is(ErrorKind::Unsupported) || p.is(ErrorKind::Invalid) => {
            format!(
                "the provider refused the request: fix its endpoint or API in the operator's \
                 configuration, {BY_HAND}"
            )
        }
        Error::Dependency(_) | Error::InvalidSpec(_) => {
            format!("configure the provider this object was made on again, {BY_HAND}")
        }
        _ => "retrying with backoff; if it persists, check that the provider answers".into(),
    }
}

/// What [`Report::conclude`] does for an outcome (pure: table-tested).
#[derive(Debug, PartialEq)]
pub struct Decision {
    /// The Ready/Reconciling/Stalled conditions.
    pub health: Health,
    /// Whether the generation is done (`observedGeneration` advances to it).
    pub finishes_generation: bool,
    /// The Event to publish: `(type, reason, note)`.
    pub event: Option<(EventType, String, String)>,
    /// The hold condition to set (a deletion that waits).
    pub hold: Option<&'static str>,
    /// What the reconcile returns.
    pub then: Then,
}

/// How a reconcile hands back to the controller.
#[derive(Debug, PartialEq)]
pub enum Then {
    /// Look again after this long.
    Requeue(Duration),
    /// Look again at the jittered resync (or when a watch event comes first).
    Resync,
    /// Fail with this error: the scaffold backs off.
    Retry,
    /// Nothing to write; the next event brings the next reconcile.
    AwaitChange,
}

/// Decides what `outcome` writes, given the Ready reason written before. On [`Then::Retry`]
/// [`Report::conclude`] hands the outcome's error back.
pub fn decide(outcome: &Outcome, previous: Option<&str>) -> Decision {
    let new = |reason: &str| previous != Some(reason);
    let requeue = |r: &Option<Duration>| r.map_or(Then::Resync, Then::Requeue);
    let settled = |health: Health, event, then| Decision {
        health,
        finishes_generation: true,
        event,
        hold: None,
        then,
    };
    match outcome {
        Outcome::Ready {
            reason,
            message,
            recheck,
        } => settled(Health::ready(reason, message), None, requeue(recheck)),
        Outcome::Waiting {
            reason,
            message,
            recheck,
        } => settled(Health::progressing(reason, message), None, requeue(recheck)),
        Outcome::InProgress {
            reason,
            message,
            recheck,
            announce,
        } => Decision {
            health: Health::progressing(reason, message),
            finishes_generation: false,
            event: new(reason).then(|| (EventType::Normal, announce.to_string(), message.clone())),
            hold: None,
            then: Then::Requeue(*recheck),
        },
        Outcome::Stalled {
            reason,
            message,
            recheck,
        } => {
            let event = new(reason).then(|| (EventType::Warning, reason.clone(), message.clone()));
            settled(Health::stalled(reason, message), event, requeue(recheck))
        }
        Outcome::Failed { error, during } => failed(error, during.as_deref(), previous),
        Outcome::Held {
            reason, message, ..
        } => held(reason, message, new(reason)),
        Outcome::ObjectGone => Decision {
            health: Health::progressing("Deleting", ""),
            finishes_generation: false,
            event: None,
            hold: None,
            then: Then::AwaitChange,
        },
    }
}

/// A held deletion: its condition beside `Reconciling`, a Warning when the reason is `new`,
/// and the error's backoff.
fn held(reason: &'static str, message: &str, new: bool) -> Decision {
    Decision {
        health: Health::progressing(reason, message),
        finishes_generation: true,
        event: new.then(|| (EventType::Warning, reason.to_string(), message.to_string())),
        hold: Some(reason),
        then: Then::Retry,
    }
}

/// A failure: retryable ones report `Reconciling` at the last finished generation and back
/// off; the rest stall (refused credentials rechecked at the backoff ceiling).
fn failed(error: &Error, during: Option<&str>, previous: Option<&str>) -> Decision {
    let reason = error.category();
    let message = error.to_string();
    let note = match during {
        Some(step) => format!("{step} failed: {message}"),
        None => message.clone(),
    };
    let warning = Some((EventType::Warning, reason.to_string(), note));
    if retryable(error) {
        return Decision {
            health: Health::progressing(reason, message),
            finishes_generation: false,
            event: warning,
            hold: None,
            then: Then::Retry,
        };
    }
    let unauthorized = matches!(error, Error::Provider(p) if p.is(ErrorKind::Unauthorized));
    Decision {
        health: Health::stalled(reason, message),
        finishes_generation: true,
        event: warning.filter(|_| previous != Some(reason)),
        hold: None,
        then: if unauthorized {
            Then::Requeue(CAP)
        } else {
            Then::Resync
        },
    }
}

/// Whether a failure is retried with backoff: a provider's transient error, the API server,
/// or our finalizer's patch (which fails on a concurrent change of the finalizers).
fn retryable(error: &Error) -> bool {
    matches!(error, Error::Provider(p) if p.is_retryable())
        || matches!(error, Error::Kube(_) | Error::Finalizer(_))
}

/// The status fields every kind reports an outcome in.
pub trait Reported: Clone + PartialEq + serde::Serialize {
    /// `status.conditions`.
    fn conditions(&self) -> &[Condition];
    /// `status.conditions`, to change.
    fn conditions_mut(&mut self) -> &mut Vec<Condition>;
    /// `status.observedGeneration`, to change.
    fn observed_generation_mut(&mut self) -> &mut Option<i64>;
    /// `status.observedGeneration`.
    fn observed_generation(&self) -> Option<i64>;
    /// Marks a stalled status beyond its conditions (the Sandbox's phase).
    fn mark_stalled(&mut self) {}
    /// What a server-side apply of this status sends: all of it, except fields another
    /// writer owns under its own concurrency rule (a warm pool's ledger).
    fn for_apply(&self) -> Self {
        self.clone()
    }
}

macro_rules! reported {
    ($status:ty) => {
        fn conditions(&self) -> &[Condition] {
            &self.conditions
        }
        fn conditions_mut(&mut self) -> &mut Vec<Condition> {
            &mut self.conditions
        }
        fn observed_generation_mut(&mut self) -> &mut Option<i64> {
            &mut self.observed_generation
        }
        fn observed_generation(&self) -> Option<i64> {
            self.observed_generation
        }
    };
}

impl Reported for SandboxStatus {
    reported!(SandboxStatus);
    fn mark_stalled(&mut self) {
        if self.phase.is_none() {
            self.phase = Some("Stalled".into());
        }
    }
}

impl Reported for SandboxTemplateStatus {
    reported!(SandboxTemplateStatus);
}

impl Reported for SandboxVolumeStatus {
    reported!(SandboxVolumeStatus);
}

impl Reported for crate::api::SandboxWarmPoolStatus {
    reported!(SandboxWarmPoolStatus);
    fn for_apply(&self) -> Self {
        Self {
            ledger: Vec::new(),
            ledger_revision: None,
            ..self.clone()
        }
    }
}

/// Where a reconcile reports: the object, its API, and (for a kind whose reconciles read
/// the watch cache, see [`super::freshness`]) the record of our writes the cache has not
/// shown yet.
pub struct Report<'a, K> {
    /// The shared context (Events, resync).
    pub ctx: &'a Context,
    /// The object's namespaced API.
    pub api: Api<K>,
    /// The object.
    pub object: &'a K,
    /// Our status writes the watch cache has not shown yet, when this kind tracks them.
    pub written: Option<&'a Written>,
    /// Normal Events that record what the pass did, published once its status is written
    /// (see [`Report::after_status`]).
    later: std::sync::Mutex<Vec<(&'static str, String)>>,
}

impl<'a, K> Report<'a, K>
where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    /// A reporter for `object`, in its namespace.
    pub fn new(ctx: &'a Context, object: &'a K, written: Option<&'a Written>) -> Self {
        let ns = object.namespace().unwrap_or_default();
        Report {
            ctx,
            api: Api::namespaced(ctx.client.clone(), &ns),
            object,
            written,
            later: std::sync::Mutex::default(),
        }
    }

    /// Records a Normal Event of what the pass did, published (off the pass's path, like
    /// [`super::events::normal_detached`]) once the pass has written its status. Why: an
    /// Event stored beside the status write competes with it on the API server, and the
    /// status is what a client waits for (a warm claim's Ready: measured ~3 ms of its
    /// status write's ~8 ms under load). A pass that ends without a status write publishes
    /// them as it ends.
    pub fn after_status(&self, reason: &'static str, note: String) {
        self.later
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push((reason, note));
    }

    /// Publishes what [`Self::after_status`] recorded.
    fn publish_later(&self) {
        let later = std::mem::take(
            &mut *self
                .later
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        for (reason, note) in later {
            super::events::normal_detached(self.ctx, self.object, reason, note);
        }
    }

    /// Writes `next` when it differs from `current`, remembering the resourceVersion
    /// written until the watch cache shows it (when tracked).
    pub async fn save<S: Reported>(&self, current: &S, next: &S) -> kube::Result<()> {
        let name = self.object.name_any();
        let (current, next) = (current.for_apply(), next.for_apply());
        let written = status::write_returning(&self.api, &name, Some(&current), &next).await?;
        if let (Some(w), Some(tracker)) = (written, self.written) {
            tracker.wrote(&w.uid().unwrap_or_default(), w.resource_version());
        }
        Ok(())
    }

    /// Ends the reconcile with `outcome`: the Event, the status (`next` over `current`, as
    /// last written), and the requeue (see the module docs).
    pub async fn conclude<S: Reported>(
        &self,
        current: &S,
        mut next: S,
        outcome: Outcome,
    ) -> Result<Action> {
        let previous = condition(current.conditions(), READY).map(|c| c.reason.as_str());
        let decision = decide(&outcome, previous);
        if decision.then == Then::AwaitChange {
            self.publish_later();
            return Ok(Action::await_change());
        }
        // The Event and the status go out together: neither waits for the other (a claim's
        // Ready is one status write away, and the Event is only a record of it).
        let event = async {
            if let Some((type_, reason, note)) = decision.event {
                publish(self.ctx, self.object, type_, &reason, &reason, note).await;
            }
        };
        let generation = if decision.finishes_generation {
            self.object.meta().generation
        } else {
            current.observed_generation()
        };
        apply(&mut next, &decision.health, decision.hold, generation);
        let ((), saved) = tokio::join!(event, self.save(current, &next));
        self.publish_later();
        match (decision.then, outcome) {
            (Then::Retry, Outcome::Failed { error, .. } | Outcome::Held { error, .. }) => {
                Err(error)
            }
            (Then::Requeue(after), _) => saved.map(|()| Action::requeue(after)).map_err(Into::into),
            _ => {
                let uid = self.object.uid().unwrap_or_default();
                saved?;
                Ok(Action::requeue(crate::jitter::by_key(
                    self.ctx.resync,
                    &uid,
                )))
            }
        }
    }
}

/// Writes the decided conditions and generation into `next`.
fn apply<S: Reported>(
    next: &mut S,
    health: &Health,
    hold: Option<&'static str>,
    generation: Option<i64>,
) {
    let now = status::now();
    let conditions = next.conditions_mut();
    health.apply(conditions, generation, &now);
    conditions.retain(|c| !HOLDS.contains(&c.type_.as_str()) || Some(c.type_.as_str()) == hold);
    if let Some(hold) = hold {
        let (reason, message) = (health.reason().to_string(), health.message().to_string());
        status::upsert(
            conditions, hold, "True", &reason, &message, generation, &now,
        );
    }
    *next.observed_generation_mut() = generation;
    if matches!(health, Health::Stalled { .. }) {
        next.mark_stalled();
    }
}

#[cfg(test)]
mod tests;
