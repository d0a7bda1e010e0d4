//! Machine endpoints: list, create, get, update, destroy, start/stop/suspend, wait, exec and
//! metadata. Paths, bodies and status codes follow the published Machines API; where the API
//! leaves a status code open, the choice is written on the handler.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use chrono::{Duration as ChronoDuration, Utc};
use serde_json::{Value, json};

use super::Shared;
use super::faults::lock;
use super::lifecycle::{Op, schedule};
use super::store::{ApiError, ApiResult, LeaseRec, MachineRec, random_id};
use super::wire::{ConfigView, ExecRequest, ExecResponse, MachineRequest, StopRequest};

/// The lease nonce header.
pub const NONCE_HEADER: &str = "fly-machine-lease-nonce";
/// Longest wait the endpoint accepts, as the API's proxy does.
const MAX_WAIT_SECS: u64 = 60;
/// Default exec timeout in seconds.
const DEFAULT_EXEC_SECS: u64 = 30;

type Shared_ = State<Arc<Shared>>;

/// Query parameters as (key, value) pairs; keys may repeat (`state=started&state=stopped`).
pub fn query_pairs(raw: &Option<String>) -> Vec<(String, String)> {
    url::form_urlencoded::parse(raw.as_deref().unwrap_or("").as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

fn param<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

fn truthy(value: Option<&str>) -> bool {
    matches!(value, Some("true" | "1"))
}

/// Parses a JSON body, answering 400 with the API's error shape when it is not valid.
pub fn parse_body<T: serde::de::DeserializeOwned + Default>(body: &Bytes) -> ApiResult<T> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("invalid body: {e}")))
}

fn nonce(headers: &HeaderMap) -> Option<String> {
    headers
        .get(NONCE_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// `GET /v1/apps/{app}/machines`: `include_deleted`, `region`, `state` (comma list) and
/// `metadata.{key}` filters (all must match). Without `limit` the answer is the whole list as
/// a JSON array, as documented; with `limit` (and `cursor`) it is one page,
/// `{"machines": [...], "next_cursor": "..."}`, with `next_cursor` absent on the last page;
/// a page holds at most `max_page_size` machines, whatever `limit` asks for.
pub async fn list(
    State(shared): Shared_,
    Path(app): Path<String>,
    RawQuery(raw): RawQuery,
) -> ApiResult<Response> {
    let pairs = query_pairs(&raw);
    let include_deleted = truthy(param(&pairs, "include_deleted"));
    let region = param(&pairs, "region");
    let states: Option<Vec<&str>> = param(&pairs, "state").map(|s| s.split(',').collect());
    let metadata: Vec<(&str, &str)> = pairs
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix("metadata.")?, v.as_str())))
        .collect();
    let limit = match param(&pairs, "limit") {
        Some(l) => Some(
            l.parse::<usize>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| ApiError::bad_request("limit must be a positive integer"))?,
        ),
        None => None,
    };
    let limit = limit.map(|l| l.min(shared.options.max_page_size.max(1)));
    let cursor = param(&pairs, "cursor").unwrap_or("");
    let store = lock(&shared.store);
    store.app(&app)?;
    let selected: Vec<&MachineRec> = store
        .machines
        .values()
        .filter(|m| m.app == app && (include_deleted || !m.deleted))
        .filter(|m| region.is_none_or(|r| m.region == r))
        .filter(|m| {
            states
                .as_ref()
                .is_none_or(|s| s.contains(&m.state.as_str()))
        })
        .filter(|m| {
            let view = m.view();
            metadata
                .iter()
                .all(|(k, v)| view.metadata.get(*k).map(String::as_str) == Some(*v))
        })
        .collect();
    let Some(limit) = limit else {
        let all: Vec<Value> = selected.iter().map(|m| listed(&shared, m)).collect();
        return Ok(Json(all).into_response());
    };
    let rest: Vec<&&MachineRec> = selected.iter().filter(|m| m.id.as_str() > cursor).collect();
    let page: Vec<Value> = rest
        .iter()
        .take(limit)
        .map(|m| listed(&shared, m))
        .collect();
    let mut body = json!({ "machines": page });
    if rest.len() > limit {
        body["next_cursor"] = json!(rest[limit - 1].id);
    }
    Ok(Json(body).into_response())
}

/// A machine as a listing entry, cut down by the history fault mode.
fn listed(shared: &Shared, machine: &MachineRec) -> Value {
    let mut json = machine.to_json();
    shared.faults.shape_history(&mut json, true);
    json
}

