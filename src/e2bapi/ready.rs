//! Waiting for a sandbox to reach the state its spec asks for. E2B's create (and the connect
//! that resumes a paused sandbox) answers once the sandbox runs, and the SDKs use envd right
//! after it; its pause answers once the sandbox is paused. The operator converges a Sandbox
//! asynchronously, so these answers watch the Sandbox until its `Ready` condition (the
//! observed state is the desired one), computed from the generation just written, is true.

use std::time::Duration;

use kube::api::Api;
use kube::runtime::wait::await_condition;

use super::error::ApiError;
use crate::api::Sandbox;
use crate::api::common::{CONDITION_READY, CONDITION_STALLED, Condition, condition};

/// How long an answer waits for the sandbox to run: under the SDKs' default request
/// timeout (60 s), so that a sandbox that does not run gets this API's answer naming it
/// rather than a client-side read timeout.
pub const WAIT: Duration = Duration::from_secs(50);
/// Watch failures in a row (a watch expired by the API server, say) before giving up.
const WATCH_RETRIES: u32 = 5;

/// Where a Sandbox stands for a caller waiting for generation `generation` to run.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Waiting,
    /// In the state its spec asks for.
    Reached,
    /// `Stalled` (it cannot run without a change to its spec), with its `Ready` message.
    Stalled(String),
    Gone,
}

/// The verdict on `sandbox` (as last seen) for `generation`: only conditions computed from
/// that generation or a later one count, so a stale `Ready` of before a resume does not.
fn verdict(sandbox: Option<&Sandbox>, generation: i64) -> Verdict {
    let Some(sandbox) = sandbox else {
        return Verdict::Gone;
    };
    let conditions = sandbox
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let current = |type_: &str| -> Option<&Condition> {
        condition(conditions, type_)
            .filter(|c| c.observed_generation.is_none_or(|g| g >= generation))
    };
    if current(CONDITION_READY).is_some_and(Condition::is_true) {
        return Verdict::Reached;
    }
    if current(CONDITION_STALLED).is_some_and(Condition::is_true) {
        let ready = current(CONDITION_READY).or_else(|| current(CONDITION_STALLED));
        let why = ready.map(|c| format!("{}: {}", c.reason, c.message));
        return Verdict::Stalled(why.unwrap_or_default());
    }
    Verdict::Waiting
}

/// Waits (at most [`WAIT`]) until `sandbox`, as written at its current generation, is in
/// the state its spec asks for (running, or paused after a pause). A Stalled sandbox answers
/// at once with its `Ready` message (400: its spec is what stops it); one that does not get
/// there in time, cannot be watched, or is deleted meanwhile, is a 500 naming the Sandbox
/// and how to look at it.
pub async fn reached(api: &Api<Sandbox>, sandbox: &Sandbox, sid: &str) -> Result<(), ApiError> {
    let name = sandbox.metadata.name.clone().unwrap_or_default();
    let ns = sandbox.metadata.namespace.clone().unwrap_or_default();
    let generation = sandbox.metadata.generation.unwrap_or(0);
    let want = format!("{:?}", sandbox.spec.state.unwrap_or_default());
    let describe = format!("see `kubectl describe sandbox {name} -n {ns}`");
    let deadline = tokio::time::Instant::now() + WAIT;
    let last = settled(api, &name, generation, deadline)
        .await
        .map_err(|e| {
            ApiError::internal(format!(
                "sandbox {sid:?} (Sandbox {name} in namespace {ns}) {e}; {describe}"
            ))
        })?;
    match verdict(last.as_ref(), generation) {
        Verdict::Reached => Ok(()),
        Verdict::Stalled(why) => Err(ApiError::bad_request(format!(
            "sandbox {sid:?} (Sandbox {name} in namespace {ns}) cannot get to {want}: {why}; \
             {describe}"
        ))),
        Verdict::Gone | Verdict::Waiting => Err(ApiError::internal(format!(
            "sandbox {sid:?} (Sandbox {name} in namespace {ns}) was deleted before it got to \
             {want}"
        ))),
    }
}

/// The Sandbox once it is no longer [`Verdict::Waiting`] for `generation`, watched until
/// `deadline`. A watch that fails (the API server expires long watches) starts again from
/// a fresh read, up to [`WATCH_RETRIES`] times in a row.
async fn settled(
    api: &Api<Sandbox>,
    name: &str,
    generation: i64,
    deadline: tokio::time::Instant,
) -> Result<Option<Sandbox>, String> {
    let mut failures = 0;
    loop {
        let done = move |s: Option<&Sandbox>| verdict(s, generation) != Verdict::Waiting;
        let watch = await_condition(api.clone(), name, done);
        match tokio::time::timeout_at(deadline, watch).await {
            Err(_) => {
                return Err(format!("did not become Ready within {}s", WAIT.as_secs()));
            }
            Ok(Ok(last)) => return Ok(last),
            Ok(Err(e)) if failures + 1 >= WATCH_RETRIES => {
                return Err(format!("could not be watched until it is Ready: {e}"));
            }
            Ok(Err(e)) => {
                failures += 1;
                tracing::debug!(%name, error = %e, "E2B API: watching a Sandbox again");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::SandboxStatus;

    fn with(conditions: &[(&str, &str, Option<i64>)]) -> Sandbox {
        let mut s: Sandbox = serde_json::from_value(serde_json::json!({
            "apiVersion": "sandboxes.dev/v1alpha1", "kind": "Sandbox",
            "metadata": {"name": "s"}, "spec": {}
        }))
        .unwrap();
        let conditions = conditions
            .iter()
            .map(|(t, st, g)| Condition::new(*t, *st, "Why", "because").with_generation(*g))
            .collect();
        s.status = Some(SandboxStatus {
            conditions,
            ..SandboxStatus::default()
        });
        s
    }

    #[test]
    fn only_a_ready_of_the_awaited_generation_runs() {
        assert_eq!(verdict(None, 1), Verdict::Gone);
        assert_eq!(verdict(Some(&with(&[])), 1), Verdict::Waiting);
        let stale = with(&[("Ready", "True", Some(1))]);
        assert_eq!(verdict(Some(&stale), 2), Verdict::Waiting);
        assert_eq!(verdict(Some(&stale), 1), Verdict::Reached);
        let unmarked = with(&[("Ready", "True", None)]);
        assert_eq!(verdict(Some(&unmarked), 3), Verdict::Reached);
        let starting = with(&[("Ready", "False", Some(2))]);
        assert_eq!(verdict(Some(&starting), 2), Verdict::Waiting);
    }

    #[test]
    fn a_stalled_sandbox_answers_with_its_ready_message() {
        let stalled = with(&[("Ready", "False", Some(1)), ("Stalled", "True", Some(1))]);
        assert_eq!(
            verdict(Some(&stalled), 1),
            Verdict::Stalled("Why: because".into())
        );
        assert_eq!(verdict(Some(&stalled), 2), Verdict::Waiting, "an old stall");
    }
}
