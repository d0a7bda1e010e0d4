//! Act: run a plan's steps on the provider, one function per step, and say what was done
//! in a type ([`Acted`]) the report stage cannot misread.

use kube::ResourceExt;

use crate::api::{AppliedEgress, HibernationStatus, ResourceChangeStatus, Sandbox, SandboxStatus};
use crate::controller::events::{normal, warning};
use crate::controller::outcome::{Outcome, Report};
use crate::controller::status;
use crate::controller::{Context, Error, Result};
use crate::provider::{ErrorKind, HibernationOutcome, ProviderError, SandboxDescriptor};
use crate::registry::ProviderHandle;

use super::SandboxContext;
use super::apply::Pass;
use super::build::Desired;
use super::decide::{Plan, Step};
use super::pulling;
use super::resolve::{SELF_DELIVERED_ENV_PATH, SelfDeliveredEnv};

/// What the steps act through: where to report, the provider, the controller's state.
pub struct Target<'a> {
    /// The object and where its status and Events go.
    pub r: &'a Report<'a, Sandbox>,
    /// Its provider.
    pub handle: &'a ProviderHandle,
    /// The Sandbox controller's state.
    pub sctx: &'a SandboxContext,
    /// The warm pool member the pool's ledger gives this Sandbox, when it claimed one.
    pub claim: Option<&'a crate::provider::labels::Claim>,
    /// The claim's environment file, staged in that member while the ledger was written.
    pub staged: Option<&'a super::claim::StagedEnv>,
}

impl Target<'_> {
    fn ctx(&self) -> &Context {
        self.r.ctx
    }
    fn sandbox(&self) -> &Sandbox {
        self.r.object
    }
}

/// What the act stage did.
pub enum Acted {
    /// No step ran, or only steps that leave the descriptor as it was (see
    /// [`Step::leaves_the_descriptor`]): the observation made before acting still stands.
    Nothing(Option<Box<SandboxDescriptor>>),
    /// Steps ran, ending on the provider id `target`: what they changed must be observed.
    Steps { target: Option<String> },
}

/// The status that records a create (the provider's id), still to be written. A create's
/// record is written while the next step — the start — runs, not before it: the id is in
/// status by the end of the pass, and a crash in between is an adoption by the owner-uid
/// label, never a second create.
#[must_use]
struct Unrecorded(SandboxStatus);

/// Runs the plan's steps in order; a failure ends the pass with its outcome.
pub async fn act_all(
    on: &Target<'_>,
    desired: &Desired,
    env: Option<&SelfDeliveredEnv>,
    plan: &Plan,
    observed: Option<SandboxDescriptor>,
    pass: &mut Pass,
) -> Result<Acted, Outcome> {
    if plan.steps.is_empty() {
        return Ok(Acted::Nothing(observed.map(Box::new)));
    }
    let unchanged = observed.clone().map(Box::new);
    let leaves = plan.steps.iter().all(|s| s.leaves_the_descriptor());
    announce(
        on,
        plan,
        observed.is_none() && pass.current.sandbox_id.is_some(),
    )
    .await;
    let uid = on.sandbox().uid().unwrap_or_default();
    on.ctx().echoes.begin(&uid);
    // The provider id every step acts on: the observed one, replaced by a create's.
    let mut target = observed.map(|d| d.id);
    let mut unrecorded: Option<Unrecorded> = None;
    let Pass { current, next } = pass;
    for step in plan.steps.iter().copied() {
        let acting = act(on, desired, env, step, &mut target, next);
        let result = match unrecorded.take() {
            Some(Unrecorded(record)) => {
                let (saved, acted) = tokio::join!(on.r.save(&*current, &record), acting);
                saved.map_err(Error::from).and(acted)
            }
            None => acting.await,
        };
        unrecorded = result.map_err(|e| failed(step, e))?;
    }
    if let Some(Unrecorded(record)) = unrecorded {
        on.r.save(&*current, &record).await?;
    }
    if leaves && unchanged.is_some() {
        return Ok(Acted::Nothing(unchanged));
    }
    Ok(Acted::Steps { target })
}

/// The Events that say why steps run: a sandbox that vanished, a recreate.
async fn announce(on: &Target<'_>, plan: &Plan, vanished: bool) {
    let (ctx, sandbox, provider) = (on.ctx(), on.sandbox(), on.handle.name());
    let external = super::build::external_name(&sandbox.uid().unwrap_or_default());
    if vanished {
        let msg = format!(
            "provider {provider} no longer holds sandbox {external}; recreating it per restartPolicy"
        );
        warning(ctx, sandbox, "SandboxVanished", msg).await;
    }
    if let Some(reason) = &plan.recreate_reason {
        let msg = format!(
            "recreating sandbox {external}: {reason}; data outside SandboxVolumes is not kept"
        );
        normal(ctx, sandbox, "Recreating", msg).await;
    }
}

/// A failed step's outcome: an image still being pulled is work in progress, not a failure.
fn failed(step: Step, e: Error) -> Outcome {
    if let Some(pull) = pulling::in_progress(&e) {
        return pulling::outcome(pull);
    }
    Outcome::Failed {
        error: e,
        during: Some(format!("{step:?}")),
    }
}

