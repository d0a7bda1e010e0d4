//! The REST half of the double: auth, faults, sprites, checkpoints, network policy.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Json;
use axum::Router;
use axum::extract::{Path, Query, Request, State as AxState};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use chrono::Utc;
use serde::Deserialize;

use super::state::{Faults, Sprite, State};
use super::wire::{ApiError, Checkpoint, CreateSprite, NetworkPolicy, SpriteList, UpdateSprite};
use super::{exec, fs, proxy, session};

type Shared = Arc<State>;

/// The whole API.
pub fn router(state: Shared) -> Router {
    Router::new()
        .route("/v1/sprites", post(create).get(list))
        .route(
            "/v1/sprites/{name}",
            get(describe).put(update).delete(destroy),
        )
        .route("/v1/sprites/{name}/exec", get(exec::upgrade))
        .route(
            "/v1/sprites/{name}/exec/{session_id}/kill",
            post(session::kill),
        )
        .route("/v1/sprites/{name}/proxy", get(proxy::upgrade))
        .route("/v1/sprites/{name}/fs/read", get(fs::read))
        .route("/v1/sprites/{name}/fs/write", axum::routing::put(fs::write))
        .route("/v1/sprites/{name}/fs/list", get(fs::list))
        .route(
            "/v1/sprites/{name}/fs/delete",
            axum::routing::delete(fs::delete),
        )
        .route("/v1/sprites/{name}/checkpoint", post(checkpoint))
        .route("/v1/sprites/{name}/checkpoints", get(checkpoints))
        .route("/v1/sprites/{name}/checkpoints/{id}", get(checkpoint_get))
        .route("/v1/sprites/{name}/checkpoints/{id}/restore", post(restore))
        .route(
            "/v1/sprites/{name}/policy/network",
            get(policy_get).post(policy_set),
        )
        .layer(middleware::from_fn_with_state(state.clone(), gate))
        .with_state(state)
}

/// An error response with the API's error body.
pub fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    let body = ApiError {
        error: code.into(),
        message: message.into(),
        retry_after_seconds: None,
    };
    (status, Json(body)).into_response()
}

/// 404 for a sprite that does not exist.
pub fn no_sprite(name: &str) -> Response {
    error(
        StatusCode::NOT_FOUND,
        "not_found",
        format!("sprite {name} not found"),
    )
}

/// 500 for a failure of the double's own engine.
pub fn engine(message: String) -> Response {
    error(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
}

/// Counts the request, applies the fault switches, then checks the bearer token.
async fn gate(AxState(state): AxState<Shared>, request: Request, next: Next) -> Response {
    state.requests.fetch_add(1, Ordering::SeqCst);
    state.log.lock().expect("log lock").push((
        request.method().to_string(),
        request.uri().path().to_string(),
    ));
    if state.faults.fail_all.load(Ordering::SeqCst) {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "injected failure",
        );
    }
    if Faults::take(&state.faults.rate_limit_next) {
        let secs = state.faults.retry_after_seconds.load(Ordering::SeqCst);
        let body = ApiError {
            error: "sprite_creation_rate_limited".into(),
            message: "rate limited (injected)".into(),
            retry_after_seconds: Some(secs),
        };
        let mut response = (StatusCode::TOO_MANY_REQUESTS, Json(body)).into_response();
        if let Ok(value) = HeaderValue::from_str(&secs.to_string()) {
            response.headers_mut().insert(header::RETRY_AFTER, value);
        }
        return response;
    }
    let expected = format!("Bearer {}", state.token.lock().expect("token lock"));
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    if given != Some(expected.as_str()) {
        return error(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "missing or invalid bearer token",
        );
    }
    next.run(request).await
}

/// Sprite names: lowercase letters, digits and dashes, starting with a letter.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

async fn create(AxState(state): AxState<Shared>, Json(body): Json<CreateSprite>) -> Response {
    if !valid_name(&body.name) {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_name",
            format!("invalid sprite name {:?}", body.name),
        );
    }
    let mut sprites = state.sprites.lock().await;
    if sprites.contains_key(&body.name) {
        return error(
            StatusCode::CONFLICT,
            "already_exists",
            format!("sprite {} already exists", body.name),
        );
    }
    let now = Utc::now();
    let sprite = Sprite {
        id: format!("sprite-{:016x}", fastrand::u64(..)),
        name: body.name.clone(),
        container: state.container_name(&body.name),
        config: body.config.unwrap_or_default(),
        environment: body.environment.unwrap_or_default(),
        labels: body.labels.unwrap_or_default(),
        created_at: now,
        updated_at: now,
        last_running_at: None,
        url_auth: "sprite".into(),
        policy: NetworkPolicy::default(),
        checkpoints: Vec::new(),
        image: state.opts.image.clone(),
    };
    if let Err(e) = state.create_container(&sprite).await {
        return engine(e);
    }
    state.creates.fetch_add(1, Ordering::SeqCst);
    let info = state.info(&sprite).await;
    sprites.insert(sprite.name.clone(), sprite);
    match info {
        Ok(info) => (StatusCode::CREATED, Json(info)).into_response(),
        Err(e) => engine(e),
    }
}

