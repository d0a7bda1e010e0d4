//! Apply: converge the provider on a Sandbox's spec, then report.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
use kube::runtime::controller::Action;

use crate::api::{
    AppliedEgress, AppliedResourcesStatus, DesiredState, EgressStatus, HibernationStatus,
    PortStatus, ResourceChangeStatus, Sandbox, SandboxStatus,
};
use crate::controller::events::{normal, normal_detached, warning};
use crate::controller::scaffold::FinalizerAdded;
use crate::controller::status::{self, Health};
use crate::controller::{Context, Error, Result};
use crate::provider::labels::OWNER_UID;
use crate::provider::{
    EgressState, ErrorKind, HibernationOutcome, ProviderError, SandboxDescriptor, SandboxQuery,
    SandboxState,
};
use crate::registry::ProviderHandle;

use super::build::{self, Desired};
use super::decide::{self, EgressConvergence, Hold, Observed, Step};
use super::lifetime::{self, Deadline};
use super::pulling;
use super::resolve::{self, Blocked, SELF_DELIVERED_ENV_PATH, SelfDeliveredEnv};

/// How long to wait before looking again at something that will come by itself.
const WAIT: Duration = Duration::from_secs(5);

/// The Apply half of the finalizer: the reconcile pipeline for a live Sandbox.
/// `added` says when our finalizer is on a new object: it is awaited (alongside the first
/// status write) before the first provider call.
pub async fn apply(cached: Arc<Sandbox>, ctx: &Context, added: FinalizerAdded) -> Result<Action> {
    let ns = cached.namespace().unwrap_or_default();
    let api: Api<Sandbox> = Api::namespaced(ctx.client.clone(), &ns);
    let name = cached.name_any();
    // Work from the watch cache, unless it may not have seen our own last status write (see
    // `freshness`): then read the object fresh, once.
    let cached_uid = cached.uid().unwrap_or_default();
    let sandbox = if ctx
        .written
        .stale(&cached_uid, cached.resource_version().as_deref())
    {
        let fresh = api.get_opt(&name).await?;
        ctx.written.forget(&cached_uid);
        match fresh {
            Some(fresh) if fresh.uid() == cached.uid() => Arc::new(fresh),
            // Gone, or replaced by a new object of the same name: that one gets its own
            // reconcile.
            _ => return Ok(Action::await_change()),
        }
    } else {
        cached
    };
    let uid = sandbox
        .uid()
        .ok_or_else(|| Error::InvalidSpec("object has no UID".into()))?;
    let current = sandbox.status.clone().unwrap_or_default();
    let mut next = current.clone();
    let generation = sandbox.metadata.generation;
    let report = Report {
        ctx,
        api: &api,
        sandbox: &sandbox,
        generation,
    };

    // Which provider. Not configured = the user must fix spec.provider (or the operator's
    // configuration): stall, do not retry in a loop.
    let handle = match ctx.providers.resolve(sandbox.spec.provider.as_deref()) {
        Ok(h) => h.clone(),
        Err(msg) => {
            return finish(
                &report,
                &current,
                next,
                Health::stalled("ProviderNotConfigured", msg),
                None,
            )
            .await;
        }
    };
    next.provider = Some(handle.name().to_string());

    // The external name goes into status BEFORE any provider call, so a crash after the
    // create leaves a record of what to look for.
    let external = build::external_name(&uid);
    // No external name in status = no provider call was ever made for this object (the name
    // is written before the first one), so there is nothing to observe or adopt yet.
    let never_touched = current.external_name.is_none();
    if current.external_name.as_deref() != Some(external.as_str()) {
        next.external_name = Some(external.clone());
        // This first write also says "working on it" at this generation, so kstatus (Flux
        // `wait: true`) reads InProgress instead of a premature Current.
        let mut conditions = next.conditions.clone();
        Health::progressing("Creating", format!("creating sandbox {external}")).apply(
            &mut conditions,
            generation,
            &status::now(),
        );
        next.conditions = conditions;
        next.observed_generation = generation;
        let (saved, finalized) = tokio::join!(
            save(ctx, &api, &sandbox, Some(&current), &next),
            added.wait()
        );
        saved?;
        finalized?;
    } else {
        added.wait().await?;
    }
    let current = next.clone();

    // Lifetime.
    let created = sandbox
        .metadata
        .creation_timestamp
        .as_ref()
        .and_then(|t| DateTime::<Utc>::from_timestamp(t.0.as_second(), 0));
    let deadline = match lifetime::evaluate(sandbox.spec.lifetime.as_ref(), created, Utc::now()) {
        Ok(d) => d,
        Err(msg) => {
            return finish(
                &report,
                &current,
                next,
                Health::stalled("InvalidSpec", msg),
                None,
            )
            .await;
        }
    };
    if deadline == Deadline::Delete {
        normal(
            ctx,
            sandbox.as_ref(),
            "LifetimeExpired",
            "spec.lifetime reached: deleting the Sandbox".into(),
        )
        .await;
        api.delete(&name, &DeleteParams::default()).await?;
        return Ok(Action::await_change());
    }

    // Dereference.
    let resolved = match resolve::references(&sandbox, ctx, &handle).await {
        Ok(r) => r,
        Err(blocked) => {
            return blocked_outcome(&report, &current, next, blocked).await;
        }
    };
    let env = match resolve::self_delivered_env(&sandbox, ctx).await {
        Ok(e) => e,
        Err(blocked) => {
            return blocked_outcome(&report, &current, next, blocked).await;
        }
    };

    // Build (pure).
    let mut desired = match build::desired(&sandbox, &ctx.instance, &resolved) {
        Ok(d) => d,
        Err(msg) => {
            return finish(
                &report,
                &current,
                next,
                Health::stalled("InvalidSpec", msg),
                None,
            )
            .await;
        }
    };
    if deadline == Deadline::Stop {
        desired.state = DesiredState::Stopped;
    }

    // Observe (nothing to look for before the first provider call).
    let observed = if never_touched {
        Ok(None)
    } else {
        observe(&handle, current.sandbox_id.as_deref(), &uid).await
    };
    let observed = match observed {
        Ok(o) => o,
        Err(e) => {
            return provider_failure(&report, &current, next, e, false).await;
        }
    };
    if let Some(d) = &observed
        && current.sandbox_id.is_none()
    {
        normal(
            ctx,
            sandbox.as_ref(),
            "Adopted",
            format!(
                "found existing sandbox {} by its owner label; adopting it",
                d.id
            ),
        )
        .await;
    }

    // Decide (pure).
    let plan = decide::decide(
        &desired,
        &Observed {
            descriptor: observed.as_ref(),
            existed_before: current.sandbox_id.is_some(),
            spec_changed: generation != current.observed_generation,
            wants_env: env.is_some(),
            env_delivered: env.as_ref().map(|e| e.version.as_str())
                == current.self_delivered_env_hash.as_deref()
                && current.sandbox_id.is_some(),
            restored: super::restore::restored(&current, observed.as_ref()),
            egress: egress_convergence(resolved.egress_in_place, &desired, &current),
        },
    );

    // A failed template restore is retried at backoff pace, not at once (see restore.rs).
    if let Some((health, wait)) = super::restore::hold(ctx, &desired, &plan) {
        return finish(&report, &current, next, health, Some(wait)).await;
    }

    // Holds: report, do not act.
    if let Some(hold) = &plan.hold {
        let health = match hold {
            Hold::Gone => {
                warning(ctx, sandbox.as_ref(), "SandboxVanished", format!("provider {} no longer holds sandbox {external}; restartPolicy Never keeps it down", handle.name())).await;
                Health::stalled(
                    "SandboxGone",
                    format!(
                        "the provider no longer holds sandbox {external} and restartPolicy is Never; delete the Sandbox, or change restartPolicy or the spec to recreate it"
                    ),
                )
            }
            // Stalled, not merely not-ready: nothing changes until the user does something,
            // and kstatus must read that as Failed rather than InProgress forever.
            Hold::Exited(code) => Health::stalled(
                "ProcessExited",
                format!(
                    "the main process exited with code {}; restartPolicy keeps it down — change spec.state or the spec to start it again",
                    code.map_or("unknown".into(), |c| c.to_string())
                ),
            ),
        };
        next.phase = Some(
            match hold {
                Hold::Gone => "Gone",
                Hold::Exited(_) => "Exited",
            }
            .into(),
        );
        if let Some(d) = &observed {
            record(&mut next, d, &sandbox);
        }
        return finish(&report, &current, next, health, None).await;
    }

    // Act.
    if observed.is_none() && current.sandbox_id.is_some() && !plan.steps.is_empty() {
        warning(
            ctx,
            sandbox.as_ref(),
            "SandboxVanished",
            format!(
                "provider {} no longer holds sandbox {external}; recreating it per restartPolicy",
                handle.name()
            ),
        )
        .await;
    }
    if let Some(reason) = &plan.recreate_reason {
        normal(
            ctx,
            sandbox.as_ref(),
            "Recreating",
            format!(
                "recreating sandbox {external}: {reason}; data outside SandboxVolumes is not kept"
            ),
        )
        .await;
    }
    let mut acted = false;
    if !plan.steps.is_empty() {
        ctx.echoes.begin(&uid);
    }
    // The provider id every step acts on: the observed one, replaced by a create's.
    let mut target = observed.as_ref().map(|d| d.id.clone());
    let on = Target {
        ctx,
        sandbox: &sandbox,
        handle: &handle,
    };
    // A create's record (the provider id) is written while the next step — the start — runs,
    // not before it: the id is in status by the end of the pass, and a crash in between is an
    // adoption by the owner-uid label, never a second create.
    let mut unrecorded = false;
    for step in &plan.steps {
        acted = true;
        let outcome = if std::mem::take(&mut unrecorded) {
            let record = next.clone();
            let (recorded, outcome) = tokio::join!(
                save(ctx, &api, &sandbox, Some(&current), &record),
                act(&on, &desired, env.as_ref(), *step, &mut target, &mut next)
            );
            recorded.map_err(Error::from).and(outcome)
        } else {
            act(&on, &desired, env.as_ref(), *step, &mut target, &mut next).await
        };
        unrecorded = *step == Step::Create && outcome.is_ok();
        if let Err(e) = outcome {
            if let Some(p) = pulling::in_progress(&e) {
                return pulling::report(ctx, &api, &sandbox, &current, next, p).await;
            }
            warning(
                ctx,
                sandbox.as_ref(),
                e.category(),
                format!("{step:?} failed: {e}"),
            )
            .await;
            return provider_failure(&report, &current, next, e, true).await;
        }
    }

    if unrecorded {
        save(ctx, &api, &sandbox, Some(&current), &next).await?;
    }

    // Observe again after acting, for ports and times the provider assigned; the egress
    // verdict of the sandbox acted on is asked at the same time.
    let mut verdict = None;
    let observed = if acted {
        let (observed, of_target) = observe_with_verdict(&handle, target.as_deref(), &uid).await;
        verdict = of_target;
        match observed {
            Ok(o) => o,
            Err(e) => {
                return provider_failure(&report, &current, next, e, false).await;
            }
        }
    } else {
        observed
    };
    let Some(descriptor) = observed else {
        return finish(
            &report,
            &current,
            next,
            Health::progressing("Creating", "waiting for the provider to report the sandbox"),
            Some(WAIT),
        )
        .await;
    };
    record(&mut next, &descriptor, &sandbox);
    match verdict {
        Some((id, egress)) if id == descriptor.id => next.egress = egress,
        _ if acted || next.egress.is_none() => next.egress = egress(&handle, &descriptor.id).await,
        _ => {}
    }

    let (health, requeue) = health_of(&desired, &descriptor);
    next.phase = Some(phase(descriptor.state).into());
    let requeue = match (requeue, &deadline) {
        (Some(r), _) => Some(r),
        (None, Deadline::At(at)) => Some(until(*at).min(crate::jitter::by_key(ctx.resync, &uid))),
        _ => None,
    };
    finish(&report, &current, next, health, requeue).await
}

