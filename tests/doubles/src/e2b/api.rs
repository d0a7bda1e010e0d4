//! The E2B control-plane API (`X-API-Key`), as the published OpenAPI spec describes it.
//!
//! Sandboxes: create, the v2 list (metadata and state filters, `limit`/`nextToken` paging
//! with `X-Next-Token`), detail, kill, pause (with or without memory), connect and the
//! deprecated resume, timeout and refreshes, and the in-place network update. Every error is
//! the spec's `{code, message}` body.

use std::collections::BTreeMap;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderValue, Response, StatusCode};
use axum::middleware::{self, Next};
use axum::response::IntoResponse;
use axum::routing::{get, post, put};
use base64::Engine as _;
use chrono::{DateTime, Duration, SecondsFormat, Utc};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::faults::{self, error_response};
use super::state::{Network, Power, Sandbox, Shared, new_sandbox_id, new_token};

/// The envd version the double reports.
pub const ENVD_VERSION: &str = "0.5.4";
/// E2B's default sandbox timeout and minimum refresh, in seconds.
const DEFAULT_TIMEOUT_SECS: i64 = 15;
/// Longest refresh E2B accepts, in seconds.
const MAX_REFRESH_SECS: i64 = 3600;
/// Page size bounds of the v2 list.
const MAX_PAGE: usize = 100;

/// An API error: status, message and optional `error_code`.
#[derive(Debug)]
pub(crate) struct ApiError(u16, String, Option<&'static str>);

impl ApiError {
    fn new(status: u16, message: impl Into<String>) -> Self {
        ApiError(status, message.into(), None)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response<Body> {
        error_response(self.0, &self.1, self.2)
    }
}

type ApiResult = Result<Response<Body>, ApiError>;

/// The API router.
pub(crate) fn router(shared: Shared) -> Router {
    let counters = shared.api_counters.clone();
    let authed = Router::new()
        .route("/sandboxes", post(create).get(list_v1))
        .route("/v2/sandboxes", get(list_v2))
        .route("/sandboxes/{sandboxID}", get(detail).delete(kill))
        .route("/sandboxes/{sandboxID}/pause", post(pause))
        .route("/sandboxes/{sandboxID}/resume", post(resume))
        .route("/sandboxes/{sandboxID}/connect", post(connect))
        .route("/sandboxes/{sandboxID}/timeout", post(set_timeout))
        .route("/sandboxes/{sandboxID}/refreshes", post(refresh))
        .route("/sandboxes/{sandboxID}/network", put(update_network))
        .route_layer(middleware::from_fn_with_state(shared.clone(), authenticate));
    Router::new()
        .route("/health", get(|| async { StatusCode::OK }))
        .merge(authed)
        .route_layer(middleware::from_fn(move |r: Request, n: Next| {
            faults::count(counters.clone(), r, n)
        }))
        .with_state(shared)
}

async fn authenticate(
    State(shared): State<Shared>,
    request: Request,
    next: Next,
) -> Response<Body> {
    let key = request
        .headers()
        .get("x-api-key")
        .and_then(|v| v.to_str().ok());
    match key {
        None => ApiError::new(401, "Authorization header is missing").into_response(),
        Some(key) if !shared.key_is_valid(key) => ApiError::new(
            401,
            "Invalid API key, please visit the dashboard to get a new one",
        )
        .into_response(),
        Some(_) => next.run(request).await,
    }
}

fn json_response(status: StatusCode, body: Value) -> Response<Body> {
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert("content-type", HeaderValue::from_static("application/json"));
    response
}

fn no_content() -> Response<Body> {
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::NO_CONTENT;
    response
}

/// Parses a JSON body; an empty body is `T::default()` only when `optional`.
fn parse<T: DeserializeOwned + Default>(body: &Bytes, optional: bool) -> Result<T, ApiError> {
    if body.is_empty() && optional {
        return Ok(T::default());
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::new(400, format!("Error when parsing request: {e}")))
}

fn not_found(id: &str) -> ApiError {
    ApiError::new(
        404,
        format!("sandbox \"{id}\" doesn't exist or you don't have access to it"),
    )
}

fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Nanos, true)
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct NewSandbox {
    #[serde(rename = "templateID")]
    template_id: String,
    timeout: Option<i64>,
    auto_pause: Option<bool>,
    secure: Option<bool>,
    #[serde(rename = "allow_internet_access")]
    allow_internet_access: Option<bool>,
    network: Option<Network>,
    metadata: Option<BTreeMap<String, String>>,
    env_vars: Option<BTreeMap<String, String>>,
}

fn is_ip_or_cidr(entry: &str) -> bool {
    let (ip, prefix) = match entry.split_once('/') {
        Some((ip, prefix)) => (ip, Some(prefix)),
        None => (entry, None),
    };
    let Ok(ip) = ip.parse::<std::net::IpAddr>() else {
        return false;
    };
    let max = if ip.is_ipv4() { 32 } else { 128 };
    prefix.is_none_or(|p| p.parse::<u8>().is_ok_and(|p| p <= max))
}

fn is_domain(entry: &str) -> bool {
    let name = entry.strip_prefix("*.").unwrap_or(entry);
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        })
}