/// A machine as a `GET` of it answers, cut down by the history fault mode.
fn fetched(shared: &Shared, machine: &MachineRec) -> Value {
    let mut json = machine.to_json();
    shared.faults.shape_history(&mut json, false);
    json
}

/// `POST /v1/apps/{app}/machines`. A taken name is 409; an image the engine does not have is
/// 422 (images are never pulled); more than one mount, or a volume attached elsewhere, is
/// refused as the API does.
pub async fn create(
    State(shared): Shared_,
    Path(app): Path<String>,
    body: Bytes,
) -> ApiResult<Response> {
    let request: MachineRequest = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("invalid body: {e}")))?;
    let view = config_view(&request.config)?;
    if !shared
        .engine
        .has_image(&view.image)
        .await
        .map_err(ApiError::internal)?
    {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!(
                "image {:?} not found (the double never pulls images)",
                view.image
            ),
        ));
    }
    let id = random_id(14);
    let container = format!("flydbl-{}-{id}", shared.instance);
    let lease = reserve(&shared, &app, &id, &container, &request, &view)?;
    let volumes = shared.docker_volumes();
    if let Err(e) = shared.engine.create(&container, &id, &view, &volumes).await {
        release_reservation(&shared, &id);
        return Err(ApiError::internal(e));
    }
    if !request.skip_launch {
        schedule(
            &shared,
            &id,
            Op::Start {
                from: "created".into(),
            },
        );
    }
    let store = lock(&shared.store);
    let mut body = fetched(&shared, store.machine(&app, &id)?);
    if let Some(nonce) = lease {
        body["nonce"] = json!(nonce);
    }
    Ok(Json(body).into_response())
}

fn config_view(config: &Value) -> ApiResult<ConfigView> {
    let view: ConfigView = serde_json::from_value(config.clone())
        .map_err(|e| ApiError::bad_request(format!("invalid config: {e}")))?;
    if view.image.trim().is_empty() {
        return Err(ApiError::bad_request("config.image is required"));
    }
    if view.mounts.len() > 1 {
        return Err(ApiError::bad_request(
            "only one volume can be mounted per machine",
        ));
    }
    Ok(view)
}

/// Inserts the machine record (state `created`) and attaches its volume, under the lock, so
/// two concurrent creates cannot take one name or one volume. Returns the lease nonce when
/// `lease_ttl` asked for one.
fn reserve(
    shared: &Shared,
    app: &str,
    id: &str,
    container: &str,
    request: &MachineRequest,
    view: &ConfigView,
) -> ApiResult<Option<String>> {
    let mut store = lock(&shared.store);
    store.app(app)?;
    let name = request.name.clone().unwrap_or_else(|| format!("m-{id}"));
    if store
        .machines
        .values()
        .any(|m| m.app == app && !m.deleted && m.name == name)
    {
        return Err(ApiError::conflict(format!(
            "a machine named {name:?} already exists in app {app}"
        )));
    }
    for mount in &view.mounts {
        let volume = store.volume_mut(app, &mount.volume)?;
        if volume.body.state == "destroyed" {
            return Err(ApiError::not_found(format!(
                "volume {} not found",
                mount.volume
            )));
        }
        if let Some(other) = &volume.body.attached_machine_id {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                format!(
                    "volume {} is already attached to machine {other}",
                    mount.volume
                ),
            ));
        }
    }
    for mount in &view.mounts {
        store
            .volume_mut(app, &mount.volume)?
            .body
            .attached_machine_id = Some(id.to_string());
    }
    let now = Utc::now();
    let lease = request.lease_ttl.map(|ttl| LeaseRec {
        nonce: random_id(32),
        expires: now + ChronoDuration::seconds(ttl as i64),
        description: "created with lease_ttl".into(),
    });
    let nonce = lease.as_ref().map(|l| l.nonce.clone());
    let mut record = MachineRec {
        id: id.to_string(),
        app: app.to_string(),
        name,
        region: request
            .region
            .clone()
            .unwrap_or_else(|| shared.options.region.clone()),
        state: "created".into(),
        instance_id: random_id(26).to_uppercase(),
        config: request.config.clone(),
        created_at: now,
        updated_at: now,
        events: Vec::new(),
        lease,
        snapshot: false,
        seq: 0,
        busy: 0,
        container: container.to_string(),
        deleted: false,
        private_ip: format!("fdaa:0:1:a7b:{}::2", random_id(4)),
    };
    record.event("launch", "created", "user", None);
    store.machines.insert(id.to_string(), record);
    Ok(nonce)
}

