//! Apply: converge a live SandboxTemplate — resolve its provider, record its id, observe,
//! decide, act step by step, observe again, report.

use std::sync::Arc;

use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;

use crate::api::{Sandbox, SandboxTemplate, SandboxTemplateStatus, TemplateSource};
use crate::controller::Result;
use crate::controller::events::normal;
use crate::controller::outcome::Outcome;
use crate::provider::{Template, validate};
use crate::registry::ProviderHandle;

use super::decide::{self, Decision, Desired, Observed, Step, capture_hash, template_id};
use super::report::{Progress, Report};
use super::{TemplateContext, WAIT, destroy_leftover_helpers, foreign_owner, owner_of, steps};

/// The Apply half of the finalizer: the reconcile pipeline for a live SandboxTemplate.
pub async fn apply(template: Arc<SandboxTemplate>, tctx: &TemplateContext) -> Result<Action> {
    let r = Report::new(&tctx.ctx, &template);
    let mut p = Progress::new(template.status.clone().unwrap_or_default());
    let outcome = converge(&r, tctx, &mut p)
        .await
        .unwrap_or_else(|ended| ended);
    r.conclude(p, outcome).await
}

/// What the steps of one reconcile act on.
pub struct Subject<'a> {
    /// The object.
    pub template: &'a SandboxTemplate,
    /// Its provider.
    pub handle: &'a ProviderHandle,
    /// The template id.
    pub id: &'a str,
}

async fn converge(
    r: &Report<'_>,
    tctx: &TemplateContext,
    p: &mut Progress,
) -> Result<Outcome, Outcome> {
    let template = r.template;
    let handle = provider(r, p).await?;
    let id = identify(r, &handle, p).await?;
    let on = Subject {
        template,
        handle: &handle,
        id: &id,
    };
    report_finished_fetch(r, tctx, &id).await;
    let service = &r.ctx.templates;
    let provider = handle.provider.as_ref();
    let observed = handle
        .call("get_template", service.get(provider, &id))
        .await?;
    let steps = plan(r, &on, observed.as_ref(), p)?;
    act_all(r, tctx, &on, steps, p).await?;
    share(r, &on, p).await?;

    // Observe again, for the reference, size, time and use the provider reports.
    let Some(t) = handle
        .call("get_template", service.get(provider, &id))
        .await?
    else {
        let msg = format!("template {id} is not at provider {} yet", handle.name());
        return Err(Outcome::waiting("Capturing", msg, WAIT));
    };
    record(&mut p.next, &t);
    let ns = template.namespace().unwrap_or_default();
    p.next.in_use = Some(r.ctx.template_users.in_use(&ns, &template.name_any()));
    let source = template.spec.source();
    if source == TemplateSource::Store || service.always_published(provider) {
        // Fetched from the shared store, or kept there: that is where it lives.
        p.next.published = Some(true);
    }
    let what = match (source, p.next.published == Some(true)) {
        (TemplateSource::Store, _) => format!("template {id} was fetched from the shared store"),
        (TemplateSource::Capture, true) => format!("template {id} is captured and published"),
        (TemplateSource::Capture, false) => format!("template {id} is captured"),
    };
    Ok(Outcome::ready("TemplateReady", what))
}

/// Which provider: `spec.provider`, what status recorded, the captured Sandbox's, the
/// default. Records it in `p.next`; a provider that cannot hold templates at all stalls.
async fn provider(r: &Report<'_>, p: &mut Progress) -> Result<ProviderHandle, Outcome> {
    let template = r.template;
    let mut name = template
        .spec
        .provider
        .clone()
        .or_else(|| p.written.provider.clone());
    if name.is_none()
        && template.spec.source() == TemplateSource::Capture
        && let Some(sref) = &template.spec.sandbox_ref
    {
        let ns = template.namespace().unwrap_or_default();
        let sandboxes: Api<Sandbox> = Api::namespaced(r.ctx.client.clone(), &ns);
        let Some(s) = sandboxes.get_opt(&sref.name).await? else {
            let msg = format!(
                "spec.sandboxRef: Sandbox {:?} does not exist in namespace {ns:?} yet",
                sref.name
            );
            return Err(Outcome::waiting("SandboxNotFound", msg, WAIT));
        };
        name = s
            .status
            .as_ref()
            .and_then(|st| st.provider.clone())
            .or_else(|| s.spec.provider.clone());
    }
    let handle = match r.ctx.providers.resolve(name.as_deref()) {
        Ok(h) => h.clone(),
        Err(msg) => return Err(Outcome::stalled("ProviderNotConfigured", msg)),
    };
    p.next.provider = Some(handle.name().to_string());
    if let Err(e) = r.ctx.templates.home(handle.provider.as_ref()) {
        return Err(Outcome::stalled(
            "TemplatesUnsupported",
            e.message().to_string(),
        ));
    }
    Ok(handle)
}

