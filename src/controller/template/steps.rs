//! The steps of a SandboxTemplate reconcile, one function each, all through the templates
//! service.

use std::collections::BTreeMap;

use kube::ResourceExt;
use kube::api::Api;

use crate::api::{Sandbox, SandboxTemplate, SandboxTemplateStatus, TemplateSource, condition};
use crate::controller::Context;
use crate::controller::events::normal;
use crate::controller::sandbox::resolve::SELF_DELIVERED_ENV_PATH;
use crate::controller::status::READY;
use crate::provider::labels::ensure_owned;
use crate::provider::{CommitRequest, ErrorKind, ProviderError};

use super::apply::{Subject, record};
use super::decide::{Step, capture_hash};
use super::report::Report;
use super::transfers::{Poll, TRANSFER_POLL, bounded};
use super::{STORE_WAIT, TemplateContext, WAIT, owner_of};
use crate::controller::outcome::Outcome;

/// Runs one step, recording what it changed in `next`.
pub async fn act(
    r: &Report<'_>,
    tctx: &TemplateContext,
    on: &Subject<'_>,
    step: Step,
    next: &mut SandboxTemplateStatus,
) -> Result<(), Outcome> {
    match step {
        Step::Capture => capture(r, on, next).await,
        Step::Publish => publish(r, tctx, on, next).await,
        Step::Unpublish => unpublish(r, on, next).await,
        Step::Fetch => fetch(r, tctx, on, next).await,
    }
}

/// Captures `capturePaths` of the Ready Sandbox `sandboxRef` (replacing an earlier capture).
async fn capture(
    r: &Report<'_>,
    on: &Subject<'_>,
    next: &mut SandboxTemplateStatus,
) -> Result<(), Outcome> {
    let template = r.template;
    let (sandbox_id, sandbox) = capture_source(r.ctx, template, on.handle.name()).await?;
    ensure_source_owned(on, &sandbox_id, &sandbox.uid().unwrap_or_default()).await?;
    let request = CommitRequest {
        sandbox_id: sandbox_id.clone(),
        template_id: on.id.to_string(),
        capture_paths: template.spec.capture_paths.clone().unwrap_or_default(),
        label: template.spec.label.clone(),
        owner: owner_of(template, &r.ctx.instance),
        env: plain_env(&sandbox),
        // Whether or not the Sandbox asks for one now: an earlier delivery may be there.
        secret_files: vec![SELF_DELIVERED_ENV_PATH.to_string()],
    };
    let provider = on.handle.provider.as_ref();
    let t = on
        .handle
        .call(
            "commit",
            r.ctx
                .templates
                .commit(provider, &request, template.spec.shared_with()),
        )
        .await?;
    let msg = format!(
        "captured {:?} of sandbox {sandbox_id} as template {}",
        request.capture_paths, on.id
    );
    normal(r.ctx, template, "Captured", msg).await;
    record(next, &t);
    next.capture_hash = Some(capture_hash(template));
    // A copy in the store is of the previous capture now: the Publish step that follows
    // replaces it. (Without spec.publish it stays marked published until the Unpublish step
    // that follows has removed it, so a failed removal is retried.)
    if next.published == Some(true) && template.spec.publish == Some(true) {
        next.published = Some(false);
    }
    Ok(())
}

/// Copies the template into the shared store, as a background transfer.
async fn publish(
    r: &Report<'_>,
    tctx: &TemplateContext,
    on: &Subject<'_>,
    next: &mut SandboxTemplateStatus,
) -> Result<(), Outcome> {
    let ctx = tctx.ctx.clone();
    let (provider, id) = (on.handle.provider.clone(), on.id.to_string());
    let shared = r.template.spec.shared_with().to_vec();
    let uid = r.template.uid().unwrap_or_default();
    let subject = next.capture_hash.clone().unwrap_or_default();
    let poll = tctx
        .transfers
        .poll_or_start(&uid, Step::Publish, &subject, move || async move {
            let limits = ctx.templates.limits();
            let what = format!("publishing template {id}");
            let work = async {
                ctx.templates
                    .publish(provider.as_ref(), &id, &shared)
                    .await
                    .map(|()| None)
            };
            let name = provider.name().to_string();
            bounded(ctx.metrics.clone(), name, "publish", what, limits, work).await
        });
    match poll {
        Poll::Running => {
            let msg = format!("publishing template {} to the shared template store", on.id);
            return Err(Outcome::waiting("Publishing", msg, TRANSFER_POLL));
        }
        Poll::Done(Err(e)) if e.is(ErrorKind::Unsupported) => {
            let msg = format!("spec.publish: {}", e.message());
            return Err(Outcome::stalled("PublishUnsupported", msg));
        }
        Poll::Done(Err(e)) => return Err(e.into()),
        Poll::Done(Ok(_)) => {}
    }
    next.published = Some(true);
    let msg = format!("published template {} to the shared template store", on.id);
    normal(r.ctx, r.template, "Published", msg).await;
    Ok(())
}

/// Removes the template's copy from the shared store (`spec.publish` turned off).
async fn unpublish(
    r: &Report<'_>,
    on: &Subject<'_>,
    next: &mut SandboxTemplateStatus,
) -> Result<(), Outcome> {
    let provider = on.handle.provider.as_ref();
    match on
        .handle
        .call("unpublish", r.ctx.templates.unpublish(provider, on.id))
        .await
    {
        Ok(()) => {}
        Err(e) if e.is(ErrorKind::Unsupported) => {
            let msg = format!(
                "template {} was published, but {}; the published copy cannot be removed until a \
                 store is configured again",
                on.id,
                e.message()
            );
            return Err(Outcome::stalled("StoreNotConfigured", msg));
        }
        Err(e) => return Err(e.into()),
    }
    next.published = Some(false);
    let msg = format!(
        "removed template {} from the shared template store (spec.publish is false)",
        on.id
    );
    normal(r.ctx, r.template, "Unpublished", msg).await;
    Ok(())
}

