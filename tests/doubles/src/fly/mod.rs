//! A Fly Machines API double: a server of our own, written from the published Machines API,
//! where every machine is a real local Docker container (so exec, ports, stop/start, suspend
//! and volumes really happen) and every volume a real Docker volume.
//!
//! It models the machine state machine with its transient states and the wait endpoint (408
//! on timeout), leases with nonces (409 without the nonce), metadata and metadata filters,
//! listing (whole or paged), bearer-token auth (401), the `{error, status}` error body, and
//! per-test fault injection ([`Faults`]): 429 with `Retry-After`, 5xx, slow, dropped and
//! truncated responses, insufficient capacity. What it does not model is listed in
//! `tests/doubles/README.md`.
//!
//! ```no_run
//! # async fn demo() -> Result<(), sandbox_doubles::fly::DoubleError> {
//! let double = sandbox_doubles::fly::spawn(Default::default()).await?;
//! println!("{} {} {}", double.base_url(), double.app(), double.token());
//! double.shutdown().await;
//! # Ok(()) }
//! ```

mod engine;
mod faults;
mod leases;
mod lifecycle;
mod machines;
mod server;
mod store;
mod volumes;
mod wire;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

pub use crate::History;
pub use faults::{Fault, Faults, Matcher, RequestLog, RequestRecord};

use engine::Engine;
use faults::lock;
use store::{AppRec, Store, random_id};

/// Longest a shutdown waits for requests and operations in flight.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(15);

/// Why the double could not start.
#[derive(Debug, thiserror::Error)]
#[error("Fly double: {0}")]
pub struct DoubleError(String);

/// How to run the double.
#[derive(Debug, Clone)]
pub struct FlyDoubleOptions {
    /// Apps that exist from the start (the first is [`FlyDouble::app`]). Empty: one app
    /// with a random name.
    pub apps: Vec<String>,
    /// Organization slug of those apps.
    pub org: String,
    /// Region machines and volumes land in when a request names none.
    pub region: String,
    /// The accepted token; random when `None`.
    pub token: Option<String>,
    /// Where to listen (port 0 = any free port).
    pub listen: SocketAddr,
    /// Address machines' public service ports are published on.
    pub publish_host: String,
    /// Extra time every transition spends in its transient state before the Docker work
    /// (zero by default: the Docker work itself takes a while).
    pub transition_delay: Duration,
    /// Largest page the paged listing returns, whatever `limit` asks for (servers clamp).
    pub max_page_size: usize,
}

impl Default for FlyDoubleOptions {
    fn default() -> Self {
        FlyDoubleOptions {
            apps: Vec::new(),
            org: "personal".into(),
            region: "ord".into(),
            token: None,
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            publish_host: "127.0.0.1".into(),
            transition_delay: Duration::ZERO,
            max_page_size: 100,
        }
    }
}

/// State shared by the handlers.
pub(crate) struct Shared {
    pub store: Mutex<Store>,
    /// Woken on every machine state change (the wait endpoint listens).
    pub changed: Notify,
    pub engine: Engine,
    /// This double instance's id (in container names and labels).
    pub instance: String,
    pub options: FlyDoubleOptions,
    pub tokens: Mutex<HashSet<String>>,
    pub faults: Faults,
    pub log: RequestLog,
    /// One FIFO lock per machine: its Docker operations run one at a time, in order.
    ops: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Requests and background operations in flight: shutdown lets them finish before it
    /// removes containers, so none is created after the cleanup.
    in_flight: AtomicUsize,
}

/// Counts one request or operation in flight for as long as it lives.
pub(crate) struct InFlight(Arc<Shared>);

