//! Apply: converge the provider on a Sandbox's spec, then report — a driver of named stages
//! (read → provider → record the name → lifetime → dereference → build → observe → plan →
//! act → report), each ending the pass early with the [`Outcome`] it reached.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
use kube::runtime::controller::Action;

use crate::api::{DesiredState, IdleAction, IdleStatus, Sandbox, SandboxStatus};
use crate::controller::events::normal;
use crate::controller::outcome::{Outcome, Report};
use crate::controller::scaffold::FinalizerAdded;
use crate::controller::status::{self, Health};
use crate::controller::{Error, Result};
use crate::idle::{self, Verdict};
use crate::provider::SandboxDescriptor;
use crate::provider::labels::ensure_owned_or_claimed;
use crate::registry::ProviderHandle;

use super::SandboxContext;
use super::act::{self, Target};
use super::build::{self, Desired, Resolved};
use super::claim;
use super::decide::{self, EgressConvergence, Hold, Observed, Plan, Step};
use super::images;
use super::lifetime::{self, Deadline};
use super::observe::{self, observe, record};
use super::resolve::{self, SelfDeliveredEnv};

/// How long to wait before looking again at something that will come by itself.
pub const WAIT: Duration = Duration::from_secs(5);

/// Status as last written, and as this pass wants it next.
pub struct Pass {
    /// What the API server holds (as far as this pass knows).
    pub current: SandboxStatus,
    /// What this pass has learned so far.
    pub next: SandboxStatus,
}

/// The Apply half of the finalizer: the reconcile pipeline for a live Sandbox.
/// `added` says when our finalizer is on a new object: it is awaited (alongside the first
/// status write) before the first provider call.
pub async fn apply(
    cached: Arc<Sandbox>,
    sctx: &SandboxContext,
    added: FinalizerAdded,
) -> Result<Action> {
    let ctx = sctx.ctx.as_ref();
    let api: Api<Sandbox> =
        Api::namespaced(ctx.client.clone(), &cached.namespace().unwrap_or_default());
    let Some(sandbox) = read(cached, sctx, &api).await? else {
        return Ok(Action::await_change());
    };
    let r = Report::new(ctx, sandbox.as_ref(), Some(&sctx.written));
    let status = sandbox.status.clone().unwrap_or_default();
    let mut pass = Pass {
        current: status.clone(),
        next: status,
    };
    let outcome = converge(&r, sctx, added, &mut pass)
        .await
        .unwrap_or_else(|ended| ended);
    r.conclude(&pass.current, pass.next, outcome).await
}

/// The stages, in order; each returns the outcome that ends the pass early.
async fn converge(
    r: &Report<'_, Sandbox>,
    sctx: &SandboxContext,
    added: FinalizerAdded,
    pass: &mut Pass,
) -> Result<Outcome, Outcome> {
    let uid = r
        .object
        .uid()
        .ok_or_else(|| Outcome::failed(Error::InvalidSpec("object has no UID".into())))?;
    // A claiming Sandbox is built from its pool's template (see `claim`).
    let claimed = pass.current.claim.as_deref() == Some(claim::WARM);
    let pool = claim::pool(r, sctx, claimed).await?;
    let effective = pool.as_ref().map(|p| claim::effective(r.object, p));
    let sandbox = effective.as_ref().unwrap_or(r.object);
    let handle = provider(r, sandbox, pass)?;
    admit(r, sctx, pass).await?;
    // Whether a provider call was ever made for this object: the external name is written
    // before the first one (see `record_external_name`).
    let touched = pass.current.external_name.is_some();
    let (deadline, parked) = idleness(r, pass, lifetime(r).await?).await;
    let (resolved, env) = dereference(sctx, r.object, sandbox, &handle).await?;
    let mut desired = build(r, sandbox, &resolved, &deadline, parked)?;
    if pool.is_some() {
        claim::cold_labels(r.object, &mut desired);
    }
    let settled = match &pool {
        Some(pool) => {
            let at = claim::Claiming {
                broker: &sctx.broker,
                handle: &handle,
                pool,
                env: env.as_ref(),
            };
            claim::settle(r, at, &desired, touched, pass).await?
        }
        None => claim::Settled::default(),
    };
    let (proof, staged) = (settled.proof, settled.staged);
    record_external_name(r, &uid, added, proof.is_none(), pass).await?;
    let observed = if touched || proof.is_some() {
        // `next`: a warm claim's member is recorded there, not yet written (see `claim`).
        let known = pass.next.sandbox_id.as_deref();
        observe_first(r, &handle, known, &uid, proof.as_ref(), settled.seen).await?
    } else {
        None
    };
    let on = Target {
        r,
        handle: &handle,
        sctx,
        claim: proof.as_ref(),
        staged: staged.as_ref(),
    };
    let plan = plan(
        &on,
        sandbox,
        &desired,
        &resolved,
        env.as_ref(),
        observed.as_ref(),
        pass,
    )?;
    if plan.steps.contains(&Step::Create) {
        images::admit(sandbox, r.ctx, &handle, &mut desired.request).await?;
    }
    // The egress verdict a first report needs, asked while steps that leave the sandbox as
    // observed run (a warm claim's env delivery), not after them.
    let early = observed
        .as_ref()
        .filter(|_| pass.next.egress.is_none() && plan.leaves_the_descriptor())
        .map(|d| d.id.clone());
    let (acted, verdict) = tokio::join!(
        act::act_all(&on, &desired, env.as_ref(), &plan, observed, pass),
        observe::verdict_of(&handle, early)
    );
    observe::report(&on, &desired, acted?, verdict, &deadline, pass).await
}

