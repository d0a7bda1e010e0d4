//! The SandboxTemplate controller: a filesystem captured from a Sandbox (or fetched from the
//! shared store) that later Sandboxes boot from.
//!
//! A reconcile is the usual pipeline: resolve the provider → record `status.templateId`
//! (before any provider call) → observe the provider's template → decide (pure, [`decide`])
//! → act step by step, writing status after each → observe again → report.
//!
//! - **Capture** (`spec.source: Capture`, the default) commits `capturePaths` of the Ready
//!   Sandbox `sandboxRef` through the provider's template capability. The capture inputs are
//!   hashed into `status.captureHash`; a spec with other inputs captures again, replacing the
//!   template under the same id.
//! - **Publish** (`spec.publish: true`) copies it to the provider's shared S3 store;
//!   `publish: false` after a publish removes the copy again.
//! - **Fetch** (`spec.source: Store`, or a published template whose local copy vanished)
//!   restores it from the store into a fresh sandbox and commits that — through
//!   [`transfer::fetch_into`], whose restore is the security boundary, with this object's
//!   owner labels so the sweeper knows who owns the result.
//! - **Deletion** removes the provider template only when the provider says nothing is
//!   backed by it (checked, never assumed): while one is, the finalizer stays, the
//!   `TemplateInUse` condition and a Warning Event say why, and the removal is retried with
//!   backoff (and at once when a Sandbox that named it goes away). The published copy goes
//!   too (a restore in flight holds it back the same way). Removing a template that is
//!   already gone succeeds.
//!
//! Template ids are per provider: a `spec.templateId` whose template another SandboxTemplate
//! owns is refused (`TemplateIdTaken`), never overwritten.
//!
//! Publishes and fetches move whole trees, so they run as background jobs ([`Transfers`]),
//! one per object, bounded by the transfer limits rather than the provider-call timeout (and
//! outside the provider's concurrency bound); the object reports `Publishing`/`Fetching`
//! meanwhile. Their helper sandboxes carry the object's owner labels: one a crash left behind
//! is destroyed by the next reconcile that acts, or by the deletion.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use sha2::{Digest, Sha256};

use crate::api::{
    FINALIZER, Sandbox, SandboxTemplate, SandboxTemplateStatus, TemplateSource, condition,
};
use crate::controller::events::{normal, warning};
use crate::controller::status::{self, Health, READY};
use crate::controller::{Context, Error, Result};
use crate::provider::labels::{OWNER_UID, Owner};
use crate::provider::{CommitRequest, ErrorKind, ProviderError, SandboxQuery, Template, validate};
use crate::registry::ProviderHandle;
use crate::templates::store::TemplateStore;
use crate::templates::transfer::{self, Limits};

const KIND: &str = "SandboxTemplate";

/// How long to wait before looking again at something that comes by itself (the Sandbox to
/// capture becoming Ready).
const WAIT: Duration = Duration::from_secs(5);
/// How long to wait before looking again for a template another cluster has not published
/// yet.
const STORE_WAIT: Duration = Duration::from_secs(30);

/// Condition type (and reason) saying a deletion waits because the template still backs a
/// sandbox, or a restore of its published copy is in flight.
pub const TEMPLATE_IN_USE: &str = "TemplateInUse";

/// Template stores by provider name, with their transfer limits.
pub type Stores = BTreeMap<String, (Arc<TemplateStore>, Limits)>;

/// What the template reconciles share: the common context plus the template stores.
pub struct TemplateContext {
    /// The shared controller context.
    pub ctx: Arc<Context>,
    /// The store of each provider that names one.
    pub stores: Stores,
    /// Publishes and fetches in flight.
    pub transfers: Arc<Transfers>,
}

/// Publishes and fetches run as background jobs, at most one per SandboxTemplate: they take
/// as long as the bytes take (bounded by the transfer limits), not a provider-call timeout,
/// and a reconcile that finds one running waits for it instead of starting a second.
#[derive(Default)]
pub struct Transfers {
    jobs: std::sync::Mutex<std::collections::HashMap<String, Job>>,
}

enum Job {
    Running,
    /// The step, what it was started for (the capture it publishes), and its result.
    Done(Step, String, Result<Option<Template>, ProviderError>),
}

/// Where a background transfer is.
enum Poll {
    /// Started now, or still running.
    Running,
    /// Finished with this result (handed out once).
    Done(Result<Option<Template>, ProviderError>),
}

