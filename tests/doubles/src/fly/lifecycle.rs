//! The machine state machine.
//!
//! A request that changes a machine's power state is answered at once, with the machine in a
//! transient state (`starting`, `stopping`, `suspending`, `destroying`, `replacing`); the
//! Docker work then runs in the background, one operation at a time per machine (a FIFO
//! lock), and sets the persistent state (`started`, `stopped`, `suspended`, `destroyed`,
//! `created`) when it is done — unless a newer operation was scheduled meanwhile. Clients
//! learn the outcome the way they do on Fly: by polling or through the wait endpoint.
//!
//! What each transition does to the container, following the API's documented behaviour:
//!
//! - start from `created`: `docker start`;
//! - start from `stopped`/`failed`: a fresh root filesystem (the container is re-created from
//!   the config) unless the config persists it (`persist_rootfs: always`), then start;
//! - start from `suspended`: `docker unpause` when the snapshot is usable (processes carry
//!   on), otherwise unpause + restart: a cold boot that keeps the root filesystem;
//! - stop: unpause if suspended (the snapshot is discarded), then `docker stop`;
//! - suspend: `docker pause` (processes frozen, memory kept);
//! - destroy: `docker rm -f`, volumes detached;
//! - update: re-create the container when anything but CPU, memory and metadata changed
//!   (otherwise `docker update` in place), and boot it again when it was running or the
//!   update did not ask for `skip_launch`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use futures::StreamExt;
use serde_json::json;

use super::Shared;
use super::faults::lock;
use super::wire::ConfigView;

/// What a scheduled operation does.
#[derive(Debug, Clone)]
pub enum Op {
    /// Boot from the state the machine was in (`from`).
    Start { from: String },
    /// Stop, SIGKILL after `timeout`.
    Stop {
        from: String,
        timeout: Option<Duration>,
    },
    /// Freeze.
    Suspend,
    /// Remove.
    Destroy,
    /// Apply a new config: `recreate` the container or update it in place; `boot` afterwards.
    Update {
        previous: Box<ConfigView>,
        boot: bool,
        was_running: bool,
    },
}

impl Op {
    /// The transient state the machine shows while this runs.
    pub fn transient(&self) -> &'static str {
        match self {
            Op::Start { .. } => "starting",
            Op::Stop { .. } => "stopping",
            Op::Suspend => "suspending",
            Op::Destroy => "destroying",
            Op::Update { .. } => "replacing",
        }
    }
}

/// Puts machine `id` into the op's transient state and runs the op in the background.
/// The caller has already checked that the op is allowed (under the same lock).
pub fn schedule(shared: &Arc<Shared>, id: &str, op: Op) {
    let (seq, container) = {
        let mut store = lock(&shared.store);
        let Some(m) = store.machines.get_mut(id) else {
            return;
        };
        m.seq += 1;
        m.busy += 1;
        m.state = op.transient().to_string();
        m.updated_at = Utc::now();
        (m.seq, m.container.clone())
    };
    shared.changed.notify_waiters();
    let shared = shared.clone();
    let id = id.to_string();
    let counted = super::InFlight::new(&shared);
    tokio::spawn(async move {
        let _counted = counted;
        let gate = shared.op_lock(&id);
        let _turn = gate.lock().await;
        if !shared.options.transition_delay.is_zero() {
            tokio::time::sleep(shared.options.transition_delay).await;
        }
        let outcome = run(&shared, &id, &container, &op).await;
        finish(&shared, &id, seq, &op, outcome).await;
    });
}

/// The persistent state an op ends in, or why it failed.
type Outcome = Result<&'static str, String>;

async fn run(shared: &Arc<Shared>, id: &str, container: &str, op: &Op) -> Outcome {
    let engine = &shared.engine;
    match op {
        Op::Start { from } => {
            let (snapshot, config) = machine_facts(shared, id);
            match from.as_str() {
                "suspended" if snapshot => engine.unpause(container).await?,
                "suspended" => {
                    engine.unpause(container).await?;
                    engine.restart(container).await?;
                }
                "stopped" | "failed" if !config.persists_rootfs() => {
                    recreate(shared, id, container, &config).await?;
                    engine.start(container).await?;
                }
                _ => engine.start(container).await?,
            }
            Ok("started")
        }
        Op::Stop { from, timeout } => {
            if from == "suspended" || from == "suspending" {
                let _ = engine.unpause(container).await;
            }
            engine.stop(container, *timeout).await?;
            Ok("stopped")
        }
        Op::Suspend => {
            engine.pause(container).await?;
            Ok("suspended")
        }
        Op::Destroy => {
            engine.remove(container).await?;
            Ok("destroyed")
        }
        Op::Update {
            previous,
            boot,
            was_running,
        } => {
            let (_, config) = machine_facts(shared, id);
            if previous.container_shape() != config.container_shape()
                || previous.services != config.services
                || previous.restart != config.restart
            {
                recreate(shared, id, container, &config).await?;
                if *boot {
                    engine.start(container).await?;
                }
            } else {
                engine.update(container, &config).await?;
                match (*was_running, *boot) {
                    (true, _) => engine.restart(container).await?,
                    (false, true) => engine.start(container).await?,
                    (false, false) => {}
                }
            }
            Ok(if *boot { "started" } else { "created" })
        }
    }
}

