//! The wire types of the E2B REST API that this API serves, with E2B's field names. Request
//! types keep every field the spec defines (unknown ones land in `rest`), so what cannot be
//! mapped is seen and refused instead of silently dropped.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// `POST /sandboxes` and `POST /v2/sandboxes` (`NewSandbox`, `NewSandboxV2`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NewSandbox {
    /// Template id or alias.
    #[serde(rename = "templateID")]
    pub template_id: String,
    /// Time to live in seconds.
    pub timeout: Option<i64>,
    /// Pause instead of kill at the timeout.
    pub auto_pause: Option<bool>,
    /// Whether an auto-pause keeps memory (processes).
    pub auto_pause_memory: Option<bool>,
    /// Resume a paused sandbox on traffic.
    pub auto_resume: Option<serde_json::Value>,
    /// v1: secure all system communication (an envd access token).
    pub secure: Option<bool>,
    /// `false`: no outbound network (except `network.allowOut`).
    #[serde(rename = "allow_internet_access")]
    pub allow_internet_access: Option<bool>,
    /// Egress and public-traffic settings.
    pub network: Option<NetworkConfig>,
    /// User metadata (string to string).
    pub metadata: Option<BTreeMap<String, String>>,
    /// Environment variables.
    pub env_vars: Option<BTreeMap<String, String>>,
    /// MCP gateway settings.
    pub mcp: Option<serde_json::Value>,
    /// Workload identity settings.
    pub iam: Option<serde_json::Value>,
    /// Volume mounts.
    pub volume_mounts: Option<Vec<serde_json::Value>>,
    /// Fields this API does not know.
    #[serde(flatten)]
    pub rest: BTreeMap<String, serde_json::Value>,
}

/// `SandboxNetworkConfig`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkConfig {
    /// Sandbox URLs reachable without authentication.
    pub allow_public_traffic: Option<bool>,
    /// Allowed egress destinations (domains, IPs or CIDRs).
    pub allow_out: Option<Vec<String>>,
    /// Denied egress CIDRs or IPs.
    pub deny_out: Option<Vec<String>>,
    /// Every other network field (egress proxy, host mask, rules, DNS servers, …).
    #[serde(flatten)]
    pub rest: BTreeMap<String, serde_json::Value>,
}

/// `SandboxTimeoutRequest`, `ConnectSandbox` and `ResumedSandbox` (timeout in seconds).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TimeoutRequest {
    /// Seconds from now.
    pub timeout: Option<i64>,
    /// Everything else (e.g. `memory`, `autoPause`).
    #[serde(flatten)]
    pub rest: BTreeMap<String, serde_json::Value>,
}

/// `SandboxPauseRequest`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PauseRequest {
    /// `false`: a filesystem-only pause.
    pub memory: Option<bool>,
    /// Refuse the pause when envd does not answer.
    pub require_healthy_guest: Option<bool>,
    /// Fields this API does not know.
    #[serde(flatten)]
    pub rest: BTreeMap<String, serde_json::Value>,
}

/// `SandboxRefreshRequest`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct RefreshRequest {
    /// Seconds from now the sandbox is kept alive at least.
    pub duration: Option<i64>,
}

/// `Sandbox`: what create and connect answer, what the SDK builds its object from.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CreatedSandbox {
    /// The template asked for.
    #[serde(rename = "templateID")]
    pub template_id: String,
    /// The sandbox id.
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    /// The serving cluster (E2B: the node); here the operator instance.
    #[serde(rename = "clientID")]
    pub client_id: String,
    /// The envd protocol version this API speaks for the sandbox.
    pub envd_version: String,
    /// Token for the sandbox's envd (`X-Access-Token`), when secured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub envd_access_token: Option<String>,
    /// The domain the sandbox is reached under.
    pub domain: Option<String>,
    /// Token for the sandbox's port URLs (`e2b-traffic-access-token`), unless it was
    /// created with `network.allowPublicTraffic: true`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub traffic_access_token: Option<String>,
}

/// `SandboxDetail` (get) and `ListedSandbox` (list), one type: the listed form is the
/// detail without its secrets and settings.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxInfo {
    /// The template asked for.
    #[serde(rename = "templateID")]
    pub template_id: String,
    /// The sandbox id.
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    /// See [`CreatedSandbox::client_id`].
    #[serde(rename = "clientID")]
    pub client_id: String,
    /// When it was created (RFC 3339).
    pub started_at: String,
    /// When its timeout ends (RFC 3339).
    pub end_at: String,
    /// See [`CreatedSandbox::envd_version`].
    pub envd_version: String,
    /// CPU ceiling in whole cores, 0 when the spec sets none.
    pub cpu_count: i64,
    /// Memory ceiling in MiB, 0 when the spec sets none.
    #[serde(rename = "memoryMB")]
    pub memory_mb: i64,
    /// Disk size in MiB, 0 when the spec sets none.
    #[serde(rename = "diskSizeMB")]
    pub disk_size_mb: i64,
    /// `running` or `paused`.
    pub state: &'static str,
    /// The user metadata.
    pub metadata: BTreeMap<String, String>,
    /// Detail only: see [`CreatedSandbox::envd_access_token`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub envd_access_token: Option<String>,
    /// Detail only: the domain.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
}