impl Transfers {
    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, Job>> {
        self.jobs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The result of `step` on `subject` for object `key` when its job has finished;
    /// otherwise starts the job `start` makes (unless one is running already) and says it
    /// runs. A finished job of another step or subject is stale and dropped.
    fn poll_or_start<F, Fut>(
        self: &Arc<Self>,
        key: &str,
        step: Step,
        subject: &str,
        start: F,
    ) -> Poll
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<Option<Template>, ProviderError>> + Send + 'static,
    {
        let mut jobs = self.lock();
        match jobs.remove(key) {
            Some(Job::Done(done, of, result)) if done == step && of == subject => {
                return Poll::Done(result);
            }
            // The result of another step is stale now: start this one.
            Some(Job::Done(..)) | None => {}
            Some(Job::Running) => {
                jobs.insert(key.to_string(), Job::Running);
                return Poll::Running;
            }
        }
        jobs.insert(key.to_string(), Job::Running);
        drop(jobs);
        let (this, key, of, job) = (self.clone(), key.to_string(), subject.to_string(), start());
        tokio::spawn(async move {
            let result = job.await;
            this.lock().insert(key, Job::Done(step, of, result));
        });
        Poll::Running
    }

    /// Takes the finished result of `step` for `key`, if there is one.
    fn take(&self, key: &str, step: Step) -> Option<Result<Option<Template>, ProviderError>> {
        let mut jobs = self.lock();
        match jobs.remove(key) {
            Some(Job::Done(done, _, result)) if done == step => Some(result),
            Some(other) => {
                jobs.insert(key.to_string(), other);
                None
            }
            None => None,
        }
    }

    /// Puts a result taken with [`Transfers::take`] back.
    fn put_back(
        &self,
        key: &str,
        step: Step,
        subject: &str,
        result: Result<Option<Template>, ProviderError>,
    ) {
        self.lock().insert(
            key.to_string(),
            Job::Done(step, subject.to_string(), result),
        );
    }

    /// Whether a job for `key` is running.
    fn running(&self, key: &str) -> bool {
        matches!(self.lock().get(key), Some(Job::Running))
    }

    /// Forgets a finished job of `key` (its object is gone).
    fn forget(&self, key: &str) {
        let mut jobs = self.lock();
        if matches!(jobs.get(key), Some(Job::Done(..))) {
            jobs.remove(key);
        }
    }
}

/// How often a reconcile looks again at a transfer in flight.
const TRANSFER_POLL: Duration = Duration::from_secs(2);

/// The longest a background transfer may take before it is given up: the in-sandbox
/// transfer budget twice over (covers the helper's create, start, commit and destroy).
fn transfer_bound(limits: &Limits) -> Duration {
    Duration::from_secs(limits.lease_ttl_secs().saturating_mul(2))
}

/// The provider template id of a SandboxTemplate: `spec.templateId`, else `sbxt-<uid>`.
pub fn template_id(template: &SandboxTemplate) -> String {
    template
        .spec
        .template_id
        .clone()
        .unwrap_or_else(|| format!("sbxt-{}", template.uid().unwrap_or_default()))
}

/// Hash of what a capture is made from: the Sandbox, the paths (as a set) and the label.
pub fn capture_hash(template: &SandboxTemplate) -> String {
    let mut paths = template.spec.capture_paths.clone().unwrap_or_default();
    for p in &mut paths {
        let trimmed = p.trim_end_matches('/').len();
        p.truncate(trimmed);
    }
    paths.sort();
    paths.dedup();
    let material = serde_json::json!({
        "sandboxRef": template.spec.sandbox_ref.as_ref().map(|r| r.name.clone()),
        "capturePaths": paths,
        "label": template.spec.label,
    });
    let digest = Sha256::digest(material.to_string().as_bytes());
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// What the spec asks for, reduced to what [`decide`] needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Desired {
    /// Where the template comes from.
    pub source: TemplateSource,
    /// The capture inputs' hash (`Capture` only).
    pub hash: String,
    /// Whether it should be in the shared store.
    pub publish: bool,
}

/// What is known about the template, reduced to what [`decide`] needs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Observed {
    /// The provider holds a template under the id.
    pub exists: bool,
    /// It is labelled with another object's UID (`Some(owner)`): not ours to replace.
    pub foreign_owner: Option<String>,
    /// `status.captureHash`: what the template at the provider was captured from.
    pub captured_hash: Option<String>,
    /// `status.published`.
    pub published: bool,
}

/// One provider action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Capture `capturePaths` of `sandboxRef` (replacing an earlier capture).
    Capture,
    /// Restore the template from the shared store onto the provider.
    Fetch,
    /// Copy the template into the shared store.
    Publish,
    /// Remove the copy from the shared store.
    Unpublish,
}

/// The decision of one reconcile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Run these steps, in order (none: converged).
    Steps(Vec<Step>),
    /// Nothing can be done until the spec or the world changes: `(reason, message)`.
    Stall(&'static str, String),
}

/// Decide (pure): desired + observed → steps.
pub fn decide(desired: &Desired, observed: &Observed, id: &str) -> Decision {
    if let Some(owner) = &observed.foreign_owner {
        return Decision::Stall(
            "TemplateIdTaken",
            format!(
                "template id {id} already holds a template of another SandboxTemplate ({owner}); set a different \
                 spec.templateId (a template is never overwritten by another object)"
            ),
        );
    }
    match desired.source {
        TemplateSource::Store => Decision::Steps(if observed.exists {
            Vec::new()
        } else {
            vec![Step::Fetch]
        }),
        TemplateSource::Capture => {
            let mut steps = Vec::new();
            let stale = observed.captured_hash.as_deref() != Some(desired.hash.as_str());
            if stale {
                steps.push(Step::Capture);
            } else if !observed.exists {
                if observed.published {
                    // The local copy vanished; the shared store still has it.
                    steps.push(Step::Fetch);
                } else {
                    return Decision::Stall(
                        "TemplateGone",
                        format!(
                            "the provider no longer holds template {id} (removed outside the operator) and it \
                             was never published; change spec.capturePaths or spec.label to capture again, or \
                             delete the SandboxTemplate (a Sandbox is never booted from the plain image instead)"
                        ),
                    );
                }
            }
            let published_after = observed.published && !stale;
            if desired.publish && !published_after {
                steps.push(Step::Publish);
            }
            if !desired.publish && observed.published {
                steps.push(Step::Unpublish);
            }
            Decision::Steps(steps)
        }
    }
}