/// Runs one step. Every step but `Create` acts on the provider's id in `target` (the
/// observed sandbox's, or the one a create in this pass returned), never on our external
/// name: providers assign their own ids.
async fn act(
    on: &Target<'_>,
    desired: &Desired,
    env: Option<&SelfDeliveredEnv>,
    step: Step,
    target: &mut Option<String>,
    next: &mut SandboxStatus,
) -> Result<Option<Unrecorded>> {
    on.ctx()
        .echoes
        .expect(&on.sandbox().uid().unwrap_or_default(), step);
    if step == Step::Create {
        *target = Some(create(on, desired, next).await?);
        return Ok(Some(Unrecorded(next.clone())));
    }
    let id = target.clone().ok_or_else(|| {
        Error::Provider(ProviderError::transient(format!(
            "no provider id known for sandbox {} before {step:?}; observing again",
            desired.request.name
        )))
    })?;
    match step {
        Step::Create => {}
        Step::Destroy => {
            destroy(on, &id, next).await?;
            *target = None;
        }
        Step::Restore => {
            let (sctx, handle) = (on.sctx, on.handle);
            sctx.restore_retries
                .restore(&sctx.ctx, on.sandbox(), handle, desired, &id, next)
                .await?
        }
        Step::DeliverEnv => deliver_env(on, env, &id, next).await?,
        Step::Start | Step::Stop => power(on, step, &id).await?,
        Step::Hibernate | Step::Resume => hibernation(on, step, &id, next).await?,
        Step::SetEgress => set_egress(on, desired, &id, next).await?,
        Step::SetResources => set_resources(on, desired, &id, next).await?,
    }
    Ok(None)
}

/// Destroys the sandbox before it is created again; what status said of it is forgotten.
async fn destroy(on: &Target<'_>, id: &str, next: &mut SandboxStatus) -> Result<()> {
    let handle = on.handle;
    handle.call("destroy", handle.provider.destroy(id)).await?;
    let msg = format!("destroyed sandbox {id} before recreating it");
    normal(on.ctx(), on.sandbox(), "Destroyed", msg).await;
    next.self_delivered_env_hash = None;
    next.template_restored_into = None;
    next.egress_applied = None;
    Ok(())
}

/// Writes `spec.selfDeliveredEnv` into the sandbox.
async fn deliver_env(
    on: &Target<'_>,
    env: Option<&SelfDeliveredEnv>,
    id: &str,
    next: &mut SandboxStatus,
) -> Result<()> {
    let Some(env) = env else { return Ok(()) };
    let handle = on.handle;
    if handle.provider.files().is_none() {
        return Err(ProviderError::unsupported(format!(
            "provider {} has no file API to deliver spec.selfDeliveredEnv; remove it or use another provider",
            handle.name()
        ))
        .into());
    }
    let content = env.content.as_bytes();
    let staged = on.staged.and_then(|s| s.take(id, &env.version));
    let committed = match staged {
        Some(write) => write.commit().await.map_err(|e| {
            tracing::debug!(sandbox = id, error = %e, "staged env not committed; writing it");
        }),
        None => Err(()),
    };
    if committed.is_err() {
        handle
            .write_file(id, SELF_DELIVERED_ENV_PATH, content, 0o600)
            .await?;
    }
    // A warm claim's first delivery is part of the claim, which its Ready and
    // `status.claim` record: no Event of its own (it would be a fifth of the API writes on
    // the claim's path, on an API server the claims keep busy). Later ones are.
    let claiming = on.claim.is_some() && next.self_delivered_env_hash.is_none();
    next.self_delivered_env_hash = Some(env.version.clone());
    if !claiming {
        let msg = format!("delivered spec.selfDeliveredEnv into {SELF_DELIVERED_ENV_PATH}");
        on.r.after_status("EnvDelivered", msg);
    }
    Ok(())
}

/// Starts or stops the sandbox.
async fn power(on: &Target<'_>, step: Step, id: &str) -> Result<()> {
    let (handle, p) = (on.handle, &on.handle.provider);
    if step == Step::Start {
        handle.call("start", p.start(id)).await?;
        on.r.after_status("Started", format!("started sandbox {id}"));
    } else {
        handle.call("stop", p.stop(id)).await?;
        normal(
            on.ctx(),
            on.sandbox(),
            "Stopped",
            format!("stopped sandbox {id}"),
        )
        .await;
    }
    Ok(())
}