#[derive(Debug, Deserialize)]
struct ListQuery {
    prefix: Option<String>,
    max_results: Option<usize>,
    continuation_token: Option<String>,
}

/// Pages by name: the continuation token is the last name of the previous page.
async fn list(AxState(state): AxState<Shared>, Query(q): Query<ListQuery>) -> Response {
    let page = q
        .max_results
        .unwrap_or(state.opts.page_size)
        .clamp(1, state.opts.page_size);
    let sprites = state.sprites.lock().await.clone();
    let prefix = q.prefix.unwrap_or_default();
    let after = q.continuation_token.unwrap_or_default();
    let mut matching = sprites
        .values()
        .filter(|s| s.name.starts_with(&prefix) && s.name.as_str() > after.as_str());
    let mut out = Vec::new();
    for sprite in matching.by_ref().take(page) {
        match state.info(sprite).await {
            Ok(info) => out.push(info),
            Err(e) => return engine(e),
        }
    }
    let has_more = matching.next().is_some();
    let next = has_more
        .then(|| out.last().map(|s| s.name.clone()))
        .flatten();
    let mut body = serde_json::to_value(SpriteList {
        sprites: out,
        has_more,
        next_continuation_token: next,
    })
    .unwrap_or_default();
    if let Some(entries) = body["sprites"].as_array_mut() {
        entries.iter_mut().for_each(|e| shape_history(&state, e));
    }
    Json(body).into_response()
}

/// Leaves out of a listing entry the timestamps the history mode does not let it carry.
fn shape_history(state: &Shared, entry: &mut serde_json::Value) {
    let now = chrono::Utc::now();
    let Some(fields) = entry.as_object_mut() else {
        return;
    };
    for key in ["created_at", "last_running_at"] {
        let at = fields
            .get(key)
            .and_then(|v| v.as_str())
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok());
        if at.is_some_and(|t| {
            !state
                .faults
                .history
                .listing_keeps(now - t.with_timezone(&chrono::Utc))
        }) {
            fields.remove(key);
        }
    }
}

async fn describe(AxState(state): AxState<Shared>, Path(name): Path<String>) -> Response {
    let Some(sprite) = state.sprites.lock().await.get(&name).cloned() else {
        return no_sprite(&name);
    };
    match state.info(&sprite).await {
        Ok(info) => Json(info).into_response(),
        Err(e) => engine(e),
    }
}

async fn update(
    AxState(state): AxState<Shared>,
    Path(name): Path<String>,
    Json(body): Json<UpdateSprite>,
) -> Response {
    let sprite = {
        let mut sprites = state.sprites.lock().await;
        let Some(sprite) = sprites.get_mut(&name) else {
            return no_sprite(&name);
        };
        if let Some(auth) = body.url_settings.and_then(|u| u.auth) {
            if auth != "sprite" && auth != "public" {
                return error(
                    StatusCode::BAD_REQUEST,
                    "invalid_url_auth",
                    format!("url_settings.auth must be sprite or public, not {auth}"),
                );
            }
            sprite.url_auth = auth;
        }
        if let Some(labels) = body.labels {
            sprite.labels = labels;
        }
        sprite.updated_at = Utc::now();
        sprite.clone()
    };
    match state.info(&sprite).await {
        Ok(info) => Json(info).into_response(),
        Err(e) => engine(e),
    }
}

async fn destroy(AxState(state): AxState<Shared>, Path(name): Path<String>) -> Response {
    let Some(sprite) = state.sprites.lock().await.remove(&name) else {
        return no_sprite(&name);
    };
    if let Err(e) = state.remove_container(&sprite.container).await {
        return engine(e);
    }
    for (_, image) in &sprite.checkpoints {
        state.remove_image(image).await;
    }
    state.deletes.fetch_add(1, Ordering::SeqCst);
    StatusCode::NO_CONTENT.into_response()
}

#[derive(Debug, Default, Deserialize)]
struct CheckpointBody {
    comment: Option<String>,
}

/// NDJSON progress lines, as the API streams them.
fn ndjson(lines: &[serde_json::Value]) -> Response {
    let body: String = lines.iter().map(|l| format!("{l}\n")).collect();
    ([(header::CONTENT_TYPE, "application/x-ndjson")], body).into_response()
}

