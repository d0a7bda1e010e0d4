//! The Machines API calls this provider makes, one function per endpoint, all scoped to the
//! configured app. Higher-level behaviour (leases around mutations, waits, fallbacks) lives
//! in `power`, `core` and the capability modules.

use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

use super::FlyProvider;
use super::api::Call;
use super::wire::{ExecReply, Lease, Machine, MachinePage, Volume};
use crate::provider::{ErrorKind, ProviderError, ProviderResult};

/// Machines per page when listing (the API answers whole lists to clients that do not page).
const PAGE_SIZE: usize = 500;
/// Pages a listing follows before it gives up (a cursor that never ends is a broken API).
const MAX_PAGES: usize = 10_000;
/// Longest wait one wait request asks for (the API's own ceiling is 60 s).
pub const MAX_WAIT: Duration = Duration::from_secs(60);

impl FlyProvider {
    fn machine_path(&self, id: &str) -> String {
        format!("/apps/{}/machines/{id}", self.settings.app)
    }

    /// `GET /apps/{app}/machines` with `metadata.{key}=value` filters, following every page.
    /// Any failure fails the whole listing (rule 1): a partial list is never returned.
    pub(crate) async fn list_machines(
        &self,
        metadata: &[(String, String)],
    ) -> ProviderResult<Vec<Machine>> {
        let mut all = Vec::new();
        let mut cursor: Option<String> = None;
        for _ in 0..MAX_PAGES {
            let mut call = Call::new(Method::GET, format!("/apps/{}/machines", self.settings.app))
                .query("limit", PAGE_SIZE.to_string());
            if let Some(c) = &cursor {
                call = call.query("cursor", c.clone());
            }
            for (k, v) in metadata {
                call = call.query(format!("metadata.{k}"), v.clone());
            }
            match self.api.json::<MachinePage>(call).await? {
                MachinePage::All(machines) => {
                    all.extend(machines);
                    return Ok(all);
                }
                MachinePage::Page {
                    machines,
                    next_cursor,
                } => {
                    all.extend(machines);
                    match next_cursor.filter(|c| !c.is_empty()) {
                        Some(next) if Some(&next) != cursor.as_ref() => cursor = Some(next),
                        Some(stuck) => {
                            return Err(ProviderError::transient(format!(
                                "listing machines of app {}: the API returned cursor {stuck:?} twice",
                                self.settings.app
                            )));
                        }
                        None => return Ok(all),
                    }
                }
            }
        }
        Err(ProviderError::transient(format!(
            "listing machines of app {}: more than {MAX_PAGES} pages",
            self.settings.app
        )))
    }

