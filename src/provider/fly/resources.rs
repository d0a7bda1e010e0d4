//! Changing CPUs and memory: a machine update (`POST /apps/{app}/machines/{id}` with the whole
//! config, the only way the API changes a machine). **Fly reboots a running machine to apply
//! it**: its processes end and start again from the main command. The result says so
//! (`restarted`, recorded by the controller in `status.lastResourceChange`), as do the log
//! line of every change and the README; a stopped machine stays stopped (`skip_launch`) and
//! is reported as not restarted.
//!
//! The update also records when the machine first started in its metadata
//! (`sandboxes.dev.fly.first-started`), so rule 6 still holds after the API's history has
//! dropped that start event.

use async_trait::async_trait;
use serde_json::{Value, json};

use super::config::guest;
use super::describe::{descriptor, first_started};
use super::machines::MAX_WAIT;
use super::{DISK_KEY, FIRST_STARTED_KEY, FlyProvider};
use crate::provider::{
    AppliedResources, ProviderError, ProviderResult, ResourceChange, Resources, SandboxState,
    SetResources,
};

/// The current values with the request's present fields applied.
fn merged(current: &AppliedResources, wanted: &Resources) -> Resources {
    Resources {
        cpu_millis: wanted.cpu_millis.or(current.cpu_millis),
        memory_bytes: wanted.memory_bytes.or(current.memory_bytes),
        disk_bytes: wanted.disk_bytes.or(current.disk_bytes),
        pids: wanted.pids,
    }
}

#[async_trait]
impl SetResources for FlyProvider {
    /// `GET` the machine, then under its lease `POST` the config with the new `guest` and
    /// wait for it to run again (when it was running). `pids` is `Unsupported`, a CPU count
    /// or memory size Fly does not offer is `Invalid` (see `config`).
    async fn set_resources(
        &self,
        id: &str,
        resources: &Resources,
    ) -> ProviderResult<ResourceChange> {
        let host = self.settings.public_host();
        let machine = self
            .get_machine(id)
            .await?
            .ok_or_else(|| ProviderError::not_found(format!("machine {id} does not exist")))?;
        let current = descriptor(&machine, &host)
            .ok_or_else(|| ProviderError::not_found(format!("machine {id} is destroyed")))?;
        let wanted = merged(&current.resources, resources);
        let mut config: Value = machine.config.clone();
        let persist = config["guest"]["persist_rootfs"].clone();
        config["guest"] = guest(&wanted)?;
        if !persist.is_null() {
            config["guest"]["persist_rootfs"] = persist;
        }
        if let Some(disk) = wanted.disk_bytes {
            config["metadata"][DISK_KEY] = json!(disk.to_string());
        }
        if let Some(first) = first_started(&machine) {
            config["metadata"][FIRST_STARTED_KEY] = json!(first.to_rfc3339());
        }
        let running = current.state == SandboxState::Running;
        let body = json!({
            "config": config,
            "current_version": machine.instance_id,
            "skip_launch": !running,
        });
        tracing::info!(
            machine = id,
            running,
            "changing resources by a machine update: Fly reboots a running machine to apply it"
        );
        self.leased(id, |nonce| async move {
            self.update_machine(id, &body, &nonce).await?;
            if running {
                self.wait(id, "started", None, MAX_WAIT).await?;
            } else {
                self.settled(id).await?;
            }
            Ok(())
        })
        .await?;
        let after = self
            .describe_machine(id)
            .await?
            .ok_or_else(|| ProviderError::not_found(format!("machine {id} vanished")))?;
        Ok(ResourceChange {
            applied: after.resources,
            restarted: running,
        })
    }
}

/// States a machine passes through while an update is applied.
const UPDATING: [&str; 2] = ["replacing", "updating"];

impl FlyProvider {
    /// Waits until a machine updated without a launch has left the update's transient
    /// states, so the description that follows is the settled machine. The wait endpoint
    /// cannot express "whatever it settles in" (it may settle `stopped` or `created`), so
    /// this re-reads the machine with a short pause, bounded by the same ceiling as a wait.
    async fn settled(&self, id: &str) -> ProviderResult<()> {
        let deadline = tokio::time::Instant::now() + MAX_WAIT;
        loop {
            let machine = self.get_machine(id).await?.ok_or_else(|| {
                ProviderError::not_found(format!("machine {id} vanished while it was updated"))
            })?;
            if !UPDATING.contains(&machine.state.as_str()) {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(ProviderError::transient(format!(
                    "machine {id} is still {} {} s after its update",
                    machine.state,
                    MAX_WAIT.as_secs()
                )));
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }
}
