//! The JSON bodies of the Sprites API, as the double speaks them.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// `config` of a sprite.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SpriteConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ram_mb: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_gb: Option<u64>,
}

/// `url_settings` of a sprite: `auth` is `sprite` (a token is needed) or `public`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UrlSettings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<String>,
}

/// A sprite as the API returns it.
#[derive(Debug, Clone, Serialize)]
pub struct SpriteInfo {
    pub id: String,
    pub name: String,
    pub organization: String,
    /// `cold`, `warm` or `running`.
    pub status: String,
    pub config: SpriteConfig,
    pub environment: BTreeMap<String, String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub url: String,
    pub url_settings: UrlSettings,
    pub labels: Vec<String>,
    pub last_running_at: Option<DateTime<Utc>>,
}

/// `POST /v1/sprites`.
#[derive(Debug, Deserialize)]
pub struct CreateSprite {
    pub name: String,
    #[serde(default)]
    pub config: Option<SpriteConfig>,
    #[serde(default)]
    pub environment: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub labels: Option<Vec<String>>,
}

/// `PUT /v1/sprites/{name}`.
#[derive(Debug, Deserialize)]
pub struct UpdateSprite {
    #[serde(default)]
    pub url_settings: Option<UrlSettings>,
    #[serde(default)]
    pub labels: Option<Vec<String>>,
}

/// One page of `GET /v1/sprites`.
#[derive(Debug, Serialize)]
pub struct SpriteList {
    pub sprites: Vec<SpriteInfo>,
    pub has_more: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_continuation_token: Option<String>,
}

/// A checkpoint.
#[derive(Debug, Clone, Serialize)]
pub struct Checkpoint {
    pub id: String,
    pub create_time: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
}

/// One rule of a network policy.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PolicyRule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include: Option<String>,
}

/// `GET|POST /v1/sprites/{name}/policy/network`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct NetworkPolicy {
    pub rules: Vec<PolicyRule>,
}

/// The error body.
#[derive(Debug, Serialize)]
pub struct ApiError {
    pub error: String,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_seconds: Option<u64>,
}

/// One entry of `fs/list`.
#[derive(Debug, Serialize)]
pub struct FsEntry {
    pub name: String,
    pub path: String,
    /// `file`, `directory`, `symlink` or `other`.
    #[serde(rename = "type")]
    pub kind: String,
    pub size: u64,
    pub mode: String,
    #[serde(rename = "isDir")]
    pub is_dir: bool,
    #[serde(rename = "linkTarget", skip_serializing_if = "Option::is_none")]
    pub link_target: Option<String>,
}

/// `fs/list`.
#[derive(Debug, Serialize)]
pub struct FsList {
    pub path: String,
    pub entries: Vec<FsEntry>,
    pub count: usize,
}