fn validate_network(network: &Network) -> Result<(), ApiError> {
    for entry in network.allow_out.iter().flatten() {
        if !is_ip_or_cidr(entry) && !is_domain(entry) {
            return Err(ApiError::new(
                400,
                format!(
                    "invalid allowOut entry {entry:?}: expected a CIDR block, an IP address or a domain name"
                ),
            ));
        }
    }
    for entry in network.deny_out.iter().flatten() {
        if !is_ip_or_cidr(entry) {
            return Err(ApiError::new(
                400,
                format!(
                    "invalid denyOut entry {entry:?}: expected a CIDR block or an IP address (domain names are not supported for deny rules)"
                ),
            ));
        }
    }
    Ok(())
}

fn timeout_secs(requested: Option<i64>, shared: &Shared) -> Result<i64, ApiError> {
    let secs = requested.unwrap_or(DEFAULT_TIMEOUT_SECS).max(0);
    if secs as u64 > shared.max_timeout_secs {
        return Err(ApiError::new(
            400,
            format!(
                "Timeout cannot be greater than {} seconds",
                shared.max_timeout_secs
            ),
        ));
    }
    Ok(secs)
}

async fn create(State(shared): State<Shared>, body: Bytes) -> ApiResult {
    let request: NewSandbox = parse(&body, false)?;
    let Some(template) = shared.templates.get(&request.template_id).cloned() else {
        return Err(ApiError::new(
            404,
            format!("template '{}' not found", request.template_id),
        ));
    };
    let timeout = timeout_secs(request.timeout, &shared)?;
    let network = request.network.unwrap_or_default();
    validate_network(&network)?;
    if let Some(max) = shared.max_running {
        let running = shared
            .sandboxes
            .lock()
            .await
            .values()
            .filter(|s| s.power == Power::Running)
            .count();
        if running >= max {
            return Err(ApiError::new(
                429,
                format!("You have reached the maximum number of concurrent E2B sandboxes ({max})"),
            ));
        }
    }
    let id = new_sandbox_id();
    let env = request.env_vars.unwrap_or_default();
    let container = shared
        .engine
        .create(&id, &template.image, &env)
        .await
        .map_err(|e| {
            ApiError(
                500,
                format!("Failed to create sandbox: {e}"),
                Some("sandbox_create_failed"),
            )
        })?;
    let now = Utc::now();
    let sandbox = Sandbox {
        id: id.clone(),
        template_id: request.template_id,
        container,
        template,
        metadata: request.metadata.unwrap_or_default(),
        started_at: now,
        end_at: now + Duration::seconds(timeout),
        power: Power::Running,
        busy: false,
        auto_pause: request.auto_pause.unwrap_or(false),
        access_token: request.secure.unwrap_or(false).then(new_token),
        allow_internet_access: request.allow_internet_access,
        network,
        network_updates: 0,
        timeout_extensions: 0,
        pauses: 0,
        resumes: 0,
    };
    let body = created_body(&sandbox, &shared.domain);
    shared.sandboxes.lock().await.insert(id, sandbox);
    Ok(json_response(StatusCode::CREATED, body))
}

/// The spec's `Sandbox` (create, connect, resume responses).
fn created_body(s: &Sandbox, domain: &str) -> Value {
    let mut body = json!({
        "templateID": s.template_id,
        "sandboxID": s.id,
        "clientID": "00000000",
        "envdVersion": ENVD_VERSION,
        "trafficAccessToken": null,
        "domain": domain,
    });
    if let Some(token) = &s.access_token {
        body["envdAccessToken"] = Value::String(token.clone());
    }
    body
}

