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
use crate::controller::events::{normal, warning};
use crate::controller::status::{self, Health};
use crate::controller::{Context, Error, Result, scaffold};
use crate::provider::labels::{Owner, RECLAIM_POLICY};
use crate::provider::validate;
use crate::provider::{ErrorKind, ProviderError};

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

async fn apply(volume: Arc<SandboxVolume>, ctx: &Context) -> Result<Action> {
    let ns = volume.namespace().unwrap_or_default();
    let api: Api<SandboxVolume> = Api::namespaced(ctx.client.clone(), &ns);
    let name = volume.name_any();
    let uid = volume.uid().unwrap_or_default();
    let current = volume.status.clone().unwrap_or_default();
    let mut next = current.clone();
    let generation = volume.metadata.generation;

    let handle = match ctx.providers.resolve(volume.spec.provider.as_deref()) {
        Ok(h) => h.clone(),
        Err(msg) => {
            return finish(
                &api,
                &name,
                &current,
                next,
                Health::stalled("ProviderNotConfigured", msg),
                generation,
                ctx,
            )
            .await;
        }
    };
    next.provider = Some(handle.name().to_string());
    let Some(volumes) = handle.provider.volumes() else {
        let msg = format!(
            "provider {:?} has no named volumes; use another provider",
            handle.name()
        );
        return finish(
            &api,
            &name,
            &current,
            next,
            Health::stalled("VolumesUnsupported", msg),
            generation,
            ctx,
        )
        .await;
    };
    let external = external_name(&uid);
    if let Err(msg) = validate::resource_name("volume name", &external) {
        return finish(
            &api,
            &name,
            &current,
            next,
            Health::stalled("InvalidName", msg),
            generation,
            ctx,
        )
        .await;
    }
    if current.volume_name.as_deref() != Some(external.as_str()) {
        next.volume_name = Some(external.clone());
        status::write(&api, &name, Some(&current), &next).await?;
    }
    let current = next.clone();

    let info = match handle
        .call("get_volume", volumes.get_volume(&external))
        .await
    {
        Ok(Some(info)) => info,
        Ok(None) => {
            let owner = Owner {
                instance: ctx.instance.clone(),
                kind: KIND.into(),
                namespace: ns.clone(),
                name: name.clone(),
                uid: uid.clone(),
            };
            let mut labels = owner.labels();
            labels.insert(RECLAIM_POLICY.into(), format!("{:?}", reclaim(&volume)));
            match handle
                .call("create_volume", volumes.create_volume(&external, &labels))
                .await
            {
                Ok(info) => {
                    normal(
                        ctx,
                        volume.as_ref(),
                        "Created",
                        format!("created volume {external} on provider {}", handle.name()),
                    )
                    .await;
                    info
                }
                Err(e) => return failure(ctx, &api, &volume, &current, next, e, generation).await,
            }
        }
        Err(e) => return failure(ctx, &api, &volume, &current, next, e, generation).await,
    };
    next.attached = Some(info.attached);
    next.attached_to = info.attached_to.clone();
    next.size_bytes = info.size_bytes.and_then(|b| i64::try_from(b).ok());
    next.created_at = info.created_at.map(crate::api::rfc3339);
    finish(
        &api,
        &name,
        &current,
        next,
        Health::ready("VolumeReady", format!("volume {external} exists")),
        generation,
        ctx,
    )
    .await
}

/// Honour the reclaim policy; an attached volume is refused (condition + Event) and retried
/// until free — the finalizer keeps the object until then.
async fn cleanup(volume: Arc<SandboxVolume>, ctx: &Context) -> Result<Action> {
    let ns = volume.namespace().unwrap_or_default();
    let api: Api<SandboxVolume> = Api::namespaced(ctx.client.clone(), &ns);
    let uid = volume.uid().unwrap_or_default();
    let external = external_name(&uid);
    let current = volume.status.clone().unwrap_or_default();
    if reclaim(&volume) == ReclaimPolicy::Retain {
        normal(
            ctx,
            volume.as_ref(),
            "Retained",
            format!("reclaimPolicy Retain: volume {external} is kept on the provider"),
        )
        .await;
        return Ok(Action::await_change());
    }
    let provider_name = current
        .provider
        .clone()
        .or_else(|| volume.spec.provider.clone());
    let handle = match ctx.providers.resolve(provider_name.as_deref()) {
        Ok(h) => h.clone(),
        Err(_) if current.volume_name.is_none() => return Ok(Action::await_change()),
        Err(msg) => return Err(Error::Dependency(format!("cannot remove volume: {msg}"))),
    };
    let Some(volumes) = handle.provider.volumes() else {
        return Ok(Action::await_change());
    };
    match handle
        .call("remove_volume", volumes.remove_volume(&external))
        .await
    {
        Ok(()) => {}
        Err(e) if e.is(ErrorKind::Conflict) => {
            let msg = e.message().to_string();
            let mut next = current.clone();
            let mut conditions = next.conditions.clone();
            Health::progressing("VolumeAttached", format!("waiting to delete: {msg}")).apply(
                &mut conditions,
                volume.metadata.generation,
                &status::now(),
            );
            next.conditions = conditions;
            next.attached = Some(true);
            status::write(&api, &volume.name_any(), Some(&current), &next).await?;
            warning(
                ctx,
                volume.as_ref(),
                "VolumeAttached",
                format!("not removing volume {external} while it is attached: {msg}"),
            )
            .await;
            return Err(Error::Provider(e));
        }
        Err(e) => return Err(e.into()),
    }
    if handle
        .call("get_volume", volumes.get_volume(&external))
        .await?
        .is_some()
    {
        return Err(Error::Provider(ProviderError::transient(format!(
            "volume {external} still present after removal"
        ))));
    }
    normal(
        ctx,
        volume.as_ref(),
        "Deleted",
        format!("removed volume {external} (reclaimPolicy Delete)"),
    )
    .await;
    Ok(Action::await_change())
}

async fn failure(
    ctx: &Context,
    api: &Api<SandboxVolume>,
    volume: &SandboxVolume,
    current: &SandboxVolumeStatus,
    next: SandboxVolumeStatus,
    err: ProviderError,
    generation: Option<i64>,
) -> Result<Action> {
    warning(
        ctx,
        volume,
        Error::Provider(err.clone()).category(),
        err.to_string(),
    )
    .await;
    if err.is_retryable() {
        let mut next = next;
        let mut conditions = next.conditions.clone();
        Health::progressing(Error::Provider(err.clone()).category(), err.to_string()).apply(
            &mut conditions,
            current.observed_generation,
            &status::now(),
        );
        next.conditions = conditions;
        let _ = status::write(api, &volume.name_any(), Some(current), &next).await;
        return Err(err.into());
    }
    finish(
        api,
        &volume.name_any(),
        current,
        next,
        Health::stalled(Error::Provider(err.clone()).category(), err.to_string()),
        generation,
        ctx,
    )
    .await
}

async fn finish(
    api: &Api<SandboxVolume>,
    name: &str,
    current: &SandboxVolumeStatus,
    mut next: SandboxVolumeStatus,
    health: Health,
    generation: Option<i64>,
    ctx: &Context,
) -> Result<Action> {
    let mut conditions = next.conditions.clone();
    health.apply(&mut conditions, generation, &status::now());
    next.conditions = conditions;
    next.observed_generation = generation;
    status::write(api, name, Some(current), &next).await?;
    Ok(Action::requeue(crate::jitter::by_key(ctx.resync, name)))
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
