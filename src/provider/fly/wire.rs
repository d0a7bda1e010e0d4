//! The Machines API's JSON as this provider reads it. A machine's `config` is kept as raw JSON
//! ([`Machine::config`]) because an update must send the whole config back — fields this
//! provider does not model included — and is read through [`ConfigRead`].

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

/// The API's error body.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ErrorBody {
    /// Message.
    #[serde(default)]
    pub error: String,
    /// Classification (`insufficient_capacity`, `name_taken`, …), when given.
    #[serde(default)]
    pub status: Option<String>,
}

/// A machine.
#[derive(Debug, Clone, Deserialize)]
pub struct Machine {
    /// Machine id (the provider id of a sandbox).
    pub id: String,
    /// State word (`created`, `started`, `suspended`, …).
    #[serde(default)]
    pub state: String,
    /// Version of the current config; changes with every update.
    #[serde(default)]
    pub instance_id: String,
    /// The config as last written.
    #[serde(default)]
    pub config: Value,
    /// RFC 3339.
    #[serde(default)]
    pub created_at: Option<String>,
    /// RFC 3339; changes with every transition and update.
    #[serde(default)]
    pub updated_at: Option<String>,
    /// History, newest first (possibly truncated by the API).
    #[serde(default)]
    pub events: Vec<Event>,
}

impl Machine {
    /// The config, typed (missing or odd fields read as their defaults).
    pub fn read(&self) -> ConfigRead {
        serde_json::from_value(self.config.clone()).unwrap_or_default()
    }
}

/// One history entry.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Event {
    /// `launch`, `start`, `stop`, `exit`, `suspend`, `update`, …
    #[serde(default, rename = "type")]
    pub kind: String,
    /// The state it led to.
    #[serde(default)]
    pub status: String,
    /// Milliseconds since the epoch.
    #[serde(default)]
    pub timestamp: i64,
    /// Details (exit code for `exit`).
    #[serde(default)]
    pub request: Option<Value>,
}

impl Event {
    /// The exit code of an `exit` event.
    pub fn exit_code(&self) -> Option<i64> {
        self.request
            .as_ref()?
            .get("exit_event")?
            .get("exit_code")?
            .as_i64()
    }
}

/// The parts of a config this provider reads.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ConfigRead {
    #[serde(default)]
    pub image: String,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub init: InitRead,
    #[serde(default)]
    pub guest: Option<GuestRead>,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    #[serde(default)]
    pub mounts: Vec<MountRead>,
    #[serde(default)]
    pub services: Vec<ServiceRead>,
    #[serde(default)]
    pub restart: Option<RestartRead>,
}

/// `config.init`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct InitRead {
    #[serde(default)]
    pub exec: Vec<String>,
}

/// `config.guest`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct GuestRead {
    #[serde(default)]
    pub cpus: Option<u64>,
    #[serde(default)]
    pub memory_mb: Option<u64>,
}

/// One `config.mounts` entry.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct MountRead {
    #[serde(default)]
    pub volume: String,
    #[serde(default)]
    pub name: Option<String>,
}

/// One `config.services` entry.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ServiceRead {
    #[serde(default)]
    pub protocol: String,
    #[serde(default)]
    pub internal_port: u16,
    #[serde(default)]
    pub ports: Vec<PortRead>,
    #[serde(default)]
    pub autostart: Option<bool>,
}

/// A public port of a service.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct PortRead {
    #[serde(default)]
    pub port: Option<u16>,
}

/// `config.restart`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct RestartRead {
    #[serde(default)]
    pub policy: String,
}

/// A lease (`POST/GET .../lease`).
#[derive(Debug, Clone, Deserialize)]
pub struct Lease {
    /// The lease.
    pub data: LeaseData,
}

/// The lease's data.
#[derive(Debug, Clone, Deserialize)]
pub struct LeaseData {
    /// What the holder sends in `fly-machine-lease-nonce`.
    pub nonce: String,
}

/// `POST .../exec` response.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ExecReply {
    #[serde(default)]
    pub exit_code: i64,
    #[serde(default)]
    pub stdout: String,
    #[serde(default)]
    pub stderr: String,
}

/// A volume.
#[derive(Debug, Clone, Deserialize)]
pub struct Volume {
    pub id: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub state: String,
    #[serde(default)]
    pub size_gb: Option<u64>,
    #[serde(default)]
    pub attached_machine_id: Option<String>,
    #[serde(default)]
    pub created_at: Option<String>,
}

impl Volume {
    /// Whether the API still counts it (the list includes destroyed volumes).
    pub fn is_live(&self) -> bool {
        !matches!(
            self.state.as_str(),
            "destroyed" | "destroying" | "pending_destroy" | "scheduling_destroy"
        )
    }
}

/// A page of the machine listing: the documented whole-list array, or the paged object.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum MachinePage {
    /// The whole list.
    All(Vec<Machine>),
    /// One page and where the next one starts.
    Page {
        machines: Vec<Machine>,
        #[serde(default)]
        next_cursor: Option<String>,
    },
}