/// Brings the template from the shared store onto the provider, as a background transfer,
/// labelled with this object's owner labels.
async fn fetch(
    r: &Report<'_>,
    tctx: &TemplateContext,
    on: &Subject<'_>,
    next: &mut SandboxTemplateStatus,
) -> Result<(), Outcome> {
    let ctx = tctx.ctx.clone();
    let (provider, id) = (on.handle.provider.clone(), on.id.to_string());
    let owner = owner_of(r.template, &ctx.instance);
    let uid = owner.uid.clone();
    // The owner check, here and not only in the transfer: a refusal stalls without a
    // transfer, so it stays Stalled until the spec or the store's sharing changes, instead
    // of starting the transfer (and reporting Fetching) again on every reconcile.
    if !tctx.transfers.running(&uid) {
        let check = ctx.templates.may_fetch(provider.as_ref(), on.id, &owner);
        on.handle
            .call("may_fetch", check)
            .await
            .map_err(fetch_failed)?;
    }
    let poll = tctx
        .transfers
        .poll_or_start(&uid, Step::Fetch, on.id, move || async move {
            let limits = ctx.templates.limits();
            let what = format!("fetching template {id}");
            let work = ctx.templates.fetch(provider.as_ref(), &id, &owner);
            let name = provider.name().to_string();
            bounded(ctx.metrics.clone(), name, "fetch", what, limits, work).await
        });
    let fetched = match poll {
        Poll::Running => {
            let msg = format!("fetching template {} from the shared template store", on.id);
            return Err(Outcome::waiting("Fetching", msg, TRANSFER_POLL));
        }
        Poll::Done(result) => result,
    };
    let Some(t) = fetched.map_err(fetch_failed)? else {
        return Err(not_in_store(r.template, on));
    };
    record(next, &t);
    if r.template.spec.source() == TemplateSource::Store {
        next.published = Some(true);
    }
    let msg = format!("fetched template {} from the shared template store", on.id);
    normal(r.ctx, r.template, "Fetched", msg).await;
    Ok(())
}

fn fetch_failed(e: ProviderError) -> Outcome {
    if e.is(ErrorKind::Unsupported) {
        Outcome::stalled("FetchUnsupported", e.message().to_string())
    } else {
        e.into()
    }
}

/// The store does not have the template: a Store SandboxTemplate waits for someone to
/// publish it; a captured one whose every copy is gone stalls.
fn not_in_store(template: &SandboxTemplate, on: &Subject<'_>) -> Outcome {
    let id = on.id;
    if template.spec.source() == TemplateSource::Store {
        return Outcome::waiting(
            "TemplateNotInStore",
            format!(
                "the shared template store of provider {:?} has no template {id} (yet); publish it \
                 where it was captured, or fix spec.templateId",
                on.handle.name()
            ),
            STORE_WAIT,
        );
    }
    Outcome::stalled(
        "TemplateGone",
        format!(
            "the provider no longer holds template {id} and the shared store does not have it \
             either; change spec.capturePaths or spec.label to capture again, or delete the \
             SandboxTemplate"
        ),
    )
}

/// The only env a capture may store (besides its image's): the Sandbox's plain `spec.env`.
/// Nothing of `envFrom` or `selfDeliveredEnv` — their values are Secrets'.
fn plain_env(sandbox: &Sandbox) -> BTreeMap<String, String> {
    let vars = sandbox.spec.env.iter().flatten();
    vars.map(|v| (v.name.clone(), v.value.clone())).collect()
}

/// Status is never authority: the id the source Sandbox's status records is captured only
/// when the provider's sandbox carries that Sandbox's owner-uid label (else a status patch
/// could capture another tenant's sandbox).
async fn ensure_source_owned(on: &Subject<'_>, id: &str, uid: &str) -> Result<(), Outcome> {
    let handle = on.handle;
    match handle
        .call("describe", handle.provider.describe(id))
        .await?
    {
        Some(d) => ensure_owned("spec.sandboxRef's status.sandboxId", id, &d.labels, uid)
            .map_err(Outcome::failed),
        None => Err(Outcome::waiting(
            "SandboxNotReady",
            format!(
                "waiting for sandbox {id} to show on provider {}",
                handle.name()
            ),
            WAIT,
        )),
    }
}

/// The provider id of the Sandbox to capture, and the Sandbox, when it can be captured now.
async fn capture_source(
    ctx: &Context,
    template: &SandboxTemplate,
    provider: &str,
) -> Result<(String, Sandbox), Outcome> {
    let ns = template.namespace().unwrap_or_default();
    let Some(sref) = &template.spec.sandbox_ref else {
        return Err(Outcome::stalled(
            "InvalidSpec",
            "spec.sandboxRef is required when spec.source is Capture",
        ));
    };
    let sandboxes: Api<Sandbox> = Api::namespaced(ctx.client.clone(), &ns);
    let Some(sandbox) = sandboxes.get_opt(&sref.name).await? else {
        return Err(Outcome::waiting(
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
        return Err(Outcome::stalled(
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
        Some(id) => Ok((id, sandbox)),
        None => Err(Outcome::waiting(
            "SandboxNotReady",
            format!(
                "waiting for Sandbox {:?} to become Ready before capturing it",
                sref.name
            ),
            WAIT,
        )),
    }
}
