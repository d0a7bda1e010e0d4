//! Cleanup: remove the template once nothing is backed by it (and its published copy once no
//! restore reads it), confirm, then let the finalizer go.

use std::sync::Arc;

use kube::ResourceExt;
use kube::runtime::controller::Action;

use crate::api::{SandboxTemplate, TemplateSource};
use crate::controller::events::{normal, warning};
use crate::controller::outcome::{Outcome, TEMPLATE_IN_USE};
use crate::controller::{Error, Result};
use crate::provider::{ErrorKind, ProviderError, validate};
use crate::registry::ProviderHandle;

use super::report::{Progress, Report};
use super::{TemplateContext, destroy_leftover_helpers, foreign_owner, template_id};

/// The Cleanup half of the finalizer: what holds the deletion back is said on the object
/// (`TemplateInUse`, `CleanupBlocked`).
pub async fn cleanup(template: Arc<SandboxTemplate>, tctx: &TemplateContext) -> Result<Action> {
    let r = Report::new(&tctx.ctx, &template);
    let p = Progress::new(template.status.clone().unwrap_or_default());
    match release(&r, tctx, &p).await {
        Ok(action) => Ok(action),
        // A wait (a transfer finishing, a removal not shown yet): retried, nothing to report.
        Err(Outcome::Failed { error, .. }) => Err(error),
        Err(held) => {
            let mut p = p;
            if matches!(held, Outcome::Held { reason, .. } if reason == TEMPLATE_IN_USE) {
                p.next.in_use = Some(true);
            }
            r.conclude(p, held).await
        }
    }
}

/// Removes the template (see [`cleanup`]); `Err` is why the finalizer stays.
async fn release(r: &Report<'_>, tctx: &TemplateContext, p: &Progress) -> Result<Action, Outcome> {
    let template = r.template;
    let status = &p.written;
    let id = status
        .template_id
        .clone()
        .unwrap_or_else(|| template_id(template));
    let provider = status
        .provider
        .clone()
        .or_else(|| template.spec.provider.clone());
    let handle = match r.ctx.providers.resolve(provider.as_deref()) {
        Ok(h) => h.clone(),
        // Never made anywhere: nothing to clean up.
        Err(_) if status.template_id.is_none() => return Ok(Action::await_change()),
        Err(msg) => {
            let what = format!("reach provider {provider:?} to remove template {id}");
            return Err(Outcome::cleanup_blocked(&what, Error::Dependency(msg)));
        }
    };
    // A provider that cannot hold templates, or an id that was never valid: nothing was made.
    if r.ctx.templates.home(handle.provider.as_ref()).is_err()
        || validate::resource_name("template id", &id).is_err()
    {
        return Ok(Action::await_change());
    }
    // A transfer in flight finishes first: it may still commit a template.
    let uid = template.uid().unwrap_or_default();
    if tctx.transfers.running(&uid) {
        return Err(Outcome::failed(ProviderError::transient(format!(
            "a publish or fetch of template {id} is in progress; deleting it once that has finished"
        ))));
    }
    tctx.transfers.forget(&uid);
    let on = handle.name();
    destroy_leftover_helpers(&handle, &uid).await.map_err(|e| {
        let what = format!("destroy this template's transfer helpers on provider {on}");
        Outcome::cleanup_blocked(&what, e)
    })?;
    match remove(r, &handle, &id, p).await {
        Ok(Removal::Done) => {}
        Ok(Removal::InUse(msg)) => return Err(in_use(msg)),
        Ok(Removal::StillPresent) => {
            return Err(Outcome::failed(ProviderError::transient(format!(
                "template {id} is still present after removal; retrying"
            ))));
        }
        Err(e) => {
            let what = format!("remove template {id} from provider {on} and confirm it is gone");
            return Err(Outcome::cleanup_blocked(&what, e));
        }
    }
    let msg = format!("removed template {id} from provider {}", handle.name());
    normal(r.ctx, r.template, "Deleted", msg).await;
    Ok(Action::await_change())
}

/// A deletion that waits: the template still backs a sandbox (or a restore reads its
/// published copy). Retried with backoff, and at once when a Sandbox that named it goes.
fn in_use(msg: String) -> Outcome {
    Outcome::Held {
        reason: TEMPLATE_IN_USE,
        message: format!("not deleted while in use: {msg}"),
        error: Error::Provider(ProviderError::conflict(msg)),
    }
}

/// How a removal ended.
enum Removal {
    /// Gone (or never ours to remove).
    Done,
    /// Refused because something still uses it: why.
    InUse(String),
    /// Removed, but the provider still shows it (yet).
    StillPresent,
}

/// Removes the template and its published copy, and confirms.
async fn remove(
    r: &Report<'_>,
    handle: &ProviderHandle,
    id: &str,
    p: &Progress,
) -> Result<Removal> {
    let service = &r.ctx.templates;
    let provider = handle.provider.as_ref();
    let uid = r.template.uid().unwrap_or_default();
    let source = r.template.spec.source();
    // A Store SandboxTemplate on a provider that keeps templates in the store only referred
    // to the publisher's template: it removes nothing.
    if source == TemplateSource::Store && service.always_published(provider) {
        return Ok(Removal::Done);
    }
    let observed = handle
        .call("get_template", service.get(provider, id))
        .await?;
    let ours = observed
        .as_ref()
        .is_none_or(|t| foreign_owner(t, &uid).is_none());
    if ours {
        match handle
            .call("remove_template", service.remove(provider, id))
            .await
        {
            Ok(()) => {}
            Err(e) if e.is(ErrorKind::Conflict) => {
                return Ok(Removal::InUse(e.message().to_string()));
            }
            Err(e) => return Err(e.into()),
        }
    }
    let published = p.written.published == Some(true);
    if source == TemplateSource::Capture
        && published
        && !service.always_published(provider)
        && let Removal::InUse(msg) = unpublish(r, handle, id).await?
    {
        return Ok(Removal::InUse(msg));
    }
    // Confirm: only a provider that no longer holds it releases the finalizer.
    if ours
        && handle
            .call("get_template", service.get(provider, id))
            .await?
            .is_some()
    {
        return Ok(Removal::StillPresent);
    }
    Ok(Removal::Done)
}

/// Removes a native template's published copy; a provider that names no store any more
/// leaves it there, with a Warning saying so.
async fn unpublish(r: &Report<'_>, handle: &ProviderHandle, id: &str) -> Result<Removal> {
    let provider = handle.provider.as_ref();
    match handle
        .call("unpublish", r.ctx.templates.unpublish(provider, id))
        .await
    {
        Ok(()) => Ok(Removal::Done),
        Err(e) if e.is(ErrorKind::Conflict) => Ok(Removal::InUse(e.message().to_string())),
        Err(e) if e.is(ErrorKind::Unsupported) => {
            let msg = format!(
                "template {id} was published, but {}: its published copy is left in the store",
                e.message()
            );
            warning(r.ctx, r.template, "StoreNotConfigured", msg).await;
            Ok(Removal::Done)
        }
        Err(e) => Err(e.into()),
    }
}
