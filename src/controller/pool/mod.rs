//! The SandboxWarmPool controller: keeps `spec.replicas` running, unclaimed members of the
//! pool's template, rolls unclaimed members when the template changes, and on deletion
//! removes the unclaimed ones (claimed members belong to their Sandboxes; the deletion waits
//! for them, as a PersistentVolumeClaim in use waits for its Pods).
//!
//! The pipeline is the Sandbox controller's: read → observe the provider (the members, by
//! the pool's owner-uid label) → decide (pure, [`decide`]) → act ([`act`]) → report, ending
//! in one [`Outcome`] that `conclude()` writes. Ownership of a member moves only through the
//! pool's [`ledger`].

pub mod act;
pub mod cleanup;
pub mod decide;
pub mod ledger;
pub mod members;
pub mod pace;
pub mod report;
pub mod sightings;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt, watcher};

use crate::api::{LedgerEntry, Sandbox, SandboxWarmPool, SandboxWarmPoolStatus};
use crate::controller::outcome::{Outcome, Report};
use crate::controller::sandbox::SandboxContext;
use crate::controller::{Context, Error, Result, scaffold};
use crate::registry::ProviderHandle;

/// Kind name for metrics and keys.
const KIND: &str = "SandboxWarmPool";

/// How soon a pool that is filling or rolling is looked at again.
pub const WAIT: Duration = Duration::from_secs(2);

/// How long a pool's reconcile waits for its triggers to settle. One claim triggers its
/// pool several times within milliseconds (the claimant appears, the ledger is written,
/// the claimant's status is written), and each pass lists the members at the provider: a
/// listing is the heaviest call an engine serves, and measured on Docker, a pass per
/// trigger made thirteen listings per claim, which slowed the claims' own engine calls.
/// Refills wait longer than this after a claim anyway (see [`pace`]).
const SETTLE: Duration = Duration::from_millis(200);

/// What the pool reconciles share: the common context, and a Sandbox controller state to
/// resolve and build members exactly as Sandboxes are.
pub struct PoolContext {
    /// The shared controller context.
    pub ctx: Arc<Context>,
    /// Resolve and build, as the Sandbox controller does them (no caches: direct reads).
    pub sctx: Arc<SandboxContext>,
    /// The Sandboxes this controller watches, as last seen: a claimant it shows alive needs
    /// no read of its own (see [`act::gone_claimants`]).
    pub sandboxes: reflector::Store<Sandbox>,
}

/// One reconcile of one SandboxWarmPool.
pub async fn reconcile(pool: Arc<SandboxWarmPool>, pctx: Arc<PoolContext>) -> Result<Action> {
    let ctx = pctx.ctx.as_ref();
    scaffold::reconcile(
        KIND,
        pool,
        ctx,
        |p, added| async {
            added.wait().await?;
            apply(p, &pctx).await
        },
        |p| cleanup::cleanup(p, &pctx),
    )
    .await
}

/// Backoff and metrics for failed reconciles.
pub fn error_policy(pool: Arc<SandboxWarmPool>, err: &Error, pctx: Arc<PoolContext>) -> Action {
    scaffold::error_policy(KIND, pool.as_ref(), err, &pctx.ctx)
}

/// The Apply half: converge the members, then report.
async fn apply(pool: Arc<SandboxWarmPool>, pctx: &PoolContext) -> Result<Action> {
    let r = Report::new(pctx.ctx.as_ref(), pool.as_ref(), None);
    let current = pool.status.clone().unwrap_or_default();
    let mut next = current.clone();
    let outcome = converge(&r, pctx, &mut next)
        .await
        .unwrap_or_else(|ended| ended);
    r.conclude(&current, next, outcome).await
}

