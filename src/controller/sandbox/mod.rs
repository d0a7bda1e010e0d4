//! The Sandbox controller.
//!
//! `reconcile` is thin: it hands off through the scaffold (our finalizer) to
//! [`apply::apply`] (converge) or [`cleanup`] (destroy, confirm, release). Its own state —
//! the watch caches, the record of status writes the cache has not shown yet, the failed
//! restores' backoff — lives in [`SandboxContext`], beside the shared [`Context`].

pub mod act;
pub mod apply;
pub mod broker;
pub mod budget;
pub mod build;
pub mod claim;
pub mod decide;
pub mod images;
pub mod lifetime;
pub mod observe;
pub mod pulling;
pub mod resolve;
pub mod restore;

use std::sync::{Arc, OnceLock};

use futures::{Stream, StreamExt, TryStreamExt};
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt, reflector, watcher};

use crate::api::{Sandbox, SandboxTemplate, SandboxVolume, SandboxWarmPool};
use crate::controller::budgets::{self, Budgets};
use crate::controller::caches::Caches;
use crate::controller::events::{normal, warning};
use crate::controller::freshness::Written;
use crate::controller::outcome::{Outcome, Report};
use crate::controller::{Context, Error, Result, scaffold};
use crate::provider::ProviderError;
use crate::provider::labels::{Claim, OWNERSHIP_MISMATCH, ensure_owned_or_claimed};
use crate::registry::ProviderHandle;

/// Kind name for metrics and keys.
const KIND: &str = "Sandbox";

/// What the Sandbox reconciles share: the common context plus this controller's own state.
pub struct SandboxContext {
    /// The shared controller context.
    pub ctx: Arc<Context>,
    /// When each Sandbox's failed template restore may be attempted again.
    pub restore_retries: restore::Retries,
    /// Watch caches of templates and volumes (set when the controller starts its watches).
    pub caches: OnceLock<Caches>,
    /// Our last status writes the watch cache has not shown yet.
    pub written: Written,
    /// Admission against the SandboxBudgets (set when the controller starts its watches).
    pub budgets: OnceLock<Arc<Budgets>>,
    /// Batches the claims of each warm pool (see [`broker`]).
    pub broker: broker::Broker,
}

impl SandboxContext {
    /// This controller's state, empty, over `ctx`.
    pub fn new(ctx: Arc<Context>) -> Arc<Self> {
        Arc::new(SandboxContext {
            ctx,
            restore_retries: restore::Retries::default(),
            caches: OnceLock::new(),
            written: Written::default(),
            budgets: OnceLock::new(),
            broker: broker::Broker::default(),
        })
    }
}

/// One reconcile of one Sandbox.
pub async fn reconcile(sandbox: Arc<Sandbox>, sctx: Arc<SandboxContext>) -> Result<Action> {
    let ctx = sctx.ctx.as_ref();
    ctx.failpoint("sandbox-reconcile");
    scaffold::reconcile(
        KIND,
        sandbox,
        ctx,
        |s, added| apply::apply(s, &sctx, added),
        |s| cleanup(s, ctx),
    )
    .await
}

/// Retries with per-object exponential backoff and counts the error by category.
pub fn error_policy(sandbox: Arc<Sandbox>, err: &Error, sctx: Arc<SandboxContext>) -> Action {
    scaffold::error_policy(KIND, sandbox.as_ref(), err, &sctx.ctx)
}

/// The Cleanup half of the finalizer: destroy every provider resource this Sandbox owns
/// (by name and by owner-uid label, so an apply that crashed mid-way is covered), confirm
/// they are gone, and only then let the finalizer go. While that cannot be done the object
/// says why (`CleanupBlocked`).
pub async fn cleanup(sandbox: Arc<Sandbox>, ctx: &Context) -> Result<Action> {
    let r = Report::new(ctx, sandbox.as_ref(), None);
    let status = sandbox.status.clone().unwrap_or_default();
    match release(&r).await {
        Ok(action) => Ok(action),
        // A wait (the sandbox still shows after its destroy): retried, nothing to report.
        Err(Outcome::Failed { error, .. }) => Err(error),
        Err(held) => r.conclude(&status, status.clone(), held).await,
    }
}