/// What every exit of the pipeline needs to report: where to write status and Events, and
/// which generation the outcome belongs to.
#[derive(Clone, Copy)]
struct Report<'a> {
    ctx: &'a Context,
    api: &'a Api<Sandbox>,
    sandbox: &'a Sandbox,
    generation: Option<i64>,
}

/// Describes the sandbox by the provider id recorded in status, falling back to its
/// owner-uid label: the id is unknown after a crash between the provider's create and the
/// status write (adoption), and a sandbox that was recreated has a new one.
pub async fn observe(
    handle: &ProviderHandle,
    known_id: Option<&str>,
    uid: &str,
) -> Result<Option<SandboxDescriptor>, ProviderError> {
    if let Some(id) = known_id
        && let Some(d) = handle
            .call("describe", handle.provider.describe(id))
            .await?
    {
        return Ok(Some(d));
    }
    let query = SandboxQuery {
        labels: [(OWNER_UID.to_string(), uid.to_string())].into(),
        ..SandboxQuery::default()
    };
    let mut found = handle.call("find", handle.provider.find(&query)).await?;
    found.sort_by_key(|d| d.created_at);
    // `find` may answer with summaries (one list call): describe the one adopted for the
    // whole picture (ports, resources, the exact start time).
    let Some(first) = found.into_iter().next() else {
        return Ok(None);
    };
    handle
        .call("describe", handle.provider.describe(&first.id))
        .await
}