/// The template id, validated and recorded in status BEFORE any provider call: a crash
/// after the capture leaves a record of what to look for.
async fn identify(
    r: &Report<'_>,
    handle: &ProviderHandle,
    p: &mut Progress,
) -> Result<String, Outcome> {
    let id = template_id(r.template);
    if let Err(msg) = validate::resource_name("spec.templateId", &id) {
        return Err(Outcome::stalled("InvalidTemplateId", msg));
    }
    if p.written.template_id.as_deref() != Some(id.as_str())
        || p.written.provider.as_deref() != Some(handle.name())
    {
        p.next.template_id = Some(id.clone());
        r.save(p).await?;
    }
    Ok(id)
}

/// A fetch that finished in the background: the template it committed is observed next; its
/// success is reported here. Anything else is left for the Fetch step to report.
async fn report_finished_fetch(r: &Report<'_>, tctx: &TemplateContext, id: &str) {
    let uid = r.template.uid().unwrap_or_default();
    match tctx.transfers.take(&uid, Step::Fetch) {
        Some(Ok(Some(_))) => {
            let msg = format!("fetched template {id} from the shared template store");
            normal(r.ctx, r.template, "Fetched", msg).await;
        }
        Some(other) => tctx.transfers.put_back(&uid, Step::Fetch, id, other),
        None => {}
    }
}

/// Keeps the store's copy of a template this object captured shared with exactly
/// `spec.sharedWith`: a change of it (a revocation too) reaches the manifest without a
/// recapture. One read of the manifest per reconcile; it is written only when it differs.
async fn share(r: &Report<'_>, on: &Subject<'_>, p: &Progress) -> Result<(), Outcome> {
    let (template, service) = (r.template, &r.ctx.templates);
    let provider = on.handle.provider.as_ref();
    let in_store = p.next.published == Some(true) || service.always_published(provider);
    if template.spec.source() != TemplateSource::Capture || !in_store {
        return Ok(());
    }
    let owner = owner_of(template, &r.ctx.instance);
    let shared = template.spec.shared_with();
    let call = service.share(provider, on.id, &owner, shared);
    on.handle.call("share", call).await?;
    Ok(())
}

/// Decides the steps (pure), or stalls recording what was observed.
fn plan(
    r: &Report<'_>,
    on: &Subject<'_>,
    observed: Option<&Template>,
    p: &mut Progress,
) -> Result<Vec<Step>, Outcome> {
    let template = r.template;
    let source = template.spec.source();
    let provider = on.handle.provider.as_ref();
    let always = r.ctx.templates.always_published(provider);
    let uid = template.uid().unwrap_or_default();
    // A Store SandboxTemplate on a provider that keeps templates in the store only refers to
    // the publisher's template: whose it is does not matter, it is never written.
    let writes = source == TemplateSource::Capture || !always;
    let desired = Desired {
        source,
        hash: capture_hash(template),
        publish: source == TemplateSource::Capture
            && (always || template.spec.publish.unwrap_or(false)),
    };
    let facts = Observed {
        exists: observed.is_some(),
        foreign_owner: observed
            .filter(|_| writes)
            .and_then(|t| foreign_owner(t, &uid)),
        captured_hash: p.written.capture_hash.clone(),
        published: p.written.published.unwrap_or(false),
    };
    match decide::decide(&desired, &facts, on.id) {
        Decision::Steps(steps) => Ok(steps),
        Decision::Stall(reason, msg) => {
            if let Some(t) = observed {
                record(&mut p.next, t);
            }
            Err(Outcome::stalled(reason, msg))
        }
    }
}

/// Runs the steps in order, writing status after each.
async fn act_all(
    r: &Report<'_>,
    tctx: &TemplateContext,
    on: &Subject<'_>,
    plan: Vec<Step>,
    p: &mut Progress,
) -> Result<(), Outcome> {
    let uid = r.template.uid().unwrap_or_default();
    // Helpers of this object are leftovers unless a transfer of ours is running.
    if !plan.is_empty() && !tctx.transfers.running(&uid) {
        destroy_leftover_helpers(on.handle, &uid).await?;
    }
    for step in plan {
        match steps::act(r, tctx, on, step, &mut p.next).await {
            Ok(()) => r.save(p).await?,
            Err(Outcome::Failed { error, .. }) => {
                let during = Some(format!("{step:?}"));
                return Err(Outcome::Failed { error, during });
            }
            Err(other) => return Err(other),
        }
    }
    Ok(())
}

/// Fills the observed fields of status from the template. `inUse` is not the provider's
/// answer: it comes from the Sandboxes naming the template (see [`crate::controller::template_users`]), so no
/// reconcile lists the provider's sandboxes; deletion checks with the provider.
pub fn record(next: &mut SandboxTemplateStatus, t: &Template) {
    next.ref_ = Some(t.reference.clone());
    next.created_at = t.created_at.map(crate::api::rfc3339);
    next.size_bytes = t.size_bytes.and_then(|b| i64::try_from(b).ok());
}
