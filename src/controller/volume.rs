//! The SandboxVolume controller: a named provider volume per object, removed on delete only
//! when `reclaimPolicy: Delete` says so and nothing holds it.

use std::sync::Arc;

use futures::{Stream, StreamExt};
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;

use crate::api::{ReclaimPolicy, SandboxVolume, SandboxVolumeStatus};
use crate::controller::events::normal;
use crate::controller::outcome::{Outcome, Report, VOLUME_ATTACHED};
use crate::controller::{Context, Error, Result, scaffold};
use crate::provider::labels::{Owner, RECLAIM_POLICY};
use crate::provider::validate;
use crate::provider::{ErrorKind, ProviderError, VolumeInfo, Volumes};
use crate::registry::ProviderHandle;

const KIND: &str = "SandboxVolume";

/// External name of a SandboxVolume's provider volume.
pub fn external_name(uid: &str) -> String {
    format!("sbxv-{uid}")
}

/// The reclaim policy in force: `Retain` unless the spec says `Delete`.
pub fn reclaim(volume: &SandboxVolume) -> ReclaimPolicy {
    match volume.spec.reclaim_policy {
        Some(ReclaimPolicy::Delete) => ReclaimPolicy::Delete,
        _ => ReclaimPolicy::Retain,
    }
}

/// One reconcile of one SandboxVolume.
pub async fn reconcile(volume: Arc<SandboxVolume>, ctx: Arc<Context>) -> Result<Action> {
    let ctx = &ctx;
    scaffold::reconcile(
        KIND,
        volume,
        ctx,
        |v, added| async move {
            added.wait().await?;
            apply(v, ctx).await
        },
        |v| cleanup(v, ctx),
    )
    .await
}

/// Backoff and metrics for failed reconciles.
pub fn error_policy(volume: Arc<SandboxVolume>, err: &Error, ctx: Arc<Context>) -> Action {
    scaffold::error_policy(KIND, volume.as_ref(), err, &ctx)
}

/// The Apply half: resolve the provider, record the volume name before any provider call,
/// make sure the volume exists, report.
async fn apply(volume: Arc<SandboxVolume>, ctx: &Context) -> Result<Action> {
    let r = Report::new(ctx, volume.as_ref(), None);
    let status = volume.status.clone().unwrap_or_default();
    let (mut current, mut next) = (status.clone(), status);
    let outcome = converge(&r, &mut current, &mut next)
        .await
        .unwrap_or_else(|ended| ended);
    r.conclude(&current, next, outcome).await
}

/// The stages of [`apply`]; each returns the outcome that ends the pass early.
async fn converge(
    r: &Report<'_, SandboxVolume>,
    current: &mut SandboxVolumeStatus,
    next: &mut SandboxVolumeStatus,
) -> Result<Outcome, Outcome> {
    let (ctx, volume) = (r.ctx, r.object);
    let handle = ctx
        .providers
        .resolve(volume.spec.provider.as_deref())
        .map_err(|msg| Outcome::stalled("ProviderNotConfigured", msg))?
        .clone();
    next.provider = Some(handle.name().to_string());
    let Some(volumes) = handle.provider.volumes() else {
        let msg = format!(
            "provider {:?} has no named volumes; use another provider",
            handle.name()
        );
        return Err(Outcome::stalled("VolumesUnsupported", msg));
    };
    let external = external_name(&volume.uid().unwrap_or_default());
    validate::resource_name("volume name", &external)
        .map_err(|msg| Outcome::stalled("InvalidName", msg))?;
    if current.volume_name.as_deref() != Some(external.as_str()) {
        next.volume_name = Some(external.clone());
        r.save(&*current, &*next).await?;
        *current = next.clone();
    }
    let info = match handle
        .call("get_volume", volumes.get_volume(&external))
        .await?
    {
        Some(info) => info,
        None => create(r, &handle, volumes, &external).await?,
    };
    next.attached = Some(info.attached);
    next.attached_to = info.attached_to.clone();
    next.size_bytes = info.size_bytes.and_then(|b| i64::try_from(b).ok());
    next.created_at = info.created_at.map(crate::api::rfc3339);
    Ok(Outcome::ready(
        "VolumeReady",
        format!("volume {external} exists"),
    ))
}

