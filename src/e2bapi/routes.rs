//! The REST routes, at the paths the official SDKs call (v2 create, list and connect; the
//! v1 forms beside them). Every handler authenticates the `X-API-KEY` first, then acts with
//! the key's ServiceAccount in the key's namespace only.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Router;
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::{get, post};
use bytes::Bytes;
use chrono::Utc;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde::de::DeserializeOwned;

use super::caller::{Caller, Target};
use super::clients::Impersonation;
use super::error::{ApiError, json};
use super::keys::Keys;
use super::mapping;
use super::token::TokenKey;
use super::wire::{CreatedSandbox, NewSandbox, PauseRequest, RefreshRequest, TimeoutRequest};
use super::{id, list, ready, view};
use crate::api::Sandbox;

/// The field manager of this API's writes.
pub const FIELD_MANAGER: &str = "sandbox-operator-e2b-api";
/// The envd protocol version announced for every sandbox. The SDKs turn features on by
/// this version: 0.5.2 turns on `commands.close_stdin` (served by `CloseStdin`). The next
/// gates stay off: 0.5.7 switches single-file uploads to octet-stream bodies (served by
/// `/files`, but the SDK tests drive uploads at this version only), 0.6.2 sends file
/// metadata and 0.6.3 asks for entries in watch events (neither served).
pub const ENVD_VERSION: &str = "0.5.2";

/// What every handler shares.
#[derive(Clone)]
pub struct E2bState {
    /// The API keys.
    pub keys: Keys,
    /// Clients acting as the keys' ServiceAccounts.
    pub clients: Impersonation,
    /// Settings and the token key.
    pub site: Arc<Site>,
    /// Sandboxes and their providers, for what reaches inside a sandbox (envd, logs).
    pub sandboxes: Arc<dyn crate::access::lookup::Directory>,
    /// The operator's own client (traffic records for idleness).
    pub operator: kube::Client,
}

/// The settings the answers carry.
pub struct Site {
    /// `e2bApi.domain`.
    pub domain: Option<String>,
    /// `e2bApi.templates`.
    pub templates: BTreeMap<String, String>,
    /// envd access tokens.
    pub tokens: TokenKey,
    /// The `clientID` of every sandbox (the operator instance).
    pub client_id: String,
}

/// The router.
pub fn router(state: E2bState) -> Router {
    Router::new()
        .route("/sandboxes", post(create).get(list::list_v1))
        .route("/v2/sandboxes", post(create).get(list::list_v2))
        .route("/sandboxes/{id}", get(detail).delete(kill))
        .route("/sandboxes/{id}/timeout", post(set_timeout))
        .route("/sandboxes/{id}/refreshes", post(refresh))
        .route("/sandboxes/{id}/pause", post(pause))
        .route("/sandboxes/{id}/resume", post(resume))
        .route("/sandboxes/{id}/connect", post(connect))
        .route("/v2/sandboxes/{id}/connect", post(connect))
        .merge(super::logs::router())
        .merge(super::envd::router())
        .with_state(state)
}

/// A JSON body (`{}` when empty); malformed is a 400, as E2B answers it.
fn body<T: DeserializeOwned + Default>(bytes: &Bytes) -> Result<T, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(bytes).map_err(|e| ApiError::bad_request(format!("request body: {e}")))
}

async fn create(c: Caller, raw: Bytes) -> Result<Response, ApiError> {
    let Caller {
        tenant,
        api,
        state: s,
    } = c;
    let request: NewSandbox = body(&raw)?;
    let client = api.clone().into_client();
    let boot =
        super::boot::resolve(client, &tenant, &s.site.templates, &request.template_id).await?;
    let sid = id::generate(&tenant.namespace);
    let Some(object) = id::parse(&sid) else {
        return Err(ApiError::bad_request(format!(
            "namespace {:?} cannot be part of a sandbox id",
            tenant.namespace
        )));
    };
    let sandbox = mapping::sandbox(&request, boot, &tenant, &object.name, Utc::now())?;
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PostParams::default()
    };
    let made = api
        .create(&params, &sandbox)
        .await
        .map_err(|e| ApiError::from_kube("creating the Sandbox", e))?;
    tracing::info!(namespace = %tenant.namespace, name = %object.name, key = %tenant.key_name, "E2B API: created a sandbox");
    ready::reached(&api, &made, &sid).await?;
    Ok(json(
        StatusCode::CREATED,
        &created(&s, &sid, &request.template_id, &made),
    ))
}