fn state_name(power: Power) -> &'static str {
    match power {
        Power::Running => "running",
        Power::Paused { .. } => "paused",
    }
}

/// The spec's `ListedSandbox`.
fn listed_body(s: &Sandbox) -> Value {
    json!({
        "templateID": s.template_id,
        "sandboxID": s.id,
        "clientID": "00000000",
        "startedAt": rfc3339(s.started_at),
        "endAt": rfc3339(s.end_at),
        "cpuCount": s.template.cpu_count,
        "memoryMB": s.template.memory_mb,
        "diskSizeMB": s.template.disk_size_mb,
        "metadata": s.metadata,
        "state": state_name(s.power),
        "envdVersion": ENVD_VERSION,
    })
}

/// A listing entry, with the timestamps the history mode leaves out removed.
fn listing_entry(shared: &Shared, s: &Sandbox) -> Value {
    let mut body = listed_body(s);
    if let Some(fields) = body.as_object_mut() {
        let mode = shared.faults.history();
        if !mode.listing_keeps(Utc::now() - s.started_at) {
            fields.remove("startedAt");
            fields.remove("endAt");
        }
    }
    body
}

/// The spec's `SandboxDetail`.
fn detail_body(s: &Sandbox, domain: &str) -> Value {
    let mut body = listed_body(s);
    body["domain"] = Value::String(domain.to_string());
    body["network"] = serde_json::to_value(&s.network).unwrap_or(Value::Null);
    body["lifecycle"] = json!({
        "autoResume": false,
        "onTimeout": if s.auto_pause { "pause" } else { "kill" },
    });
    body["allowInternetAccess"] = s.allow_internet_access.map_or(Value::Null, Value::Bool);
    if let Some(token) = &s.access_token {
        body["envdAccessToken"] = Value::String(token.clone());
    }
    body
}

#[derive(Debug, Default, Deserialize)]
struct ListParams {
    metadata: Option<String>,
    state: Option<String>,
    order: Option<String>,
    #[serde(rename = "nextToken")]
    next_token: Option<String>,
    limit: Option<String>,
    template: Option<String>,
}

/// `user=abc&app=prod`, each key and value URL-encoded once more inside the parameter.
fn parse_metadata_filter(raw: &str) -> Result<BTreeMap<String, String>, ApiError> {
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8()
            .map(|c| c.into_owned())
            .map_err(|_| ApiError::new(400, "metadata filter is not valid UTF-8 after decoding"))
    };
    let mut filters = BTreeMap::new();
    for pair in raw.split('&').filter(|p| !p.is_empty()) {
        let Some((key, value)) = pair.split_once('=') else {
            return Err(ApiError::new(400, "invalid key value pair in query"));
        };
        filters.insert(decode(key)?, decode(value)?);
    }
    Ok(filters)
}

fn page_token(s: &Sandbox) -> String {
    let raw = format!("{}__{}", rfc3339(s.started_at), s.id);
    base64::engine::general_purpose::URL_SAFE.encode(raw)
}

fn parse_page_token(token: &str) -> Result<(DateTime<Utc>, String), ApiError> {
    let invalid = || ApiError::new(400, "Error parsing nextToken: invalid cursor");
    let raw = base64::engine::general_purpose::URL_SAFE
        .decode(token)
        .map_err(|_| invalid())?;
    let raw = String::from_utf8(raw).map_err(|_| invalid())?;
    let (time, id) = raw.split_once("__").ok_or_else(invalid)?;
    let time = DateTime::parse_from_rfc3339(time).map_err(|_| invalid())?;
    Ok((time.with_timezone(&Utc), id.to_string()))
}