async fn checkpoint(
    AxState(state): AxState<Shared>,
    Path(name): Path<String>,
    body: Option<Json<CheckpointBody>>,
) -> Response {
    let container = match state.wake(&name).await {
        Ok(Some(c)) => c,
        Ok(None) => return no_sprite(&name),
        Err(e) => return engine(e),
    };
    let id = {
        let sprites = state.sprites.lock().await;
        let n = sprites.get(&name).map_or(0, |s| s.checkpoints.len());
        format!("v{n}")
    };
    let image = match state.commit(&container, &id).await {
        Ok(image) => image,
        Err(e) => return ndjson(&[serde_json::json!({"type": "error", "error": e})]),
    };
    let record = Checkpoint {
        id: id.clone(),
        create_time: Utc::now(),
        comment: body.and_then(|Json(b)| b.comment),
    };
    match state.sprites.lock().await.get_mut(&name) {
        Some(sprite) => sprite.checkpoints.push((record, image)),
        None => return no_sprite(&name),
    }
    ndjson(&[
        serde_json::json!({"type": "info", "data": format!("Creating checkpoint {id}")}),
        serde_json::json!({"type": "info", "data": format!("Checkpoint {id} created")}),
    ])
}

async fn checkpoints(AxState(state): AxState<Shared>, Path(name): Path<String>) -> Response {
    match state.sprites.lock().await.get(&name) {
        Some(s) => {
            let list: Vec<Checkpoint> = s.checkpoints.iter().map(|(c, _)| c.clone()).collect();
            Json(list).into_response()
        }
        None => no_sprite(&name),
    }
}

async fn checkpoint_get(
    AxState(state): AxState<Shared>,
    Path((name, id)): Path<(String, String)>,
) -> Response {
    let sprites = state.sprites.lock().await;
    let Some(sprite) = sprites.get(&name) else {
        return no_sprite(&name);
    };
    match sprite.checkpoints.iter().find(|(c, _)| c.id == id) {
        Some((c, _)) => Json(c.clone()).into_response(),
        None => error(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("checkpoint {id} not found"),
        ),
    }
}

/// Restores a checkpoint: the container is replaced by one from the checkpoint's image, so
/// the filesystem rewinds and running processes end (as the service documents).
async fn restore(
    AxState(state): AxState<Shared>,
    Path((name, id)): Path<(String, String)>,
) -> Response {
    let sprite = {
        let mut sprites = state.sprites.lock().await;
        let Some(sprite) = sprites.get_mut(&name) else {
            return no_sprite(&name);
        };
        let Some((_, image)) = sprite.checkpoints.iter().find(|(c, _)| c.id == id) else {
            return error(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("checkpoint {id} not found"),
            );
        };
        sprite.image = image.clone();
        sprite.clone()
    };
    if let Err(e) = state.remove_container(&sprite.container).await {
        return engine(e);
    }
    if let Err(e) = state.create_container(&sprite).await {
        return engine(e);
    }
    if let Err(e) = state.wake(&name).await {
        return engine(e);
    }
    ndjson(&[serde_json::json!({"type": "info", "data": format!("Restored to {id}")})])
}

async fn policy_get(AxState(state): AxState<Shared>, Path(name): Path<String>) -> Response {
    if state.faults.fail_policy_reads.load(Ordering::SeqCst) {
        return engine("injected failure reading the network policy".into());
    }
    match state.sprites.lock().await.get(&name) {
        Some(s) => Json(s.policy.clone()).into_response(),
        None => no_sprite(&name),
    }
}

async fn policy_set(
    AxState(state): AxState<Shared>,
    Path(name): Path<String>,
    Json(policy): Json<NetworkPolicy>,
) -> Response {
    for rule in &policy.rules {
        let action_ok = matches!(rule.action.as_deref(), Some("allow") | Some("deny"));
        if rule.include.is_none() && (rule.domain.is_none() || !action_ok) {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_policy",
                "each rule needs a domain and an action of allow or deny",
            );
        }
    }
    match state.sprites.lock().await.get_mut(&name) {
        Some(s) => {
            s.policy = policy;
            StatusCode::NO_CONTENT.into_response()
        }
        None => no_sprite(&name),
    }
}

/// The query string as ordered pairs (repeated keys kept).
pub fn pairs(raw: Option<&str>) -> Vec<(String, String)> {
    url::form_urlencoded::parse(raw.unwrap_or("").as_bytes())
        .into_owned()
        .collect()
}

/// The first value of `key`.
pub fn first<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// Every value of `key`, in order.
pub fn all<'a>(pairs: &'a [(String, String)], key: &str) -> Vec<&'a str> {
    pairs
        .iter()
        .filter(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .collect()
}