/// The object to work from: the watch cache's copy, unless it may not have seen our own
/// last status write (see `freshness`): then read fresh, once. `None`: gone, or replaced by
/// a new object of the same name (that one gets its own reconcile).
async fn read(
    cached: Arc<Sandbox>,
    sctx: &SandboxContext,
    api: &Api<Sandbox>,
) -> Result<Option<Arc<Sandbox>>> {
    let uid = cached.uid().unwrap_or_default();
    if !sctx
        .written
        .stale(&uid, cached.resource_version().as_deref())
    {
        return Ok(Some(cached));
    }
    let fresh = api.get_opt(&cached.name_any()).await?;
    sctx.written.forget(&uid);
    Ok(fresh.filter(|f| f.uid() == cached.uid()).map(Arc::new))
}

/// Which provider. Not configured = the user must fix spec.provider (or the operator's
/// configuration): stall, do not retry in a loop.
fn provider(
    r: &Report<'_, Sandbox>,
    sandbox: &Sandbox,
    pass: &mut Pass,
) -> Result<ProviderHandle, Outcome> {
    let handle = r
        .ctx
        .providers
        .resolve(sandbox.spec.provider.as_deref())
        .map_err(|msg| Outcome::stalled("ProviderNotConfigured", msg))?
        .clone();
    pass.next.provider = Some(handle.name().to_string());
    Ok(handle)
}

/// Admission against the namespace's SandboxBudgets before the first provider call (or a
/// start after a stop): over budget the Sandbox waits, `OverBudget` (see `budgets`).
async fn admit(r: &Report<'_, Sandbox>, sctx: &SandboxContext, pass: &Pass) -> Result<(), Outcome> {
    let Some(budgets) = sctx.budgets.get() else {
        return Ok(());
    };
    let mut latest = r.object.clone();
    latest.status = Some(pass.current.clone());
    budgets.admit(&latest, &r.ctx.providers).await
}

/// Writes the external name into status BEFORE any provider call that may create, so a
/// crash after the create leaves a record of what to look for, and waits for our finalizer.
/// A warm claim (`before_create` false) creates nothing — the pool's ledger already records
/// its member — so its name goes out with the pass's last status write instead of one of its
/// own: one round trip fewer on the claim path.
async fn record_external_name(
    r: &Report<'_, Sandbox>,
    uid: &str,
    added: FinalizerAdded,
    before_create: bool,
    pass: &mut Pass,
) -> Result<(), Outcome> {
    let external = build::external_name(uid);
    if pass.current.external_name.as_deref() == Some(external.as_str()) {
        return Ok(added.wait().await?);
    }
    let generation = r.object.metadata.generation;
    pass.next.external_name = Some(external.clone());
    // This first write also says "working on it" at this generation, so kstatus (Flux
    // `wait: true`) reads InProgress instead of a premature Current.
    Health::progressing("Creating", format!("creating sandbox {external}")).apply(
        &mut pass.next.conditions,
        generation,
        &status::now(),
    );
    pass.next.observed_generation = generation;
    if !before_create {
        return Ok(added.wait().await?);
    }
    let (saved, finalized) = tokio::join!(r.save(&pass.current, &pass.next), added.wait());
    saved?;
    finalized?;
    pass.current = pass.next.clone();
    Ok(())
}