/// The stages; each returns the outcome that ends the pass early.
async fn converge(
    r: &Report<'_, SandboxWarmPool>,
    pctx: &PoolContext,
    next: &mut SandboxWarmPoolStatus,
) -> Result<Outcome, Outcome> {
    let pool = r.object;
    let uid = pool.uid().unwrap_or_default();
    let handle = provider(r.ctx, pool)?;
    let hash = members::template_hash(&pool.spec.template);
    next.template_hash = Some(hash.clone());
    let observed = members::observe(r.ctx, &handle, &uid).await?;
    let all: Vec<_> = observed.iter().map(members::member).collect();
    let ledger = next.ledger.clone();
    let gone = act::gone_claimants(r, &pctx.sandboxes, &ledger).await?;
    let replicas = usize::try_from(pool.spec.replicas).unwrap_or(0);
    let mut plan = decide::decide(&all, &ledger, replicas, &hash, |e: &LedgerEntry| {
        e.claimed_by.as_ref().is_some_and(|c| gone.contains(&c.uid))
    });
    let free = decide::counts(&all, &ledger, &hash).ready;
    let claims = pctx.ctx.claim_times.of(pool);
    let held = pace::hold(claims, free, Instant::now()).filter(|_| plan.create > 0);
    if held.is_some() {
        plan.create = 0;
    }
    let on = act::On {
        r,
        pctx,
        handle: &handle,
    };
    let acted = act::act(&on, &plan, &all, &hash).await?;
    let outcome = report::report(&on, acted, observed, &hash, next).await;
    match held {
        Some(left) => outcome
            .map(|o| o.look_again_within(left))
            .map_err(|o| o.look_again_within(left)),
        None => outcome,
    }
}

/// The pool's provider: a template naming one that is not configured stalls the pool.
fn provider(ctx: &Context, pool: &SandboxWarmPool) -> Result<ProviderHandle, Outcome> {
    ctx.providers
        .resolve(pool.spec.template.provider.as_deref())
        .cloned()
        .map_err(|msg| Outcome::stalled("ProviderNotConfigured", format!("spec.template: {msg}")))
}

/// Who a pool is in this process's claim bookkeeping (the broker's lanes, the claim times):
/// namespace, name and UID, so a pool recreated under the same name is another.
pub fn identity(pool: &SandboxWarmPool) -> String {
    format!(
        "{}/{}/{}",
        pool.namespace().unwrap_or_default(),
        pool.name_any(),
        pool.uid().unwrap_or_default()
    )
}

/// The pool a Sandbox claims from (a Sandbox change can free or take a member).
fn pool_of(sandbox: Sandbox) -> Option<ObjectRef<SandboxWarmPool>> {
    let name = &sandbox.spec.warm_pool_ref.as_ref()?.name;
    Some(ObjectRef::new(name).within(&sandbox.namespace().unwrap_or_default()))
}

/// Runs the pool controller until `shutdown` resolves.
pub async fn run(
    ctx: Arc<Context>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
    namespace: Option<String>,
) {
    let (pools, sandboxes): (Api<SandboxWarmPool>, Api<Sandbox>) = match &namespace {
        Some(ns) => (
            Api::namespaced(ctx.client.clone(), ns),
            Api::namespaced(ctx.client.clone(), ns),
        ),
        None => (Api::all(ctx.client.clone()), Api::all(ctx.client.clone())),
    };
    let (store, writer) = reflector::store();
    let claimants = watcher(sandboxes, watcher::Config::default().any_semantic())
        .default_backoff()
        .reflect(writer)
        .touched_objects();
    let pctx = Arc::new(PoolContext {
        sctx: SandboxContext::new(ctx.clone()),
        ctx,
        sandboxes: store,
    });
    Controller::new(pools, watcher::Config::default().any_semantic())
        .with_config(kube::runtime::controller::Config::default().debounce(SETTLE))
        .watches_stream(claimants, pool_of)
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, pctx)
        .for_each(|res| async move {
            if let Err(err) = res {
                tracing::debug!(%err, "warm pool reconcile loop");
            }
        })
        .await;
}
