//! Reporting the outcome of a SandboxTemplate reconcile through the one
//! [`crate::controller::outcome::Report::conclude`], with the status as last written and as
//! the reconcile wants it next.

use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;

use crate::api::{SandboxTemplate, SandboxTemplateStatus};
use crate::controller::outcome::{self, Outcome};
use crate::controller::{Context, Result};

/// Status as last written, and as the reconcile wants it next.
pub struct Progress {
    /// What the API server holds (as far as this reconcile knows).
    pub written: SandboxTemplateStatus,
    /// What this reconcile has learned so far.
    pub next: SandboxTemplateStatus,
}

impl Progress {
    /// Starts from the object's status.
    pub fn new(status: SandboxTemplateStatus) -> Self {
        Progress {
            written: status.clone(),
            next: status,
        }
    }
}

/// Where a reconcile reports: the object and its API.
pub struct Report<'a> {
    /// The shared context (Events).
    pub ctx: &'a Context,
    /// The object's namespaced API.
    pub api: Api<SandboxTemplate>,
    /// The object.
    pub template: &'a SandboxTemplate,
}

impl<'a> Report<'a> {
    /// A reporter for `template`.
    pub fn new(ctx: &'a Context, template: &'a SandboxTemplate) -> Self {
        let ns = template.namespace().unwrap_or_default();
        Report {
            ctx,
            api: Api::namespaced(ctx.client.clone(), &ns),
            template,
        }
    }

    fn outcome(&self) -> outcome::Report<'_, SandboxTemplate> {
        outcome::Report::new(self.ctx, self.template, None)
    }

    /// Writes `p.next` when it differs from what was written.
    pub async fn save(&self, p: &mut Progress) -> kube::Result<()> {
        self.outcome().save(&p.written, &p.next).await?;
        p.written = p.next.clone();
        Ok(())
    }

    /// Ends the reconcile with `outcome` (status, Event, requeue).
    pub async fn conclude(&self, p: Progress, outcome: Outcome) -> Result<Action> {
        self.outcome().conclude(&p.written, p.next, outcome).await
    }
}
