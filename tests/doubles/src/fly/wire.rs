//! The JSON shapes of the Machines API, as the published API documents them (the Machines and
//! Volumes resource pages and the official Go client's wire types). Only what the double reads
//! or writes is typed; a machine's `config` is kept verbatim as JSON and read through
//! [`ConfigView`], so fields the double does not model still round-trip unchanged.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The API's error body: `{"error": "...", "status": "..."}` (`status` only for classified
/// failures such as `insufficient_capacity`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorBody {
    /// Human-readable message.
    pub error: String,
    /// Machine-readable classification, when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
}

/// `POST /v1/apps/{app}/machines` and `POST /v1/apps/{app}/machines/{id}` bodies.
#[derive(Debug, Clone, Deserialize)]
pub struct MachineRequest {
    /// The full machine configuration.
    pub config: Value,
    /// Machine name (create only; immutable).
    #[serde(default)]
    pub name: Option<String>,
    /// Target region.
    #[serde(default)]
    pub region: Option<String>,
    /// Create or update without booting.
    #[serde(default)]
    pub skip_launch: bool,
    /// Acquire a lease of this many seconds on the new machine (create only).
    #[serde(default)]
    pub lease_ttl: Option<u64>,
}

/// What the double reads out of a machine `config`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct ConfigView {
    /// Image reference (required).
    #[serde(default)]
    pub image: String,
    /// Environment.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// How the main process is chosen.
    #[serde(default)]
    pub init: InitView,
    /// CPUs and memory.
    #[serde(default)]
    pub guest: Option<GuestView>,
    /// Root filesystem persistence (newer form of `guest.persist_rootfs`).
    #[serde(default)]
    pub rootfs: Option<RootfsView>,
    /// Metadata (the only place a machine carries caller key/values).
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// Volume mounts.
    #[serde(default)]
    pub mounts: Vec<MountView>,
    /// Fly Proxy services.
    #[serde(default)]
    pub services: Vec<ServiceView>,
    /// Restart policy.
    #[serde(default)]
    pub restart: Option<RestartView>,
    /// Suspend needs a machine without swap.
    #[serde(default)]
    pub schedule: Option<String>,
}

/// `config.init`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct InitView {
    /// Replaces every other start-up command line.
    #[serde(default)]
    pub exec: Vec<String>,
    /// Replaces the image's ENTRYPOINT.
    #[serde(default)]
    pub entrypoint: Vec<String>,
    /// Replaces the image's CMD.
    #[serde(default)]
    pub cmd: Vec<String>,
    /// Swap size; a machine with swap cannot be suspended.
    #[serde(default)]
    pub swap_size_mb: Option<u64>,
}

/// `config.guest`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct GuestView {
    /// CPU count.
    #[serde(default)]
    pub cpus: Option<u32>,
    /// Memory in MB.
    #[serde(default)]
    pub memory_mb: Option<u64>,
    /// `never` (default), `restart` or `always`.
    #[serde(default)]
    pub persist_rootfs: Option<String>,
}

/// `config.rootfs`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct RootfsView {
    /// `never`, `restart` or `always`.
    #[serde(default)]
    pub persist: Option<String>,
}

/// One `config.mounts` entry.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct MountView {
    /// Volume id (`vol_…`).
    #[serde(default)]
    pub volume: String,
    /// Absolute mount path.
    #[serde(default)]
    pub path: String,
}

/// One `config.services` entry.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct ServiceView {
    /// `tcp` or `udp`.
    #[serde(default)]
    pub protocol: String,
    /// Port inside the machine.
    #[serde(default)]
    pub internal_port: u16,
    /// Public ports.
    #[serde(default)]
    pub ports: Vec<PortView>,
}

/// One public port of a service.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct PortView {
    /// The public port.
    #[serde(default)]
    pub port: Option<u16>,
}

/// `config.restart`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct RestartView {
    /// `no`, `on-failure` or `always`.
    #[serde(default)]
    pub policy: String,
    /// Retries for `on-failure`.
    #[serde(default)]
    pub max_retries: Option<i64>,
}

