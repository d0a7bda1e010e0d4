//! Restore: the step that gives a sandbox on a provider WITHOUT native templates (Fly
//! Machines, E2B) its template's files.
//!
//! Such a sandbox is created from the template manifest's base image and started; this step
//! then restores the template's archive into it through the templates service, whose restore
//! is the security boundary (rule 11): only the manifest's capture paths are extracted, `..`,
//! absolute members and symlink escapes are refused, and no setuid/setgid file survives
//! (asserted inside the sandbox). The main process runs from the start, so it sees the
//! restored files appear; the sandbox is reported Ready only after they have.
//!
//! A restore that fails is never handed out: the sandbox is destroyed and forgotten
//! (`status.sandboxId` cleared), so the next pass creates a fresh one rather than reporting
//! it gone. A refused archive is `Invalid` and stalls; a failed download retries.

use crate::api::{Sandbox, SandboxStatus};
use crate::controller::events::{normal, warning};
use crate::controller::{Context, Error};
use crate::provider::SandboxDescriptor;
use crate::registry::ProviderHandle;

use super::build::Desired;

/// Whether the sandbox observed now is the one the template was restored into. (Status
/// clears the record on every create and destroy, because a provider may reuse an id.)
pub fn restored(status: &SandboxStatus, observed: Option<&SandboxDescriptor>) -> bool {
    observed.is_some_and(|d| status.template_restored_into.as_deref() == Some(d.id.as_str()))
}

/// Restores `desired.restore` into the started sandbox `id` (see the module docs).
pub async fn restore(
    ctx: &Context,
    sandbox: &Sandbox,
    handle: &ProviderHandle,
    desired: &Desired,
    id: &str,
    next: &mut SandboxStatus,
) -> Result<(), Error> {
    let Some(template) = desired.restore.as_deref() else {
        return Ok(());
    };
    let provider = handle.provider.as_ref();
    match ctx.templates.restore(provider, id, template).await {
        Ok(m) => {
            next.template_restored_into = Some(id.to_string());
            let msg = format!(
                "restored template {template} ({:?}) into sandbox {id}",
                m.capture_paths
            );
            normal(ctx, sandbox, "TemplateRestored", msg).await;
            Ok(())
        }
        Err(e) => {
            let msg = format!(
                "restoring template {template} into sandbox {id} failed, so the sandbox is destroyed \
                 instead of handed out: {e}"
            );
            warning(ctx, sandbox, "TemplateRestoreFailed", msg).await;
            handle.call("destroy", provider.destroy(id)).await?;
            next.sandbox_id = None;
            next.template_restored_into = None;
            Err(e.into())
        }
    }
}