/// The `Sandbox` answer of create and connect. It always carries the envd access token:
/// envd here requires it whatever `secure` asked, since an id alone must not open a
/// sandbox to anyone who learns it (the SDKs send the token whenever the answer has one).
/// The traffic access token comes for a sandbox whose port URLs need it: every one not
/// created with `allowPublicTraffic: true` (see `mapping`).
fn created(s: &E2bState, sid: &str, template: &str, sandbox: &Sandbox) -> CreatedSandbox {
    CreatedSandbox {
        template_id: template.to_string(),
        sandbox_id: sid.to_string(),
        client_id: s.site.client_id.clone(),
        envd_version: ENVD_VERSION.into(),
        envd_access_token: Some(s.site.tokens.token(sid)),
        domain: s.site.domain.clone(),
        traffic_access_token: mapping::restricts_traffic(sandbox)
            .then(|| s.site.tokens.traffic_token(sid)),
    }
}

async fn detail(t: Target) -> Result<Response, ApiError> {
    let site = &t.caller.state.site;
    let mut info = view::info(&t.sandbox, site, Utc::now());
    info.envd_access_token = Some(site.tokens.token(&t.sid));
    info.domain = site.domain.clone();
    Ok(json(StatusCode::OK, &info))
}

async fn kill(t: Target) -> Result<StatusCode, ApiError> {
    let name = kube::ResourceExt::name_any(&t.sandbox);
    match t.caller.api.delete(&name, &DeleteParams::default()).await {
        Ok(_) => Ok(StatusCode::NO_CONTENT),
        Err(kube::Error::Api(e)) if e.code == 404 => Err(ApiError::sandbox_not_found(&t.sid)),
        Err(e) => Err(ApiError::from_kube("deleting the Sandbox", e)),
    }
}

/// A merge patch of the target's spec, as the key's ServiceAccount; the Sandbox as written.
async fn patch_spec(t: &Target, spec: serde_json::Value) -> Result<Sandbox, ApiError> {
    let name = kube::ResourceExt::name_any(&t.sandbox);
    let patch = serde_json::json!({"spec": spec});
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    t.caller
        .api
        .patch(&name, &params, &Patch::Merge(&patch))
        .await
        .map_err(|e| ApiError::from_kube("updating the Sandbox", e))
}

/// The lifetime `timeout` seconds from now, with the sandbox's own action.
fn lifetime_from_now(sandbox: &Sandbox, timeout: i64) -> Result<serde_json::Value, ApiError> {
    let l = mapping::lifetime(timeout, mapping::auto_pauses(sandbox), Utc::now())?;
    serde_json::to_value(l).map_err(|e| ApiError::internal(e.to_string()))
}

