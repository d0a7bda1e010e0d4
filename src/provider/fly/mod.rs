//! The Fly Machines provider (reqwest over the process-wide rustls provider).
//!
//! Every sandbox is a machine of one Fly app (`app`), created without starting it, named
//! after the request's deterministic external name, with the owner labels in its metadata.
//! The machine id is the sandbox id. Every call after create goes by that id.
//!
//! # Each seam operation and the API calls it makes
//!
//! | seam operation | Machines API calls |
//! |---|---|
//! | `create` | (`GET /apps/{app}`, once; `POST /apps` when missing and `org` is set) · `GET /apps/{app}/volumes` when it mounts one · `GET /apps/{app}/machines` when it publishes ports · `POST /apps/{app}/machines` (`skip_launch`) |
//! | `describe` | `GET /apps/{app}/machines/{id}` · once per machine, the first time it is seen `started` without a recorded first start: `POST …/{id}/metadata/sandboxes.dev.fly.first-started` |
//! | `find` | `GET /apps/{app}/machines?metadata.{k}=v…&limit=…[&cursor=…]`, every page |
//! | `start`, `wake` | `POST …/{id}/lease` · `POST …/{id}/start` · `GET …/{id}/wait?state=started` · `DELETE …/{id}/lease` |
//! | `stop` | lease · `GET …/{id}` · `POST …/{id}/stop` · `GET …/{id}/wait?state=stopped&instance_id=…` · release |
//! | `sleep`, `hibernate` | `POST …/{id}/exec` (fingerprint) · lease · `POST …/{id}/metadata/sandboxes.dev.fly.fingerprint` · `GET …/{id}` · `POST …/{id}/suspend` · `GET …/{id}/wait?state=suspended` (on 412: `POST …/stop` + wait `stopped`) · release |
//! | `resume` | `GET …/{id}` · lease · start · wait `started` · release · `POST …/{id}/exec` (fingerprint) |
//! | `destroy` | lease · `DELETE …/{id}?force=true` · release · `GET …/{id}/wait?state=destroyed` (404 anywhere = success) |
//! | `exec` | `POST …/{id}/exec` `{command, timeout}` |
//! | `read_file`, `write_file`, `list_dir`, `delete_path` | `POST …/{id}/exec` (base64 through stdin/stdout) |
//! | `export`, `import` | `POST …/{id}/exec` (`tar` + base64; import sanitised by `tarsafe` first) |
//! | `create_volume` | `GET /apps/{app}/machines` · `GET /apps/{app}/volumes` · `POST /apps/{app}/volumes` |
//! | `get_volume`, `list_volumes` | `GET /apps/{app}/volumes` · `GET /apps/{app}/machines` |
//! | `remove_volume` | `GET …/volumes` · `GET …/machines` · `DELETE /apps/{app}/volumes/{vol}` |
//! | `set_resources` | `GET …/{id}` · lease · `POST /apps/{app}/machines/{id}` (whole config) · wait `started` if it ran · release · `GET …/{id}` |
//! | `events` (drift) | `GET /apps/{app}/machines?metadata.sandboxes.dev/managed-by=<instance>` every `driftIntervalSeconds` |
//! | `templates` | none: `None` — the operator's templates service captures and restores over exec |
//! | `capacity` | none: `None` — the API has no headroom call |
//! | `egress` | none: `None` — Fly cannot filter egress, and allow-lists are refused at create |
//!
//! Mutations run under the machine's lease (see `power`), so two operator replicas or a
//! person with flyctl cannot interleave updates to one machine. Errors map as `api` says.
//!
//! # Routing: a URL that reaches this sandbox alone
//!
//! Sandboxes share one app, and the Fly Proxy sends a request for a public port only to the
//! machines whose services list that port; each sandbox port gets a public port of its own,
//! so `status.url` is `http://<app>.fly.dev:<port>` (see `ports`). One app (rather than one
//! app per sandbox) keeps drift detection to one listing for all sandboxes and needs no app
//! creation, IP allocation or DNS per sandbox; it needs a dedicated IPv4 or IPv6 address on the
//! app (`fly ips allocate-v6`), because the shared IPv4 serves only ports 80 and 443.

mod api;
mod config;
mod core;
mod describe;
mod drift;
mod exec;
mod hibernation;
mod machines;
mod ports;
mod power;
mod resources;
mod settings;
mod volumes;
mod wire;

