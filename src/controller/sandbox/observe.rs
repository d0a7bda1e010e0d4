//! Observe: what the provider holds for a Sandbox, and the report stage that turns the last
//! observation into status and the pass's outcome.

use std::time::Duration;

use chrono::{DateTime, Utc};
use kube::ResourceExt;

use crate::api::{
    AppliedResourcesStatus, DesiredState, EgressStatus, PortStatus, Sandbox, SandboxStatus,
};
use crate::controller::outcome::Outcome;
use crate::provider::labels::{Claim, OWNER_UID, ensure_owned_or_claimed};
use crate::provider::{EgressState, ProviderError, SandboxDescriptor, SandboxQuery, SandboxState};
use crate::registry::ProviderHandle;

use super::act::{Acted, Target};
use super::apply::{Pass, WAIT};
use super::build::Desired;
use super::lifetime::Deadline;

/// Describes the sandbox by the provider id recorded in status, falling back to its
/// owner-uid label: the id is unknown after a crash between the provider's create and the
/// status write (adoption), and a sandbox that was recreated has a new one. A recorded id
/// naming a sandbox this object does not own is an `OwnershipMismatch` error: status is
/// never authority, so nothing is done to it. `claim`: the warm pool member the pool's
/// ledger gives this object, which it owns without its owner-uid label.
pub async fn observe(
    handle: &ProviderHandle,
    known_id: Option<&str>,
    uid: &str,
    claim: Option<&Claim>,
) -> Result<Option<SandboxDescriptor>, ProviderError> {
    if let Some(id) = known_id
        && let Some(d) = handle
            .call("describe", handle.provider.describe(id))
            .await?
    {
        ensure_owned_or_claimed("status.sandboxId", id, &d.labels, uid, claim)?;
        return Ok(Some(d));
    }
    let mut found = handle
        .call("find", handle.provider.find(&owned_by(uid)))
        .await?;
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

/// The query for the sandboxes a Sandbox owns: its owner-uid label.
pub fn owned_by(uid: &str) -> SandboxQuery {
    SandboxQuery {
        labels: [(OWNER_UID.to_string(), uid.to_string())].into(),
        ..SandboxQuery::default()
    }
}

/// The report stage: observes again after acting (for ports and times the provider
/// assigned, with the egress verdict of the sandbox acted on asked at the same time),
/// records what the provider reports, and says whether the sandbox is where the spec wants
/// it.
pub async fn report(
    on: &Target<'_>,
    desired: &Desired,
    acted: Acted,
    asked: Option<(String, Option<EgressStatus>)>,
    deadline: &Deadline,
    pass: &mut Pass,
) -> Result<Outcome, Outcome> {
    let (handle, sandbox) = (on.handle, on.r.object);
    let uid = sandbox.uid().unwrap_or_default();
    let (observed, verdict, acted) = match acted {
        Acted::Nothing(observed) => (observed.map(|d| *d), asked, false),
        Acted::Steps { target } => {
            let (observed, verdict) =
                observe_with_verdict(handle, target.as_deref(), &uid, on.claim).await;
            (observed?, verdict, true)
        }
    };
    let Some(descriptor) = observed else {
        let msg = "waiting for the provider to report the sandbox";
        return Ok(Outcome::waiting("Creating", msg, Some(WAIT)));
    };
    let next = &mut pass.next;
    record(next, &descriptor, sandbox);
    match verdict {
        Some((id, egress)) if id == descriptor.id => next.egress = egress,
        _ if acted || next.egress.is_none() => next.egress = egress(handle, &descriptor.id).await,
        _ => {}
    }
    let state = power_state(desired, &descriptor, next);
    next.phase = Some(phase(state).into());
    let recheck = match deadline {
        Deadline::At(at) => Some(until(*at).min(crate::jitter::by_key(on.r.ctx.resync, &uid))),
        _ => None,
    };
    Ok(health_of(desired, state, recheck))
}

/// The sandbox's power state as the operator reports it: what the provider reports, except
/// that a sandbox our own sleep stopped (a provider whose sleep is a stop: a Pod) is asleep
/// — `status.lastHibernation` says its processes were not kept.
fn power_state(desired: &Desired, d: &SandboxDescriptor, next: &SandboxStatus) -> SandboxState {
    let asleep = super::decide::slept_since_start(
        next.last_hibernation.as_ref(),
        next.started_at.as_deref(),
    );
    match (desired.state, d.state) {
        (DesiredState::Sleeping, SandboxState::Stopped) if asleep => SandboxState::Sleeping,
        (_, state) => state,
    }
}

/// The egress verdict of sandbox `id`, when there is one to ask for: asked beside steps
/// that leave the sandbox as observed, and handed to [`report`], which uses it only for
/// that very sandbox.
pub async fn verdict_of(
    handle: &ProviderHandle,
    id: Option<String>,
) -> Option<(String, Option<EgressStatus>)> {
    let id = id?;
    let verdict = egress(handle, &id).await;
    Some((id, verdict))
}

/// [`observe`], with the egress verdict of `target` asked at the same time (the verdict of
/// the id it was asked for: the caller uses it only if the observed sandbox is that one).
async fn observe_with_verdict(
    handle: &ProviderHandle,
    target: Option<&str>,
    uid: &str,
    claim: Option<&Claim>,
) -> (
    Result<Option<SandboxDescriptor>, ProviderError>,
    Option<(String, Option<EgressStatus>)>,
) {
    match target {
        Some(id) => tokio::join!(observe(handle, Some(id), uid, claim), async {
            Some((id.to_string(), egress(handle, id).await))
        }),
        None => (observe(handle, None, uid, claim).await, None),
    }
}

/// Copies what the provider reports into status.
pub fn record(next: &mut SandboxStatus, d: &SandboxDescriptor, sandbox: &Sandbox) {
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

/// The provider's egress verdict on sandbox `id`; a failed check is `inconclusive`.
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

/// Ready when the observed power state is the desired one (looked at again at `recheck`, a
/// lifetime deadline); else converging, looked at again shortly.
fn health_of(desired: &Desired, state: SandboxState, recheck: Option<Duration>) -> Outcome {
    let (reason, message) = match (&desired.state, state) {
        (DesiredState::Running, SandboxState::Running) => ("Running", "the sandbox is running"),
        (DesiredState::Sleeping, SandboxState::Sleeping) => {
            ("Sleeping", "the sandbox is hibernated")
        }
        (DesiredState::Stopped, SandboxState::Stopped) => ("Stopped", "the sandbox is stopped"),
        (want, is) => {
            let msg = format!("sandbox is {is:?}, want {want:?}");
            return Outcome::waiting("Converging", msg, Some(WAIT));
        }
    };
    Outcome::Ready {
        reason: reason.into(),
        message: message.into(),
        recheck,
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

fn until(at: DateTime<Utc>) -> Duration {
    (at - Utc::now())
        .to_std()
        .unwrap_or(Duration::from_secs(1))
        .max(Duration::from_secs(1))
}
