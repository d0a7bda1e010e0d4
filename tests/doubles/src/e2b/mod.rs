//! A double of E2B: its control-plane API and envd, the daemon inside each sandbox, written
//! from E2B's published OpenAPI spec and envd's protocol definitions. Each sandbox is a real
//! local Docker container, so commands, files, pause and timeouts really happen.
//!
//! [`spawn`] starts it on two loopback listeners (the API, and the shared envd host that the
//! SDKs address with `E2b-Sandbox-Id` headers) and returns an [`E2bDouble`]: its URLs and API
//! key, a [`Faults`] queue for per-test fault injection, request counters, and a view of
//! every sandbox it holds. What it models and what it does not is written in
//! `tests/doubles/README.md`.

mod api;
mod connect;
mod engine;
mod envd;
mod faults;
mod process;
mod reaper;
mod state;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::task::JoinSet;

pub use engine::{EngineError, LABEL_DOUBLE, LABEL_SANDBOX};
pub use envd::ENVD_PORT;
pub use faults::{Counters, FaultAction, Faults};
pub use state::{Expired, Network, Power, Sandbox, TemplateSpec};

use state::Shared;

/// The template every double serves unless told otherwise, and its image.
pub const BASE_TEMPLATE: &str = "base";
/// The local image behind [`BASE_TEMPLATE`].
pub const BASE_IMAGE: &str = "sandbox-operator/base:bookworm";

/// How to start a double.
#[derive(Debug, Clone)]
pub struct E2bDoubleOptions {
    /// Where the API listens (`127.0.0.1:0` picks a free port).
    pub api_listen: SocketAddr,
    /// Where the shared envd host listens.
    pub envd_listen: SocketAddr,
    /// The API key it accepts (more can be added, and any revoked, later).
    pub api_key: String,
    /// Templates by id (or alias); [`BASE_TEMPLATE`] → [`BASE_IMAGE`] by default.
    pub templates: BTreeMap<String, TemplateSpec>,
    /// Longest timeout it accepts, in seconds (E2B: 1 h on Hobby, 24 h on Pro).
    pub max_timeout_secs: u64,
    /// Concurrent running sandboxes allowed before create answers 429 (`None`: no limit).
    pub max_running: Option<usize>,
    /// The `domain` it reports for sandboxes.
    pub domain: String,
    /// Largest page the v2 list returns, whatever `limit` asks (E2B: 100). A test lowers it
    /// to make a client follow `X-Next-Token` without a hundred containers.
    pub page_cap: usize,
}

impl Default for E2bDoubleOptions {
    fn default() -> Self {
        let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
        E2bDoubleOptions {
            api_listen: loopback,
            envd_listen: loopback,
            api_key: format!("e2b_{}", state::new_token()),
            templates: BTreeMap::from([(
                BASE_TEMPLATE.to_string(),
                TemplateSpec {
                    image: BASE_IMAGE.to_string(),
                    cpu_count: 2,
                    memory_mb: 512,
                    disk_size_mb: 1024,
                },
            )]),
            max_timeout_secs: 24 * 3600,
            max_running: None,
            domain: "e2b-double.local".to_string(),
            page_cap: 100,
        }
    }
}

/// A running double. Dropping it stops its listeners and removes its containers; prefer
/// [`E2bDouble::shutdown`], which reports a failed cleanup.
pub struct E2bDouble {
    shared: Shared,
    api_addr: SocketAddr,
    envd_addr: SocketAddr,
    api_key: String,
    tasks: JoinSet<()>,
    cleaned: bool,
}

/// Why a double could not start.
#[derive(Debug)]
pub struct SpawnError(pub String);

impl std::fmt::Display for SpawnError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SpawnError {}

