//! The SandboxTemplate controller: a filesystem captured from a Sandbox (or fetched from the
//! shared store) that later Sandboxes boot from.
//!
//! Every template operation goes through the controller-side templates service
//! ([`crate::templates::service`]), so the same controller serves a provider that commits
//! images itself (Docker) and one that keeps templates as archives in an S3 store (Fly
//! Machines, E2B).
//!
//! A reconcile is the usual pipeline ([`apply`]): resolve the provider → record
//! `status.templateId` (before any provider call) → observe the template → decide (pure,
//! [`decide`]) → act step by step ([`steps`]), writing status after each → observe again →
//! report ([`report`]).
//!
//! - **Capture** (`spec.source: Capture`, the default) captures `capturePaths` of the Ready
//!   Sandbox `sandboxRef`. The capture inputs are hashed into `status.captureHash`; a spec
//!   with other inputs captures again, replacing the template under the same id.
//! - **Publish** (`spec.publish: true`) copies a native template to the provider's shared S3
//!   store; `publish: false` after a publish removes the copy again. On a provider without
//!   image commit the store is where the template lives, so it is always published.
//! - **Fetch** (`spec.source: Store`, or a published template whose local copy vanished)
//!   restores it from the store into a fresh sandbox and commits that — the restore is the
//!   security boundary — with this object's owner labels, so the sweeper knows who owns the
//!   result.
//! - **Deletion** ([`cleanup`]) removes the template only when nothing is backed by it
//!   (checked, never assumed): while something is, the finalizer stays, the `TemplateInUse`
//!   condition and a Warning Event say why, and the removal is retried with backoff (and at
//!   once when a Sandbox that named it goes away). The published copy goes too (a restore in
//!   flight holds it back the same way). Removing a template that is already gone succeeds.
//!   A removal that fails, or cannot be confirmed, says so in `CleanupBlocked`.
//!
//! Template ids are per provider (per store, for a provider without image commit): a
//! `spec.templateId` whose template another SandboxTemplate owns is refused
//! (`TemplateIdTaken`), never overwritten.
//!
//! Publishes and fetches move whole trees, so they run as background jobs ([`transfers`]),
//! one per object, bounded by the transfer limits rather than the provider-call timeout (and
//! outside the provider's concurrency bound); the object reports `Publishing`/`Fetching`
//! meanwhile. Their helper sandboxes carry the object's owner labels: one a crash left behind
//! is destroyed by the next reconcile that acts, or by the deletion.

pub mod apply;
pub mod cleanup;
pub mod decide;
pub mod report;
pub mod steps;
pub mod transfers;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;

use crate::api::SandboxTemplate;
use crate::controller::{Context, Error, Result, scaffold};
use crate::provider::labels::{KIND as KIND_LABEL, OWNER, OWNER_UID, Owner};
use crate::provider::{ProviderError, SandboxQuery, Template};
use crate::registry::ProviderHandle;
use crate::templates::transfer;

pub use decide::{capture_hash, template_id};
pub use transfers::Transfers;

const KIND: &str = "SandboxTemplate";

/// How long to wait before looking again at something that comes by itself (the Sandbox to
/// capture becoming Ready).
const WAIT: Duration = Duration::from_secs(5);
/// How long to wait before looking again for a template another cluster has not published
/// yet.
const STORE_WAIT: Duration = Duration::from_secs(30);

/// Condition type (and reason) saying a deletion waits because the template still backs a
/// sandbox, or a restore of its published copy is in flight.
pub use crate::controller::outcome::TEMPLATE_IN_USE;

/// What the template reconciles share: the common context (with the templates service) plus
/// the transfers in flight.
pub struct TemplateContext {
    /// The shared controller context.
    pub ctx: Arc<Context>,
    /// Publishes and fetches in flight.
    pub transfers: Arc<Transfers>,
}

/// One reconcile of one SandboxTemplate (through the shared scaffold).
pub async fn reconcile(
    template: Arc<SandboxTemplate>,
    tctx: Arc<TemplateContext>,
) -> Result<Action> {
    let tctx = &tctx;
    scaffold::reconcile(
        KIND,
        template,
        &tctx.ctx,
        |t, added| async move {
            added.wait().await?;
            apply::apply(t, tctx).await
        },
        |t| cleanup::cleanup(t, tctx),
    )
    .await
}

/// Retries with per-object exponential backoff and counts the error by category.
pub fn error_policy(
    template: Arc<SandboxTemplate>,
    err: &Error,
    tctx: Arc<TemplateContext>,
) -> Action {
    scaffold::error_policy(KIND, template.as_ref(), err, &tctx.ctx)
}

/// The owner labels a SandboxTemplate's provider resources carry (its template, its transfer
/// helpers, and a template fetched for a Sandbox that boots from it).
pub fn owner_of(template: &SandboxTemplate, instance: &str) -> Owner {
    Owner {
        instance: instance.to_string(),
        kind: KIND.into(),
        namespace: template.namespace().unwrap_or_default(),
        name: template.name_any(),
        uid: template.uid().unwrap_or_default(),
    }
}

/// The owner a template is labelled with, when it is not `uid` (an unlabelled or
/// empty-labelled template is not foreign: it can be adopted).
fn foreign_owner(t: &Template, uid: &str) -> Option<String> {
    let other = t
        .labels
        .get(OWNER_UID)
        .filter(|u| !u.is_empty() && *u != uid)?;
    let who = t.labels.get(OWNER).cloned().unwrap_or_default();
    Some(format!("{who}, UID {other}"))
}

/// Destroys transfer helpers (publish/fetch sandboxes) of this object that a crash left
/// behind: they carry its owner-uid label and the SandboxTemplate kind.
async fn destroy_leftover_helpers(handle: &ProviderHandle, uid: &str) -> Result<(), ProviderError> {
    let query = SandboxQuery {
        labels: [
            (OWNER_UID.to_string(), uid.to_string()),
            (KIND_LABEL.to_string(), KIND.to_string()),
        ]
        .into(),
        ..SandboxQuery::default()
    };
    for d in handle.call("find", handle.provider.find(&query)).await? {
        if transfer::is_helper(&d.labels) {
            tracing::info!(helper = %d.id, "destroying a transfer helper left behind");
            handle
                .call("destroy", handle.provider.destroy(&d.id))
                .await?;
        }
    }
    Ok(())
}

/// Runs the SandboxTemplate controller until `shutdown` resolves. A template is also
/// reconciled when the set of Sandboxes naming it (in `templateRef`) changes — told by the
/// Sandbox controller's watch through [`crate::controller::template_users::TemplateUsers`] — so `inUse` and a waiting
/// deletion follow promptly, while Sandbox status writes wake nothing here.
pub async fn run(
    ctx: Arc<Context>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
    namespace: Option<String>,
) {
    let api: Api<SandboxTemplate> = match &namespace {
        Some(ns) => Api::namespaced(ctx.client.clone(), ns),
        None => Api::all(ctx.client.clone()),
    };
    let users = ctx.template_users.take_triggers();
    let tctx = Arc::new(TemplateContext {
        ctx,
        transfers: Arc::default(),
    });
    let controller = Controller::new(api, watcher::Config::default().any_semantic());
    let controller = match users {
        Some(users) => controller.reconcile_on(users),
        None => controller,
    };
    controller
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, tctx)
        .for_each(|res| async move {
            if let Err(err) = res {
                tracing::debug!(%err, "template reconcile loop");
            }
        })
        .await;
}