async fn list_v2(State(shared): State<Shared>, Query(params): Query<ListParams>) -> ApiResult {
    let filters = params
        .metadata
        .as_deref()
        .map(parse_metadata_filter)
        .transpose()?
        .unwrap_or_default();
    let states: Vec<&str> = match params.state.as_deref() {
        None | Some("") => vec!["running", "paused"],
        Some(list) => list.split(',').collect(),
    };
    if let Some(bad) = states.iter().find(|s| !matches!(**s, "running" | "paused")) {
        return Err(ApiError::new(
            400,
            format!("invalid state {bad:?}: expected running or paused"),
        ));
    }
    let limit = match params.limit.as_deref() {
        None => MAX_PAGE,
        Some(raw) => match raw.parse::<usize>() {
            Ok(n) if (1..=MAX_PAGE).contains(&n) => n,
            _ => {
                return Err(ApiError::new(
                    400,
                    format!("limit must be an integer between 1 and {MAX_PAGE}"),
                ));
            }
        },
    };
    let ascending = match params.order.as_deref() {
        None | Some("desc") => false,
        Some("asc") => true,
        Some(other) => return Err(ApiError::new(400, format!("invalid order {other:?}"))),
    };
    let after = params
        .next_token
        .as_deref()
        .map(parse_page_token)
        .transpose()?;

    let sandboxes = shared.sandboxes.lock().await;
    let mut matching: Vec<&Sandbox> = sandboxes
        .values()
        .filter(|s| states.contains(&state_name(s.power)))
        .filter(|s| params.template.as_ref().is_none_or(|t| &s.template_id == t))
        .filter(|s| filters.iter().all(|(k, v)| s.metadata.get(k) == Some(v)))
        .collect();
    let key = |s: &Sandbox| (s.started_at, s.id.clone());
    matching.sort_by_key(|s| key(s));
    if !ascending {
        matching.reverse();
    }
    if let Some(cursor) = after {
        matching.retain(|s| {
            let k = key(s);
            if ascending { k > cursor } else { k < cursor }
        });
    }
    let limit = limit.min(shared.page_cap);
    let more = matching.len() > limit;
    matching.truncate(limit);
    let body = Value::Array(matching.iter().map(|s| listing_entry(&shared, s)).collect());
    let mut response = json_response(StatusCode::OK, body);
    if more
        && let Some(last) = matching.last()
        && let Ok(token) = HeaderValue::from_str(&page_token(last))
    {
        response.headers_mut().insert("x-next-token", token);
    }
    Ok(response)
}

/// The deprecated v1 list: running sandboxes only, metadata filter, no paging.
async fn list_v1(State(shared): State<Shared>, Query(params): Query<ListParams>) -> ApiResult {
    let filters = params
        .metadata
        .as_deref()
        .map(parse_metadata_filter)
        .transpose()?
        .unwrap_or_default();
    let sandboxes = shared.sandboxes.lock().await;
    let body: Vec<Value> = sandboxes
        .values()
        .filter(|s| s.power == Power::Running)
        .filter(|s| filters.iter().all(|(k, v)| s.metadata.get(k) == Some(v)))
        .map(|s| listing_entry(&shared, s))
        .collect();
    Ok(json_response(StatusCode::OK, Value::Array(body)))
}

async fn detail(State(shared): State<Shared>, Path(id): Path<String>) -> ApiResult {
    let sandboxes = shared.sandboxes.lock().await;
    let sandbox = sandboxes.get(&id).ok_or_else(|| not_found(&id))?;
    Ok(json_response(
        StatusCode::OK,
        detail_body(sandbox, &shared.domain),
    ))
}

async fn kill(State(shared): State<Shared>, Path(id): Path<String>) -> ApiResult {
    let removed = shared.sandboxes.lock().await.remove(&id);
    let sandbox = removed.ok_or_else(|| not_found(&id))?;
    shared
        .engine
        .remove(&sandbox.container)
        .await
        .map_err(|e| ApiError::new(500, format!("Error killing sandbox: {e}")))?;
    Ok(no_content())
}

/// Marks `id` busy for a transition, after `check` accepted its current record.
async fn begin(
    shared: &Shared,
    id: &str,
    check: impl FnOnce(&Sandbox) -> Result<(), ApiError>,
) -> Result<Sandbox, ApiError> {
    let mut sandboxes = shared.sandboxes.lock().await;
    let sandbox = sandboxes.get_mut(id).ok_or_else(|| not_found(id))?;
    if sandbox.busy {
        return Err(ApiError::new(
            409,
            format!("Sandbox '{id}' is changing state, try again"),
        ));
    }
    check(sandbox)?;
    sandbox.busy = true;
    Ok(sandbox.clone())
}

/// Ends a transition: applies `update` to the record (if it still exists) and clears busy.
async fn finish(shared: &Shared, id: &str, update: impl FnOnce(&mut Sandbox)) -> Option<Sandbox> {
    let mut sandboxes = shared.sandboxes.lock().await;
    let sandbox = sandboxes.get_mut(id)?;
    update(sandbox);
    sandbox.busy = false;
    Some(sandbox.clone())
}