async fn set_timeout(t: Target, raw: Bytes) -> Result<StatusCode, ApiError> {
    let request: TimeoutRequest = body(&raw)?;
    let timeout = request
        .timeout
        .ok_or_else(|| ApiError::bad_request("timeout is required"))?;
    let lifetime = lifetime_from_now(&t.sandbox, timeout)?;
    patch_spec(&t, serde_json::json!({"lifetime": lifetime})).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn refresh(t: Target, raw: Bytes) -> Result<StatusCode, ApiError> {
    let request: RefreshRequest = body(&raw)?;
    let secs = request.duration.unwrap_or(mapping::DEFAULT_TIMEOUT_SECS);
    extend(&t, secs).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Moves the end to `secs` from now unless it is already later (TTL is only extended);
/// the Sandbox as it now is.
async fn extend(t: &Target, secs: i64) -> Result<Sandbox, ApiError> {
    let wanted = Utc::now() + chrono::Duration::seconds(secs.max(0));
    let end = t.sandbox.spec.lifetime.as_ref().and_then(mapping::end_of);
    if end.is_some_and(|e| e >= wanted) {
        return Ok(t.sandbox.clone());
    }
    let lifetime = lifetime_from_now(&t.sandbox, secs)?;
    patch_spec(t, serde_json::json!({"lifetime": lifetime})).await
}

async fn pause(t: Target, raw: Bytes) -> Result<StatusCode, ApiError> {
    let request: PauseRequest = body(&raw)?;
    refuse_pause_options(&request)?;
    if mapping::state_of(&t.sandbox, Utc::now()) == "paused" {
        let msg = format!("sandbox {:?} is already paused", t.sid);
        return Err(ApiError::conflict(msg));
    }
    // A paused sandbox does not time out: its lifetime starts again on connect.
    let paused = patch_spec(
        &t,
        serde_json::json!({"state": "Sleeping", "lifetime": null}),
    )
    .await?;
    // As on E2B, the answer comes once the sandbox is paused: a connect right after it then
    // resumes a paused sandbox, never one whose pause has not happened yet.
    ready::reached(&t.caller.api, &paused, &t.sid).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A pause keeps memory where the provider can; the other kinds are refused by name.
fn refuse_pause_options(r: &PauseRequest) -> Result<(), ApiError> {
    if r.memory == Some(false) {
        return Err(ApiError::bad_request(
            "memory: false (a filesystem-only pause) is not supported",
        ));
    }
    if r.require_healthy_guest == Some(true) {
        return Err(ApiError::bad_request(
            "requireHealthyGuest is not supported: this API does not probe envd yet",
        ));
    }
    match r.rest.keys().next() {
        Some(f) => Err(ApiError::bad_request(format!(
            "pause: field {f:?} is not supported"
        ))),
        None => Ok(()),
    }
}

/// Connect and resume options: only a timeout (and a resume that keeps memory).
fn refuse_wake_options(r: &TimeoutRequest) -> Result<(), ApiError> {
    for (field, value) in &r.rest {
        let harmless = matches!(
            (field.as_str(), value),
            ("memory", serde_json::Value::Bool(true))
                | ("autoPause", serde_json::Value::Bool(false))
        );
        if !harmless {
            return Err(ApiError::bad_request(format!(
                "{field}: {value} is not supported (a resume keeps memory; autoPause is set \
                 at create)"
            )));
        }
    }
    Ok(())
}

async fn connect(t: Target, raw: Bytes) -> Result<Response, ApiError> {
    wake(t, raw, false).await
}

async fn resume(t: Target, raw: Bytes) -> Result<Response, ApiError> {
    wake(t, raw, true).await
}

/// Connect (200 running, 201 resumed) and resume (409 when it runs): a paused sandbox runs
/// again with its timeout from now; a running one only has its timeout extended. Either
/// answers once the sandbox runs, as create does.
async fn wake(t: Target, raw: Bytes, only_paused: bool) -> Result<Response, ApiError> {
    let request: TimeoutRequest = body(&raw)?;
    refuse_wake_options(&request)?;
    let timeout = request.timeout.unwrap_or(mapping::DEFAULT_TIMEOUT_SECS);
    let paused = mapping::state_of(&t.sandbox, Utc::now()) == "paused";
    let (status, now) = match (paused, only_paused) {
        (false, true) => {
            let msg = format!("sandbox {:?} is not paused", t.sid);
            return Err(ApiError::conflict(msg));
        }
        (false, false) => (StatusCode::OK, extend(&t, timeout).await?),
        (true, _) => {
            let lifetime = lifetime_from_now(&t.sandbox, timeout)?;
            let spec = serde_json::json!({"state": null, "lifetime": lifetime});
            (StatusCode::CREATED, patch_spec(&t, spec).await?)
        }
    };
    ready::reached(&t.caller.api, &now, &t.sid).await?;
    let template = view::template_of(&t.sandbox);
    let answer = created(&t.caller.state, &t.sid, &template, &now);
    Ok(json(status, &answer))
}
