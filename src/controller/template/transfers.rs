//! Publishes and fetches as background jobs, at most one per SandboxTemplate.
//!
//! They take as long as the bytes take (bounded by the transfer limits), not a provider-call
//! timeout, and a reconcile that finds one running waits for it instead of starting a second.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::decide::Step;
use crate::metrics::Metrics;
use crate::provider::{ProviderError, Template};
use crate::templates::transfer::Limits;

/// How often a reconcile looks again at a transfer in flight.
pub const TRANSFER_POLL: Duration = Duration::from_secs(2);

/// What a transfer job ends with.
pub type Outcome = Result<Option<Template>, ProviderError>;

/// The background transfers, by object UID.
#[derive(Default)]
pub struct Transfers {
    jobs: Mutex<HashMap<String, Job>>,
}

enum Job {
    Running,
    /// The step, what it was started for (the capture it publishes), and its result.
    Done(Step, String, Box<Outcome>),
}

/// Where a background transfer is.
pub enum Poll {
    /// Started now, or still running.
    Running,
    /// Finished with this result (handed out once).
    Done(Outcome),
}

impl Transfers {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Job>> {
        self.jobs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The result of `step` on `subject` for object `key` when its job has finished;
    /// otherwise starts the job `start` makes (unless one is running already) and says it
    /// runs. A finished job of another step or subject is stale and dropped.
    pub fn poll_or_start<F, Fut>(
        self: &Arc<Self>,
        key: &str,
        step: Step,
        subject: &str,
        start: F,
    ) -> Poll
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Outcome> + Send + 'static,
    {
        let mut jobs = self.lock();
        match jobs.remove(key) {
            Some(Job::Done(done, of, result)) if done == step && of == subject => {
                return Poll::Done(*result);
            }
            // The result of another step is stale now: start this one.
            Some(Job::Done(..)) | None => {}
            Some(Job::Running) => {
                jobs.insert(key.to_string(), Job::Running);
                return Poll::Running;
            }
        }
        jobs.insert(key.to_string(), Job::Running);
        drop(jobs);
        let (this, key, of, job) = (self.clone(), key.to_string(), subject.to_string(), start());
        tokio::spawn(async move {
            let result = job.await;
            this.lock()
                .insert(key, Job::Done(step, of, Box::new(result)));
        });
        Poll::Running
    }

    /// Takes the finished result of `step` for `key`, if there is one.
    pub fn take(&self, key: &str, step: Step) -> Option<Outcome> {
        let mut jobs = self.lock();
        match jobs.remove(key) {
            Some(Job::Done(done, _, result)) if done == step => Some(*result),
            Some(other) => {
                jobs.insert(key.to_string(), other);
                None
            }
            None => None,
        }
    }

    /// Puts a result taken with [`Transfers::take`] back.
    pub fn put_back(&self, key: &str, step: Step, subject: &str, result: Outcome) {
        self.lock().insert(
            key.to_string(),
            Job::Done(step, subject.to_string(), Box::new(result)),
        );
    }

    /// Whether a job for `key` is running.
    pub fn running(&self, key: &str) -> bool {
        matches!(self.lock().get(key), Some(Job::Running))
    }

    /// Forgets a finished job of `key` (its object is gone).
    pub fn forget(&self, key: &str) {
        let mut jobs = self.lock();
        if matches!(jobs.get(key), Some(Job::Done(..))) {
            jobs.remove(key);
        }
    }
}

/// The longest a background transfer may take before it is given up: the in-sandbox
/// transfer budget twice over (covers the helper's create, start, commit and destroy).
pub fn transfer_bound(limits: &Limits) -> Duration {
    Duration::from_secs(limits.lease_ttl_secs().saturating_mul(2))
}

/// Runs one transfer `work` under [`transfer_bound`], recording it as the provider call
/// `operation` (what it did to which template, for the timeout message: `what`).
pub async fn bounded(
    metrics: Metrics,
    provider: String,
    operation: &'static str,
    what: String,
    limits: Limits,
    work: impl Future<Output = Outcome>,
) -> Outcome {
    let started = Instant::now();
    let bound = transfer_bound(&limits);
    let result = tokio::time::timeout(bound, work).await.unwrap_or_else(|_| {
        Err(ProviderError::transient(format!(
            "{what} did not finish within {} s",
            bound.as_secs()
        )))
    });
    let outcome = result.as_ref().map_or_else(|e| e.category(), |_| "ok");
    metrics.provider_call(
        &provider,
        operation,
        outcome,
        started.elapsed().as_secs_f64(),
    );
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_transfer_runs_once_and_its_result_is_handed_out_once() {
        let transfers = Arc::new(Transfers::default());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let started = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = started.clone();
        let poll = transfers.poll_or_start("uid", Step::Publish, "h1", move || {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async move {
                let _ = rx.await;
                Ok(None)
            }
        });
        assert!(matches!(poll, Poll::Running));
        assert!(transfers.running("uid"));
        // While it runs, polling does not start a second one.
        let poll = transfers.poll_or_start("uid", Step::Publish, "h1", || async { Ok(None) });
        assert!(matches!(poll, Poll::Running));
        assert_eq!(started.load(std::sync::atomic::Ordering::SeqCst), 1);
        tx.send(()).expect("release");
        let deadline = Instant::now() + Duration::from_secs(5);
        while transfers.running("uid") {
            assert!(Instant::now() < deadline, "the job never finished");
            tokio::task::yield_now().await;
        }
        let poll = transfers.poll_or_start("uid", Step::Publish, "h1", || async {
            Err(ProviderError::transient("must not start"))
        });
        assert!(matches!(poll, Poll::Done(Ok(None))));
        // Handed out once: the next poll starts a new job.
        let poll = transfers.poll_or_start("uid", Step::Publish, "h1", || async { Ok(None) });
        assert!(matches!(poll, Poll::Running), "a result is handed out once");
    }
}
