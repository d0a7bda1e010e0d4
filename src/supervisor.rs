//! Supervision of the operator's long-running tasks.
//!
//! Every task that must run for the process to be useful (a controller, the sweeper, the HTTP
//! server) goes into a [`TaskSet`]. The operator waits on [`TaskSet::first_exit`] next to its
//! shutdown signal and its leadership: a task that ends or panics on its own is a failure
//! that the process cannot repair (nothing would reconcile any more while the Lease stays
//! held and the probes stay green), so `run` fails `/healthz`, stops the rest within a
//! deadline, releases the Lease and exits non-zero, and the other replica takes over.
//!
//! Stopping is bounded: [`TaskSet::stop_within`] waits for the tasks to finish after they
//! were asked to, and aborts whatever is still running at the deadline (as
//! controller-runtime's `GracefulShutdownTimeout` does), so a stuck graceful shutdown can
//! never keep the process alive. A [`Trigger`] is the stop signal handed to the tasks.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::{Id, JoinError, JoinSet};

/// A stop signal with any number of listeners: fired once, observed by every
/// [`fired`](Self::fired) future, including those created after it fired.
#[derive(Clone, Debug)]
pub struct Trigger(watch::Sender<bool>);

impl Default for Trigger {
    fn default() -> Self {
        Trigger::new()
    }
}

impl Trigger {
    /// Not fired.
    pub fn new() -> Self {
        Trigger(watch::channel(false).0)
    }

    /// Fire it (idempotent).
    pub fn fire(&self) {
        self.0.send_replace(true);
    }

    /// Resolves once fired (or once every clone of the trigger is dropped, which can no
    /// longer tell anyone to keep going).
    pub fn fired(&self) -> impl Future<Output = ()> + Send + Sync + 'static {
        let mut rx = self.0.subscribe();
        async move {
            let _ = rx.wait_for(|fired| *fired).await;
        }
    }
}

/// How a supervised task ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// It returned.
    Returned,
    /// It panicked, with this message.
    Panicked(String),
    /// It was aborted (only by [`TaskSet::stop_within`] or a runtime shutdown).
    Aborted,
}

/// A task that ended, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskExit {
    /// The name it was spawned under.
    pub task: &'static str,
    /// How it ended.
    pub ending: Ending,
}

impl fmt::Display for TaskExit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.ending {
            Ending::Returned => write!(f, "the {} stopped unexpectedly", self.task),
            Ending::Panicked(msg) => write!(f, "the {} panicked: {msg}", self.task),
            Ending::Aborted => write!(f, "the {} was aborted", self.task),
        }
    }
}

/// A set of named tasks, each spawned on the runtime.
#[derive(Default)]
pub struct TaskSet {
    set: JoinSet<()>,
    names: HashMap<Id, &'static str>,
}

impl TaskSet {
    /// An empty set.
    pub fn new() -> Self {
        TaskSet::default()
    }

    /// Spawn `task` under `name` (used in logs and in the `/healthz` reason).
    pub fn spawn(&mut self, name: &'static str, task: impl Future<Output = ()> + Send + 'static) {
        let handle = self.set.spawn(task);
        self.names.insert(handle.id(), name);
    }

    /// Number of tasks still running.
    pub fn len(&self) -> usize {
        self.set.len()
    }

    /// Whether no task is running.
    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }

    /// Waits for the first task to end and says which and how. Never resolves while the set
    /// is empty, so it can sit in a `select!` next to other events. Cancel-safe.
    pub async fn first_exit(&mut self) -> TaskExit {
        match self.set.join_next_with_id().await {
            Some(joined) => self.exit_of(joined),
            None => std::future::pending().await,
        }
    }

    /// Waits up to `deadline` for every task to end (the caller has asked them to stop), then
    /// aborts the ones still running. Returns how each ended, in the order they did; tasks
    /// aborted at the deadline come last, as [`Ending::Aborted`].
    pub async fn stop_within(&mut self, deadline: Duration) -> Vec<TaskExit> {
        let mut exits = Vec::with_capacity(self.set.len());
        let drained = tokio::time::timeout(deadline, async {
            while let Some(joined) = self.set.join_next_with_id().await {
                let exit = self.exit_of(joined);
                exits.push(exit);
            }
        })
        .await;
        if drained.is_err() {
            self.set.abort_all();
            while let Some(joined) = self.set.join_next_with_id().await {
                let exit = self.exit_of(joined);
                exits.push(exit);
            }
        }
        exits
    }

    fn exit_of(&mut self, joined: Result<(Id, ()), JoinError>) -> TaskExit {
        let (id, ending) = match joined {
            Ok((id, ())) => (id, Ending::Returned),
            Err(e) if e.is_panic() => {
                let id = e.id();
                (id, Ending::Panicked(panic_message(e)))
            }
            Err(e) => (e.id(), Ending::Aborted),
        };
        TaskExit {
            task: self.names.remove(&id).unwrap_or("unnamed task"),
            ending,
        }
    }
}