    /// `GET /apps/{app}/machines/{id}`; `None` when the machine does not exist.
    pub(crate) async fn get_machine(&self, id: &str) -> ProviderResult<Option<Machine>> {
        match self
            .api
            .json::<Machine>(Call::new(Method::GET, self.machine_path(id)))
            .await
        {
            Ok(m) => Ok(Some(m)),
            Err(e) if e.is(ErrorKind::NotFound) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// `POST /apps/{app}/machines` with `skip_launch` (created, not started).
    pub(crate) async fn create_machine(&self, body: &Value) -> ProviderResult<Machine> {
        self.api
            .json(
                Call::new(
                    Method::POST,
                    format!("/apps/{}/machines", self.settings.app),
                )
                .json(body),
            )
            .await
    }

    /// `POST /apps/{app}/machines/{id}`: replaces the whole config.
    pub(crate) async fn update_machine(
        &self,
        id: &str,
        body: &Value,
        nonce: &str,
    ) -> ProviderResult<Machine> {
        self.api
            .json(
                Call::new(Method::POST, self.machine_path(id))
                    .json(body)
                    .nonce(Some(nonce)),
            )
            .await
    }

    /// `POST .../{action}` (`start`, `stop`, `suspend`) with the lease nonce.
    pub(crate) async fn action(
        &self,
        id: &str,
        action: &str,
        body: Option<&Value>,
        nonce: &str,
    ) -> ProviderResult<()> {
        let mut call = Call::new(Method::POST, format!("{}/{action}", self.machine_path(id)))
            .nonce(Some(nonce));
        if let Some(body) = body {
            call = call.json(body);
        }
        self.api.unit(call).await
    }

    /// `DELETE /apps/{app}/machines/{id}?force=true`.
    pub(crate) async fn delete_machine(&self, id: &str, nonce: Option<&str>) -> ProviderResult<()> {
        self.api
            .unit(
                Call::new(Method::DELETE, self.machine_path(id))
                    .query("force", "true")
                    .nonce(nonce),
            )
            .await
    }

    /// `GET .../wait?state=…&timeout=…`: `Ok` once the machine is in `state`; a 408 (the
    /// timeout passed) is `Transient` naming the state.
    pub(crate) async fn wait(
        &self,
        id: &str,
        state: &str,
        instance_id: Option<&str>,
        timeout: Duration,
    ) -> ProviderResult<()> {
        let timeout = timeout.clamp(Duration::from_secs(1), MAX_WAIT);
        let mut call = Call::new(Method::GET, format!("{}/wait", self.machine_path(id)))
            .query("state", state)
            .query("timeout", timeout.as_secs().to_string())
            .long_poll(timeout);
        if let Some(instance) = instance_id.filter(|i| !i.is_empty()) {
            call = call.query("instance_id", instance);
        }
        self.api.unit(call).await.map_err(|e| {
            e.context(format!(
                "waiting up to {} s for machine {id} to be {state}",
                timeout.as_secs()
            ))
        })
    }

    /// `POST .../lease` for `ttl` seconds: the nonce. 409 (held elsewhere) is `Conflict`.
    pub(crate) async fn acquire_lease(&self, id: &str) -> ProviderResult<String> {
        let body = json!({
            "ttl": self.settings.lease_ttl_seconds,
            "description": format!("sandbox-operator provider {}", self.name),
        });
        let lease: Lease = self
            .api
            .json(Call::new(Method::POST, format!("{}/lease", self.machine_path(id))).json(&body))
            .await?;
        Ok(lease.data.nonce)
    }

    /// `DELETE .../lease` with the nonce.
    pub(crate) async fn release_lease(&self, id: &str, nonce: &str) -> ProviderResult<()> {
        self.api
            .unit(
                Call::new(Method::DELETE, format!("{}/lease", self.machine_path(id)))
                    .nonce(Some(nonce)),
            )
            .await
    }

    /// `POST .../metadata/{key}`, with the lease nonce when the caller holds the lease.
    pub(crate) async fn set_metadata(
        &self,
        id: &str,
        key: &str,
        value: &str,
        nonce: Option<&str>,
    ) -> ProviderResult<()> {
        let body = json!({ "value": value });
        self.api
            .unit(
                Call::new(
                    Method::POST,
                    format!("{}/metadata/{key}", self.machine_path(id)),
                )
                .json(&body)
                .nonce(nonce),
            )
            .await
    }

    /// `POST .../exec`: argv, optional stdin text, timeout in whole seconds.
    pub(crate) async fn exec_call(
        &self,
        id: &str,
        argv: &[String],
        stdin: Option<&str>,
        timeout: Duration,
    ) -> ProviderResult<ExecReply> {
        let secs = timeout.as_secs_f64().ceil().max(1.0) as u64;
        let mut body = json!({ "command": argv, "timeout": secs });
        if let Some(text) = stdin {
            body["stdin"] = json!(text);
        }
        self.api
            .json(
                Call::new(Method::POST, format!("{}/exec", self.machine_path(id)))
                    .json(&body)
                    .long_poll(Duration::from_secs(secs)),
            )
            .await
    }

    /// `GET /apps/{app}/volumes`, live ones only (the API lists destroyed volumes too).
    pub(crate) async fn list_fly_volumes(&self) -> ProviderResult<Vec<Volume>> {
        let all: Vec<Volume> = self
            .api
            .json(Call::new(
                Method::GET,
                format!("/apps/{}/volumes", self.settings.app),
            ))
            .await?;
        Ok(all.into_iter().filter(Volume::is_live).collect())
    }

    /// `POST /apps/{app}/volumes`.
    pub(crate) async fn create_fly_volume(&self, body: &Value) -> ProviderResult<Volume> {
        self.api
            .json(
                Call::new(Method::POST, format!("/apps/{}/volumes", self.settings.app)).json(body),
            )
            .await
    }

    /// `DELETE /apps/{app}/volumes/{id}`.
    pub(crate) async fn delete_fly_volume(&self, id: &str) -> ProviderResult<()> {
        self.api
            .unit(Call::new(
                Method::DELETE,
                format!("/apps/{}/volumes/{id}", self.settings.app),
            ))
            .await
    }
}
