//! A machine as the seam describes a sandbox.
//!
//! - **state**: `started` and `suspending` → Running (processes run until the snapshot is
//!   done); `suspended` → Sleeping; `created` → Creating when it never ran and Stopped when
//!   it did (an update with `skip_launch` leaves a machine that ran in `created`); `creating`,
//!   `starting`, `replacing`, `updating`, `restarting` → Creating; `destroying`, `destroyed`
//!   → absent; anything else (`stopped`, `stopping`, `failed`, `launch_failed`) → Stopped.
//! - **started_at** (rule 6): the earliest `start` event in the machine's history, or the
//!   first-start time this provider recorded in metadata (`sandboxes.dev.fly.first-started`),
//!   whichever is earlier. The API keeps only recent events, and a listing need not carry
//!   them at all, so a missing start proves nothing by itself: `Never` only when the history
//!   reaches back to the machine's `launch` event and holds no start, in a state a machine
//!   that never ran is in; a `started`/`suspended` machine has run whatever its history says;
//!   anything else is `Unknown`. The provider writes the first-start time into metadata the
//!   first time it describes a running machine without it (see `core`), and on every config
//!   update, so the record outlives the history.
//! - **labels**: the machine's metadata without Fly's own `fly_*` keys and this provider's
//!   bookkeeping keys (`sandboxes.dev.fly.*`).
//! - **ports**: every service's public port on the public host, reported while the machine
//!   runs or when the Fly Proxy would start it on a request (`autostart`).

use std::collections::BTreeMap;

use chrono::{DateTime, TimeZone, Utc};

use super::config::restart_policy_of;
use super::volumes::seam_volume_name;
use super::wire::{Event, Machine};
use super::{BOOKKEEPING_PREFIX, DISK_KEY, FIRST_STARTED_KEY};
use crate::provider::labels::TEMPLATE;
use crate::provider::{AppliedResources, PortMapping, SandboxDescriptor, SandboxState, StartedAt};

/// The newest event (by timestamp: the API's order is not relied on).
pub(crate) fn newest_event(machine: &Machine) -> Option<&Event> {
    machine.events.iter().max_by_key(|e| e.timestamp)
}

