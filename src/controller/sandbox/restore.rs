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
//! (`status.sandboxId` cleared), so a later pass creates a fresh one rather than reporting it
//! gone. A refused archive is `Invalid` and stalls; a failed download is retried. Either way
//! the next attempt waits out an exponential backoff ([`Retries`]): each attempt writes
//! status, and a status write queues the next reconcile at once, so without it a template
//! that cannot be restored would be a hot create/destroy loop against the provider.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::api::{Sandbox, SandboxStatus};
use crate::controller::backoff::delay_for;
use crate::controller::events::normal;
use crate::controller::outcome::Outcome;
use crate::controller::status::Health;
use crate::controller::{Context, Error};
use crate::provider::SandboxDescriptor;
use crate::registry::ProviderHandle;

use super::build::Desired;
use super::decide::{Plan, Step};

/// The condition/Event reason of a failed restore.
pub const RESTORE_FAILED: &str = "TemplateRestoreFailed";

/// Failed restores by Sandbox UID: when the last one failed, how many failed in a row, and
/// what was reported, so the next attempt waits its backoff and reports the same meanwhile.
#[derive(Default)]
pub struct Retries {
    failed: Mutex<HashMap<String, Failure>>,
}

struct Failure {
    at: Instant,
    attempts: u32,
    health: Health,
}

impl Retries {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Failure>> {
        self.failed.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn failed(&self, uid: &str, health: Health) {
        let mut map = self.lock();
        let attempts = map.get(uid).map_or(1, |f| f.attempts.saturating_add(1));
        let at = Instant::now();
        map.insert(
            uid.to_string(),
            Failure {
                at,
                attempts,
                health,
            },
        );
    }

    /// A plan that would restore while the last restore of this Sandbox is still backing
    /// off: report what was reported, and look again when the wait is over.
    pub fn hold(&self, desired: &Desired, plan: &Plan) -> Option<Outcome> {
        if desired.restore.is_none() || !plan.steps.contains(&Step::Restore) {
            return None;
        }
        let (health, left) = self.waiting(&desired.request.owner.uid)?;
        let (reason, message) = (health.reason().to_string(), health.message().to_string());
        Some(match health {
            Health::Stalled { .. } => Outcome::Stalled {
                reason,
                message,
                recheck: Some(left),
            },
            _ => Outcome::Waiting {
                reason,
                message,
                recheck: Some(left),
            },
        })
    }

    /// Restores `desired.restore` into the started sandbox `id` (see the module docs).
    pub async fn restore(
        &self,
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
        let uid = &desired.request.owner.uid;
        match ctx.templates.restore(provider, id, template).await {
            Ok(m) => {
                self.succeeded(uid);
                next.template_restored_into = Some(id.to_string());
                let msg = format!(
                    "restored template {template} ({:?}) into sandbox {id}",
                    m.capture_paths
                );
                normal(ctx, sandbox, "TemplateRestored", msg).await;
                Ok(())
            }
            Err(e) => {
                handle.call("destroy", provider.destroy(id)).await?;
                next.sandbox_id = None;
                next.template_restored_into = None;
                let err = Error::from(e.with_reason(RESTORE_FAILED).context(format!(
                    "restoring template {template} into sandbox {id} failed, so the sandbox was \
                     destroyed instead of handed out"
                )));
                // Reported as the failure itself is (retryable: Reconciling, else Stalled).
                let health = match &err {
                    Error::Provider(p) if p.is_retryable() => {
                        Health::progressing(err.category(), err.to_string())
                    }
                    _ => Health::stalled(err.category(), err.to_string()),
                };
                self.failed(uid, health);
                Err(err)
            }
        }
    }

    fn succeeded(&self, uid: &str) {
        self.lock().remove(uid);
    }

    /// What to report, and how long to wait, while `uid`'s next restore attempt waits.
    fn waiting(&self, uid: &str) -> Option<(Health, Duration)> {
        let map = self.lock();
        let f = map.get(uid)?;
        let left = delay_for(f.attempts).checked_sub(f.at.elapsed())?;
        (!left.is_zero()).then(|| (f.health.clone(), left))
    }
}

/// Whether the sandbox observed now is the one the template was restored into. (Status
/// clears the record on every create and destroy, because a provider may reuse an id.)
pub fn restored(status: &SandboxStatus, observed: Option<&SandboxDescriptor>) -> bool {
    observed.is_some_and(|d| status.template_restored_into.as_deref() == Some(d.id.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_restore_waits_its_backoff_and_a_success_forgets_it() {
        let retries = Retries::default();
        assert!(retries.waiting("u").is_none(), "nothing failed yet");
        retries.failed("u", Health::stalled(RESTORE_FAILED, "refused"));
        let (health, left) = retries.waiting("u").expect("waits after a failure");
        assert_eq!(health.reason(), RESTORE_FAILED);
        assert!(left <= delay_for(1), "{left:?}");
        retries.failed("u", Health::stalled(RESTORE_FAILED, "refused"));
        let (_, left) = retries.waiting("u").expect("waits longer after two");
        assert!(left > delay_for(1) && left <= delay_for(2), "{left:?}");
        assert!(retries.waiting("other").is_none(), "per object");
        retries.succeeded("u");
        assert!(retries.waiting("u").is_none());
    }
}