use std::sync::Arc;

use reqwest::Method;
use serde_json::json;
use tokio::sync::{Mutex, OnceCell};

pub use settings::{DEFAULT_API_URL, DEFAULT_TOKEN_ENV, FlySettings};

use self::api::{Api, Call};
use crate::provider::{ErrorKind, ProviderError, ProviderResult};

/// Prefix of this provider's own metadata keys (not labels: hidden from descriptors).
pub(crate) const BOOKKEEPING_PREFIX: &str = "sandboxes.dev.fly.";
/// Metadata: when the machine first started (RFC 3339), kept across history truncation.
pub(crate) const FIRST_STARTED_KEY: &str = "sandboxes.dev.fly.first-started";
/// Metadata: the fingerprint of the system taken before a suspend.
pub(crate) const FINGERPRINT_KEY: &str = "sandboxes.dev.fly.fingerprint";
/// Metadata: the requested (advisory, not enforced) disk ceiling in bytes.
pub(crate) const DISK_KEY: &str = "sandboxes.dev.fly.disk-bytes";

/// A Fly app as a sandbox provider. Cloning is cheap and shares the client and locks.
#[derive(Clone)]
pub struct FlyProvider {
    name: String,
    settings: FlySettings,
    api: Api,
    /// Serialises public-port choices (see `ports`).
    allocation: Arc<Mutex<()>>,
    /// Set once the app is known to exist.
    app_ready: Arc<OnceCell<()>>,
}

impl FlyProvider {
    /// Builds the provider without contacting the API. The token is read now (from where
    /// `token` points); a missing one is `Invalid` naming the setting, never printing a value.
    pub fn new(name: impl Into<String>, settings: FlySettings) -> ProviderResult<Self> {
        let name = name.into();
        let token = settings
            .token
            .resolve_for(&format!("provider {name} fly.token"))
            .map_err(|e| ProviderError::invalid(e.to_string()))?;
        let api = Api::new(&settings.api_url, token)?;
        Ok(FlyProvider {
            name,
            settings,
            api,
            allocation: Arc::new(Mutex::new(())),
            app_ready: Arc::new(OnceCell::new()),
        })
    }

    /// [`new`](Self::new), then checks (or creates) the app, so a wrong token, URL or app
    /// shows up at start-up with the setting named.
    pub async fn connect(name: impl Into<String>, settings: FlySettings) -> ProviderResult<Self> {
        let provider = Self::new(name, settings)?;
        provider.ensure_app().await?;
        Ok(provider)
    }

    /// The provider's settings.
    pub fn settings(&self) -> &FlySettings {
        &self.settings
    }

    /// `GET /apps/{app}`; when it is missing and `org` is set, `POST /apps` in the provider's
    /// own private network (`network`, see [`FlySettings::network`]). Once per provider
    /// (retried on the next call after a failure).
    pub(crate) async fn ensure_app(&self) -> ProviderResult<()> {
        self.app_ready
            .get_or_try_init(|| async {
                let app = &self.settings.app;
                let found = self
                    .api
                    .unit(Call::new(Method::GET, format!("/apps/{app}")))
                    .await;
                match (found, &self.settings.org) {
                    (Ok(()), _) => Ok(()),
                    (Err(e), Some(org)) if e.is(ErrorKind::NotFound) => {
                        let network = self.settings.network();
                        let body = json!({ "app_name": app, "org_slug": org, "network": network });
                        self.api
                            .unit(Call::new(Method::POST, "/apps").json(&body))
                            .await
                            .map_err(|e| {
                                e.context(format!(
                                    "creating Fly app {app} in organization {org} (the provider's \
                                     `app` and `org` settings)"
                                ))
                            })
                    }
                    (Err(e), None) if e.is(ErrorKind::NotFound) => {
                        Err(ProviderError::invalid(format!(
                            "Fly app {app} does not exist: create it (`fly apps create {app}`), \
                             or set the provider's `org` so the operator creates it"
                        )))
                    }
                    (Err(e), _) => Err(e.context(format!(
                        "checking Fly app {app} (the provider's `app` and `apiUrl` settings)"
                    ))),
                }
            })
            .await
            .map(|_| ())
    }
}
