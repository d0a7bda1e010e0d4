//! Reporting the outcome of a SandboxTemplate reconcile: status (conditions, observed
//! generation) and Events, and when to look again.

use std::time::Duration;

use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;

use crate::api::{SandboxTemplate, SandboxTemplateStatus, condition};
use crate::controller::events::warning;
use crate::controller::status::{self, Health, READY};
use crate::controller::{Context, Error, Result};
use crate::provider::ProviderError;

use super::TEMPLATE_IN_USE;

/// Why the pipeline stopped before the template was ready.
pub enum Blocked {
    /// Waiting for something that comes by itself: `(reason, message, recheck after)`.
    Wait(&'static str, String, Duration),
    /// Needs a change from the user: `(reason, message)`.
    Stall(&'static str, String),
    /// A failure: retryable ones back off, the others stall.
    Failed(Error),
}

impl From<ProviderError> for Blocked {
    fn from(e: ProviderError) -> Self {
        Blocked::Failed(Error::Provider(e))
    }
}

impl From<Error> for Blocked {
    fn from(e: Error) -> Self {
        Blocked::Failed(e)
    }
}

impl From<kube::Error> for Blocked {
    fn from(e: kube::Error) -> Self {
        Blocked::Failed(Error::Kube(e))
    }
}

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

/// Where a reconcile reports: the object, its API, and the generation its outcome belongs to.
pub struct Report<'a> {
    /// The shared context (Events).
    pub ctx: &'a Context,
    /// The object's namespaced API.
    pub api: Api<SandboxTemplate>,
    /// The object.
    pub template: &'a SandboxTemplate,
    /// `metadata.generation`.
    pub generation: Option<i64>,
}

impl<'a> Report<'a> {
    /// A reporter for `template`.
    pub fn new(ctx: &'a Context, template: &'a SandboxTemplate) -> Self {
        let ns = template.namespace().unwrap_or_default();
        Report {
            ctx,
            api: Api::namespaced(ctx.client.clone(), &ns),
            template,
            generation: template.metadata.generation,
        }
    }

    /// Writes `p.next` when it differs from what was written.
    pub async fn save(&self, p: &mut Progress) -> kube::Result<()> {
        let name = self.template.name_any();
        status::write(&self.api, &name, Some(&p.written), &p.next).await?;
        p.written = p.next.clone();
        Ok(())
    }

    /// Reports a pipeline that stopped early.
    pub async fn blocked(&self, p: Progress, blocked: Blocked) -> Result<Action> {
        match blocked {
            Blocked::Wait(reason, msg, after) => {
                self.finish(p, Health::progressing(reason, msg), Some(after))
                    .await
            }
            Blocked::Stall(reason, msg) => self.finish(p, Health::stalled(reason, msg), None).await,
            Blocked::Failed(e) => self.failure(p, e).await,
        }
    }

    /// A failure: retryable ones report `Ready=False` and back off; the rest stall.
    pub async fn failure(&self, mut p: Progress, err: Error) -> Result<Action> {
        let retryable =
            matches!(&err, Error::Provider(e) if e.is_retryable()) || matches!(err, Error::Kube(_));
        if !retryable {
            let health = Health::stalled(err.category(), err.to_string());
            return self.finish(p, health, None).await;
        }
        // Keep the previous observedGeneration: this generation is not done.
        let observed = p.written.observed_generation;
        p.next.observed_generation = observed;
        let mut conditions = p.next.conditions.clone();
        Health::progressing(err.category(), err.to_string()).apply(
            &mut conditions,
            observed,
            &status::now(),
        );
        p.next.conditions = conditions;
        let _ = self.save(&mut p).await;
        Err(err)
    }

    /// Writes conditions + observedGeneration and decides when to look again.
    pub async fn finish(
        &self,
        mut p: Progress,
        health: Health,
        requeue: Option<Duration>,
    ) -> Result<Action> {
        let stalled = matches!(health, Health::Stalled { .. });
        let mut conditions = p.next.conditions.clone();
        health.apply(&mut conditions, self.generation, &status::now());
        // A live object is not waiting to be deleted.
        conditions.retain(|c| c.type_ != TEMPLATE_IN_USE);
        p.next.conditions = conditions;
        p.next.observed_generation = self.generation;
        let previous = condition(&p.written.conditions, READY).map(|c| c.reason.clone());
        if stalled && previous.as_deref() != Some(health.reason()) {
            let message = health.message().to_string();
            warning(self.ctx, self.template, health.reason(), message).await;
        }
        self.save(&mut p).await?;
        let uid = self.template.uid().unwrap_or_default();
        Ok(Action::requeue(requeue.unwrap_or_else(|| {
            crate::jitter::by_key(self.ctx.resync, &uid)
        })))
    }

    /// A deletion that waits: the template still backs a sandbox (or a restore reads its
    /// published copy). Says so in `TemplateInUse` and an Event, and retries with backoff.
    pub async fn in_use(&self, mut p: Progress, msg: String) -> Result<Action> {
        let message = format!("not deleted while in use: {msg}");
        let mut conditions = p.next.conditions.clone();
        let now = status::now();
        Health::progressing(TEMPLATE_IN_USE, message.clone()).apply(
            &mut conditions,
            self.generation,
            &now,
        );
        status::upsert(
            &mut conditions,
            TEMPLATE_IN_USE,
            "True",
            TEMPLATE_IN_USE,
            &message,
            self.generation,
            &now,
        );
        p.next.conditions = conditions;
        p.next.in_use = Some(true);
        self.save(&mut p).await?;
        warning(self.ctx, self.template, TEMPLATE_IN_USE, message).await;
        Err(Error::Provider(ProviderError::conflict(msg)))
    }
}