/// When the machine first started, if it ever did (rule 6).
pub(crate) fn first_started(machine: &Machine) -> Option<DateTime<Utc>> {
    let from_events = machine
        .events
        .iter()
        .filter(|e| e.kind == "start" && e.status == "started")
        .map(|e| e.timestamp)
        .min()
        .and_then(|ms| Utc.timestamp_millis_opt(ms).single());
    let recorded = machine
        .read()
        .metadata
        .get(FIRST_STARTED_KEY)
        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
        .map(|t| t.with_timezone(&Utc));
    match (from_events, recorded) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Whether the machine's events reach back to its creation (the `launch` event), so that no
/// `start` among them proves it never started.
fn history_complete(machine: &Machine) -> bool {
    machine.events.iter().any(|e| e.kind == "launch")
}

/// Rule 6 for `machine` in `state` (see the module docs).
pub(crate) fn started_at(machine: &Machine, state: SandboxState) -> StartedAt {
    StartedAt::from_evidence(state, first_started(machine), history_complete(machine))
}

/// The coarse state; `None` for a destroyed machine (the seam's "absent").
pub(crate) fn state_of(machine: &Machine, started: bool) -> Option<SandboxState> {
    Some(match machine.state.as_str() {
        "destroyed" | "destroying" => return None,
        "started" | "suspending" => SandboxState::Running,
        "suspended" => SandboxState::Sleeping,
        "created" if started => SandboxState::Stopped,
        "created" | "creating" | "starting" | "replacing" | "updating" | "restarting" => {
            SandboxState::Creating
        }
        _ => SandboxState::Stopped,
    })
}

/// The descriptor of `machine`; `None` when it is destroyed. `public_host` is where its
/// public ports are reached.
pub(crate) fn descriptor(machine: &Machine, public_host: &str) -> Option<SandboxDescriptor> {
    let state = state_of(machine, first_started(machine).is_some())?;
    let started_at = started_at(machine, state);
    let config = machine.read();
    let labels: BTreeMap<String, String> = config
        .metadata
        .iter()
        .filter(|(k, _)| !k.starts_with("fly_") && !k.starts_with(BOOKKEEPING_PREFIX))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let guest = config.guest.clone().unwrap_or_default();
    let reachable = state == SandboxState::Running;
    let ports = config
        .services
        .iter()
        .filter(|s| reachable || s.autostart == Some(true))
        .flat_map(|s| {
            s.ports.iter().filter_map(|p| {
                Some(PortMapping {
                    sandbox_port: s.internal_port,
                    protocol: if s.protocol.is_empty() {
                        "tcp".into()
                    } else {
                        s.protocol.clone()
                    },
                    host: public_host.to_string(),
                    port: p.port?,
                })
            })
        })
        .collect();
    let exit_code = (state == SandboxState::Stopped)
        .then(|| newest_event(machine).filter(|e| e.kind == "exit"))
        .flatten()
        .and_then(Event::exit_code);
    Some(SandboxDescriptor {
        id: machine.id.clone(),
        state,
        image_digest: None,
        image_pull: None,
        isolation: None,
        template_ref: labels.get(TEMPLATE).cloned(),
        labels,
        created_at: machine
            .created_at
            .as_deref()
            .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
            .map(|t| t.with_timezone(&Utc)),
        started_at,
        exit_code,
        image: (!config.image.is_empty()).then(|| config.image.clone()),
        volumes: config
            .mounts
            .iter()
            .map(|m| m.name.as_deref().map_or(m.volume.clone(), seam_volume_name))
            .collect(),
        ports,
        resources: AppliedResources {
            cpu_millis: guest.cpus.map(|c| c * 1000),
            memory_bytes: guest.memory_mb.map(|mb| mb * 1024 * 1024),
            disk_bytes: config.metadata.get(DISK_KEY).and_then(|d| d.parse().ok()),
            disk_enforced: false,
            pids: None,
        },
        command: (!config.init.exec.is_empty()).then(|| config.init.exec.clone()),
        restart_policy: restart_policy_of(config.restart.as_ref().map(|r| r.policy.as_str())),
        env: config.env.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn machine(state: &str, events: serde_json::Value, metadata: serde_json::Value) -> Machine {
        serde_json::from_value(json!({
            "id": "m1",
            "name": "sbx-1",
            "state": state,
            "instance_id": "I",
            "created_at": "2026-01-01T00:00:00Z",
            "events": events,
            "config": {
                "image": "img",
                "metadata": metadata,
                "guest": {"cpus": 2, "memory_mb": 512},
                "services": [{"protocol": "tcp", "internal_port": 8080, "ports": [{"port": 10001}]}],
                "mounts": [{"volume": "vol_1", "path": "/d", "name": "data_a"}],
                "init": {"exec": ["sleep", "1"]},
                "restart": {"policy": "always"},
            },
        }))
        .unwrap()
    }

    #[test]
    fn never_started_is_none_and_a_start_event_or_the_record_is_the_first_start() {
        let created = machine(
            "created",
            json!([{"type": "launch", "status": "created", "timestamp": 1}]),
            json!({}),
        );
        let d = descriptor(&created, "h").unwrap();
        assert_eq!(d.started_at, StartedAt::Never);
        assert_eq!(d.state, SandboxState::Creating);

        let ran = machine(
            "stopped",
            json!([
                {"type": "exit", "status": "stopped", "timestamp": 3000, "request": {"exit_event": {"exit_code": 3}}},
                {"type": "start", "status": "started", "timestamp": 2000},
                {"type": "start", "status": "started", "timestamp": 1000},
            ]),
            json!({}),
        );
        let d = descriptor(&ran, "h").unwrap();
        assert_eq!(d.started_at.time().unwrap().timestamp_millis(), 1000);
        assert_eq!(d.exit_code, Some(3));

        let updated = machine(
            "created",
            json!([]),
            json!({FIRST_STARTED_KEY: "2026-01-02T00:00:00Z"}),
        );
        let d = descriptor(&updated, "h").unwrap();
        assert!(
            d.started_at.time().is_some(),
            "history truncated, record kept"
        );
        assert_eq!(
            d.state,
            SandboxState::Stopped,
            "created after it ran is stopped"
        );
    }

    #[test]
    fn a_listing_without_events_never_reads_as_never_started() {
        let started = machine("started", json!([]), json!({}));
        let d = descriptor(&started, "h").unwrap();
        assert_eq!(d.state, SandboxState::Running);
        assert_eq!(d.started_at, StartedAt::Unknown, "running: it has run");
        for state in ["suspended", "stopped", "created", "failed"] {
            let m = machine(state, json!([]), json!({}));
            let d = descriptor(&m, "h").unwrap();
            assert_eq!(d.started_at, StartedAt::Unknown, "{state} without events");
        }
        let truncated = machine(
            "stopped",
            json!([{"type": "exit", "status": "stopped", "timestamp": 5}]),
            json!({}),
        );
        assert_eq!(
            descriptor(&truncated, "h").unwrap().started_at,
            StartedAt::Unknown,
            "history cut before the launch proves nothing"
        );
    }

    #[test]
    fn labels_hide_fly_and_bookkeeping_keys_and_everything_else_is_read_back() {
        let m = machine(
            "started",
            json!([{"type": "start", "status": "started", "timestamp": 1}]),
            json!({"team": "a", "fly_platform_version": "v2", FIRST_STARTED_KEY: "x", TEMPLATE: "t1"}),
        );
        let d = descriptor(&m, "app.fly.dev").unwrap();
        assert_eq!(
            d.labels.keys().collect::<Vec<_>>(),
            ["sandboxes.dev/template", "team"]
        );
        assert_eq!(d.template_ref.as_deref(), Some("t1"));
        assert_eq!(d.ports[0].host, "app.fly.dev");
        assert_eq!(d.ports[0].port, 10001);
        assert_eq!(d.resources.cpu_millis, Some(2000));
        assert_eq!(d.resources.memory_bytes, Some(512 << 20));
        assert_eq!(d.volumes, ["data-a"]);
        assert_eq!(d.restart_policy, crate::provider::RestartPolicy::Always);
        assert!(descriptor(&machine("destroyed", json!([]), json!({})), "h").is_none());
    }
}