/// The text a panic carried (`panic!("...")` payloads are `&str` or `String`).
fn panic_message(err: JoinError) -> String {
    match err.try_into_panic() {
        Ok(payload) => payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".into()),
        Err(_) => "a panic without a message".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::oneshot;

    #[tokio::test]
    async fn first_exit_names_a_task_that_returns() {
        let mut tasks = TaskSet::new();
        let (_keep, forever) = oneshot::channel::<()>();
        tasks.spawn("volume controller", async {
            let _ = forever.await;
        });
        tasks.spawn("sandbox controller", async {});
        let exit = tasks.first_exit().await;
        assert_eq!(
            exit,
            TaskExit {
                task: "sandbox controller",
                ending: Ending::Returned
            }
        );
        assert_eq!(
            exit.to_string(),
            "the sandbox controller stopped unexpectedly"
        );
        assert_eq!(tasks.len(), 1);
    }

    #[tokio::test]
    async fn first_exit_reports_a_panic_with_its_message() {
        let mut tasks = TaskSet::new();
        tasks.spawn("sweeper", async { panic!("boom {}", 42) });
        let exit = tasks.first_exit().await;
        assert_eq!(exit.ending, Ending::Panicked("boom 42".into()));
        assert_eq!(exit.to_string(), "the sweeper panicked: boom 42");
        let mut tasks = TaskSet::new();
        tasks.spawn("server", async { panic!("static") });
        assert_eq!(
            tasks.first_exit().await.ending,
            Ending::Panicked("static".into())
        );
    }

    #[tokio::test]
    async fn first_exit_of_an_empty_set_never_resolves() {
        let mut tasks = TaskSet::new();
        assert!(tasks.is_empty());
        let waited = tokio::time::timeout(Duration::from_millis(50), tasks.first_exit()).await;
        assert!(waited.is_err());
    }

    #[tokio::test]
    async fn stop_within_waits_for_cooperative_tasks_and_aborts_stuck_ones() {
        let mut tasks = TaskSet::new();
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let mut rx = stop_rx.clone();
        tasks.spawn("cooperative", async move {
            let _ = rx.wait_for(|s| *s).await;
        });
        tasks.spawn("stuck", std::future::pending());
        let _ = stop_tx.send(true);
        let deadline = Duration::from_millis(300);
        let started = tokio::time::Instant::now();
        let exits = tokio::time::timeout(Duration::from_secs(30), tasks.stop_within(deadline))
            .await
            .expect("stop_within is bounded");
        assert_eq!(
            exits,
            vec![
                TaskExit {
                    task: "cooperative",
                    ending: Ending::Returned
                },
                TaskExit {
                    task: "stuck",
                    ending: Ending::Aborted
                },
            ]
        );
        assert!(
            started.elapsed() >= deadline,
            "the stuck task had until the deadline"
        );
        assert!(tasks.is_empty());
    }

    #[tokio::test]
    async fn trigger_reaches_earlier_and_later_listeners() {
        let trigger = Trigger::new();
        let early = tokio::spawn(trigger.fired());
        let pending = tokio::time::timeout(Duration::from_millis(20), trigger.fired()).await;
        assert!(pending.is_err(), "not fired yet");
        trigger.fire();
        trigger.fire();
        tokio::time::timeout(Duration::from_secs(5), early)
            .await
            .expect("an earlier listener sees it")
            .unwrap();
        tokio::time::timeout(Duration::from_secs(5), trigger.fired())
            .await
            .expect("a later listener sees it");
    }

    #[tokio::test]
    async fn stop_within_returns_once_all_have_stopped() {
        let mut tasks = TaskSet::new();
        tasks.spawn("quick", async {});
        tasks.spawn("panicky", async { panic!("late") });
        // A deadline no test run waits out: returning at all proves it did not wait for it.
        let exits = tokio::time::timeout(
            Duration::from_secs(60),
            tasks.stop_within(Duration::from_secs(3600)),
        )
        .await
        .expect("returned before the deadline");
        assert_eq!(exits.len(), 2);
        assert!(
            exits
                .iter()
                .any(|e| e.ending == Ending::Panicked("late".into()))
        );
    }
}