#[derive(Debug, Deserialize)]
struct PauseRequest {
    #[serde(default = "yes")]
    memory: bool,
}

impl Default for PauseRequest {
    fn default() -> Self {
        PauseRequest { memory: true }
    }
}

fn yes() -> bool {
    true
}

async fn pause(State(shared): State<Shared>, Path(id): Path<String>, body: Bytes) -> ApiResult {
    let request: PauseRequest = parse(&body, true)?;
    let sandbox = begin(&shared, &id, |s| match s.power {
        Power::Paused { .. } => Err(ApiError::new(
            409,
            format!("Error pausing sandbox - sandbox '{id}' is already paused"),
        )),
        Power::Running => Ok(()),
    })
    .await?;
    pause_container(&shared, &sandbox, request.memory)
        .await
        .map_err(|e| ApiError::new(500, format!("Error pausing sandbox: {e}")))?;
    Ok(no_content())
}

/// Pauses a sandbox already marked busy, and records it.
pub(crate) async fn pause_container(
    shared: &Shared,
    sandbox: &Sandbox,
    memory: bool,
) -> Result<(), super::engine::EngineError> {
    let result = if memory {
        shared.engine.pause(&sandbox.container).await
    } else {
        shared.engine.stop(&sandbox.container).await
    };
    finish(shared, &sandbox.id, |s| {
        if result.is_ok() {
            s.power = Power::Paused { memory };
            s.end_at = Utc::now();
            s.pauses += 1;
        }
    })
    .await;
    result
}

#[derive(Debug, Default, Deserialize)]
struct TimeoutRequest {
    timeout: Option<i64>,
}

/// Resumes a paused sandbox (already marked busy) with a fresh timeout.
async fn resume_container(shared: &Shared, sandbox: &Sandbox, timeout: i64) -> ApiResult {
    let result = match sandbox.power {
        Power::Paused { memory: true } => shared.engine.unpause(&sandbox.container).await,
        Power::Paused { memory: false } => shared.engine.start(&sandbox.container).await,
        Power::Running => Ok(()),
    };
    let updated = finish(shared, &sandbox.id, |s| {
        if result.is_ok() {
            s.power = Power::Running;
            s.end_at = Utc::now() + Duration::seconds(timeout);
            s.resumes += 1;
        }
    })
    .await;
    result.map_err(|e| ApiError::new(500, format!("Error resuming sandbox: {e}")))?;
    let updated = updated.ok_or_else(|| not_found(&sandbox.id))?;
    Ok(json_response(
        StatusCode::CREATED,
        created_body(&updated, &shared.domain),
    ))
}