/// Creates the volume with the object's owner labels and its reclaim policy.
async fn create(
    r: &Report<'_, SandboxVolume>,
    handle: &ProviderHandle,
    volumes: &dyn Volumes,
    external: &str,
) -> Result<VolumeInfo, ProviderError> {
    let (ctx, volume) = (r.ctx, r.object);
    let owner = Owner {
        instance: ctx.instance.clone(),
        kind: KIND.into(),
        namespace: volume.namespace().unwrap_or_default(),
        name: volume.name_any(),
        uid: volume.uid().unwrap_or_default(),
    };
    let mut labels = owner.labels();
    labels.insert(RECLAIM_POLICY.into(), format!("{:?}", reclaim(volume)));
    let info = handle
        .call("create_volume", volumes.create_volume(external, &labels))
        .await?;
    let msg = format!("created volume {external} on provider {}", handle.name());
    normal(ctx, volume, "Created", msg).await;
    Ok(info)
}

/// Honour the reclaim policy; an attached volume is refused (`VolumeAttached`), a removal
/// that fails or cannot be confirmed says so (`CleanupBlocked`), and either is retried —
/// the finalizer keeps the object until then.
async fn cleanup(volume: Arc<SandboxVolume>, ctx: &Context) -> Result<Action> {
    let r = Report::new(ctx, volume.as_ref(), None);
    let current = volume.status.clone().unwrap_or_default();
    match release(&r, &current).await {
        Ok(action) => Ok(action),
        // A wait (a removal not shown yet): retried, nothing to report.
        Err(Outcome::Failed { error, .. }) => Err(error),
        Err(held) => {
            let mut next = current.clone();
            if matches!(held, Outcome::Held { reason, .. } if reason == VOLUME_ATTACHED) {
                next.attached = Some(true);
            }
            r.conclude(&current, next, held).await
        }
    }
}

/// Removes the volume (see [`cleanup`]); `Err` is why the finalizer stays.
async fn release(
    r: &Report<'_, SandboxVolume>,
    current: &SandboxVolumeStatus,
) -> Result<Action, Outcome> {
    let (ctx, volume) = (r.ctx, r.object);
    let external = external_name(&volume.uid().unwrap_or_default());
    if reclaim(volume) == ReclaimPolicy::Retain {
        let msg = format!("reclaimPolicy Retain: volume {external} is kept on the provider");
        normal(ctx, volume, "Retained", msg).await;
        return Ok(Action::await_change());
    }
    let provider = current
        .provider
        .clone()
        .or_else(|| volume.spec.provider.clone());
    let handle = match ctx.providers.resolve(provider.as_deref()) {
        Ok(h) => h.clone(),
        Err(_) if current.volume_name.is_none() => return Ok(Action::await_change()),
        Err(msg) => {
            let what = format!("reach provider {provider:?} to remove volume {external}");
            return Err(Outcome::cleanup_blocked(&what, Error::Dependency(msg)));
        }
    };
    let Some(volumes) = handle.provider.volumes() else {
        return Ok(Action::await_change());
    };
    let blocked = |e: ProviderError| {
        let what = format!(
            "remove volume {external} from provider {} and confirm it is gone",
            handle.name()
        );
        Outcome::cleanup_blocked(&what, e)
    };
    match handle
        .call("remove_volume", volumes.remove_volume(&external))
        .await
    {
        Ok(()) => {}
        Err(e) if e.is(ErrorKind::Conflict) => {
            return Err(Outcome::Held {
                reason: VOLUME_ATTACHED,
                message: format!("waiting to delete: {}", e.message()),
                error: Error::Provider(e),
            });
        }
        Err(e) => return Err(blocked(e)),
    }
    let left = handle
        .call("get_volume", volumes.get_volume(&external))
        .await;
    if left.map_err(blocked)?.is_some() {
        return Err(Outcome::failed(ProviderError::transient(format!(
            "volume {external} still present after removal"
        ))));
    }
    let msg = format!("removed volume {external} (reclaimPolicy Delete)");
    normal(ctx, volume, "Deleted", msg).await;
    Ok(Action::await_change())
}

/// Runs the SandboxVolume controller until `shutdown` resolves.
pub async fn run(
    ctx: Arc<Context>,
    triggers: impl Stream<Item = ObjectRef<SandboxVolume>> + Send + 'static,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
    namespace: Option<String>,
) {
    let api: Api<SandboxVolume> = match &namespace {
        Some(ns) => Api::namespaced(ctx.client.clone(), ns),
        None => Api::all(ctx.client.clone()),
    };
    Controller::new(api, watcher::Config::default().any_semantic())
        .reconcile_on(triggers)
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|res| async move {
            if let Err(err) = res {
                tracing::debug!(%err, "volume reconcile loop");
            }
        })
        .await;
}
