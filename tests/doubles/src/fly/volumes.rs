//! Volume and app endpoints. A volume is a real Docker volume; the API's list includes
//! destroyed volumes (state `destroyed`), as the real one does, so clients must filter.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use chrono::Utc;
use serde_json::{Value, json};

use super::Shared;
use super::faults::lock;
use super::machines::{parse_body, query_pairs};
use super::store::{ApiError, ApiResult, AppRec, VolumeRec, random_id, rfc3339};
use super::wire::{AppRequest, VolumeBody, VolumeRequest};

/// Default size of a volume that names none, in GB.
const DEFAULT_SIZE_GB: u64 = 3;

/// `GET /v1/apps/{app}/volumes`.
pub async fn list(
    State(shared): State<Arc<Shared>>,
    Path(app): Path<String>,
) -> ApiResult<Json<Vec<VolumeBody>>> {
    let store = lock(&shared.store);
    store.app(&app)?;
    Ok(Json(
        store
            .volumes
            .values()
            .filter(|v| v.app == app)
            .map(|v| v.body.clone())
            .collect(),
    ))
}

/// `POST /v1/apps/{app}/volumes`: `name` must be 1-30 characters of lowercase letters,
/// digits and underscores (names are not unique).
pub async fn create(
    State(shared): State<Arc<Shared>>,
    Path(app): Path<String>,
    body: Bytes,
) -> ApiResult<Json<VolumeBody>> {
    let request: VolumeRequest = parse_body(&body)?;
    let valid = !request.name.is_empty()
        && request.name.len() <= 30
        && request
            .name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !valid {
        return Err(ApiError::bad_request(format!(
            "volume name {:?} must be 1-30 lowercase letters, digits or underscores",
            request.name
        )));
    }
    lock(&shared.store).app(&app)?;
    let id = format!("vol_{}", random_id(16));
    let docker_name = format!("flydbl-{}-{id}", shared.instance);
    shared
        .engine
        .create_volume(&docker_name)
        .await
        .map_err(ApiError::internal)?;
    let body = VolumeBody {
        id: id.clone(),
        name: request.name,
        state: "created".into(),
        size_gb: request.size_gb.unwrap_or(DEFAULT_SIZE_GB),
        region: request
            .region
            .unwrap_or_else(|| shared.options.region.clone()),
        zone: random_id(4),
        encrypted: true,
        attached_machine_id: None,
        attached_alloc_id: None,
        created_at: rfc3339(Utc::now()),
        blocks: 0,
        block_size: 4096,
        blocks_free: 0,
        blocks_avail: 0,
        fstype: "ext4".into(),
        snapshot_retention: 5,
        auto_backup_enabled: true,
        host_dedication_key: String::new(),
    };
    lock(&shared.store).volumes.insert(
        id,
        VolumeRec {
            body: body.clone(),
            app,
            docker_name,
        },
    );
    Ok(Json(body))
}

/// `GET /v1/apps/{app}/volumes/{id}`.
pub async fn get(
    State(shared): State<Arc<Shared>>,
    Path((app, id)): Path<(String, String)>,
) -> ApiResult<Json<VolumeBody>> {
    let mut store = lock(&shared.store);
    Ok(Json(store.volume_mut(&app, &id)?.body.clone()))
}

/// `PUT /v1/apps/{app}/volumes/{id}`: accepted and ignored (snapshot settings).
pub async fn update(
    state: State<Arc<Shared>>,
    path: Path<(String, String)>,
) -> ApiResult<Json<VolumeBody>> {
    get(state, path).await
}

/// `DELETE /v1/apps/{app}/volumes/{id}`: refused with 409 while a machine has it attached
/// (the double's choice of code; the API documents none); the volume then shows state
/// `destroyed`.
pub async fn delete(
    State(shared): State<Arc<Shared>>,
    Path((app, id)): Path<(String, String)>,
) -> ApiResult<Json<VolumeBody>> {
    let docker_name = {
        let mut store = lock(&shared.store);
        let volume = store.volume_mut(&app, &id)?;
        if volume.body.state == "destroyed" {
            return Ok(Json(volume.body.clone()));
        }
        if let Some(machine) = &volume.body.attached_machine_id {
            return Err(ApiError::conflict(format!(
                "volume {id} is attached to machine {machine}; destroy the machine first"
            )));
        }
        volume.docker_name.clone()
    };
    shared
        .engine
        .remove_volume(&docker_name)
        .await
        .map_err(ApiError::internal)?;
    let mut store = lock(&shared.store);
    let volume = store.volume_mut(&app, &id)?;
    volume.body.state = "destroyed".into();
    Ok(Json(volume.body.clone()))
}

/// `GET /v1/apps?org_slug=`.
pub async fn list_apps(
    State(shared): State<Arc<Shared>>,
    RawQuery(raw): RawQuery,
) -> ApiResult<Json<Value>> {
    let org = query_pairs(&raw)
        .into_iter()
        .find(|(k, _)| k == "org_slug")
        .map(|(_, v)| v)
        .ok_or_else(|| ApiError::bad_request("org_slug is required"))?;
    let store = lock(&shared.store);
    let apps: Vec<Value> = store
        .apps
        .iter()
        .filter(|(_, a)| a.org == org)
        .map(|(name, a)| {
            let count = store
                .machines
                .values()
                .filter(|m| &m.app == name && !m.deleted)
                .count();
            json!({"id": a.id, "name": name, "machine_count": count, "network": a.network})
        })
        .collect();
    Ok(Json(json!({"total_apps": apps.len(), "apps": apps})))
}

/// `POST /v1/apps` → 201; a taken name is 409 with status `name_taken`.
pub async fn create_app(
    State(shared): State<Arc<Shared>>,
    body: Bytes,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let request: AppRequest = parse_body(&body)?;
    if request.app_name.is_empty() || request.org_slug.is_empty() {
        return Err(ApiError::bad_request("app_name and org_slug are required"));
    }
    let mut store = lock(&shared.store);
    if store.apps.contains_key(&request.app_name) {
        let mut err = ApiError::conflict("Name has already been taken");
        err.body.status = Some("name_taken".into());
        return Err(err);
    }
    let id = random_id(16);
    store.apps.insert(
        request.app_name,
        AppRec {
            id: id.clone(),
            org: request.org_slug,
            network: request.network.unwrap_or_else(|| "default".into()),
        },
    );
    Ok((
        StatusCode::CREATED,
        Json(json!({"id": id, "created_at": Utc::now().timestamp_millis()})),
    ))
}

/// `GET /v1/apps/{app}`.
pub async fn get_app(
    State(shared): State<Arc<Shared>>,
    Path(app): Path<String>,
) -> ApiResult<Json<Value>> {
    let store = lock(&shared.store);
    let rec = store.app(&app)?;
    Ok(Json(json!({
        "id": rec.id,
        "name": app,
        "status": "deployed",
        "organization": {"name": rec.org, "slug": rec.org},
    })))
}
