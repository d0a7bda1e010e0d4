//! The Sprites API's JSON bodies, as this provider sends and reads them.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// `config` of a sprite: its VM size.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpriteConfig {
    /// Memory in MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ram_mb: Option<u64>,
    /// Whole CPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<u64>,
    /// Disk in GiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_gb: Option<u64>,
}

/// `url_settings`: `auth` is `sprite` (the URL needs a Sprites token) or `public`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UrlSettings {
    /// `sprite` or `public`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<String>,
}

/// A sprite as `GET /v1/sprites/{name}` and the listing return it.
#[derive(Debug, Clone, Deserialize)]
pub struct SpriteInfo {
    /// The sprite's name: the key every API path uses.
    pub name: String,
    /// `running`, `warm` (suspended, processes frozen) or `cold` (stopped).
    #[serde(default)]
    pub status: String,
    /// VM size.
    #[serde(default)]
    pub config: Option<SpriteConfig>,
    /// Environment given at create.
    #[serde(default)]
    pub environment: Option<BTreeMap<String, String>>,
    /// Creation time.
    pub created_at: Option<DateTime<Utc>>,
    /// The sprite URL (routes HTTP to port 8080 inside the sprite).
    #[serde(default)]
    pub url: Option<String>,
    /// Labels, each a string (this provider writes `key=value`).
    #[serde(default)]
    pub labels: Option<Vec<String>>,
    /// When the sprite last ran; absent when it never has.
    #[serde(default)]
    pub last_running_at: Option<DateTime<Utc>>,
}

/// `POST /v1/sprites`.
#[derive(Debug, Serialize)]
pub struct CreateSprite<'a> {
    /// Our deterministic external name.
    pub name: &'a str,
    /// VM size, when any ceiling was asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config: Option<SpriteConfig>,
    /// Non-secret environment.
    pub environment: &'a BTreeMap<String, String>,
    /// Owner and caller labels as `key=value`.
    pub labels: Vec<String>,
}

/// `PUT /v1/sprites/{name}`.
#[derive(Debug, Serialize)]
pub struct UpdateSprite {
    /// URL auth.
    pub url_settings: UrlSettings,
}

/// One page of `GET /v1/sprites`.
#[derive(Debug, Deserialize)]
pub struct SpriteList {
    /// This page.
    #[serde(default)]
    pub sprites: Vec<SpriteInfo>,
    /// Whether another page follows.
    #[serde(default)]
    pub has_more: bool,
    /// The token for the next page.
    #[serde(default)]
    pub next_continuation_token: Option<String>,
}

/// One rule of a network policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyRule {
    /// A domain (`example.com`, `*.example.com`, `*`); empty in a rule that names a preset
    /// list instead (`include`), which is read back but never written by this provider.
    #[serde(default)]
    pub domain: String,
    /// `allow` or `deny`.
    #[serde(default)]
    pub action: String,
}

/// `GET|POST /v1/sprites/{name}/policy/network`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkPolicy {
    /// Rules, first match wins.
    #[serde(default)]
    pub rules: Vec<PolicyRule>,
}

/// The API's error body.
#[derive(Debug, Default, Deserialize)]
pub struct ApiError {
    /// Machine-readable code.
    #[serde(default)]
    pub error: Option<String>,
    /// Human-readable message.
    #[serde(default)]
    pub message: Option<String>,
    /// Seconds to wait before retrying (rate limits).
    #[serde(default)]
    pub retry_after_seconds: Option<u64>,
}

/// One entry of `fs/list`.
#[derive(Debug, Deserialize)]
pub struct FsEntry {
    /// One path segment.
    pub name: String,
    /// `file`, `directory`, `symlink` or something else.
    #[serde(rename = "type", default)]
    pub kind: String,
    /// Size in bytes.
    #[serde(default)]
    pub size: Option<u64>,
    /// A symlink's target.
    #[serde(rename = "linkTarget", default)]
    pub link_target: Option<String>,
}

/// `fs/list`.
#[derive(Debug, Deserialize)]
pub struct FsList {
    /// One directory level.
    #[serde(default)]
    pub entries: Vec<FsEntry>,
}