impl InFlight {
    pub fn new(shared: &Arc<Shared>) -> InFlight {
        shared.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(shared.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Shared {
    pub fn op_lock(&self, id: &str) -> Arc<tokio::sync::Mutex<()>> {
        lock(&self.ops).entry(id.to_string()).or_default().clone()
    }

    pub fn docker_volumes(&self) -> BTreeMap<String, String> {
        lifecycle::docker_volumes(&lock(&self.store))
    }
}

/// A running double. Dropping it removes its containers and volumes; [`FlyDouble::shutdown`]
/// does the same without blocking.
pub struct FlyDouble {
    shared: Arc<Shared>,
    base_url: String,
    token: String,
    app: String,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    cleaned: bool,
}

/// Starts a double on loopback.
pub async fn spawn(options: FlyDoubleOptions) -> Result<FlyDouble, DoubleError> {
    let instance = random_id(8);
    let engine = Engine::connect(&instance, &options.publish_host)
        .await
        .map_err(DoubleError)?;
    let token = options
        .token
        .clone()
        .unwrap_or_else(|| format!("fo1_{}", random_id(40)));
    let mut apps = options.apps.clone();
    if apps.is_empty() {
        apps.push(format!("sbx-double-{instance}"));
    }
    let mut store = Store::default();
    for app in &apps {
        store.apps.insert(
            app.clone(),
            AppRec {
                id: random_id(16),
                org: options.org.clone(),
                network: "default".into(),
            },
        );
    }
    let listener = TcpListener::bind(options.listen)
        .await
        .map_err(|e| DoubleError(format!("binding {}: {e}", options.listen)))?;
    let addr = listener
        .local_addr()
        .map_err(|e| DoubleError(e.to_string()))?;
    let shared = Arc::new(Shared {
        store: Mutex::new(store),
        changed: Notify::new(),
        engine,
        instance,
        options,
        tokens: Mutex::new(HashSet::from([token.clone()])),
        faults: Faults::default(),
        log: RequestLog::default(),
        ops: Mutex::new(HashMap::new()),
        in_flight: AtomicUsize::new(0),
    });
    let (stop, stopped) = watch::channel(false);
    let router = server::router(shared.clone());
    let tasks = vec![
        tokio::spawn(server::serve(listener, shared.clone(), router, stopped)),
        tokio::spawn(lifecycle::watch_exits(shared.clone())),
    ];
    Ok(FlyDouble {
        shared,
        base_url: format!("http://{addr}"),
        token,
        app: apps[0].clone(),
        stop,
        tasks,
        cleaned: false,
    })
}

impl FlyDouble {
    /// Base URL to configure as the API endpoint (`http://127.0.0.1:PORT`, no `/v1`).
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// The token the double accepts.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The first app.
    pub fn app(&self) -> &str {
        &self.app
    }

    /// The address public service ports are published on.
    pub fn publish_host(&self) -> &str {
        &self.shared.options.publish_host
    }

    /// Fault injection for this double.
    pub fn faults(&self) -> &Faults {
        &self.shared.faults
    }

    /// Every request received so far.
    pub fn requests(&self) -> &RequestLog {
        &self.shared.log
    }

    /// The private network `app` was created in (`default`: the organization's); `None`
    /// when there is no such app.
    pub fn app_network(&self, app: &str) -> Option<String> {
        lock(&self.shared.store)
            .apps
            .get(app)
            .map(|a| a.network.clone())
    }

    /// Revokes every token: from now on every request is 401.
    pub fn revoke_tokens(&self) {
        lock(&self.shared.tokens).clear();
    }

    /// Accepts `token` (again).
    pub fn grant_token(&self, token: &str) {
        lock(&self.shared.tokens).insert(token.to_string());
    }

    /// Makes the suspend snapshot of machine `id` unusable, so its next start is a cold boot
    /// (as when Fly discards a snapshot). Returns whether the machine exists.
    pub fn lose_snapshot(&self, id: &str) -> bool {
        let mut store = lock(&self.shared.store);
        match store.machines.get_mut(id) {
            Some(m) => {
                m.snapshot = false;
                true
            }
            None => false,
        }
    }

    /// The Docker container backing machine `id`.
    pub fn container_name(&self, id: &str) -> Option<String> {
        lock(&self.shared.store)
            .machines
            .get(id)
            .map(|m| m.container.clone())
    }

    /// The Docker volume backing Fly volume `id`.
    pub fn docker_volume(&self, id: &str) -> Option<String> {
        lock(&self.shared.store)
            .volumes
            .get(id)
            .map(|v| v.docker_name.clone())
    }

    /// Ids of the machines of `app` that are not destroyed.
    pub fn live_machines(&self, app: &str) -> Vec<String> {
        lock(&self.shared.store)
            .machines
            .values()
            .filter(|m| m.app == app && !m.deleted)
            .map(|m| m.id.clone())
            .collect()
    }

    /// Stops serving, lets requests and operations in flight finish (at most
    /// [`SHUTDOWN_GRACE`]), and removes every container and volume this double created.
    pub async fn shutdown(mut self) {
        self.stop_tasks();
        let deadline = tokio::time::Instant::now() + SHUTDOWN_GRACE;
        while self.shared.in_flight.load(Ordering::SeqCst) > 0
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.shared.engine.cleanup().await;
        self.cleaned = true;
    }

    fn stop_tasks(&self) {
        let _ = self.stop.send(true);
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl Drop for FlyDouble {
    fn drop(&mut self) {
        if self.cleaned {
            return;
        }
        self.stop_tasks();
        let instance = self.shared.instance.clone();
        let publish_host = self.shared.options.publish_host.clone();
        // Drop cannot await and may run inside a runtime: clean up on a thread of its own,
        // with a client of that thread's runtime.
        let cleanup = std::thread::spawn(move || {
            if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                rt.block_on(async {
                    if let Ok(engine) = Engine::connect(&instance, &publish_host).await {
                        engine.cleanup().await;
                    }
                });
            }
        });
        let _ = cleanup.join();
    }
}