/// Starts a double (see the module docs).
pub async fn spawn(options: E2bDoubleOptions) -> Result<E2bDouble, SpawnError> {
    let double_id: String = state::new_token().chars().take(10).collect();
    let engine = engine::Engine::connect(double_id)
        .await
        .map_err(|e| SpawnError(e.0))?;
    let shared = Shared {
        engine,
        sandboxes: Arc::default(),
        templates: Arc::new(options.templates),
        api_keys: Arc::new(std::sync::Mutex::new(BTreeSet::from([options
            .api_key
            .clone()]))),
        faults: Faults::default(),
        api_counters: Counters::default(),
        envd_counters: Counters::default(),
        expired: Arc::default(),
        max_timeout_secs: options.max_timeout_secs,
        max_running: options.max_running,
        domain: options.domain,
        page_cap: options.page_cap.max(1),
        processes: Default::default(),
    };
    let bind = |addr| async move {
        TcpListener::bind(addr)
            .await
            .map_err(|e| SpawnError(format!("binding {addr}: {e}")))
    };
    let api_listener = bind(options.api_listen).await?;
    let envd_listener = bind(options.envd_listen).await?;
    let local = |l: &TcpListener| l.local_addr().map_err(|e| SpawnError(e.to_string()));
    let (api_addr, envd_addr) = (local(&api_listener)?, local(&envd_listener)?);

    let mut tasks = JoinSet::new();
    let mut api_server = faults::serve(
        api_listener,
        api::router(shared.clone()),
        shared.faults.clone(),
    );
    let mut envd_server = faults::serve(
        envd_listener,
        envd::router(shared.clone()),
        shared.faults.clone(),
    );
    tasks.spawn(async move { while api_server.join_next().await.is_some() {} });
    tasks.spawn(async move { while envd_server.join_next().await.is_some() {} });
    tasks.spawn(reaper::run(shared.clone()));
    Ok(E2bDouble {
        shared,
        api_addr,
        envd_addr,
        api_key: options.api_key,
        tasks,
        cleaned: false,
    })
}

impl E2bDouble {
    /// The API's base URL (`http://127.0.0.1:PORT`).
    pub fn api_url(&self) -> String {
        format!("http://{}", self.api_addr)
    }

    /// The shared envd host's base URL (address sandboxes with `E2b-Sandbox-Id`).
    pub fn envd_url(&self) -> String {
        format!("http://{}", self.envd_addr)
    }

    /// The API key it was started with.
    pub fn api_key(&self) -> &str {
        &self.api_key
    }

    /// The domain it reports for sandboxes.
    pub fn domain(&self) -> &str {
        &self.shared.domain
    }

    /// The fault queue shared by the API and envd.
    pub fn faults(&self) -> &Faults {
        &self.shared.faults
    }

    /// Requests the API handled, by route.
    pub fn api_counters(&self) -> &Counters {
        &self.shared.api_counters
    }

    /// Requests envd handled, by route.
    pub fn envd_counters(&self) -> &Counters {
        &self.shared.envd_counters
    }

    /// Accepts another API key.
    pub fn add_api_key(&self, key: &str) {
        self.keys().insert(key.to_string());
    }

    /// Stops accepting `key` (every request with it answers 401 from now on).
    pub fn revoke_api_key(&self, key: &str) {
        self.keys().remove(key);
    }

    fn keys(&self) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
        self.shared
            .api_keys
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// One sandbox as the double holds it.
    pub async fn sandbox(&self, id: &str) -> Option<Sandbox> {
        self.shared.sandboxes.lock().await.get(id).cloned()
    }

    /// Every sandbox it holds.
    pub async fn sandboxes(&self) -> Vec<Sandbox> {
        self.shared
            .sandboxes
            .lock()
            .await
            .values()
            .cloned()
            .collect()
    }

    /// Sandboxes the double killed or paused at their timeout, in order.
    pub fn expired(&self) -> Vec<Expired> {
        self.shared
            .expired
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Stops the listeners and removes every container this double created.
    pub async fn shutdown(mut self) -> Result<usize, EngineError> {
        self.tasks.abort_all();
        self.cleaned = true;
        self.shared.engine.remove_all().await
    }
}

impl Drop for E2bDouble {
    fn drop(&mut self) {
        self.tasks.abort_all();
        if self.cleaned {
            return;
        }
        // A test that panicked never reached `shutdown`: clean up on a thread of our own,
        // since the test's runtime may be going away.
        // A fresh engine connection: pooled ones belong to the test's runtime.
        let double_id = self.shared.engine.double_id().to_string();
        let cleanup = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            if let Ok(runtime) = runtime {
                let _ = runtime.block_on(async move {
                    engine::Engine::connect(double_id).await?.remove_all().await
                });
            }
        });
        let _ = cleanup.join();
    }
}