impl ConfigView {
    /// Whether the root filesystem survives a stop/start (`always`); otherwise a start from
    /// `stopped` boots a fresh root filesystem, as the API documents.
    pub fn persists_rootfs(&self) -> bool {
        let guest = self
            .guest
            .as_ref()
            .and_then(|g| g.persist_rootfs.as_deref());
        let rootfs = self.rootfs.as_ref().and_then(|r| r.persist.as_deref());
        guest.or(rootfs) == Some("always")
    }

    /// The parts of the config that need a new container when they change (everything but
    /// CPUs, memory and metadata, which change in place).
    pub fn container_shape(&self) -> (String, BTreeMap<String, String>, InitView) {
        (self.image.clone(), self.env.clone(), self.init.clone())
    }
}

/// One entry of a machine's `events`.
#[derive(Debug, Clone, Serialize)]
pub struct MachineEvent {
    /// Event id.
    pub id: String,
    /// `launch`, `start`, `stop`, `exit`, `suspend`, `update`, `destroy`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The state it led to.
    pub status: String,
    /// `user` or `flyd`.
    pub source: String,
    /// Milliseconds since the epoch.
    pub timestamp: i64,
    /// Exit details for `exit` events.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request: Option<Value>,
}

/// `GET/POST /lease` response.
#[derive(Debug, Clone, Serialize)]
pub struct LeaseBody {
    /// `success`.
    pub status: String,
    /// The lease.
    pub data: LeaseData,
}

/// The lease itself.
#[derive(Debug, Clone, Serialize)]
pub struct LeaseData {
    /// The nonce a holder sends in `fly-machine-lease-nonce`.
    pub nonce: String,
    /// Expiry, seconds since the epoch.
    pub expires_at: i64,
    /// Who holds it.
    pub owner: String,
    /// The machine version it was taken on.
    pub version: String,
    /// The holder's description.
    pub description: String,
}

/// `POST /lease` body (the TTL may also come as `?ttl=`).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct LeaseRequest {
    /// Seconds.
    #[serde(default)]
    pub ttl: Option<u64>,
    /// Free text.
    #[serde(default)]
    pub description: Option<String>,
}

/// `POST /stop` body (`signal` is accepted and ignored: Docker sends SIGTERM).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StopRequest {
    /// Go duration string (`"10s"`) before SIGKILL.
    #[serde(default)]
    pub timeout: Option<Value>,
}

/// `POST /exec` body.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ExecRequest {
    /// argv.
    #[serde(default)]
    pub command: Vec<String>,
    /// Deprecated single-string form, split on whitespace.
    #[serde(default)]
    pub cmd: Option<String>,
    /// Text written to the command's stdin.
    #[serde(default)]
    pub stdin: Option<String>,
    /// Seconds.
    #[serde(default)]
    pub timeout: Option<u64>,
}

/// `POST /exec` response. Output is text: bytes that are not UTF-8 do not survive, exactly
/// as with a JSON string from the real API.
#[derive(Debug, Clone, Serialize)]
pub struct ExecResponse {
    /// Exit code.
    pub exit_code: i64,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

/// `POST /v1/apps/{app}/volumes` body.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct VolumeRequest {
    /// Volume name (not unique).
    #[serde(default)]
    pub name: String,
    /// Region.
    #[serde(default)]
    pub region: Option<String>,
    /// Size in GB (default 3).
    #[serde(default)]
    pub size_gb: Option<u64>,
}

/// A volume as the API returns it.
#[derive(Debug, Clone, Serialize)]
pub struct VolumeBody {
    pub id: String,
    pub name: String,
    pub state: String,
    pub size_gb: u64,
    pub region: String,
    pub zone: String,
    pub encrypted: bool,
    pub attached_machine_id: Option<String>,
    pub attached_alloc_id: Option<String>,
    pub created_at: String,
    pub blocks: u64,
    pub block_size: u64,
    pub blocks_free: u64,
    pub blocks_avail: u64,
    pub fstype: String,
    pub snapshot_retention: u64,
    pub auto_backup_enabled: bool,
    pub host_dedication_key: String,
}

/// `POST /v1/apps` body.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct AppRequest {
    /// App name (global on Fly).
    #[serde(default)]
    pub app_name: String,
    /// Organization slug.
    #[serde(default)]
    pub org_slug: String,
    /// Private network; absent = the organization's default one.
    #[serde(default)]
    pub network: Option<String>,
}
