//! Cleanup: remove the template once nothing is backed by it (and its published copy once no
//! restore reads it), confirm, then let the finalizer go.

use std::sync::Arc;

use kube::ResourceExt;
use kube::runtime::controller::Action;

use crate::api::{SandboxTemplate, TemplateSource};
use crate::controller::events::{normal, warning};
use crate::controller::{Error, Result};
use crate::provider::{ErrorKind, ProviderError, validate};
use crate::registry::ProviderHandle;

use super::report::{Progress, Report};
use super::{TemplateContext, destroy_leftover_helpers, foreign_owner, template_id};

/// The Cleanup half of the finalizer.
pub async fn cleanup(template: Arc<SandboxTemplate>, tctx: &TemplateContext) -> Result<Action> {
    let r = Report::new(&tctx.ctx, &template);
    let status = template.status.clone().unwrap_or_default();
    let id = status
        .template_id
        .clone()
        .unwrap_or_else(|| template_id(&template));
    let provider = status
        .provider
        .clone()
        .or_else(|| template.spec.provider.clone());
    let handle = match r.ctx.providers.resolve(provider.as_deref()) {
        Ok(h) => h.clone(),
        // Never made anywhere: nothing to clean up.
        Err(_) if status.template_id.is_none() => return Ok(Action::await_change()),
        Err(msg) => {
            return Err(Error::Dependency(format!(
                "cannot remove template {id}: {msg}"
            )));
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
        return Err(Error::Provider(ProviderError::transient(format!(
            "a publish or fetch of template {id} is in progress; deleting it once that has finished"
        ))));
    }
    tctx.transfers.forget(&uid);
    destroy_leftover_helpers(&handle, &uid).await?;
    let p = Progress::new(status);
    if let Removal::InUse(msg) = remove(&r, &handle, &id, &p).await? {
        return r.in_use(p, msg).await;
    }
    let msg = format!("removed template {id} from provider {}", handle.name());
    normal(r.ctx, r.template, "Deleted", msg).await;
    Ok(Action::await_change())
}

/// How a removal ended.
enum Removal {
    /// Gone (or never ours to remove).
    Done,
    /// Refused because something still uses it: why.
    InUse(String),
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
        return Err(Error::Provider(ProviderError::transient(format!(
            "template {id} is still present after removal; retrying"
        ))));
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