async fn connect(State(shared): State<Shared>, Path(id): Path<String>, body: Bytes) -> ApiResult {
    let request: TimeoutRequest = parse(&body, false)?;
    let timeout = timeout_secs(Some(request.timeout.unwrap_or(0)), &shared)?;
    {
        let mut sandboxes = shared.sandboxes.lock().await;
        let sandbox = sandboxes.get_mut(&id).ok_or_else(|| not_found(&id))?;
        if sandbox.power == Power::Running && !sandbox.busy {
            // TTL is only ever extended by connect.
            let wanted = Utc::now() + Duration::seconds(timeout);
            if wanted > sandbox.end_at {
                sandbox.end_at = wanted;
                sandbox.timeout_extensions += 1;
            }
            return Ok(json_response(
                StatusCode::OK,
                created_body(sandbox, &shared.domain),
            ));
        }
    }
    let sandbox = begin(&shared, &id, |_| Ok(())).await?;
    resume_container(&shared, &sandbox, timeout).await
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ResumeRequest {
    timeout: Option<i64>,
}

async fn resume(State(shared): State<Shared>, Path(id): Path<String>, body: Bytes) -> ApiResult {
    let request: ResumeRequest = parse(&body, false)?;
    let timeout = timeout_secs(request.timeout, &shared)?;
    let sandbox = begin(&shared, &id, |s| match s.power {
        Power::Running => Err(ApiError::new(
            409,
            format!("Sandbox {id} is already running"),
        )),
        Power::Paused { .. } => Ok(()),
    })
    .await?;
    resume_container(&shared, &sandbox, timeout).await
}

async fn set_timeout(
    State(shared): State<Shared>,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult {
    let request: TimeoutRequest = parse(&body, false)?;
    let timeout = timeout_secs(Some(request.timeout.unwrap_or(0)), &shared)?;
    let mut sandboxes = shared.sandboxes.lock().await;
    // A paused sandbox is not in the orchestrator, so E2B answers 404 for it too.
    let sandbox = sandboxes
        .get_mut(&id)
        .filter(|s| s.power == Power::Running)
        .ok_or_else(|| not_found(&id))?;
    sandbox.end_at = Utc::now() + Duration::seconds(timeout);
    sandbox.timeout_extensions += 1;
    Ok(no_content())
}

#[derive(Debug, Default, Deserialize)]
struct RefreshRequest {
    duration: Option<i64>,
}

async fn refresh(State(shared): State<Shared>, Path(id): Path<String>, body: Bytes) -> ApiResult {
    let request: RefreshRequest = parse(&body, true)?;
    let duration = request.duration.unwrap_or(DEFAULT_TIMEOUT_SECS);
    if !(0..=MAX_REFRESH_SECS).contains(&duration) {
        return Err(ApiError::new(
            400,
            format!("duration must be between 0 and {MAX_REFRESH_SECS} seconds"),
        ));
    }
    let mut sandboxes = shared.sandboxes.lock().await;
    let sandbox = sandboxes
        .get_mut(&id)
        .filter(|s| s.power == Power::Running)
        .ok_or_else(|| not_found(&id))?;
    // A refresh only extends, and never by less than the default timeout.
    let wanted = Utc::now() + Duration::seconds(duration.max(DEFAULT_TIMEOUT_SECS));
    if wanted > sandbox.end_at {
        sandbox.end_at = wanted;
        sandbox.timeout_extensions += 1;
    }
    Ok(no_content())
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct NetworkUpdate {
    allow_out: Option<Vec<String>>,
    deny_out: Option<Vec<String>>,
    #[serde(rename = "allow_internet_access")]
    allow_internet_access: Option<bool>,
}

async fn update_network(
    State(shared): State<Shared>,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult {
    let update: NetworkUpdate = parse(&body, false)?;
    let network = Network {
        allow_out: update.allow_out,
        deny_out: update.deny_out,
        ..Network::default()
    };
    validate_network(&network)?;
    let mut sandboxes = shared.sandboxes.lock().await;
    let sandbox = sandboxes.get_mut(&id).ok_or_else(|| not_found(&id))?;
    if sandbox.power != Power::Running || sandbox.busy {
        return Err(ApiError::new(
            409,
            format!(
                "Sandbox '{id}' is not running; the network can only be updated on a running sandbox"
            ),
        ));
    }
    // The update replaces the egress rules: an omitted field is cleared.
    sandbox.network.allow_out = network.allow_out;
    sandbox.network.deny_out = network.deny_out;
    sandbox.allow_internet_access = update.allow_internet_access;
    sandbox.network_updates += 1;
    Ok(no_content())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_filters_decode_keys_and_values_once_more() {
        let parsed = parse_metadata_filter("sandboxes.dev%2Fowner=ns.a%26b&x=1").unwrap();
        assert_eq!(
            parsed.get("sandboxes.dev/owner").map(String::as_str),
            Some("ns.a&b")
        );
        assert_eq!(parsed.get("x").map(String::as_str), Some("1"));
        assert!(parse_metadata_filter("novalue").is_err());
    }

    #[test]
    fn network_entries_are_checked_like_the_spec_says() {
        assert!(is_ip_or_cidr("8.8.8.8") && is_ip_or_cidr("0.0.0.0/0") && is_ip_or_cidr("::1/128"));
        assert!(!is_ip_or_cidr("10.0.0.0/33") && !is_ip_or_cidr("example.com"));
        assert!(is_domain("example.com") && is_domain("*.example.com"));
        assert!(!is_domain("exa mple.com") && !is_domain("a..b"));
        let deny_domain = Network {
            deny_out: Some(vec!["example.com".into()]),
            ..Network::default()
        };
        assert!(validate_network(&deny_domain).is_err());
    }

    #[test]
    fn page_tokens_round_trip() {
        let t = Utc::now();
        let raw = base64::engine::general_purpose::URL_SAFE.encode(format!("{}__abc", rfc3339(t)));
        let (time, id) = parse_page_token(&raw).unwrap();
        assert_eq!((time, id.as_str()), (t, "abc"));
        assert!(parse_page_token("!!").is_err());
    }
}
