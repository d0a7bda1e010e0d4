//! Waiting for a sandbox to run. E2B's create (and the connect that resumes a paused
//! sandbox) answers once the sandbox runs, and the SDKs use envd right after it; the
//! operator makes a Sandbox run asynchronously, so these answers watch the Sandbox until
//! its `Ready` condition, computed from the generation just written, is true.

use std::time::Duration;

use kube::api::Api;
use kube::runtime::wait::await_condition;

use super::error::ApiError;
use crate::api::Sandbox;
use crate::api::common::{CONDITION_READY, CONDITION_STALLED, Condition, condition};

/// How long an answer waits for the sandbox to run.
pub const WAIT: Duration = Duration::from_secs(120);

/// Where a Sandbox stands for a caller waiting for generation `generation` to run.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Waiting,
    Running,
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
        return Verdict::Running;
    }
    if current(CONDITION_STALLED).is_some_and(Condition::is_true) {
        let ready = current(CONDITION_READY).or_else(|| current(CONDITION_STALLED));
        let why = ready.map(|c| format!("{}: {}", c.reason, c.message));
        return Verdict::Stalled(why.unwrap_or_default());
    }
    Verdict::Waiting
}

/// Waits (at most [`WAIT`]) until `sandbox`, as written at its current generation, runs.
/// A Stalled sandbox answers at once with its `Ready` message (400: its spec is what stops
/// it); one that does not run in time, or is deleted meanwhile, is a 500 naming the
/// Sandbox and how to look at it.
pub async fn running(api: &Api<Sandbox>, sandbox: &Sandbox, sid: &str) -> Result<(), ApiError> {
    let name = sandbox.metadata.name.clone().unwrap_or_default();
    let ns = sandbox.metadata.namespace.clone().unwrap_or_default();
    let generation = sandbox.metadata.generation.unwrap_or(0);
    let describe = format!("see `kubectl describe sandbox {name} -n {ns}`");
    let settled = move |s: Option<&Sandbox>| verdict(s, generation) != Verdict::Waiting;
    let seen = tokio::time::timeout(WAIT, await_condition(api.clone(), &name, settled)).await;
    let last = match seen {
        Err(_) => {
            return Err(ApiError::internal(format!(
                "sandbox {sid:?} (Sandbox {name} in namespace {ns}) did not become Ready \
                 within {}s; {describe}",
                WAIT.as_secs()
            )));
        }
        Ok(Err(e)) => {
            return Err(ApiError::internal(format!(
                "watching Sandbox {name} in namespace {ns} until it runs: {e}; {describe}"
            )));
        }
        Ok(Ok(last)) => last,
    };
    match verdict(last.as_ref(), generation) {
        Verdict::Running => Ok(()),
        Verdict::Stalled(why) => Err(ApiError::bad_request(format!(
            "sandbox {sid:?} (Sandbox {name} in namespace {ns}) cannot run: {why}; {describe}"
        ))),
        Verdict::Gone | Verdict::Waiting => Err(ApiError::internal(format!(
            "sandbox {sid:?} (Sandbox {name} in namespace {ns}) was deleted before it ran"
        ))),
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
        assert_eq!(verdict(Some(&stale), 1), Verdict::Running);
        let unmarked = with(&[("Ready", "True", None)]);
        assert_eq!(verdict(Some(&unmarked), 3), Verdict::Running);
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