/// Destroys and confirms (see [`cleanup`]); `Err` is why the finalizer stays.
async fn release(r: &Report<'_, Sandbox>) -> Result<Action, Outcome> {
    let (ctx, sandbox) = (r.ctx, r.object);
    let uid = sandbox.uid().unwrap_or_default();
    let status = sandbox.status.clone().unwrap_or_default();
    let provider_name = status
        .provider
        .clone()
        .or_else(|| sandbox.spec.provider.clone());
    let handle = match ctx.providers.resolve(provider_name.as_deref()) {
        Ok(h) => h.clone(),
        // Never created anywhere: nothing to clean up.
        Err(_) if status.sandbox_id.is_none() && status.external_name.is_none() => {
            return Ok(Action::await_change());
        }
        Err(msg) => {
            let what = format!("reach provider {provider_name:?}");
            return Err(Outcome::cleanup_blocked(&what, Error::Dependency(msg)));
        }
    };
    // A claimed warm pool member is this Sandbox's through its pool's ledger.
    let claim = crate::claims::proof(&ctx.client, sandbox)
        .await
        .map_err(|e| Outcome::cleanup_blocked("read the ledger of the spec.warmPoolRef pool", e))?;
    let known = destroy_owned(r, &handle, status.sandbox_id.as_deref(), claim.as_ref()).await?;
    // Confirm: only a provider that no longer holds anything releases the finalizer.
    let left = observe::observe(&handle, known.as_deref(), &uid, claim.as_ref())
        .await
        .map_err(|e| {
            let what = format!(
                "confirm on provider {} that the sandbox is gone",
                handle.name()
            );
            Outcome::cleanup_blocked(&what, e)
        })?;
    if let Some(d) = left {
        return Err(Outcome::failed(ProviderError::transient(format!(
            "sandbox {} is still present after destroy; retrying",
            d.id
        ))));
    }
    let msg = format!(
        "destroyed sandbox {} on provider {}",
        build::external_name(&uid),
        handle.name()
    );
    normal(ctx, sandbox, "Destroyed", msg).await;
    Ok(Action::await_change())
}

/// The sandbox id status records, when it is not among those the owner label found: kept
/// when the provider still holds it and it carries this object's owner-uid label. Status is
/// never authority: an id naming someone else's sandbox is left alone, with a Warning, and
/// deletion goes on with what the labels prove is ours.
async fn owned_known(
    r: &Report<'_, Sandbox>,
    handle: &ProviderHandle,
    id: &str,
    claim: Option<&Claim>,
) -> Result<Option<String>, Outcome> {
    let uid = r.object.uid().unwrap_or_default();
    let described = handle
        .call("describe", handle.provider.describe(id))
        .await
        .map_err(|e| {
            let what = format!("describe sandbox {id} on provider {}", handle.name());
            Outcome::cleanup_blocked(&what, e)
        })?;
    let Some(d) = described else {
        return Ok(None);
    };
    match ensure_owned_or_claimed("status.sandboxId", id, &d.labels, &uid, claim) {
        Ok(()) => Ok(Some(id.to_string())),
        Err(e) => {
            warning(r.ctx, r.object, OWNERSHIP_MISMATCH, e.message().to_string()).await;
            Ok(None)
        }
    }
}

/// Destroys every sandbox labelled with the object's owner uid, and the one status names when
/// it is provably the object's own (see [`owned_known`]); returns that one, for the confirm.
async fn destroy_owned(
    r: &Report<'_, Sandbox>,
    handle: &ProviderHandle,
    known: Option<&str>,
    claim: Option<&Claim>,
) -> Result<Option<String>, Outcome> {
    let (ctx, uid) = (r.ctx, r.object.uid().unwrap_or_default());
    let provider = handle.name();
    let mut ids: Vec<String> = handle
        .call("find", handle.provider.find(&observe::owned_by(&uid)))
        .await
        .map_err(|e| {
            let what =
                format!("list the sandboxes labelled owner-uid={uid} on provider {provider}");
            Outcome::cleanup_blocked(&what, e)
        })?
        .into_iter()
        .map(|d| d.id)
        .collect();
    let known = match known {
        Some(id) if ids.iter().any(|i| i == id) => Some(id.to_string()),
        Some(id) => owned_known(r, handle, id, claim).await?,
        None => None,
    };
    ids.extend(known.clone());
    ids.sort();
    ids.dedup();
    for id in &ids {
        ctx.echoes.expect(&uid, decide::Step::Destroy);
        handle
            .call("destroy", handle.provider.destroy(id))
            .await
            .map_err(|e| {
                let what = format!("destroy sandbox {id} on provider {provider}");
                Outcome::cleanup_blocked(&what, e)
            })?;
    }
    Ok(known)
}

/// The annotation that asks for a reconcile now (any new value), as Flux's
/// `reconcile.fluxcd.io/requestedAt` does: `kubectl annotate --overwrite sandbox/x
/// sandboxes.dev/reconcile-requested-at="$(date +%s)"`. Other label and annotation changes do
/// not reconcile: the controller reads none.
pub const RECONCILE_REQUESTED_AT: &str = "sandboxes.dev/reconcile-requested-at";

