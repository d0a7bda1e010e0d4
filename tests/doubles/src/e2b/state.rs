//! What the double remembers about its sandboxes and templates.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

use super::engine::Engine;
use super::faults::{Counters, Faults};

/// A template the double can boot: which local image backs it and the size E2B would report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateSpec {
    /// Local Docker image.
    pub image: String,
    /// Reported `cpuCount` (not enforced).
    pub cpu_count: u32,
    /// Reported `memoryMB` (not enforced).
    pub memory_mb: u32,
    /// Reported `diskSizeMB` (not enforced).
    pub disk_size_mb: u32,
}

/// A sandbox's power state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Power {
    /// Running; envd answers.
    Running,
    /// Paused. `memory = true`: frozen with its processes (`docker pause`); `false`: only
    /// its filesystem kept (`docker stop`), so a resume is a cold boot.
    Paused {
        /// Whether the memory (the process tree) was kept.
        memory: bool,
    },
}

/// The egress policy fields E2B stores with a sandbox (`SandboxNetworkConfig`). Stored and
/// returned exactly; NOT enforced (the container's network is the Docker default bridge).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Network {
    /// Allowed destinations (CIDR, IP or domain, `*.` wildcards).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_out: Option<Vec<String>>,
    /// Denied CIDRs or IPs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deny_out: Option<Vec<String>>,
    /// Whether sandbox URLs are reachable without the traffic token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_public_traffic: Option<bool>,
    /// Host mask for requests to the sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mask_request_host: Option<String>,
}

/// One sandbox.
#[derive(Debug, Clone)]
pub struct Sandbox {
    /// `sandboxID`.
    pub id: String,
    /// The template it was created from.
    pub template_id: String,
    /// The container backing it.
    pub container: String,
    /// Reported sizes.
    pub template: TemplateSpec,
    /// `metadata`, as given at create.
    pub metadata: BTreeMap<String, String>,
    /// `startedAt`.
    pub started_at: DateTime<Utc>,
    /// `endAt`: when a running sandbox times out (for a paused one: when it was paused).
    pub end_at: DateTime<Utc>,
    /// Power state.
    pub power: Power,
    /// A lifecycle call (pause, resume, kill, timeout handling) is under way: others get 409.
    pub busy: bool,
    /// `autoPause`: pause instead of kill at the timeout.
    pub auto_pause: bool,
    /// `envdAccessToken`, when created with `secure: true`.
    pub access_token: Option<String>,
    /// `allow_internet_access`, when given.
    pub allow_internet_access: Option<bool>,
    /// The stored network policy.
    pub network: Network,
    /// How many times the network policy was replaced in place.
    pub network_updates: u64,
    /// How many times the timeout was moved (timeout, refreshes, connect).
    pub timeout_extensions: u64,
    /// How many times it was paused (by a call or at its timeout).
    pub pauses: u64,
    /// How many times it was resumed.
    pub resumes: u64,
}

/// Why the double removed a sandbox on its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expired {
    /// The sandbox.
    pub id: String,
    /// `killed` or `paused`.
    pub outcome: &'static str,
}

/// Everything one double holds, shared by its handlers.
#[derive(Clone)]
pub struct Shared {
    pub(crate) engine: Engine,
    pub(crate) sandboxes: Arc<Mutex<BTreeMap<String, Sandbox>>>,
    pub(crate) templates: Arc<BTreeMap<String, TemplateSpec>>,
    pub(crate) api_keys: Arc<std::sync::Mutex<BTreeSet<String>>>,
    pub(crate) faults: Faults,
    pub(crate) api_counters: Counters,
    pub(crate) envd_counters: Counters,
    pub(crate) expired: Arc<std::sync::Mutex<Vec<Expired>>>,
    pub(crate) max_timeout_secs: u64,
    pub(crate) max_running: Option<usize>,
    pub(crate) domain: String,
    pub(crate) page_cap: usize,
    /// envd's running processes, by sandbox and pid.
    pub(crate) processes: super::process::Processes,
}

impl Shared {
    pub(crate) fn key_is_valid(&self, key: &str) -> bool {
        self.api_keys
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(key)
    }
}

/// A fresh sandbox id: 20 lowercase alphanumerics, the shape E2B uses.
pub(crate) fn new_sandbox_id() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    (0..20)
        .map(|_| ALPHABET[fastrand::usize(..ALPHABET.len())] as char)
        .collect()
}

/// A fresh secret token.
pub(crate) fn new_token() -> String {
    (0..32)
        .map(|_| format!("{:x}", fastrand::u8(..16)))
        .collect()
}
