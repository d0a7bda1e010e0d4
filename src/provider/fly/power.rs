//! Power-state changes under a lease, each bounded by the wait endpoint.
//!
//! Every mutation takes the machine's lease first (`POST .../lease`), sends its nonce, and
//! releases it afterwards (`DELETE .../lease`), so two operator replicas or a person using
//! flyctl cannot interleave updates to one machine: whoever does not hold the lease gets 409,
//! which is `Conflict` (reason `LeaseHeld`) and retried. A lease that is never released (the
//! operator died) lapses after `leaseTtlSeconds`.

use std::future::Future;

use serde_json::json;

use super::FlyProvider;
use super::machines::MAX_WAIT;
use crate::provider::{ErrorKind, ProviderError, ProviderResult};

/// Seconds a stop gives the main process after the signal before it is killed.
const STOP_GRACE: &str = "10s";

/// What a suspend request ended in.
pub(crate) enum Suspended {
    /// Snapshotted.
    Snapshot,
    /// Fly refused to snapshot it (the message says why); it was stopped instead.
    Stopped(String),
}

impl FlyProvider {
    /// Runs `f` holding machine `id`'s lease. A machine that is gone is `NotFound`.
    pub(crate) async fn leased<T, F, Fut>(&self, id: &str, f: F) -> ProviderResult<T>
    where
        F: FnOnce(String) -> Fut,
        Fut: Future<Output = ProviderResult<T>>,
    {
        let nonce = self
            .acquire_lease(id)
            .await
            .map_err(|e| e.context(format!("taking the lease of machine {id}")))?;
        let result = f(nonce.clone()).await;
        if let Err(e) = self.release_lease(id, &nonce).await
            && !e.is(ErrorKind::NotFound)
        {
            tracing::debug!(machine = id, error = %e, "releasing a lease failed; it lapses by itself");
        }
        result
    }

    /// Starts machine `id` and waits until it runs. Already running is a success; a main
    /// process that ran and exited before the wait saw it is a success too (the machine did
    /// start: its `exit` event says so).
    pub(crate) async fn power_start(&self, id: &str) -> ProviderResult<()> {
        self.leased(id, |nonce| async move {
            match self.action(id, "start", None, &nonce).await {
                Ok(()) => {}
                Err(e) if e.is(ErrorKind::Conflict) && e.reason() != "LeaseHeld" => {
                    if self.state_of(id).await? != "started" {
                        return Err(e);
                    }
                }
                Err(e) => return Err(e),
            }
            match self.wait(id, "started", None, MAX_WAIT).await {
                Ok(()) => Ok(()),
                Err(e) if e.is(ErrorKind::Transient) && self.ran_and_exited(id).await? => Ok(()),
                Err(e) => Err(e),
            }
        })
        .await
    }

    /// Stops machine `id` (signal, then kill after the grace period) and waits until it is
    /// stopped. Already stopped (or never started) is a success.
    pub(crate) async fn power_stop(&self, id: &str) -> ProviderResult<()> {
        self.leased(id, |nonce| async move {
            let Some(machine) = self.get_machine(id).await? else {
                return Err(ProviderError::not_found(format!(
                    "machine {id} does not exist"
                )));
            };
            if matches!(machine.state.as_str(), "stopped" | "created" | "failed") {
                return Ok(());
            }
            let body = json!({ "timeout": STOP_GRACE });
            self.action(id, "stop", Some(&body), &nonce).await?;
            self.wait(id, "stopped", Some(&machine.instance_id), MAX_WAIT)
                .await
        })
        .await
    }

    /// Suspends machine `id` (a snapshot of its memory). When Fly refuses to snapshot it
    /// (412: too much memory, swap, a schedule), it is stopped instead and the answer says
    /// so — the caller reports what happened, never what was asked for.
    pub(crate) async fn power_suspend(&self, id: &str, nonce: &str) -> ProviderResult<Suspended> {
        let state = self.state_of(id).await?;
        if state == "suspended" {
            return Ok(Suspended::Snapshot);
        }
        match self.action(id, "suspend", None, nonce).await {
            Ok(()) => {
                self.wait(id, "suspended", None, MAX_WAIT).await?;
                Ok(Suspended::Snapshot)
            }
            Err(e) if e.is(ErrorKind::Conflict) && e.reason() != "LeaseHeld" => {
                let why = e.message().to_string();
                let machine = self.get_machine(id).await?;
                let instance = machine.map(|m| m.instance_id).unwrap_or_default();
                let body = json!({ "timeout": STOP_GRACE });
                self.action(id, "stop", Some(&body), nonce).await?;
                self.wait(id, "stopped", Some(&instance), MAX_WAIT).await?;
                Ok(Suspended::Stopped(why))
            }
            Err(e) => Err(e),
        }
    }

    /// The machine's state word; `NotFound` when it is gone.
    pub(crate) async fn state_of(&self, id: &str) -> ProviderResult<String> {
        match self.get_machine(id).await? {
            Some(m) => Ok(m.state),
            None => Err(ProviderError::not_found(format!(
                "machine {id} does not exist in app {}",
                self.settings.app
            ))),
        }
    }

    /// Whether the machine is stopped because its main process exited (newest event).
    async fn ran_and_exited(&self, id: &str) -> ProviderResult<bool> {
        Ok(self.get_machine(id).await?.is_some_and(|m| {
            m.state == "stopped" && m.events.first().is_some_and(|e| e.kind == "exit")
        }))
    }
}