/// Whether the `Ready` condition is `True`.
fn ready(conditions: &[crate::api::Condition]) -> bool {
    crate::api::condition(conditions, crate::controller::status::READY)
        .is_some_and(|c| c.status == "True")
}

/// A watch of `K` (in `namespace`, or everywhere) into a cache, and its stream of changes a
/// Sandbox depends on: the generation and what `depends` extracts; status churn beyond that
/// passes nothing on.
fn cached<K>(
    ctx: &Context,
    namespace: &Option<String>,
    depends: impl Fn(&K) -> (bool, Option<String>) + Send + 'static,
) -> (
    reflector::Store<K>,
    impl Stream<Item = std::result::Result<K, watcher::Error>> + Send + 'static,
)
where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let api: Api<K> = match namespace {
        Some(ns) => Api::namespaced(ctx.client.clone(), ns),
        None => Api::all(ctx.client.clone()),
    };
    let (reader, writer) = reflector::store();
    let stream = watcher(api, watcher::Config::default().any_semantic())
        .default_backoff()
        .modify(|o: &mut K| {
            o.managed_fields_mut().clear();
            o.annotations_mut()
                .remove("kubectl.kubernetes.io/last-applied-configuration");
        })
        .reflect(writer)
        .applied_objects()
        .predicate_filter(
            move |o: &K| {
                use std::hash::{Hash, Hasher};
                let mut h = std::collections::hash_map::DefaultHasher::new();
                o.meta().generation.hash(&mut h);
                depends(o).hash(&mut h);
                Some(h.finish())
            },
            Default::default(),
        );
    (reader, stream)
}

/// The Sandboxes in `object`'s namespace for which `names` holds.
fn naming<K: ResourceExt>(
    sandboxes: &reflector::Store<Sandbox>,
    object: &K,
    names: impl Fn(&Sandbox) -> bool,
) -> Vec<ObjectRef<Sandbox>> {
    let ns = object.namespace().unwrap_or_default();
    sandboxes
        .state()
        .iter()
        .filter(|s| s.namespace().as_deref() == Some(ns.as_str()) && names(s))
        .map(|s| ObjectRef::from_obj(s.as_ref()))
        .collect()
}

/// What in a Sandbox a reconcile acts on: the spec (its generation, which deletion also
/// bumps), the deletion mark, [`RECONCILE_REQUESTED_AT`] and the traffic record that wakes an
/// idle sandbox ([`crate::idle::LAST_ACTIVITY`]). Status — which only this
/// operator writes — is not: our own writes must not reconcile again, and a retry's status
/// write must not bypass its backoff. Nor are the finalizers: the pass that adds ours goes on
/// to apply (see `scaffold`), so its coming back has nothing left to do; one removed by hand
/// from a live object is put back at the next resync.
pub fn changes_we_act_on(s: &Sandbox) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    s.metadata.generation.hash(&mut h);
    s.metadata.deletion_timestamp.is_some().hash(&mut h);
    s.annotations().get(RECONCILE_REQUESTED_AT).hash(&mut h);
    s.annotations().get(crate::idle::LAST_ACTIVITY).hash(&mut h);
    Some(h.finish())
}

/// The Sandbox watch, into the cache the controller works from, feeding the template-users
/// index as its events pass; its stream carries only the changes a reconcile acts on.
fn watch_sandboxes(
    ctx: &Context,
    namespace: &Option<String>,
    dirty: futures::channel::mpsc::UnboundedSender<String>,
) -> (
    reflector::Store<Sandbox>,
    impl Stream<Item = std::result::Result<Sandbox, watcher::Error>> + Send + 'static,
) {
    let api: Api<Sandbox> = match namespace {
        Some(ns) => Api::namespaced(ctx.client.clone(), ns),
        None => Api::all(ctx.client.clone()),
    };
    // The cache holds every Sandbox for the operator's lifetime: drop what reconciles never
    // read (managedFields, kubectl's last-applied copy of the whole manifest) before caching,
    // so idle memory grows with what matters per object.
    let (reader, writer) = reflector::store();
    let objects = watcher(api, watcher::Config::default().any_semantic())
        .default_backoff()
        .modify(|s: &mut Sandbox| {
            s.managed_fields_mut().clear();
            s.annotations_mut()
                .remove("kubectl.kubernetes.io/last-applied-configuration");
        })
        .reflect(writer)
        .inspect_ok({
            let users = ctx.template_users.clone();
            move |event| users.observe(event)
        })
        // Any change may free or take room in its namespace's budgets (see `budgets`).
        .inspect_ok(move |event| {
            if let Some(ns) = budgets::touched(event) {
                let _ = dirty.unbounded_send(ns);
            }
        })
        .applied_objects()
        .predicate_filter(changes_we_act_on, Default::default());
    (reader, objects)
}