fn release_reservation(shared: &Shared, id: &str) {
    let mut store = lock(&shared.store);
    store.machines.remove(id);
    for volume in store.volumes.values_mut() {
        if volume.body.attached_machine_id.as_deref() == Some(id) {
            volume.body.attached_machine_id = None;
        }
    }
}

/// `GET /v1/apps/{app}/machines/{id}`.
pub async fn get(
    State(shared): Shared_,
    Path((app, id)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    let store = lock(&shared.store);
    Ok(Json(fetched(&shared, store.machine(&app, &id)?)))
}

/// `POST /v1/apps/{app}/machines/{id}`: the whole config is replaced (there are no partial
/// updates), the machine gets a new `instance_id`, and it reboots if it was running. Changing
/// the mounted volume is refused, as documented.
pub async fn update(
    State(shared): Shared_,
    Path((app, id)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Json<Value>> {
    let request: MachineRequest = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("invalid body: {e}")))?;
    let view = config_view(&request.config)?;
    if !shared
        .engine
        .has_image(&view.image)
        .await
        .map_err(ApiError::internal)?
    {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("image {:?} not found", view.image),
        ));
    }
    let op = {
        let mut store = lock(&shared.store);
        let m = store.machine_mut(&app, &id)?;
        m.check_lease(nonce(&headers).as_deref())?;
        let previous = m.view();
        if previous.mounts != view.mounts {
            return Err(ApiError::bad_request(
                "the mounted volume of a machine cannot be changed by an update; create a new machine",
            ));
        }
        if m.state == "destroying" {
            return Err(ApiError::precondition("machine is being destroyed"));
        }
        let was_running = matches!(m.state.as_str(), "started" | "starting" | "replacing");
        m.config = request.config.clone();
        m.instance_id = random_id(26).to_uppercase();
        Op::Update {
            previous: Box::new(previous),
            boot: was_running || !request.skip_launch,
            was_running,
        }
    };
    schedule(&shared, &id, op);
    let store = lock(&shared.store);
    Ok(Json(fetched(&shared, store.machine(&app, &id)?)))
}

/// `DELETE /v1/apps/{app}/machines/{id}?force=true`: a running machine without `force`
/// (or `kill`) is refused with 412.
pub async fn destroy(
    State(shared): Shared_,
    Path((app, id)): Path<(String, String)>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
) -> ApiResult<Json<Value>> {
    let pairs = query_pairs(&raw);
    let force = truthy(param(&pairs, "force")) || truthy(param(&pairs, "kill"));
    {
        let mut store = lock(&shared.store);
        let m = store.machine_mut(&app, &id)?;
        m.check_lease(nonce(&headers).as_deref())?;
        if m.state == "destroying" {
            return Ok(Json(json!({"ok": true})));
        }
        if !force && matches!(m.state.as_str(), "started" | "starting" | "replacing") {
            return Err(ApiError::precondition(format!(
                "unable to destroy machine {id}: it is {}; stop it first or pass force=true",
                m.state
            )));
        }
    }
    schedule(&shared, &id, Op::Destroy);
    Ok(Json(json!({"ok": true})))
}

/// `POST .../start`: from `created`, `stopped`, `suspended` or `failed`. Starting a machine
/// that is already started or starting changes nothing.
pub async fn start(
    State(shared): Shared_,
    Path((app, id)): Path<(String, String)>,
    headers: HeaderMap,
) -> ApiResult<Json<Value>> {
    let from = {
        let mut store = lock(&shared.store);
        let m = store.machine_mut(&app, &id)?;
        m.check_lease(nonce(&headers).as_deref())?;
        match m.state.as_str() {
            "created" | "stopped" | "suspended" | "failed" => m.state.clone(),
            "started" | "starting" | "replacing" => {
                return Ok(Json(json!({"previous_state": m.state})));
            }
            other => {
                return Err(ApiError::precondition(format!(
                    "unable to start machine from current state: {other}"
                )));
            }
        }
    };
    schedule(&shared, &id, Op::Start { from: from.clone() });
    Ok(Json(json!({"previous_state": from})))
}