/// Replaces the container with a fresh one from `config` (same name, same volumes).
async fn recreate(
    shared: &Arc<Shared>,
    id: &str,
    container: &str,
    config: &ConfigView,
) -> Result<(), String> {
    shared.engine.remove(container).await?;
    let volumes = shared.docker_volumes();
    shared.engine.create(container, id, config, &volumes).await
}

fn machine_facts(shared: &Shared, id: &str) -> (bool, ConfigView) {
    let store = lock(&shared.store);
    store
        .machines
        .get(id)
        .map(|m| (m.snapshot, m.view()))
        .unwrap_or_default()
}

async fn finish(shared: &Arc<Shared>, id: &str, seq: u64, op: &Op, outcome: Outcome) {
    // On failure, report what Docker says is true rather than what was attempted.
    let observed = match &outcome {
        Ok(_) => None,
        Err(_) => {
            let container = lock(&shared.store)
                .machines
                .get(id)
                .map(|m| m.container.clone());
            match container {
                Some(c) => shared.engine.state(&c).await.ok().flatten(),
                None => None,
            }
        }
    };
    {
        let mut store = lock(&shared.store);
        let Some(m) = store.machines.get_mut(id) else {
            return;
        };
        m.busy = m.busy.saturating_sub(1);
        if m.seq == seq {
            match &outcome {
                Ok(state) => {
                    m.state = state.to_string();
                    m.snapshot = matches!(op, Op::Suspend);
                    let kind = match op {
                        Op::Start { .. } => "start",
                        Op::Stop { .. } => "stop",
                        Op::Suspend => "suspend",
                        Op::Destroy => "destroy",
                        Op::Update { .. } => "update",
                    };
                    m.event(kind, state, "user", None);
                    if matches!(op, Op::Destroy) {
                        m.deleted = true;
                        m.lease = None;
                    }
                }
                Err(message) => {
                    m.state = match observed {
                        Some((true, _)) => "started",
                        Some((false, _)) => "stopped",
                        None => "failed",
                    }
                    .to_string();
                    m.event(
                        "failed",
                        &m.state.clone(),
                        "flyd",
                        Some(json!({"error": message})),
                    );
                }
            }
        }
        if matches!((op, &outcome), (Op::Destroy, Ok(_))) {
            for volume in store.volumes.values_mut() {
                if volume.body.attached_machine_id.as_deref() == Some(id) {
                    volume.body.attached_machine_id = None;
                }
            }
        }
    }
    shared.changed.notify_waiters();
}

/// Watches this double's containers for main processes that exit on their own, and marks
/// such machines `stopped` with an `exit` event carrying the exit code, as flyd does. A
/// machine with an operation in flight is left to that operation.
pub async fn watch_exits(shared: Arc<Shared>) {
    let mut exits = Box::pin(shared.engine.exits());
    while let Some(id) = exits.next().await {
        let container = {
            let store = lock(&shared.store);
            match store.machines.get(&id) {
                Some(m) if m.busy == 0 && m.state == "started" && !m.deleted => m.container.clone(),
                _ => continue,
            }
        };
        let Ok(Some((running, code))) = shared.engine.state(&container).await else {
            continue;
        };
        if running {
            continue; // Docker's restart policy brought it back.
        }
        {
            let mut store = lock(&shared.store);
            let Some(m) = store.machines.get_mut(&id) else {
                continue;
            };
            if m.busy > 0 || m.state != "started" {
                continue;
            }
            m.state = "stopped".into();
            let exit = json!({"exit_event": {
                "exit_code": code.unwrap_or(-1),
                "requested_stop": false,
                "exited_at": Utc::now().to_rfc3339(),
            }});
            m.event("exit", "stopped", "flyd", Some(exit));
        }
        shared.changed.notify_waiters();
    }
}

/// Docker volume names by Fly volume id.
pub fn docker_volumes(store: &super::store::Store) -> BTreeMap<String, String> {
    store
        .volumes
        .iter()
        .map(|(id, v)| (id.clone(), v.docker_name.clone()))
        .collect()
}