/// Runs the Sandbox controller until `shutdown` resolves. `triggers` are provider events
/// already mapped to Sandbox references (drift noticed by events, not polling).
pub async fn run(
    ctx: Arc<Context>,
    triggers: impl Stream<Item = ObjectRef<Sandbox>> + Send + 'static,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
    concurrency: u16,
    namespace: Option<String>,
) {
    let (dirty, dirty_rx) = futures::channel::mpsc::unbounded();
    let (wake, woken) = futures::channel::mpsc::unbounded();
    let (reader, objects) = watch_sandboxes(&ctx, &namespace, dirty.clone());
    let (budget_cache, budget_watch) = budgets::watch(&ctx, &namespace, dirty);
    // The templates and volumes Sandboxes name: cached (see `caches`), and a change that can
    // unblock a Sandbox — readiness, the id or volume name it resolves to, its spec — wakes
    // the Sandboxes naming it.
    let (templates, template_events) = cached::<SandboxTemplate>(&ctx, &namespace, |t| {
        let st = t.status.clone().unwrap_or_default();
        (ready(&st.conditions), st.template_id)
    });
    let (volumes, volume_events) = cached::<SandboxVolume>(&ctx, &namespace, |v| {
        let st = v.status.clone().unwrap_or_default();
        (ready(&st.conditions), st.volume_name)
    });
    // Pools: a claimant waiting for its pool to appear is woken by the pool's first
    // generation; ledger and status churn only refresh the cache.
    let (pools, pool_events) = cached::<SandboxWarmPool>(&ctx, &namespace, |_| (false, None));
    let sctx = SandboxContext::new(ctx.clone());
    let _ = sctx.caches.set(Caches {
        templates,
        volumes,
        pools,
    });
    let gate = Arc::new(Budgets::new(reader.clone(), budget_cache, wake));
    let _ = sctx.budgets.set(gate.clone());
    let by_template = reader.clone();
    let by_volume = reader.clone();
    let by_pool = reader.clone();
    let controller = Controller::for_stream(objects, reader)
        .with_config(kube::runtime::controller::Config::default().concurrency(concurrency))
        .watches_stream(template_events, move |t: SandboxTemplate| {
            naming(&by_template, &t, |s| {
                s.spec.template_ref.as_ref().map(|r| r.name.as_str()) == Some(t.name_any().as_str())
            })
        })
        .watches_stream(volume_events, move |v: SandboxVolume| {
            naming(&by_volume, &v, |s| {
                s.spec
                    .volumes
                    .iter()
                    .flatten()
                    .any(|m| m.volume_ref.name == v.name_any())
            })
        })
        .watches_stream(pool_events, move |p: SandboxWarmPool| {
            naming(&by_pool, &p, |s| {
                s.spec.warm_pool_ref.as_ref().map(|r| r.name.as_str())
                    == Some(p.name_any().as_str())
            })
        })
        .reconcile_on(futures::stream::select(triggers, woken))
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, sctx)
        .for_each(|res| async move {
            if let Err(err) = res {
                tracing::debug!(%err, "sandbox reconcile loop");
            }
        });
    // The budgets' watch and refresher live as long as the controller, and no longer.
    let budgets = futures::future::join(
        budget_watch.for_each(|()| async {}),
        gate.refresh(&ctx, dirty_rx),
    );
    futures::pin_mut!(controller, budgets);
    futures::future::select(controller, budgets).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{SandboxSpec, SandboxStatus};

    fn sandbox() -> Sandbox {
        let mut s = Sandbox::new("s", SandboxSpec::default());
        s.metadata.generation = Some(1);
        s
    }

    #[test]
    fn our_own_writes_do_not_reconcile_again() {
        let before = changes_we_act_on(&sandbox());
        let mut s = sandbox();
        s.status = Some(SandboxStatus {
            phase: Some("Running".into()),
            ..SandboxStatus::default()
        });
        s.metadata.finalizers = Some(vec![crate::api::FINALIZER.into()]);
        s.annotations_mut().insert("team".into(), "a".into());
        assert_eq!(changes_we_act_on(&s), before);
    }

    #[test]
    fn spec_deletion_and_the_reconcile_request_do() {
        let before = changes_we_act_on(&sandbox());
        let mut spec = sandbox();
        spec.metadata.generation = Some(2);
        let mut deleting = sandbox();
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        let mut asked = sandbox();
        asked
            .annotations_mut()
            .insert(RECONCILE_REQUESTED_AT.into(), "1".into());
        for changed in [spec, deleting, asked] {
            assert_ne!(changes_we_act_on(&changed), before);
        }
    }
}