/// `POST .../stop` with an optional `{signal, timeout}` body. Stopping a suspended machine
/// discards its snapshot. Stopping a stopped one changes nothing.
pub async fn stop(
    State(shared): Shared_,
    Path((app, id)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Json<Value>> {
    let request: StopRequest = parse_body(&body)?;
    let timeout = request.timeout.as_ref().and_then(parse_go_duration);
    let from = {
        let mut store = lock(&shared.store);
        let m = store.machine_mut(&app, &id)?;
        m.check_lease(nonce(&headers).as_deref())?;
        match m.state.as_str() {
            "started" | "starting" | "suspended" | "suspending" | "replacing" => m.state.clone(),
            "stopped" | "created" | "stopping" | "failed" => {
                return Ok(Json(json!({"ok": true})));
            }
            other => {
                return Err(ApiError::precondition(format!(
                    "unable to stop machine from current state: {other}"
                )));
            }
        }
    };
    schedule(&shared, &id, Op::Stop { from, timeout });
    Ok(Json(json!({"ok": true})))
}

/// `POST .../suspend`: only a started machine; a machine that cannot be snapshotted (more
/// than 2 GB of memory, swap, a schedule) is refused with 412, so a client must fall back to
/// a stop itself.
pub async fn suspend(
    State(shared): Shared_,
    Path((app, id)): Path<(String, String)>,
    headers: HeaderMap,
) -> ApiResult<Json<Value>> {
    {
        let mut store = lock(&shared.store);
        let m = store.machine_mut(&app, &id)?;
        m.check_lease(nonce(&headers).as_deref())?;
        match m.state.as_str() {
            "suspended" | "suspending" => return Ok(Json(json!({"ok": true}))),
            "started" => {}
            other => {
                return Err(ApiError::precondition(format!(
                    "unable to suspend machine from current state: {other}"
                )));
            }
        }
        if let Some(why) = suspend_ineligible(&m.view()) {
            return Err(ApiError::precondition(format!(
                "machine {id} cannot be suspended: {why}"
            )));
        }
    }
    schedule(&shared, &id, Op::Suspend);
    Ok(Json(json!({"ok": true})))
}

fn suspend_ineligible(view: &ConfigView) -> Option<&'static str> {
    let memory = view.guest.as_ref().and_then(|g| g.memory_mb).unwrap_or(256);
    if memory > 2048 {
        Some("memory over 2048 MB")
    } else if view.init.swap_size_mb.is_some_and(|s| s > 0) {
        Some("swap is configured")
    } else if view.schedule.is_some() {
        Some("a schedule is configured")
    } else {
        None
    }
}

/// `GET .../wait?state=…&timeout=…`: 200 once the machine is in one of the states (`state`
/// may repeat; default `started`), 408 when `timeout` seconds (default and maximum 60) pass
/// first. Waiting for `destroyed` on a machine that is gone succeeds.
pub async fn wait(
    State(shared): Shared_,
    Path((app, id)): Path<(String, String)>,
    RawQuery(raw): RawQuery,
) -> ApiResult<Json<Value>> {
    let pairs = query_pairs(&raw);
    let mut states: Vec<String> = pairs
        .iter()
        .filter(|(k, _)| k == "state")
        .flat_map(|(_, v)| v.split(',').map(str::to_string))
        .collect();
    if states.is_empty() {
        states.push("started".into());
    }
    if let Some(bad) = states.iter().find(|s| {
        !matches!(
            s.as_str(),
            "started" | "stopped" | "suspended" | "destroyed"
        )
    }) {
        return Err(ApiError::bad_request(format!(
            "invalid state {bad:?}: wait accepts started, stopped, suspended or destroyed"
        )));
    }
    let secs = match param(&pairs, "timeout") {
        Some(t) => t
            .parse::<u64>()
            .map_err(|_| ApiError::bad_request("timeout must be a whole number of seconds"))?,
        None => MAX_WAIT_SECS,
    }
    .clamp(1, MAX_WAIT_SECS);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        let notified = shared.changed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        {
            let store = lock(&shared.store);
            store.app(&app)?;
            let machine = store.machines.get(&id).filter(|m| m.app == app);
            let state = match machine {
                Some(m) if m.deleted => "destroyed",
                Some(m) => m.state.as_str(),
                None if states.iter().any(|s| s == "destroyed") => "destroyed",
                None => return Err(ApiError::not_found(format!("machine {id} not found"))),
            };
            if states.iter().any(|s| s == state) {
                return Ok(Json(json!({"ok": true, "state": state})));
            }
        }
        if tokio::time::timeout_at(deadline, notified).await.is_err() {
            return Err(ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                format!("deadline_exceeded: machine {id} did not reach {states:?} within {secs}s"),
            ));
        }
    }
}

