//! The double's in-memory model of apps, machines, volumes and leases, and the API error type.
//!
//! Everything here is plain data behind one `std::sync::Mutex` that is never held across an
//! `.await`; Docker work happens outside it (see `engine` and `lifecycle`).

use std::collections::BTreeMap;

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use super::wire::{ConfigView, ErrorBody, MachineEvent, VolumeBody};

/// An API error: a status code and the `{error, status}` body.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP status.
    pub code: StatusCode,
    /// Body.
    pub body: ErrorBody,
}

impl ApiError {
    /// An error with a message and no classification.
    pub fn new(code: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            code,
            body: ErrorBody {
                error: message.into(),
                status: None,
            },
        }
    }

    /// 404 for something that does not exist.
    pub fn not_found(what: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, what)
    }

    /// 400 for a malformed request.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    /// 412 for an operation the machine's current state does not allow.
    pub fn precondition(message: impl Into<String>) -> Self {
        Self::new(StatusCode::PRECONDITION_FAILED, message)
    }

    /// 409.
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, message)
    }

    /// 500 for a failure of the double's own engine.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.code, Json(self.body)).into_response()
    }
}

/// Handler result.
pub type ApiResult<T> = Result<T, ApiError>;

/// A Fly app.
#[derive(Debug, Clone)]
pub struct AppRec {
    /// App id.
    pub id: String,
    /// Organization slug.
    pub org: String,
    /// Private network it was created in (`default`: the organization's).
    pub network: String,
}

/// A held lease.
#[derive(Debug, Clone)]
pub struct LeaseRec {
    /// The holder's secret.
    pub nonce: String,
    /// When it lapses.
    pub expires: DateTime<Utc>,
    /// Free text.
    pub description: String,
}

/// One machine.
#[derive(Debug, Clone)]
pub struct MachineRec {
    pub id: String,
    pub app: String,
    pub name: String,
    pub region: String,
    pub state: String,
    pub instance_id: String,
    /// The configuration exactly as last written (metadata included).
    pub config: Value,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub events: Vec<MachineEvent>,
    pub lease: Option<LeaseRec>,
    /// Whether a suspend snapshot is usable for the next start.
    pub snapshot: bool,
    /// Bumped by every scheduled operation; a finishing operation only writes its final state
    /// when no newer one was scheduled meanwhile.
    pub seq: u64,
    /// Operations scheduled and not finished (the exit watcher stays out while > 0).
    pub busy: u32,
    /// Docker container name.
    pub container: String,
    /// Set when destroyed (kept for `include_deleted`).
    pub deleted: bool,
    pub private_ip: String,
}

impl MachineRec {
    /// The config, typed.
    pub fn view(&self) -> ConfigView {
        serde_json::from_value(self.config.clone()).unwrap_or_default()
    }

    /// The lease, if one is held and has not lapsed.
    pub fn live_lease(&self, now: DateTime<Utc>) -> Option<&LeaseRec> {
        self.lease.as_ref().filter(|l| l.expires > now)
    }

    /// Refuses a mutation when another client holds the lease (409), as the API documents.
    pub fn check_lease(&self, nonce: Option<&str>) -> ApiResult<()> {
        match self.live_lease(Utc::now()) {
            Some(lease) if Some(lease.nonce.as_str()) != nonce => Err(ApiError::conflict(format!(
                "machine {} is leased ({}); send its nonce in fly-machine-lease-nonce",
                self.id, lease.description
            ))),
            _ => Ok(()),
        }
    }

    /// Appends an event.
    pub fn event(&mut self, kind: &str, status: &str, source: &str, request: Option<Value>) {
        self.events.push(MachineEvent {
            id: random_id(26).to_uppercase(),
            kind: kind.into(),
            status: status.into(),
            source: source.into(),
            timestamp: Utc::now().timestamp_millis(),
            request,
        });
        self.updated_at = Utc::now();
    }

    /// The machine as the API returns it (newest event first, as Fly lists them).
    pub fn to_json(&self) -> Value {
        let view = self.view();
        let (repository, tag) = split_image(&view.image);
        let mut events: Vec<&MachineEvent> = self.events.iter().collect();
        events.reverse();
        json!({
            "id": self.id,
            "name": self.name,
            "state": self.state,
            "region": self.region,
            "instance_id": self.instance_id,
            "version": self.instance_id,
            "private_ip": self.private_ip,
            "config": self.config,
            "image_ref": {"registry": "", "repository": repository, "tag": tag, "digest": "", "labels": {}},
            "created_at": rfc3339(self.created_at),
            "updated_at": rfc3339(self.updated_at),
            "events": events,
            "checks": [],
            "host_status": "ok",
            "cordoned": false,
        })
    }
}

/// One volume.
#[derive(Debug, Clone)]
pub struct VolumeRec {
    pub body: VolumeBody,
    pub app: String,
    /// Docker volume name.
    pub docker_name: String,
}

/// Everything the double knows.
#[derive(Debug, Default)]
pub struct Store {
    pub apps: BTreeMap<String, AppRec>,
    pub machines: BTreeMap<String, MachineRec>,
    pub volumes: BTreeMap<String, VolumeRec>,
}

impl Store {
    /// The app, or 404 naming it.
    pub fn app(&self, app: &str) -> ApiResult<&AppRec> {
        self.apps
            .get(app)
            .ok_or_else(|| ApiError::not_found(format!("app {app} not found")))
    }

    /// A live machine of `app`, or 404.
    pub fn machine(&self, app: &str, id: &str) -> ApiResult<&MachineRec> {
        self.app(app)?;
        self.machines
            .get(id)
            .filter(|m| m.app == app && !m.deleted)
            .ok_or_else(|| ApiError::not_found(format!("machine {id} not found")))
    }

    /// A live machine of `app`, mutably, or 404.
    pub fn machine_mut(&mut self, app: &str, id: &str) -> ApiResult<&mut MachineRec> {
        self.app(app)?;
        self.machines
            .get_mut(id)
            .filter(|m| m.app == app && !m.deleted)
            .ok_or_else(|| ApiError::not_found(format!("machine {id} not found")))
    }

    /// A volume of `app` that has not been destroyed, or 404.
    pub fn volume_mut(&mut self, app: &str, id: &str) -> ApiResult<&mut VolumeRec> {
        self.app(app)?;
        self.volumes
            .get_mut(id)
            .filter(|v| v.app == app)
            .ok_or_else(|| ApiError::not_found(format!("volume {id} not found")))
    }
}

/// A random lowercase hex id of `len` characters.
pub fn random_id(len: usize) -> String {
    (0..len)
        .map(|_| char::from_digit(fastrand::u32(0..16), 16).unwrap_or('0'))
        .collect()
}

/// RFC 3339 with seconds, as the API writes times.
pub fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

fn split_image(image: &str) -> (String, String) {
    match image.rsplit_once(':') {
        Some((repo, tag)) if !tag.contains('/') => (repo.to_string(), tag.to_string()),
        _ => (image.to_string(), "latest".to_string()),
    }
}
