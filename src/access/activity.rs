//! Traffic through the operator, recorded for idleness (see [`crate::idle`]): a request to
//! a Sandbox with an idle policy records itself on the object (at most once per quarter of
//! the timeout), and a request that needs the sandbox running wakes one that idleness
//! parked, then waits for it to run again — so the request is served, not refused.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::wait::await_condition;
use kube::{Client, ResourceExt};

use super::status::AccessError;
use crate::api::Sandbox;
use crate::api::common::{CONDITION_READY, condition};
use crate::idle::{self, OnRequest};

/// How long a request waits for a parked sandbox to run again.
pub const WAKE_WAIT: Duration = Duration::from_secs(90);
/// The field manager of the traffic record.
const FIELD_MANAGER: &str = "sandbox-operator-activity";

/// Records traffic to `sandbox` when its record is stale, without waiting for the write; it
/// never wakes a parked sandbox (reading about a sandbox is not using it).
pub fn record(client: &Client, sandbox: &Sandbox) {
    if idle::on_request(sandbox, Utc::now()) != OnRequest::Record {
        return;
    }
    let (api, name) = api_of(client, sandbox);
    tokio::spawn(async move {
        if let Err(e) = stamp(&api, &name).await {
            tracing::warn!(sandbox = %name, error = %e, "could not record traffic for idleness");
        }
    });
}

/// Keeps recording traffic while a session lasts — an exec, attach or port-forward open for
/// longer than the idle timeout is in use all along, not only when it began. Records once
/// per quarter of the timeout (as requests do) until dropped.
pub struct Heartbeat(tokio::task::JoinHandle<()>);

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A [`Heartbeat`] for a session to `sandbox`; `None` without an idle policy. Its first
/// beat is at once when the record is stale: a sandbox just woken for this session carries
/// the record of the wake, which its start may have used most of the timeout of.
pub fn heartbeat(client: &Client, sandbox: &Sandbox) -> Option<Arc<Heartbeat>> {
    let period = idle::policy(sandbox)?.timeout / 4;
    let stale = idle::on_request(sandbox, Utc::now()) != OnRequest::Nothing;
    let (api, name) = api_of(client, sandbox);
    let beats = tokio::spawn(async move {
        let now = tokio::time::Instant::now();
        let start = if stale { now } else { now + period };
        let mut every = tokio::time::interval_at(start, period);
        loop {
            every.tick().await;
            if let Err(e) = stamp(&api, &name).await {
                tracing::warn!(sandbox = %name, error = %e, "could not record an open session for idleness");
            }
        }
    });
    Some(Arc::new(Heartbeat(beats)))
}

/// Before a request that needs `sandbox` running: records traffic when stale, and wakes it
/// when idleness parked it (or is about to), returning the object as it runs again.
pub async fn before_use(client: &Client, sandbox: Sandbox) -> Result<Sandbox, AccessError> {
    match idle::on_request(&sandbox, Utc::now()) {
        OnRequest::Nothing => Ok(sandbox),
        OnRequest::Record => {
            record(client, &sandbox);
            Ok(sandbox)
        }
        OnRequest::Wake => wake(client, &sandbox).await,
    }
}

/// Records traffic, then waits until the controller has the sandbox running again.
async fn wake(client: &Client, sandbox: &Sandbox) -> Result<Sandbox, AccessError> {
    let (api, name) = api_of(client, sandbox);
    stamp(&api, &name)
        .await
        .map_err(|e| AccessError::Unavailable(format!("cannot wake idle sandbox {name}: {e}")))?;
    tracing::info!(sandbox = %name, "waking an idle sandbox for a request");
    let running = await_condition(api, &name, |s: Option<&Sandbox>| s.is_some_and(runs_again));
    match tokio::time::timeout(WAKE_WAIT, running).await {
        Ok(Ok(Some(s))) => Ok(s),
        Ok(Ok(None)) => Err(AccessError::NotFound(format!(
            "sandbox {name} was deleted while waking"
        ))),
        Ok(Err(e)) => Err(AccessError::Unavailable(format!(
            "waiting for idle sandbox {name} to wake: {e}"
        ))),
        Err(_) => Err(AccessError::Unavailable(format!(
            "idle sandbox {name} did not run again within {}s; see `kubectl describe sandbox {name}`",
            WAKE_WAIT.as_secs()
        ))),
    }
}

/// Running and Ready again, by a reconcile that saw the traffic record.
fn runs_again(s: &Sandbox) -> bool {
    let status = s.status.as_ref();
    let running = status.and_then(|st| st.phase.as_deref()) == Some("Running");
    let ready = status
        .and_then(|st| condition(&st.conditions, CONDITION_READY))
        .is_some_and(|c| c.is_true());
    running && ready && !matches!(idle::evaluate(s, Utc::now()), idle::Verdict::Idle(..))
}

fn api_of(client: &Client, sandbox: &Sandbox) -> (Api<Sandbox>, String) {
    let ns = sandbox.namespace().unwrap_or_default();
    (Api::namespaced(client.clone(), &ns), sandbox.name_any())
}

/// Writes the traffic record: now.
async fn stamp(api: &Api<Sandbox>, name: &str) -> Result<(), kube::Error> {
    let patch = serde_json::json!({
        "metadata": {"annotations": {idle::LAST_ACTIVITY: idle::stamp(Utc::now())}}
    });
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    api.patch(name, &params, &Patch::Merge(&patch))
        .await
        .map(drop)
}