/// Why a step could not run.
enum Blocked {
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

impl From<kube::Error> for Blocked {
    fn from(e: kube::Error) -> Self {
        Blocked::Failed(Error::Kube(e))
    }
}

/// One reconcile of one SandboxTemplate.
pub async fn reconcile(
    template: Arc<SandboxTemplate>,
    tctx: Arc<TemplateContext>,
) -> Result<Action> {
    let ctx = &tctx.ctx;
    let _timer = ctx.metrics.reconcile_timer(KIND);
    let ns = template.namespace().unwrap_or_default();
    let key = format!("{KIND}/{ns}/{}", template.name_any());
    let api: Api<SandboxTemplate> = Api::namespaced(ctx.client.clone(), &ns);
    let result = crate::controller::finalizer_outcome(
        finalizer(&api, FINALIZER, template, |event| async {
            match event {
                Finalizer::Apply(t) => apply(t, &tctx).await,
                Finalizer::Cleanup(t) => cleanup(t, &tctx).await,
            }
        })
        .await,
    );
    if result.is_ok() {
        ctx.backoff.reset(&key);
    }
    result
}

/// Backoff and metrics for failed reconciles.
pub fn error_policy(
    template: Arc<SandboxTemplate>,
    err: &Error,
    tctx: Arc<TemplateContext>,
) -> Action {
    let ctx = &tctx.ctx;
    ctx.metrics.reconcile_error(KIND, err.category());
    let key = format!(
        "{KIND}/{}/{}",
        template.namespace().unwrap_or_default(),
        template.name_any()
    );
    let delay = ctx.backoff.next_delay(&key);
    tracing::warn!(template = %key, error = %err, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

fn owner_of(template: &SandboxTemplate, instance: &str) -> Owner {
    Owner {
        instance: instance.to_string(),
        kind: KIND.into(),
        namespace: template.namespace().unwrap_or_default(),
        name: template.name_any(),
        uid: template.uid().unwrap_or_default(),
    }
}

/// The owner a provider template is labelled with, when it is not `uid` (an unlabelled or
/// empty-labelled template — e.g. one fetched by a Sandbox without an owner — is not
/// foreign: it can be adopted).
fn foreign_owner(t: &Template, uid: &str) -> Option<String> {
    let other = t
        .labels
        .get(OWNER_UID)
        .filter(|u| !u.is_empty() && *u != uid)?;
    let who = t
        .labels
        .get(crate::provider::labels::OWNER)
        .cloned()
        .unwrap_or_default();
    Some(format!("{who}, UID {other}"))
}

/// Fills the observed fields of status from the provider's template.
fn record(next: &mut SandboxTemplateStatus, t: &Template) {
    next.ref_ = Some(t.reference.clone());
    next.created_at = t
        .created_at
        .map(|c| c.to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
    next.size_bytes = t.size_bytes.and_then(|b| i64::try_from(b).ok());
    next.in_use = Some(t.in_use);
}

/// The Sandbox to capture, when it can be captured now.
async fn capture_source(
    ctx: &Context,
    template: &SandboxTemplate,
    provider: &str,
) -> Result<String, Blocked> {
    let ns = template.namespace().unwrap_or_default();
    let Some(sref) = &template.spec.sandbox_ref else {
        return Err(Blocked::Stall(
            "InvalidSpec",
            "spec.sandboxRef is required when spec.source is Capture".into(),
        ));
    };
    let sandboxes: Api<Sandbox> = Api::namespaced(ctx.client.clone(), &ns);
    let Some(sandbox) = sandboxes.get_opt(&sref.name).await? else {
        return Err(Blocked::Wait(
            "SandboxNotFound",
            format!(
                "spec.sandboxRef: Sandbox {:?} does not exist in namespace {ns:?} yet",
                sref.name
            ),
            WAIT,
        ));
    };
    let st = sandbox.status.clone().unwrap_or_default();
    if let Some(p) = st.provider.as_deref().or(sandbox.spec.provider.as_deref())
        && p != provider
    {
        return Err(Blocked::Stall(
            "ProviderMismatch",
            format!(
                "spec.sandboxRef: Sandbox {:?} runs on provider {p:?}, this SandboxTemplate is on {provider:?}; \
                 remove spec.provider or set it to {p:?}",
                sref.name
            ),
        ));
    }
    let ready = condition(&st.conditions, READY).is_some_and(|c| c.status == "True");
    match st.sandbox_id.filter(|_| ready) {
        Some(id) => Ok(id),
        None => Err(Blocked::Wait(
            "SandboxNotReady",
            format!(
                "waiting for Sandbox {:?} to become Ready before capturing it",
                sref.name
            ),
            WAIT,
        )),
    }
}

/// Destroys transfer helpers (publish/fetch sandboxes) of this object that a crash left
/// behind; they carry its owner-uid label.
async fn destroy_leftover_helpers(handle: &ProviderHandle, uid: &str) -> Result<(), ProviderError> {
    let query = SandboxQuery {
        labels: [(OWNER_UID.to_string(), uid.to_string())].into(),
        ..SandboxQuery::default()
    };
    for d in handle.call("find", handle.provider.find(&query)).await? {
        if transfer::is_helper(&d.id) {
            tracing::info!(helper = %d.id, "destroying a transfer helper left behind");
            handle
                .call("destroy", handle.provider.destroy(&d.id))
                .await?;
        }
    }
    Ok(())
}

async fn apply(template: Arc<SandboxTemplate>, tctx: &TemplateContext) -> Result<Action> {
    let ctx = tctx.ctx.as_ref();
    let ns = template.namespace().unwrap_or_default();
    let api: Api<SandboxTemplate> = Api::namespaced(ctx.client.clone(), &ns);
    let name = template.name_any();
    let uid = template
        .uid()
        .ok_or_else(|| Error::InvalidSpec("object has no UID".into()))?;
    let generation = template.metadata.generation;
    let current = template.status.clone().unwrap_or_default();
    let mut next = current.clone();
    let source = template.spec.source();

    // Which provider: spec.provider, what status recorded, the captured Sandbox's, the default.
    let mut provider_name = template
        .spec
        .provider
        .clone()
        .or_else(|| current.provider.clone());
    if provider_name.is_none()
        && source == TemplateSource::Capture
        && let Some(sref) = &template.spec.sandbox_ref
    {
        let sandboxes: Api<Sandbox> = Api::namespaced(ctx.client.clone(), &ns);
        match sandboxes.get_opt(&sref.name).await? {
            Some(s) => {
                provider_name = s
                    .status
                    .as_ref()
                    .and_then(|st| st.provider.clone())
                    .or_else(|| s.spec.provider.clone());
            }
            None => {
                let msg = format!(
                    "spec.sandboxRef: Sandbox {:?} does not exist in namespace {ns:?} yet",
                    sref.name
                );
                return finish(
                    ctx,
                    &api,
                    &template,
                    &current,
                    next,
                    Health::progressing("SandboxNotFound", msg),
                    generation,
                    Some(WAIT),
                )
                .await;
            }
        }
    }
    let handle = match ctx.providers.resolve(provider_name.as_deref()) {
        Ok(h) => h.clone(),
        Err(msg) => {
            return finish(
                ctx,
                &api,
                &template,
                &current,
                next,
                Health::stalled("ProviderNotConfigured", msg),
                generation,
                None,
            )
            .await;
        }
    };
    next.provider = Some(handle.name().to_string());
    let Some(templates) = handle.provider.templates() else {
        let msg = format!(
            "provider {:?} cannot hold templates; use another provider (spec.provider)",
            handle.name()
        );
        return finish(
            ctx,
            &api,
            &template,
            &current,
            next,
            Health::stalled("TemplatesUnsupported", msg),
            generation,
            None,
        )
        .await;
    };
    let id = template_id(&template);
    if let Err(msg) = validate::resource_name("spec.templateId", &id) {
        return finish(
            ctx,
            &api,
            &template,
            &current,
            next,
            Health::stalled("InvalidTemplateId", msg),
            generation,
            None,
        )
        .await;
    }
    // The id goes into status BEFORE any provider call: a crash after the commit leaves a
    // record of what to look for.
    if current.template_id.as_deref() != Some(id.as_str()) || current.provider != next.provider {
        next.template_id = Some(id.clone());
        status::write(&api, &name, Some(&current), &next).await?;
    }
    let current = next.clone();

    // A fetch that finished in the background: the template it committed is observed below;
    // its success is reported here.
    match tctx.transfers.take(&uid, Step::Fetch) {
        Some(Ok(Some(_))) => {
            normal(
                ctx,
                template.as_ref(),
                "Fetched",
                format!("fetched template {id} from the shared template store"),
            )
            .await;
        }
        // Nothing fetched, or a failure: left for the Fetch step to report.
        Some(other) => tctx.transfers.put_back(&uid, Step::Fetch, &id, other),
        None => {}
    }

    // Observe.
    let observed = match handle
        .call("get_template", templates.get_template(&id))
        .await
    {
        Ok(t) => t,
        Err(e) => {
            return provider_failure(ctx, &api, &template, &current, next, e.into(), generation)
                .await;
        }
    };
    let desired = Desired {
        source,
        hash: capture_hash(&template),
        publish: template.spec.publish.unwrap_or(false) && source == TemplateSource::Capture,
    };
    let facts = Observed {
        exists: observed.is_some(),
        foreign_owner: observed.as_ref().and_then(|t| foreign_owner(t, &uid)),
        captured_hash: current.capture_hash.clone(),
        published: current.published.unwrap_or(false),
    };

    // Decide (pure).
    let steps = match decide(&desired, &facts, &id) {
        Decision::Stall(reason, msg) => {
            if let Some(t) = &observed {
                record(&mut next, t);
            }
            return finish(
                ctx,
                &api,
                &template,
                &current,
                next,
                Health::stalled(reason, msg),
                generation,
                None,
            )
            .await;
        }
        Decision::Steps(steps) => steps,
    };

    // Act.
    // Helpers of this object are leftovers unless a transfer of ours is running.
    if !steps.is_empty()
        && !tctx.transfers.running(&uid)
        && let Err(e) = destroy_leftover_helpers(&handle, &uid).await
    {
        return provider_failure(ctx, &api, &template, &current, next, e.into(), generation).await;
    }
    let owner = owner_of(&template, &ctx.instance);
    let store = tctx.stores.get(handle.name()).cloned();
    for step in steps {
        let before = next.clone();
        let outcome = act(
            ctx,
            &template,
            &handle,
            &id,
            &owner,
            store.as_ref(),
            &tctx.transfers,
            step,
            &mut next,
        )
        .await;
        match outcome {
            Ok(()) => {
                status::write(&api, &name, Some(&before), &next).await?;
            }
            Err(Blocked::Wait(reason, msg, after)) => {
                return finish(
                    ctx,
                    &api,
                    &template,
                    &before,
                    next,
                    Health::progressing(reason, msg),
                    generation,
                    Some(after),
                )
                .await;
            }
            Err(Blocked::Stall(reason, msg)) => {
                return finish(
                    ctx,
                    &api,
                    &template,
                    &before,
                    next,
                    Health::stalled(reason, msg),
                    generation,
                    None,
                )
                .await;
            }
            Err(Blocked::Failed(e)) => {
                warning(
                    ctx,
                    template.as_ref(),
                    e.category(),
                    format!("{step:?} failed: {e}"),
                )
                .await;
                return provider_failure(ctx, &api, &template, &before, next, e, generation).await;
            }
        }
    }
    let current = next.clone();

    // Observe again, for the reference, size, time and use the provider reports.
    let Some(t) = (match handle
        .call("get_template", templates.get_template(&id))
        .await
    {
        Ok(t) => t,
        Err(e) => {
            return provider_failure(ctx, &api, &template, &current, next, e.into(), generation)
                .await;
        }
    }) else {
        let msg = format!("template {id} is not at provider {} yet", handle.name());
        return finish(
            ctx,
            &api,
            &template,
            &current,
            next,
            Health::progressing("Capturing", msg),
            generation,
            Some(WAIT),
        )
        .await;
    };
    record(&mut next, &t);
    if source == TemplateSource::Store {
        // Fetched from the shared store: that is where it lives.
        next.published = Some(true);
    }
    let what = match (source, next.published == Some(true)) {
        (TemplateSource::Store, _) => format!("template {id} was fetched from the shared store"),
        (TemplateSource::Capture, true) => format!("template {id} is captured and published"),
        (TemplateSource::Capture, false) => format!("template {id} is captured"),
    };
    finish(
        ctx,
        &api,
        &template,
        &current,
        next,
        Health::ready("TemplateReady", what),
        generation,
        None,
    )
    .await
}

#[allow(clippy::too_many_arguments)]
async fn act(
    ctx: &Context,
    template: &SandboxTemplate,
    handle: &ProviderHandle,
    id: &str,
    owner: &Owner,
    store: Option<&(Arc<TemplateStore>, Limits)>,
    transfers: &Arc<Transfers>,
    step: Step,
    next: &mut SandboxTemplateStatus,
) -> Result<(), Blocked> {
    let templates = handle.provider.templates().ok_or_else(|| {
        Blocked::Stall(
            "TemplatesUnsupported",
            format!("provider {:?} cannot hold templates", handle.name()),
        )
    })?;
    match step {
        Step::Capture => {
            let sandbox_id = capture_source(ctx, template, handle.name()).await?;
            let request = CommitRequest {
                sandbox_id: sandbox_id.clone(),
                template_id: id.to_string(),
                capture_paths: template.spec.capture_paths.clone().unwrap_or_default(),
                label: template.spec.label.clone(),
                owner: owner.clone(),
            };
            let t = handle.call("commit", templates.commit(&request)).await?;
            normal(
                ctx,
                template,
                "Captured",
                format!(
                    "captured {:?} of sandbox {sandbox_id} as template {id}",
                    request.capture_paths
                ),
            )
            .await;
            record(next, &t);
            next.capture_hash = Some(capture_hash(template));
            // A copy in the store is of the previous capture now: the Publish step that follows
            // replaces it. (Without spec.publish it stays marked published until the Unpublish
            // step that follows has removed it, so a failed removal is retried.)
            if next.published == Some(true) && template.spec.publish == Some(true) {
                next.published = Some(false);
            }
        }
        Step::Publish => {
            let limits = store.map(|(_, l)| *l).unwrap_or_default();
            let (provider, id_owned, metrics) =
                (handle.provider.clone(), id.to_string(), ctx.metrics.clone());
            let poll = transfers.poll_or_start(
                &owner.uid,
                step,
                next.capture_hash.as_deref().unwrap_or_default(),
                move || async move {
                    let started = std::time::Instant::now();
                    let result = match provider.templates() {
                        Some(t) => {
                            tokio::time::timeout(transfer_bound(&limits), t.publish(&id_owned))
                                .await
                                .unwrap_or_else(|_| {
                                    Err(ProviderError::transient(format!(
                                        "publishing template {id_owned} did not finish within {} s",
                                        transfer_bound(&limits).as_secs()
                                    )))
                                })
                        }
                        None => Err(ProviderError::unsupported("templates")),
                    };
                    let outcome = result.as_ref().map_or_else(|e| e.category(), |()| "ok");
                    metrics.provider_call(
                        provider.name(),
                        "publish",
                        outcome,
                        started.elapsed().as_secs_f64(),
                    );
                    result.map(|()| None)
                },
            );
            match poll {
                Poll::Running => {
                    return Err(Blocked::Wait(
                        "Publishing",
                        format!("publishing template {id} to the shared template store"),
                        TRANSFER_POLL,
                    ));
                }
                Poll::Done(Ok(_)) => {}
                Poll::Done(Err(e)) if e.is(ErrorKind::Unsupported) => {
                    return Err(Blocked::Stall(
                        "PublishUnsupported",
                        format!("spec.publish: {}", e.message()),
                    ));
                }
                Poll::Done(Err(e)) => return Err(e.into()),
            }
            next.published = Some(true);
            normal(
                ctx,
                template,
                "Published",
                format!("published template {id} to the shared template store"),
            )
            .await;
        }
        Step::Unpublish => {
            let Some((store, limits)) = store else {
                return Err(Blocked::Stall(
                    "StoreNotConfigured",
                    format!(
                        "template {id} was published, but provider {:?} names no template store any more, so the \
                         published copy cannot be removed; configure templateStore on the provider again",
                        handle.name()
                    ),
                ));
            };
            handle
                .call("unpublish", transfer::remove(store, id, *limits))
                .await?;
            next.published = Some(false);
            normal(
                ctx,
                template,
                "Unpublished",
                format!(
                    "removed template {id} from the shared template store (spec.publish is false)"
                ),
            )
            .await;
        }
        Step::Fetch => {
            let limits = store.map(|(_, l)| *l).unwrap_or_default();
            let (provider, id_owned, owner_owned, store_owned, metrics) = (
                handle.provider.clone(),
                id.to_string(),
                owner.clone(),
                store.map(|(s, _)| s.clone()),
                ctx.metrics.clone(),
            );
            let poll = transfers.poll_or_start(&owner.uid, step, id, move || async move {
                let started = std::time::Instant::now();
                let job = async {
                    match (&store_owned, provider.templates()) {
                        // With this object's owner labels on the result.
                        (Some(store), _) => {
                            transfer::fetch_into(
                                provider.as_ref(),
                                store,
                                &id_owned,
                                &owner_owned,
                                None,
                                limits,
                            )
                            .await
                        }
                        (None, Some(t)) => t.fetch(&id_owned).await,
                        (None, None) => Err(ProviderError::unsupported("templates")),
                    }
                };
                let result = tokio::time::timeout(transfer_bound(&limits), job)
                    .await
                    .unwrap_or_else(|_| {
                        Err(ProviderError::transient(format!(
                            "fetching template {id_owned} did not finish within {} s",
                            transfer_bound(&limits).as_secs()
                        )))
                    });
                let outcome = result.as_ref().map_or_else(|e| e.category(), |_| "ok");
                metrics.provider_call(
                    provider.name(),
                    "fetch",
                    outcome,
                    started.elapsed().as_secs_f64(),
                );
                result
            });
            let fetched = match poll {
                Poll::Running => {
                    return Err(Blocked::Wait(
                        "Fetching",
                        format!("fetching template {id} from the shared template store"),
                        TRANSFER_POLL,
                    ));
                }
                Poll::Done(result) => result,
            };
            let t = match fetched {
                Ok(Some(t)) => t,
                Ok(None) if template.spec.source() == TemplateSource::Store => {
                    return Err(Blocked::Wait(
                        "TemplateNotInStore",
                        format!(
                            "the shared template store of provider {:?} has no template {id} (yet); publish it \
                             where it was captured, or fix spec.templateId",
                            handle.name()
                        ),
                        STORE_WAIT,
                    ));
                }
                Ok(None) => {
                    return Err(Blocked::Stall(
                        "TemplateGone",
                        format!(
                            "the provider no longer holds template {id} and the shared store does not have it either; \
                             change spec.capturePaths or spec.label to capture again, or delete the SandboxTemplate"
                        ),
                    ));
                }
                Err(e) if e.is(ErrorKind::Unsupported) => {
                    return Err(Blocked::Stall("FetchUnsupported", e.message().to_string()));
                }
                Err(e) => return Err(e.into()),
            };
            record(next, &t);
            if template.spec.source() == TemplateSource::Store {
                next.published = Some(true);
            }
            normal(
                ctx,
                template,
                "Fetched",
                format!("fetched template {id} from the shared template store"),
            )
            .await;
        }
    }
    Ok(())
}

/// Remove the provider template once nothing is backed by it (and the published copy once
/// no restore reads it), confirm, then let the finalizer go.
async fn cleanup(template: Arc<SandboxTemplate>, tctx: &TemplateContext) -> Result<Action> {
    let ctx = tctx.ctx.as_ref();
    let ns = template.namespace().unwrap_or_default();
    let api: Api<SandboxTemplate> = Api::namespaced(ctx.client.clone(), &ns);
    let uid = template.uid().unwrap_or_default();
    let current = template.status.clone().unwrap_or_default();
    let id = current
        .template_id
        .clone()
        .unwrap_or_else(|| template_id(&template));
    let provider_name = current
        .provider
        .clone()
        .or_else(|| template.spec.provider.clone());
    let handle = match ctx.providers.resolve(provider_name.as_deref()) {
        Ok(h) => h.clone(),
        // Never made anywhere: nothing to clean up.
        Err(_) if current.template_id.is_none() => return Ok(Action::await_change()),
        Err(msg) => {
            return Err(Error::Dependency(format!(
                "cannot remove template {id}: {msg}"
            )));
        }
    };
    let Some(templates) = handle.provider.templates() else {
        return Ok(Action::await_change());
    };
    if validate::resource_name("template id", &id).is_err() {
        return Ok(Action::await_change());
    }
    // A transfer in flight finishes first: it may still commit a template.
    if tctx.transfers.running(&uid) {
        return Err(Error::Provider(ProviderError::transient(format!(
            "a publish or fetch of template {id} is in progress; deleting it once that has finished"
        ))));
    }
    tctx.transfers.forget(&uid);
    destroy_leftover_helpers(&handle, &uid).await?;

    let observed = handle
        .call("get_template", templates.get_template(&id))
        .await?;
    let ours = observed
        .as_ref()
        .is_none_or(|t| foreign_owner(t, &uid).is_none());
    if ours {
        match handle
            .call("remove_template", templates.remove_template(&id))
            .await
        {
            Ok(()) => {}
            Err(e) if e.is(ErrorKind::Conflict) => {
                return in_use(ctx, &api, &template, &current, e.message().to_string()).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    if template.spec.source() == TemplateSource::Capture && current.published == Some(true) {
        match tctx.stores.get(handle.name()) {
            Some((store, limits)) => match handle
                .call("unpublish", transfer::remove(store, &id, *limits))
                .await
            {
                Ok(()) => {}
                Err(e) if e.is(ErrorKind::Conflict) => {
                    return in_use(ctx, &api, &template, &current, e.message().to_string()).await;
                }
                Err(e) => return Err(e.into()),
            },
            None => {
                warning(ctx, template.as_ref(), "StoreNotConfigured", format!("template {id} was published, but provider {} names no template store any more: its published copy is left in the store", handle.name())).await;
            }
        }
    }
    // Confirm: only a provider that no longer holds it releases the finalizer.
    if ours
        && handle
            .call("get_template", templates.get_template(&id))
            .await?
            .is_some()
    {
        return Err(Error::Provider(ProviderError::transient(format!(
            "template {id} is still present after removal; retrying"
        ))));
    }
    normal(
        ctx,
        template.as_ref(),
        "Deleted",
        format!("removed template {id} from provider {}", handle.name()),
    )
    .await;
    Ok(Action::await_change())
}

/// A deletion that waits: the template still backs a sandbox (or a restore reads its
/// published copy). Says so in `TemplateInUse` and an Event, and retries with backoff.
async fn in_use(
    ctx: &Context,
    api: &Api<SandboxTemplate>,
    template: &SandboxTemplate,
    current: &SandboxTemplateStatus,
    msg: String,
) -> Result<Action> {
    let message = format!("not deleted while in use: {msg}");
    let mut next = current.clone();
    let mut conditions = next.conditions.clone();
    let now = status::now();
    let generation = template.metadata.generation;
    Health::progressing(TEMPLATE_IN_USE, message.clone()).apply(&mut conditions, generation, &now);
    status::upsert(
        &mut conditions,
        TEMPLATE_IN_USE,
        "True",
        TEMPLATE_IN_USE,
        &message,
        generation,
        &now,
    );
    next.conditions = conditions;
    next.in_use = Some(true);
    status::write(api, &template.name_any(), Some(current), &next).await?;
    warning(ctx, template, TEMPLATE_IN_USE, message).await;
    Err(Error::Provider(ProviderError::conflict(msg)))
}

/// A provider error: retryable ones report `Ready=False` and back off; the rest stall.
async fn provider_failure(
    ctx: &Context,
    api: &Api<SandboxTemplate>,
    template: &SandboxTemplate,
    current: &SandboxTemplateStatus,
    mut next: SandboxTemplateStatus,
    err: Error,
    generation: Option<i64>,
) -> Result<Action> {
    let retryable =
        matches!(&err, Error::Provider(p) if p.is_retryable()) || matches!(err, Error::Kube(_));
    if retryable {
        next.observed_generation = current.observed_generation;
        let mut conditions = next.conditions.clone();
        Health::progressing(err.category(), err.to_string()).apply(
            &mut conditions,
            current.observed_generation,
            &status::now(),
        );
        next.conditions = conditions;
        let _ = status::write(api, &template.name_any(), Some(current), &next).await;
        return Err(err);
    }
    finish(
        ctx,
        api,
        template,
        current,
        next,
        Health::stalled(err.category(), err.to_string()),
        generation,
        None,
    )
    .await
}

/// Writes conditions + observedGeneration and decides when to look again.
#[allow(clippy::too_many_arguments)]
async fn finish(
    ctx: &Context,
    api: &Api<SandboxTemplate>,
    template: &SandboxTemplate,
    current: &SandboxTemplateStatus,
    mut next: SandboxTemplateStatus,
    health: Health,
    generation: Option<i64>,
    requeue: Option<Duration>,
) -> Result<Action> {
    let stalled = matches!(health, Health::Stalled { .. });
    let mut conditions = next.conditions.clone();
    health.apply(&mut conditions, generation, &status::now());
    // A live object is not waiting to be deleted.
    conditions.retain(|c| c.type_ != TEMPLATE_IN_USE);
    next.conditions = conditions;
    next.observed_generation = generation;
    let previous_reason = condition(&current.conditions, READY).map(|c| c.reason.clone());
    if stalled && previous_reason.as_deref() != Some(health.reason()) {
        warning(ctx, template, health.reason(), health.message().to_string()).await;
    }
    status::write(api, &template.name_any(), Some(current), &next).await?;
    let uid = template.uid().unwrap_or_default();
    Ok(Action::requeue(requeue.unwrap_or_else(|| {
        crate::jitter::by_key(ctx.resync, &uid)
    })))
}

/// Runs the SandboxTemplate controller until `shutdown` resolves. A change to a Sandbox that
/// names a template (in `templateRef` or as the captured `sandboxRef`) reconciles that
/// template, so `inUse` and a waiting deletion follow promptly.
pub async fn run(
    ctx: Arc<Context>,
    stores: Stores,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
    namespace: Option<String>,
) {
    let (api, sandboxes): (Api<SandboxTemplate>, Api<Sandbox>) = match &namespace {
        Some(ns) => (
            Api::namespaced(ctx.client.clone(), ns),
            Api::namespaced(ctx.client.clone(), ns),
        ),
        None => (Api::all(ctx.client.clone()), Api::all(ctx.client.clone())),
    };
    let tctx = Arc::new(TemplateContext {
        ctx,
        stores,
        transfers: Arc::default(),
    });
    Controller::new(api, watcher::Config::default().any_semantic())
        .watches(
            sandboxes,
            watcher::Config::default().any_semantic(),
            |s: Sandbox| {
                let ns = s.namespace().unwrap_or_default();
                s.spec
                    .template_ref
                    .as_ref()
                    .map(|r| ObjectRef::<SandboxTemplate>::new(&r.name).within(&ns))
            },
        )
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, tctx)
        .for_each(|res| async move {
            if let Err(err) = res {
                tracing::debug!(%err, "template reconcile loop");
            }
        })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn capture(publish: bool) -> Desired {
        Desired {
            source: TemplateSource::Capture,
            hash: "h1".into(),
            publish,
        }
    }

    fn seen(exists: bool, hash: Option<&str>, published: bool) -> Observed {
        Observed {
            exists,
            foreign_owner: None,
            captured_hash: hash.map(str::to_string),
            published,
        }
    }

    fn steps(d: Decision) -> Vec<Step> {
        match d {
            Decision::Steps(s) => s,
            Decision::Stall(r, m) => panic!("stalled: {r}: {m}"),
        }
    }

    #[test]
    fn capture_decisions() {
        use Step::*;
        let table: &[(Desired, Observed, Vec<Step>)] = &[
            // First capture, then publish when asked.
            (capture(false), seen(false, None, false), vec![Capture]),
            (
                capture(true),
                seen(false, None, false),
                vec![Capture, Publish],
            ),
            // Converged.
            (capture(false), seen(true, Some("h1"), false), vec![]),
            (capture(true), seen(true, Some("h1"), true), vec![]),
            // A spec change recaptures, and a published copy is replaced or removed.
            (capture(false), seen(true, Some("h0"), false), vec![Capture]),
            (
                capture(true),
                seen(true, Some("h0"), true),
                vec![Capture, Publish],
            ),
            (
                capture(false),
                seen(true, Some("h0"), true),
                vec![Capture, Unpublish],
            ),
            // Publish toggled without a recapture.
            (capture(true), seen(true, Some("h1"), false), vec![Publish]),
            (
                capture(false),
                seen(true, Some("h1"), true),
                vec![Unpublish],
            ),
            // The local copy vanished: the shared store is the cache.
            (capture(true), seen(false, Some("h1"), true), vec![Fetch]),
        ];
        for (d, o, want) in table {
            assert_eq!(&steps(decide(d, o, "t")), want, "{d:?} {o:?}");
        }
    }

    #[test]
    fn a_vanished_unpublished_capture_stalls_instead_of_recapturing() {
        match decide(&capture(false), &seen(false, Some("h1"), false), "t") {
            Decision::Stall(reason, msg) => {
                assert_eq!(reason, "TemplateGone");
                assert!(msg.contains("never booted from the plain image"), "{msg}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn store_templates_are_fetched_when_absent() {
        let d = Desired {
            source: TemplateSource::Store,
            hash: "x".into(),
            publish: false,
        };
        assert_eq!(
            steps(decide(&d, &seen(false, None, false), "t")),
            vec![Step::Fetch]
        );
        assert!(steps(decide(&d, &seen(true, None, true), "t")).is_empty());
    }

    #[test]
    fn another_objects_template_is_never_replaced() {
        let mut o = seen(true, None, false);
        o.foreign_owner = Some("ns.other, UID 1".into());
        match decide(&capture(true), &o, "t") {
            Decision::Stall(reason, msg) => {
                assert_eq!(reason, "TemplateIdTaken");
                assert!(msg.contains("spec.templateId"), "{msg}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_transfer_runs_once_and_its_result_is_handed_out_once() {
        let transfers = Arc::new(Transfers::default());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let started = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = started.clone();
        let poll = transfers.poll_or_start("uid", Step::Publish, "h1", move || {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async move {
                let _ = rx.await;
                Ok(None)
            }
        });
        assert!(matches!(poll, Poll::Running));
        assert!(transfers.running("uid"));
        // While it runs, polling does not start a second one.
        let poll = transfers.poll_or_start("uid", Step::Publish, "h1", || async { Ok(None) });
        assert!(matches!(poll, Poll::Running));
        assert_eq!(started.load(std::sync::atomic::Ordering::SeqCst), 1);
        tx.send(()).expect("release");
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while transfers.running("uid") {
            assert!(
                std::time::Instant::now() < deadline,
                "the job never finished"
            );
            tokio::task::yield_now().await;
        }
        let poll = transfers.poll_or_start("uid", Step::Publish, "h1", || async {
            Err(ProviderError::transient("must not start"))
        });
        assert!(matches!(poll, Poll::Done(Ok(None))));
        // Handed out once: the next poll starts a new job.
        let poll = transfers.poll_or_start("uid", Step::Publish, "h1", || async { Ok(None) });
        assert!(matches!(poll, Poll::Running), "a result is handed out once");
    }

    #[test]
    fn capture_hash_ignores_order_and_trailing_slashes_but_not_content() {
        let tpl = |paths: &[&str], label: Option<&str>| -> SandboxTemplate {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "sandboxes.dev/v1alpha1", "kind": "SandboxTemplate",
                "metadata": {"name": "t", "uid": "u1"},
                "spec": {"sandboxRef": {"name": "s"}, "capturePaths": paths, "label": label}
            }))
            .expect("template")
        };
        let a = capture_hash(&tpl(&["/a", "/b/"], None));
        assert_eq!(a, capture_hash(&tpl(&["/b", "/a"], None)));
        assert_ne!(a, capture_hash(&tpl(&["/a"], None)));
        assert_ne!(a, capture_hash(&tpl(&["/a", "/b"], Some("v2"))));
        assert_eq!(template_id(&tpl(&["/a"], None)), "sbxt-u1");
    }
}