/// [`observe`], with the egress verdict of `target` asked at the same time (the verdict of
/// the id it was asked for: the caller uses it only if the observed sandbox is that one).
async fn observe_with_verdict(
    handle: &ProviderHandle,
    target: Option<&str>,
    uid: &str,
) -> (
    Result<Option<SandboxDescriptor>, ProviderError>,
    Option<(String, Option<EgressStatus>)>,
) {
    match target {
        Some(id) => tokio::join!(observe(handle, Some(id), uid), async {
            Some((id.to_string(), egress(handle, id).await))
        }),
        None => (observe(handle, None, uid).await, None),
    }
}

/// What a step acts through: the object (for Events) and its provider.
struct Target<'a> {
    ctx: &'a Context,
    sandbox: &'a Sandbox,
    handle: &'a ProviderHandle,
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
) -> Result<(), Error> {
    let Target {
        ctx,
        sandbox,
        handle,
        ..
    } = *on;
    let p = &handle.provider;
    ctx.echoes.expect(&sandbox.uid().unwrap_or_default(), step);
    if step == Step::Create {
        let id = create(on, desired, next).await?;
        *target = Some(id);
        return Ok(());
    }
    let id = target.clone().ok_or_else(|| {
        Error::Provider(ProviderError::transient(format!(
            "no provider id known for sandbox {} before {step:?}; observing again",
            desired.request.name
        )))
    })?;
    let id = id.as_str();
    match step {
        Step::Create => {}
        Step::Destroy => {
            handle.call("destroy", p.destroy(id)).await?;
            *target = None;
            normal(
                ctx,
                sandbox,
                "Destroyed",
                format!("destroyed sandbox {id} before recreating it"),
            )
            .await;
            next.self_delivered_env_hash = None;
            next.template_restored_into = None;
            next.egress_applied = None;
        }
        Step::Restore => {
            super::restore::restore(on.ctx, sandbox, handle, desired, id, next).await?
        }
        Step::DeliverEnv => {
            let Some(env) = env else { return Ok(()) };
            let files = p.files().ok_or_else(|| {
                Error::Provider(ProviderError::unsupported(format!(
                    "provider {} has no file API to deliver spec.selfDeliveredEnv; remove it or use another provider",
                    handle.name()
                )))
            })?;
            handle
                .call(
                    "write_file",
                    files.write_file(id, SELF_DELIVERED_ENV_PATH, env.content.as_bytes(), 0o600),
                )
                .await?;
            next.self_delivered_env_hash = Some(env.version.clone());
            normal(
                ctx,
                sandbox,
                "EnvDelivered",
                format!("delivered spec.selfDeliveredEnv into {SELF_DELIVERED_ENV_PATH}"),
            )
            .await;
        }
        Step::Start => {
            handle.call("start", p.start(id)).await?;
            normal_detached(ctx, sandbox, "Started", format!("started sandbox {id}"));
        }
        Step::Stop => {
            handle.call("stop", p.stop(id)).await?;
            normal(ctx, sandbox, "Stopped", format!("stopped sandbox {id}")).await;
        }
        Step::Hibernate | Step::Resume => {
            let outcome = match p.hibernation() {
                Some(h) if step == Step::Hibernate => {
                    handle.call("hibernate", h.hibernate(id)).await?
                }
                Some(h) => handle.call("resume", h.resume(id)).await?,
                None if step == Step::Hibernate => {
                    handle.call("sleep", p.sleep(id)).await?;
                    HibernationOutcome {
                        processes_preserved: false,
                        mechanism: "sleep".into(),
                        detail: Some(
                            "provider cannot report process survival; assume processes are gone"
                                .into(),
                        ),
                    }
                }
                None => {
                    handle.call("wake", p.wake(id)).await?;
                    HibernationOutcome {
                        processes_preserved: false,
                        mechanism: "wake".into(),
                        detail: Some(
                            "provider cannot report process survival; assume processes are gone"
                                .into(),
                        ),
                    }
                }
            };
            let verb = if step == Step::Hibernate {
                "Hibernated"
            } else {
                "Resumed"
            };
            normal(
                ctx,
                sandbox,
                verb,
                format!(
                    "{verb} sandbox {id} by {}: processes {}",
                    outcome.mechanism,
                    if outcome.processes_preserved {
                        "preserved"
                    } else {
                        "NOT preserved"
                    }
                ),
            )
            .await;
            next.last_hibernation = Some(HibernationStatus {
                processes_preserved: outcome.processes_preserved,
                mechanism: outcome.mechanism,
                detail: outcome.detail,
                time: status::now(),
            });
        }
        Step::SetEgress => {
            let policy = p.egress_policy().ok_or_else(|| {
                Error::Provider(ProviderError::unsupported(format!(
                    "provider {} cannot replace spec.egress in place",
                    handle.name()
                )))
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
            normal(
                ctx,
                sandbox,
                "EgressPolicyApplied",
                format!("applied the egress allow-list of sandbox {id} in place: {what}"),
            )
            .await;
        }
        Step::SetResources => {
            let setter = p.resources().ok_or_else(|| {
                Error::Provider(ProviderError::unsupported(format!(
                    "provider {} cannot change resources in place; recreate the Sandbox to change spec.resources",
                    handle.name()
                )))
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
            normal(
                ctx,
                sandbox,
                "ResourcesUpdated",
                format!("updated resource ceilings of sandbox {id}{how}"),
            )
            .await;
        }
    }
    Ok(())
}

/// Creates the sandbox and puts the provider's id into `next`, for the caller to write while
/// the next step runs. Returns the provider's id.
async fn create(on: &Target<'_>, desired: &Desired, next: &mut SandboxStatus) -> Result<String> {
    let Target {
        ctx,
        sandbox,
        handle,
    } = *on;
    let name = &desired.request.name;
    match handle
        .call("create", handle.provider.create(&desired.request))
        .await
    {
        Ok(d) => {
            ctx.failpoint("after-create");
            if let Some(pull) = &d.image_pull {
                pulling::pulled(ctx, sandbox, pull, d.image_digest.as_deref()).await;
            }
            normal_detached(
                ctx,
                sandbox,
                "Created",
                format!(
                    "created sandbox {name} (id {}) on provider {}",
                    d.id,
                    handle.name()
                ),
            );
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
        // Someone (a previous incarnation of us) created it between our observe and this
        // create: adopt on the next pass instead of creating a second one.
        Err(e) if e.is(ErrorKind::Conflict) => {
            Err(Error::Provider(ProviderError::transient(format!(
                "sandbox {name} appeared during create ({}); adopting it on retry",
                e.message()
            ))))
        }
        Err(e) => Err(e.into()),
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
    let want = AppliedEgress::of(desired.request.allowed_domains.as_deref());
    if current.egress_applied.as_ref() == Some(&want) {
        EgressConvergence::Applied
    } else {
        EgressConvergence::Differs
    }
}

/// Copies what the provider reports into status.
fn record(next: &mut SandboxStatus, d: &SandboxDescriptor, sandbox: &Sandbox) {
    next.sandbox_id = Some(d.id.clone());
    next.created_at = d.created_at.map(crate::api::rfc3339);
    next.started_at = d.started_at.time().map(crate::api::rfc3339);
    next.template_ref = d.template_ref.clone();
    next.image_digest = d.image_digest.clone();
    next.isolation = d.isolation.clone();
    let names = sandbox.spec.ports.iter().flatten();
    next.ports = d
        .ports
        .iter()
        .map(|m| PortStatus {
            name: names
                .clone()
                .find(|p| p.port == i32::from(m.sandbox_port))
                .and_then(|p| p.name.clone()),
            sandbox_port: i32::from(m.sandbox_port),
            protocol: m.protocol.clone(),
            host: m.host.clone(),
            host_port: i32::from(m.port),
        })
        .collect();
    next.ports
        .sort_by_key(|p| (p.sandbox_port, p.protocol.clone()));
    next.url = next
        .ports
        .iter()
        .find(|p| p.protocol == "tcp")
        .map(|p| format!("http://{}:{}", p.host, p.host_port));
    let r = &d.resources;
    next.resources = Some(AppliedResourcesStatus {
        cpu: r.cpu_millis.map(|m| format!("{m}m")),
        memory: r.memory_bytes.map(|b| b.to_string()),
        disk: r.disk_bytes.map(|b| b.to_string()),
        disk_enforced: r.disk_enforced,
        pids: r.pids,
    });
}

async fn egress(handle: &ProviderHandle, id: &str) -> Option<EgressStatus> {
    let cap = handle.provider.egress()?;
    let verdict = match handle.call("egress_verdict", cap.egress_verdict(id)).await {
        Ok(v) => v,
        Err(e) => {
            return Some(EgressStatus {
                state: "inconclusive".into(),
                detail: format!("egress check failed: {e}"),
                remediation: None,
            });
        }
    };
    Some(EgressStatus {
        state: match verdict.state {
            EgressState::Filtered => "filtered",
            EgressState::Open => "open",
            EgressState::Inconclusive => "inconclusive",
        }
        .into(),
        detail: verdict.detail,
        remediation: verdict.remediation,
    })
}

/// Ready when the observed power state is the desired one.
fn health_of(desired: &Desired, d: &SandboxDescriptor) -> (Health, Option<Duration>) {
    let matches = matches!(
        (&desired.state, d.state),
        (DesiredState::Running, SandboxState::Running)
            | (DesiredState::Sleeping, SandboxState::Sleeping)
            | (DesiredState::Stopped, SandboxState::Stopped)
    );
    if matches {
        let (reason, msg) = match desired.state {
            DesiredState::Running => ("Running", "the sandbox is running"),
            DesiredState::Sleeping => ("Sleeping", "the sandbox is hibernated"),
            DesiredState::Stopped => ("Stopped", "the sandbox is stopped"),
        };
        (Health::ready(reason, msg), None)
    } else {
        (
            Health::progressing(
                "Converging",
                format!("sandbox is {:?}, want {:?}", d.state, desired.state),
            ),
            Some(WAIT),
        )
    }
}

fn phase(state: SandboxState) -> &'static str {
    match state {
        SandboxState::Creating => "Creating",
        SandboxState::Running => "Running",
        SandboxState::Sleeping => "Sleeping",
        SandboxState::Stopped => "Stopped",
    }
}

async fn blocked_outcome(
    r: &Report<'_>,
    current: &SandboxStatus,
    next: SandboxStatus,
    blocked: Blocked,
) -> Result<Action> {
    match blocked {
        Blocked::Stall(reason, msg) => {
            finish(r, current, next, Health::stalled(reason, msg), None).await
        }
        Blocked::Wait(reason, msg) => {
            // A template or volume wakes the Sandbox through its watch (the resync is the
            // net); anything else is looked at again shortly.
            let again = if resolve::watched(reason) {
                crate::jitter::by_key(r.ctx.resync, &r.sandbox.uid().unwrap_or_default())
            } else {
                WAIT
            };
            finish(
                r,
                current,
                next,
                Health::progressing(reason, msg),
                Some(again),
            )
            .await
        }
        Blocked::Failed(Error::Provider(e)) => provider_failure(r, current, next, e, false).await,
        Blocked::Failed(e) => Err(e),
    }
}

/// A provider error: retryable ones report `Ready=False` and back off; the rest stall.
/// Nothing is ever deleted because a provider failed.
async fn provider_failure(
    r: &Report<'_>,
    current: &SandboxStatus,
    mut next: SandboxStatus,
    err: impl Into<Error>,
    announced: bool,
) -> Result<Action> {
    let Report {
        ctx, api, sandbox, ..
    } = *r;
    let err = err.into();
    let retryable =
        matches!(&err, Error::Provider(p) if p.is_retryable()) || matches!(err, Error::Kube(_));
    if retryable {
        // Keep the previous observedGeneration: this generation is not done.
        next.observed_generation = current.observed_generation;
        let mut conditions = next.conditions.clone();
        Health::progressing(err.category(), err.to_string()).apply(
            &mut conditions,
            current.observed_generation,
            &status::now(),
        );
        next.conditions = conditions;
        let _ = save(ctx, api, sandbox, Some(current), &next).await;
        if !announced {
            warning(ctx, sandbox, err.category(), err.to_string()).await;
        }
        return Err(err);
    }
    // Refused credentials stall every object on the provider with one condition and one
    // Event each; they are looked at again only at the backoff ceiling, so a revoked token
    // never turns into a hot retry loop against the provider.
    let unauthorized = matches!(&err, Error::Provider(p) if p.is(ErrorKind::Unauthorized));
    finish(
        r,
        current,
        next,
        Health::stalled(err.category(), err.to_string()),
        unauthorized.then_some(crate::controller::backoff::CAP),
    )
    .await
}

/// Writes status when it changed, and remembers the resourceVersion written until the watch
/// cache shows it (see [`crate::controller::freshness`]).
pub async fn save(
    ctx: &Context,
    api: &Api<Sandbox>,
    sandbox: &Sandbox,
    current: Option<&SandboxStatus>,
    next: &SandboxStatus,
) -> kube::Result<()> {
    if let Some(written) = status::write_returning(api, &sandbox.name_any(), current, next).await? {
        ctx.written.wrote(
            &written.uid().unwrap_or_default(),
            written.resource_version(),
        );
    }
    Ok(())
}

/// Writes conditions + observedGeneration and decides when to look again.
async fn finish(
    r: &Report<'_>,
    current: &SandboxStatus,
    mut next: SandboxStatus,
    health: Health,
    requeue: Option<Duration>,
) -> Result<Action> {
    let Report {
        ctx,
        api,
        sandbox,
        generation,
    } = *r;
    let stalled = matches!(health, Health::Stalled { .. });
    let mut conditions = next.conditions.clone();
    health.apply(&mut conditions, generation, &status::now());
    next.conditions = conditions;
    next.observed_generation = generation;
    if stalled && next.phase.is_none() {
        next.phase = Some("Stalled".into());
    }
    let previous_reason =
        crate::api::condition(&current.conditions, status::READY).map(|c| c.reason.clone());
    if stalled && previous_reason.as_deref() != Some(health.reason()) {
        warning(ctx, sandbox, health.reason(), health.message().to_string()).await;
    }
    save(ctx, api, sandbox, Some(current), &next).await?;
    let uid = sandbox.uid().unwrap_or_default();
    Ok(match (stalled, requeue) {
        (_, Some(d)) => Action::requeue(d),
        // Stalled waits for a spec change (a watch event), with the slow resync as a net.
        _ => Action::requeue(crate::jitter::by_key(ctx.resync, &uid)),
    })
}

fn until(at: DateTime<Utc>) -> Duration {
    (at - Utc::now())
        .to_std()
        .unwrap_or(Duration::from_secs(1))
        .max(Duration::from_secs(1))
}