/// Hibernates or resumes the sandbox, recording what happened to its processes — what the
/// provider reports, or that they are gone when it cannot tell.
async fn hibernation(
    on: &Target<'_>,
    step: Step,
    id: &str,
    next: &mut SandboxStatus,
) -> Result<()> {
    let (handle, p) = (on.handle, &on.handle.provider);
    let hibernate = step == Step::Hibernate;
    let unknown = |mechanism: &str| HibernationOutcome {
        processes_preserved: false,
        mechanism: mechanism.into(),
        detail: Some("provider cannot report process survival; assume processes are gone".into()),
    };
    let outcome = match p.hibernation() {
        Some(h) if hibernate => handle.call("hibernate", h.hibernate(id)).await?,
        Some(h) => handle.call("resume", h.resume(id)).await?,
        None if hibernate => {
            handle.call("sleep", p.sleep(id)).await?;
            unknown("sleep")
        }
        None => {
            handle.call("wake", p.wake(id)).await?;
            unknown("wake")
        }
    };
    let verb = if hibernate { "Hibernated" } else { "Resumed" };
    let kept = if outcome.processes_preserved {
        "preserved"
    } else {
        "NOT preserved"
    };
    let msg = format!(
        "{verb} sandbox {id} by {}: processes {kept}",
        outcome.mechanism
    );
    normal(on.ctx(), on.sandbox(), verb, msg).await;
    next.last_hibernation = Some(HibernationStatus {
        processes_preserved: outcome.processes_preserved,
        mechanism: outcome.mechanism,
        detail: outcome.detail,
        time: status::now(),
        suspended: Some(hibernate),
    });
    Ok(())
}

/// Replaces the sandbox's egress allow-list in place.
async fn set_egress(
    on: &Target<'_>,
    desired: &Desired,
    id: &str,
    next: &mut SandboxStatus,
) -> Result<()> {
    let handle = on.handle;
    let policy = handle.provider.egress_policy().ok_or_else(|| {
        ProviderError::unsupported(format!(
            "provider {} cannot replace spec.egress in place",
            handle.name()
        ))
    })?;
    let allowed = desired.request.allowed_domains.as_deref();
    handle
        .call(
            "set_allowed_domains",
            policy.set_allowed_domains(id, allowed),
        )
        .await?;
    next.egress_applied = Some(AppliedEgress::of(allowed));
    let what = match allowed {
        None => "unrestricted".to_string(),
        Some([]) => "no egress".to_string(),
        Some(list) => list.join(", "),
    };
    let msg = format!("applied the egress allow-list of sandbox {id} in place: {what}");
    normal(on.ctx(), on.sandbox(), "EgressPolicyApplied", msg).await;
    Ok(())
}

/// Changes the sandbox's resource ceilings in place.
async fn set_resources(
    on: &Target<'_>,
    desired: &Desired,
    id: &str,
    next: &mut SandboxStatus,
) -> Result<()> {
    let handle = on.handle;
    let setter = handle.provider.resources().ok_or_else(|| {
        ProviderError::unsupported(format!(
            "provider {} cannot change resources in place; recreate the Sandbox to change spec.resources",
            handle.name()
        ))
    })?;
    let change = handle
        .call(
            "set_resources",
            setter.set_resources(id, &desired.request.resources),
        )
        .await?;
    next.last_resource_change = Some(ResourceChangeStatus {
        restarted: change.restarted,
        time: status::now(),
    });
    let how = if change.restarted {
        "; the provider restarted it to apply them"
    } else {
        " in place, without a restart"
    };
    let msg = format!("updated resource ceilings of sandbox {id}{how}");
    normal(on.ctx(), on.sandbox(), "ResourcesUpdated", msg).await;
    Ok(())
}

/// Creates the sandbox and puts the provider's id into `next`, for the caller to write while
/// the next step runs. Returns the provider's id.
async fn create(on: &Target<'_>, desired: &Desired, next: &mut SandboxStatus) -> Result<String> {
    let (ctx, sandbox, handle) = (on.ctx(), on.sandbox(), on.handle);
    let name = &desired.request.name;
    let d = match handle
        .call("create", handle.provider.create(&desired.request))
        .await
    {
        Ok(d) => d,
        // Someone (a previous incarnation of us) created it between our observe and this
        // create: adopt on the next pass instead of creating a second one.
        Err(e) if e.is(ErrorKind::Conflict) => {
            return Err(Error::Provider(ProviderError::transient(format!(
                "sandbox {name} appeared during create ({}); adopting it on retry",
                e.message()
            ))));
        }
        Err(e) => return Err(e.into()),
    };
    ctx.failpoint("after-create");
    if let Some(pull) = &d.image_pull {
        pulling::pulled(ctx, sandbox, pull, d.image_digest.as_deref()).await;
    }
    let msg = format!(
        "created sandbox {name} (id {}) on provider {}",
        d.id,
        handle.name()
    );
    on.r.after_status("Created", msg);
    next.sandbox_id = Some(d.id.clone());
    next.self_delivered_env_hash = None;
    next.template_restored_into = None;
    // The allow-list was applied at create, where the provider could.
    next.egress_applied = handle
        .provider
        .egress_policy()
        .map(|_| AppliedEgress::of(desired.request.allowed_domains.as_deref()));
    // What the digest in status was resolved from (see `build::image_to_boot`).
    next.image = sandbox
        .spec
        .image
        .clone()
        .filter(|_| d.template_ref.is_none());
    next.image_digest = d.image_digest.clone();
    Ok(d.id)
}