/// `POST .../exec`: `{command: [...], stdin, timeout}` (or the deprecated `cmd` string) on a
/// started machine (412 otherwise). Output comes back as JSON text: bytes that are not UTF-8
/// are replaced, as a JSON string from the real API would carry them. A command that outlives
/// `timeout` is answered with 408 (its process is not killed).
pub async fn exec(
    State(shared): Shared_,
    Path((app, id)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult<Json<ExecResponse>> {
    let request: ExecRequest = parse_body(&body)?;
    let argv = if request.command.is_empty() {
        request
            .cmd
            .as_deref()
            .unwrap_or("")
            .split_whitespace()
            .map(str::to_string)
            .collect()
    } else {
        request.command.clone()
    };
    if argv.is_empty() {
        return Err(ApiError::bad_request("command is required"));
    }
    let container = {
        let store = lock(&shared.store);
        let m = store.machine(&app, &id)?;
        if m.state != "started" {
            return Err(ApiError::precondition(format!(
                "machine {id} is {}, not started",
                m.state
            )));
        }
        m.container.clone()
    };
    let secs = request.timeout.unwrap_or(DEFAULT_EXEC_SECS).max(1);
    let run = shared.engine.exec(&container, argv, request.stdin.clone());
    match tokio::time::timeout(Duration::from_secs(secs), run).await {
        Ok(Ok(out)) => Ok(Json(ExecResponse {
            exit_code: out.exit_code,
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })),
        Ok(Err(e)) => Err(ApiError::internal(e)),
        Err(_) => Err(ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            format!("deadline_exceeded: command did not finish within {secs}s"),
        )),
    }
}

/// `GET .../metadata`.
pub async fn metadata(
    State(shared): Shared_,
    Path((app, id)): Path<(String, String)>,
) -> ApiResult<Json<BTreeMap<String, String>>> {
    let store = lock(&shared.store);
    Ok(Json(store.machine(&app, &id)?.view().metadata))
}

/// `POST .../metadata/{key}` with `{"value": "..."}` → 204.
pub async fn set_metadata(
    State(shared): Shared_,
    Path((app, id, key)): Path<(String, String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<StatusCode> {
    #[derive(serde::Deserialize, Default)]
    struct SetValue {
        value: Option<String>,
    }
    let value = parse_body::<SetValue>(&body)?
        .value
        .ok_or_else(|| ApiError::bad_request("value is required"))?;
    let mut store = lock(&shared.store);
    let m = store.machine_mut(&app, &id)?;
    m.check_lease(nonce(&headers).as_deref())?;
    if !m.config.get("metadata").is_some_and(Value::is_object) {
        m.config["metadata"] = json!({});
    }
    m.config["metadata"][key] = json!(value);
    m.updated_at = Utc::now();
    Ok(StatusCode::NO_CONTENT)
}

/// `DELETE .../metadata/{key}` → 204.
pub async fn delete_metadata(
    State(shared): Shared_,
    Path((app, id, key)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> ApiResult<StatusCode> {
    let mut store = lock(&shared.store);
    let m = store.machine_mut(&app, &id)?;
    m.check_lease(nonce(&headers).as_deref())?;
    if let Some(map) = m.config.get_mut("metadata").and_then(Value::as_object_mut) {
        map.remove(&key);
    }
    m.updated_at = Utc::now();
    Ok(StatusCode::NO_CONTENT)
}

/// A Go duration (`"10s"`, `"1m30s"`) or a number of seconds.
fn parse_go_duration(value: &Value) -> Option<Duration> {
    if let Some(n) = value.as_u64() {
        return Some(Duration::from_secs(n));
    }
    let text = value.as_str()?;
    let mut total = 0f64;
    let mut number = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() || c == '.' {
            number.push(c);
            continue;
        }
        let mut unit = c.to_string();
        if c == 'm' && chars.peek() == Some(&'s') {
            unit.push('s');
            chars.next();
        }
        let n: f64 = number.parse().ok()?;
        number.clear();
        total += n * match unit.as_str() {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 0.001,
            _ => return None,
        };
    }
    number.is_empty().then(|| Duration::from_secs_f64(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_parse() {
        assert_eq!(
            parse_go_duration(&json!("10s")),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            parse_go_duration(&json!("1m30s")),
            Some(Duration::from_secs(90))
        );
        assert_eq!(parse_go_duration(&json!(7)), Some(Duration::from_secs(7)));
        assert_eq!(parse_go_duration(&json!("10")), None);
    }
}