/// `spec.lifetime`: a passed deadline deletes the Sandbox (its cleanup destroys the sandbox).
async fn lifetime(r: &Report<'_, Sandbox>) -> Result<Deadline, Outcome> {
    let sandbox = r.object;
    let created = sandbox
        .metadata
        .creation_timestamp
        .as_ref()
        .and_then(|t| DateTime::<Utc>::from_timestamp(t.0.as_second(), 0));
    let deadline = lifetime::evaluate(sandbox.spec.lifetime.as_ref(), created, Utc::now())
        .map_err(|msg| Outcome::stalled("InvalidSpec", msg))?;
    if deadline != Deadline::Delete {
        return Ok(deadline);
    }
    let msg = "spec.lifetime reached: deleting the Sandbox".to_string();
    normal(r.ctx, sandbox, "LifetimeExpired", msg).await;
    r.api
        .delete(&sandbox.name_any(), &DeleteParams::default())
        .await?;
    Err(Outcome::ObjectGone)
}

/// `spec.idleTimeoutSeconds`: a busy sandbox is looked at again when it would turn idle; an
/// idle one that the spec runs is parked with `spec.idleAction` (returned for [`build`]),
/// and the first pass of each idle period says so in `status.lastIdle` and an Event. Traffic
/// recorded after that wakes it: the verdict turns busy, and the spec's state applies again.
async fn idleness(
    r: &Report<'_, Sandbox>,
    pass: &mut Pass,
    deadline: Deadline,
) -> (Deadline, Option<IdleAction>) {
    let runs = r.object.spec.state.unwrap_or_default() == DesiredState::Running;
    match idle::evaluate(r.object, Utc::now()) {
        Verdict::Unmanaged => (deadline, None),
        Verdict::Busy(at) => (deadline.earliest(at), None),
        Verdict::Idle(since, action) if runs && deadline.keeps_running() => {
            record_idle(r, pass, since, action).await;
            (deadline, Some(action))
        }
        Verdict::Idle(..) => (deadline, None),
    }
}

/// `status.lastIdle` and an Event, once per idle period (the one recorded is from before
/// `since` when the sandbox was woken since).
async fn record_idle(
    r: &Report<'_, Sandbox>,
    pass: &mut Pass,
    since: DateTime<Utc>,
    action: IdleAction,
) {
    let recorded = pass
        .current
        .last_idle
        .as_ref()
        .and_then(|l| DateTime::parse_from_rfc3339(&l.time).ok());
    if recorded.is_some_and(|t| t >= since) {
        return;
    }
    let secs = r.object.spec.idle_timeout_seconds.unwrap_or_default();
    let reason = format!(
        "no exec, attach, port-forward, files or E2B API traffic through the operator for \
         {secs}s (since {})",
        idle::stamp(since - chrono::Duration::seconds(secs))
    );
    let verb = match action {
        IdleAction::Stop => "stopping",
        IdleAction::Suspend | IdleAction::Off => "suspending",
    };
    normal(r.ctx, r.object, "Idle", format!("{reason}: {verb} it")).await;
    pass.next.last_idle = Some(IdleStatus {
        time: idle::stamp(Utc::now()),
        action,
        reason,
    });
}

/// Dereference: the objects and Secrets the spec names (`effective`: the spec the sandbox
/// is built from, its pool's template for a claiming Sandbox, whose own env goes into the
/// self-delivered file instead).
async fn dereference(
    sctx: &SandboxContext,
    sandbox: &Sandbox,
    effective: &Sandbox,
    handle: &ProviderHandle,
) -> Result<(Resolved, Option<SelfDeliveredEnv>), Outcome> {
    let resolved = resolve::references(effective, sctx, handle).await?;
    let env = if sandbox.spec.warm_pool_ref.is_some() {
        claim::env_file(sandbox, &sctx.ctx).await?
    } else {
        resolve::self_delivered_env(sandbox, &sctx.ctx).await?
    };
    Ok((resolved, env))
}

/// Build (pure): the provider request; a passed stop (sleep) deadline wants the sandbox
/// stopped (sleeping), and so does an idle one parked with `stop` (`suspend`).
fn build(
    r: &Report<'_, Sandbox>,
    sandbox: &Sandbox,
    resolved: &Resolved,
    deadline: &Deadline,
    parked: Option<IdleAction>,
) -> Result<Desired, Outcome> {
    let mut desired = build::desired(sandbox, &r.ctx.instance, resolved)
        .map_err(|msg| Outcome::stalled("InvalidSpec", msg))?;
    match deadline {
        Deadline::Stop => desired.state = DesiredState::Stopped,
        // A sandbox the spec already stops stays stopped.
        Deadline::Sleep if desired.state == DesiredState::Running => {
            desired.state = DesiredState::Sleeping;
        }
        Deadline::Sleep | Deadline::None | Deadline::At(_) | Deadline::Delete => {}
    }
    match parked {
        Some(IdleAction::Stop) => desired.state = DesiredState::Stopped,
        Some(IdleAction::Suspend) => desired.state = DesiredState::Sleeping,
        Some(IdleAction::Off) | None => {}
    }
    Ok(desired)
}

