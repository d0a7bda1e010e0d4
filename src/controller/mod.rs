//! Controllers: one per kind, sharing one [`Context`] (what every controller needs); each
//! kind keeps its own state in its own context (`sandbox::SandboxContext`,
//! `template::TemplateContext`).
//!
//! Each reconcile is a short pipeline — read → validate (pure) → observe the provider →
//! decide (pure) → act → write status — run by the shared scaffold ([`scaffold`]): a new
//! object gets our finalizer alongside its first pass, one that has it goes through
//! kube-runtime's `finalizer()` to the kind's apply or cleanup. Every pass ends in one
//! [`outcome::Outcome`], which [`outcome::Report::conclude`] turns into status, an Event and
//! the requeue, the same way for every kind. Only this module talks to both Kubernetes and
//! providers.

pub mod backoff;
pub mod budgets;
pub mod caches;
pub mod echoes;
pub mod error;
pub mod events;
pub mod freshness;
pub mod outcome;
pub mod pool;
pub mod recorder;
pub mod sandbox;
pub mod scaffold;
pub mod status;
pub mod sweeper;
pub mod template;
pub mod template_users;
pub mod triggers;
pub mod volume;

use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use kube::runtime::events::Reporter;

use recorder::Recorder;

pub use error::{Error, Result};

use crate::metrics::Metrics;
use crate::registry::ProviderRegistry;
use crate::templates::service::TemplateService;

/// The field manager the operator's server-side applies use. It only ever owns `status`
/// (and the finalizer, through kube-runtime): never `spec`.
pub const FIELD_MANAGER: &str = "sandbox-operator";

/// What every reconcile shares.
pub struct Context {
    /// Kubernetes client.
    pub client: Client,
    /// Configured providers.
    pub providers: ProviderRegistry,
    /// Every template operation, on any provider (with the configured template stores).
    pub templates: Arc<TemplateService>,
    /// Publishes events.k8s.io Events.
    pub recorder: Recorder,
    /// Prometheus metrics.
    pub metrics: Metrics,
    /// This operator instance's name (`sandboxes.dev/managed-by`).
    pub instance: String,
    /// Safety-net resync period for converged objects (jittered per object).
    pub resync: Duration,
    /// Per-object retry counters for exponential backoff.
    pub backoff: backoff::Backoff,
    /// Provider events our own steps cause, so they do not reconcile again: the link between
    /// the provider event streams ([`triggers`]) and the Sandbox controller's steps.
    pub echoes: Arc<echoes::Echoes>,
    /// Which templates the Sandboxes name: the link between the Sandbox controller's watch,
    /// which feeds it, and the template controller, which reads it.
    pub template_users: Arc<template_users::TemplateUsers>,
    /// Test-only crash points (`SANDBOX_OPERATOR_FAILPOINT`), see [`Context::failpoint`].
    pub failpoints: Vec<String>,
    /// Which cached images a Sandbox may boot (`openImages`, registry verification).
    pub images: Arc<sandbox::images::ImageRules>,
    /// When each warm pool last had a claim: the link between the Sandbox controller's
    /// claims and the pool controller's refill pacing ([`pool::pace`]).
    pub claim_times: Arc<pool::pace::ClaimTimes>,
    /// The last listing of each warm pool's members: the link between the pool controller,
    /// which lists them, and the claims, which pick from it ([`pool::sightings`]).
    pub sightings: Arc<pool::sightings::Sightings>,
}

/// Maps kube-runtime's finalizer outcome onto ours, keeping the error category.
///
/// A finalizer removal answered 404 means the object is already gone — the goal of the
/// cleanup — so it is a success, not an error to retry: a provider `destroy` event can queue
/// one more reconcile of an object whose deletion is completing.
pub fn finalizer_outcome(
    result: std::result::Result<
        kube::runtime::controller::Action,
        kube::runtime::finalizer::Error<Error>,
    >,
) -> Result<kube::runtime::controller::Action> {
    use kube::runtime::finalizer::Error as F;
    match result {
        Ok(action) => Ok(action),
        Err(F::RemoveFinalizer(kube::Error::Api(status))) if status.code == 404 => {
            Ok(kube::runtime::controller::Action::await_change())
        }
        Err(F::ApplyFailed(e) | F::CleanupFailed(e)) => Err(e),
        Err(F::AddFinalizer(e) | F::RemoveFinalizer(e)) => Err(Error::Kube(e)),
        Err(other) => Err(Error::Finalizer(other.to_string())),
    }
}

impl Context {
    /// Builds the shared context, with the default `openImages` (the base image).
    pub fn new(
        client: Client,
        providers: ProviderRegistry,
        templates: Arc<TemplateService>,
        metrics: Metrics,
        instance: String,
        resync: Duration,
    ) -> Arc<Self> {
        let images = sandbox::images::ImageRules::new(&crate::config::default_open_images());
        Self::with_images(
            client, providers, templates, metrics, instance, resync, images,
        )
    }

    /// [`Context::new`] with the operator's image rules (its `openImages` setting).
    #[allow(clippy::too_many_arguments)]
    pub fn with_images(
        client: Client,
        providers: ProviderRegistry,
        templates: Arc<TemplateService>,
        metrics: Metrics,
        instance: String,
        resync: Duration,
        images: sandbox::images::ImageRules,
    ) -> Arc<Self> {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: "sandbox-operator".into(),
                instance: std::env::var("POD_NAME").ok(),
            },
        );
        let failpoints = std::env::var("SANDBOX_OPERATOR_FAILPOINT")
            .map(|v| v.split(',').map(str::to_string).collect())
            .unwrap_or_default();
        Arc::new(Context {
            client,
            providers,
            templates,
            recorder,
            metrics,
            instance,
            resync,
            backoff: backoff::Backoff::default(),
            echoes: Arc::default(),
            template_users: Arc::default(),
            failpoints,
            images: Arc::new(images),
            claim_times: Arc::default(),
            sightings: Arc::default(),
        })
    }

    /// A crash point for the crash-consistency and supervision tests.
    /// `SANDBOX_OPERATOR_FAILPOINT` is a comma-separated list of `point` (the process aborts
    /// on the spot, as SIGKILL would, leaving whatever half-done state that moment implies)
    /// or `point=panic` (the task running it panics, as a bug would: the supervisor must
    /// notice). Unset in production: the check is one comparison per listed point.
    pub fn failpoint(&self, point: &str) {
        for listed in &self.failpoints {
            let (name, action) = listed.split_once('=').unwrap_or((listed, "abort"));
            if name != point {
                continue;
            }
            if action == "panic" {
                tracing::error!(point, "failpoint hit: panicking");
                panic!("failpoint {point}");
            }
            tracing::error!(point, "failpoint hit: aborting the process");
            std::process::abort();
        }
    }
}