/// Observes the sandbox before acting; one found only by its owner label is adopted. `seen`:
/// the claimed member as its claim described it moments ago, which stands for a description
/// of the same id (judged by the same ownership rule).
async fn observe_first(
    r: &Report<'_, Sandbox>,
    handle: &ProviderHandle,
    known: Option<&str>,
    uid: &str,
    claim: Option<&crate::provider::labels::Claim>,
    seen: Option<SandboxDescriptor>,
) -> Result<Option<SandboxDescriptor>, Outcome> {
    if let Some(d) = seen.filter(|d| Some(d.id.as_str()) == known) {
        ensure_owned_or_claimed("status.sandboxId", &d.id, &d.labels, uid, claim)?;
        return Ok(Some(d));
    }
    let observed = observe(handle, known, uid, claim).await?;
    if let Some(d) = &observed
        && known.is_none()
    {
        let msg = format!(
            "found existing sandbox {} by its owner label; adopting it",
            d.id
        );
        normal(r.ctx, r.object, "Adopted", msg).await;
    }
    Ok(observed)
}

/// Decide (pure), then the reasons not to act: a failed restore still backing off, or a
/// hold (the sandbox is gone, or its main process exited, and restartPolicy keeps it down).
fn plan(
    on: &Target<'_>,
    sandbox: &Sandbox,
    desired: &Desired,
    resolved: &Resolved,
    env: Option<&SelfDeliveredEnv>,
    observed: Option<&SandboxDescriptor>,
    pass: &mut Pass,
) -> Result<Plan, Outcome> {
    let sctx = on.sctx;
    let current = &pass.current;
    // Served from a pool, warm or cold: its build is the pool template's at that time.
    let claimed = on.r.object.spec.warm_pool_ref.is_some();
    let plan = decide::decide(
        desired,
        &Observed {
            descriptor: observed,
            existed_before: current.sandbox_id.is_some(),
            spec_changed: sandbox.metadata.generation != current.observed_generation,
            wants_env: env.is_some(),
            env_delivered: env.map(|e| e.version.as_str())
                == current.self_delivered_env_hash.as_deref()
                && current.sandbox_id.is_some(),
            restored: super::restore::restored(current, observed),
            env_after_start: resolved.files_need_running,
            egress: egress_convergence(resolved.egress_in_place, desired, current),
            asleep: decide::slept_since_start(
                current.last_hibernation.as_ref(),
                current.started_at.as_deref(),
            ),
            claimed,
        },
    );
    // A failed template restore is retried at backoff pace, not at once (see restore.rs).
    if let Some(waiting) = sctx.restore_retries.hold(desired, &plan) {
        return Err(waiting);
    }
    let Some(hold) = &plan.hold else {
        return Ok(plan);
    };
    if let Some(d) = observed {
        record(&mut pass.next, d, sandbox);
    }
    Err(held(hold, &desired.request.name, &mut pass.next))
}

/// A hold's outcome. Stalled, not merely not-ready: nothing changes until the user does
/// something, and kstatus must read that as Failed rather than InProgress forever.
fn held(hold: &Hold, external: &str, next: &mut SandboxStatus) -> Outcome {
    match hold {
        Hold::Gone => {
            next.phase = Some("Gone".into());
            Outcome::stalled(
                "SandboxGone",
                format!(
                    "the provider no longer holds sandbox {external} and restartPolicy is Never; delete the Sandbox, or change restartPolicy or the spec to recreate it"
                ),
            )
        }
        Hold::Exited(code) => {
            next.phase = Some("Exited".into());
            Outcome::stalled(
                "ProcessExited",
                format!(
                    "the main process exited with code {}; restartPolicy keeps it down — change spec.state or the spec to start it again",
                    code.map_or("unknown".into(), |c| c.to_string())
                ),
            )
        }
    }
}

/// Whether the applied allow-list matches the spec, for a provider that replaces it in place.
fn egress_convergence(
    in_place: bool,
    desired: &Desired,
    current: &SandboxStatus,
) -> EgressConvergence {
    if !in_place {
        return EgressConvergence::NotInPlace;
    }
    let want = crate::api::AppliedEgress::of(desired.request.allowed_domains.as_deref());
    if current.egress_applied.as_ref() == Some(&want) {
        EgressConvergence::Applied
    } else {
        EgressConvergence::Differs
    }
}
