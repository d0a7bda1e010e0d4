//! The E2B provider: sandboxes are E2B sandboxes (Firecracker microVMs), driven through
//! E2B's control-plane API and, inside each sandbox, its daemon envd.
//!
//! # Every seam operation and the call it makes
//!
//! | seam | E2B |
//! |---|---|
//! | `create` | `GET /v2/sandboxes?metadata=sandboxes.dev/e2b-name=<name>` (E2B does not keep names unique: an existing one is `Conflict`), then `POST /sandboxes` {`templateID` (= `spec.image`, default `base`), `timeout`, `autoPause`, `secure: true`, `metadata` (owner + caller labels, name, restart policy, ports), `envVars`, `network` {`allowOut`, `denyOut: [0.0.0.0/0]`} when an allow-list is set}, then `GET /sandboxes/{id}` |
//! | `describe` | `GET /sandboxes/{id}` (404 → `None`) |
//! | `find` | `GET /v2/sandboxes?metadata=…&state=running,paused&limit=100`, following `X-Next-Token` to the last page; any failed page fails the whole call (rule 1) |
//! | `start`, `wake` | `POST /sandboxes/{id}/connect` {`timeout`} (200 running, 201 resumed) |
//! | `stop` | `POST /sandboxes/{id}/pause` {`memory: false`}: processes end, the filesystem is kept |
//! | `sleep`, `hibernate` | `POST /sandboxes/{id}/pause` {`memory: true`}, after recording a boot fingerprint inside |
//! | `resume` | `POST /sandboxes/{id}/connect`, then compares the boot fingerprint: `processesPreserved` is what it shows |
//! | `destroy` | `DELETE /sandboxes/{id}` (404 = success, rule 5) |
//! | `exec` | envd `process.Process/Start` (Connect, server streaming, JSON), bounded by the request's timeout |
//! | `exec_stream` ([`StreamingExec`](super::stream::StreamingExec)) | envd `process.Process/Start` with `stdin` and `pty`, unbounded; then, by pid, `SendInput`, `CloseStdin` (^D with a PTY), `Update` (resize) and `SendSignal` (TERM, KILL; INT and HUP by a second process running `kill`) |
//! | `read_file` / `write_file` | envd `GET` / `POST /files?path=` (404 = `NotFound`, rule 2; multipart upload), then `chmod` via `Process/Start` |
//! | `list_dir` / `delete_path` | envd `filesystem.Filesystem/ListDir` / `Remove` |
//! | `export` / `import` | envd `Filesystem/Stat`, then `tar` through `Process/Start`; import uploads the sanitised archive with `POST /files` and extracts it |
//! | keep-alive, drift ([`ProviderEvents`]) | one `GET /v2/sandboxes?metadata=sandboxes.dev/managed-by=<instance>` (all pages) per `watchIntervalSecs`; `POST /sandboxes/{id}/timeout` for each running sandbox nearing its timeout; events for what changed between two lists, and for the provider's own calls as it makes them (no call of their own) |
//! | [`E2bProvider::set_allowed_domains`] | `PUT /sandboxes/{id}/network` {`allowOut`, `denyOut`}: replaced in place |
//!
//! Capabilities: hibernation, files, bulk files, events and streaming exec. No logs (E2B
//! has no main process to follow, see [`Provider::logs`](super::Provider::logs) on
//! [`E2bProvider`]), no port-forward, no templates (the controller's
//! templates service captures and restores over exec and files), no volumes (E2B's volumes
//! carry no labels, so ownership could not be recorded), no `set_resources` (E2B sizes a
//! sandbox by its template and cannot change it in place), no capacity probe (E2B reports
//! none), no egress observation (nothing inside the sandbox checks the policy).
//!
//! # Lifetime
//!
//! E2B ends every sandbox at its timeout. A `Running` Sandbox must outlive any timeout, so
//! the provider keeps its own sandboxes alive from ONE periodic paginated list per operator
//! instance (learned from create, find, describe and event subscriptions): each running
//! sandbox whose `endAt` is closer than half the timeout gets `POST /timeout`. A sandbox that
//! should not run is paused or killed by the controller, so "running and ours" is exactly
//! "keep alive". At idle that is one list per interval plus one refresh per sandbox per half
//! timeout — raise `timeoutSecs` (up to 24 h) to make the per-sandbox part rarer. If the
//! operator is down longer than the timeout, `onTimeout: pause` (the default, E2B's
//! `autoPause`) makes E2B pause instead of kill; the controller resumes a `Running` Sandbox
//! it finds paused. With `onTimeout: kill`, a sandbox E2B removed is the dead-machine signal.
//!
//! # Stopped and sleeping
//!
//! E2B reports both a memory pause and a filesystem-only pause as `paused`, and metadata
//! cannot change after create. The provider remembers which sandboxes it stopped (in memory):
//! those read `Stopped`, every other paused one `Sleeping`. After an operator restart a
//! stopped sandbox reads `Sleeping` until the controller's next stop, which is harmless.
//!
//! # Wreckage (rule 6)
//!
//! E2B starts a sandbox as it creates it, so `started_at` is never `Never` (it is `Unknown`
//! when an answer omits `startedAt`) and there is no never-started wreckage. E2B metadata
//! cannot change after create, so there is nothing to record a first start in, and nothing
//! needs it: a crash between create and the status write leaves a running
//! sandbox labelled with its owner, which the controller adopts by `find` and the sweeper
//! removes once its owner is gone.

mod api;
mod convert;
mod envd;
mod files;
mod hibernation;
mod interactive;
mod lifecycle;
mod process;
mod settings;
mod watch;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::broadcast;

pub use settings::{
    DEFAULT_API_KEY_ENV, DEFAULT_API_URL, DEFAULT_TEMPLATE, E2bSettings, OnTimeout,
};

use self::api::Api;
use self::envd::{Access, Envd, EnvdError};
use super::labels::Owner;
use super::{ProviderError, ProviderEvent, ProviderResult};

/// An E2B account as a sandbox provider. Cheap to clone; clones share state.
#[derive(Clone)]
pub struct E2bProvider {
    inner: Arc<Inner>,
}

/// A drift notice for one operator instance, or a failed look.
type WatchNotice = (String, Result<ProviderEvent, String>);

pub(crate) struct Inner {
    name: String,
    settings: E2bSettings,
    api: Api,
    envd: Envd,
    /// envd access per sandbox id (token and domain), filled from create/describe.
    access: Mutex<HashMap<String, Access>>,
    /// Sandboxes this process paused without their memory (see the module docs).
    stopped: Mutex<HashSet<String>>,
    /// Operator instances whose sandboxes the watch keeps alive.
    instances: Mutex<BTreeSet<String>>,
    /// The owner of each sandbox seen, read from its metadata, so the provider's own calls
    /// can be reported as events (see [`Inner::notify`]).
    owners: Mutex<HashMap<String, Owner>>,
    events: broadcast::Sender<WatchNotice>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl E2bProvider {
    /// Builds the provider `name`: resolves the API key now (an unusable reference fails
    /// here, naming the setting, never the value) and, inside a Tokio runtime, starts the
    /// watch that keeps this provider's sandboxes alive.
    pub fn new(name: &str, settings: E2bSettings) -> ProviderResult<Self> {
        let key = settings
            .api_key
            .resolve_for(&format!("provider {name:?} e2b.apiKey"))
            .map_err(|e| ProviderError::invalid(e.to_string()))?;
        let http = reqwest::Client::builder().build().map_err(|e| {
            ProviderError::invalid(format!(
                "provider {name:?}: cannot build an HTTP client: {e}"
            ))
        })?;
        let api = Api::new(http.clone(), &settings.api_url, key);
        let envd = Envd::new(http, settings.sandbox_url.clone(), settings.user.clone());
        let (events, _) = broadcast::channel(1024);
        let inner = Arc::new(Inner {
            name: name.to_string(),
            settings,
            api,
            envd,
            access: Mutex::default(),
            stopped: Mutex::default(),
            instances: Mutex::default(),
            owners: Mutex::default(),
            events,
        });
        watch::spawn(&inner);
        Ok(E2bProvider { inner })
    }

    /// The provider's settings.
    pub fn settings(&self) -> &E2bSettings {
        &self.inner.settings
    }
}

impl Inner {
    /// Keeps `instance`'s sandboxes alive from now on.
    fn learn(&self, instance: &str) {
        if !instance.is_empty() && !lock(&self.instances).contains(instance) {
            lock(&self.instances).insert(instance.to_string());
        }
    }

    fn remember(&self, id: &str, token: Option<String>, domain: Option<String>) {
        let domain = domain.unwrap_or_else(|| self.settings.default_domain());
        lock(&self.access).insert(id.to_string(), Access { token, domain });
    }

    fn forget(&self, id: &str) {
        lock(&self.access).remove(id);
        lock(&self.stopped).remove(id);
        lock(&self.owners).remove(id);
    }

    /// Records who owns `id`, from its metadata (sandboxes without owner labels concern no
    /// object and are not recorded).
    fn own(&self, id: &str, metadata: Option<&std::collections::BTreeMap<String, String>>) {
        if let Some(owner) = metadata.and_then(Owner::from_labels) {
            lock(&self.owners).insert(id.to_string(), owner);
        }
    }

    /// Reports a change this provider made itself (`start`, `stop`, `pause`, …) to the
    /// subscribers of the sandbox's instance. The watch alone would miss a change undone
    /// between two of its lists (a stop and a start inside one interval), which Docker's own
    /// event stream, for instance, reports.
    fn notify(&self, id: &str, action: &str) {
        let owner = lock(&self.owners).get(id).cloned();
        if let Some(owner) = owner {
            let event = ProviderEvent {
                owner: owner.clone(),
                action: action.to_string(),
            };
            let _ = self.events.send((owner.instance, Ok(event)));
        }
    }

    fn is_stopped(&self, id: &str) -> bool {
        lock(&self.stopped).contains(id)
    }

    fn domain_of(&self, id: &str) -> String {
        lock(&self.access)
            .get(id)
            .map(|a| a.domain.clone())
            .unwrap_or_else(|| self.settings.default_domain())
    }

    /// How to reach `id`'s envd: cached, or read from the API (`NotFound` when it is gone).
    async fn access(&self, id: &str) -> ProviderResult<Access> {
        if let Some(access) = lock(&self.access).get(id).cloned() {
            return Ok(access);
        }
        let detail =
            self.api.detail(id).await?.ok_or_else(|| {
                ProviderError::not_found(format!("E2B sandbox {id} does not exist"))
            })?;
        self.remember(id, detail.envd_access_token, detail.domain);
        lock(&self.access)
            .get(id)
            .cloned()
            .ok_or_else(|| ProviderError::transient(format!("E2B sandbox {id}: access lost")))
    }

    /// Runs an envd call for sandbox `id` and settles what a failure means: a refused token
    /// is re-read once (the call never ran), and an unreachable sandbox is looked up with the
    /// API — gone is `NotFound` (the dead-machine signal), paused is `Conflict`, anything
    /// else `Transient`.
    async fn envd_call<T, F, Fut>(&self, id: &str, call: F) -> ProviderResult<T>
    where
        F: Fn(Access) -> Fut,
        Fut: Future<Output = Result<T, EnvdError>>,
    {
        let access = self.access(id).await?;
        let outcome = match call(access).await {
            Err(EnvdError::Token(_)) => {
                lock(&self.access).remove(id);
                let access = self.access(id).await?;
                call(access).await
            }
            other => other,
        };
        match outcome {
            Ok(value) => Ok(value),
            Err(EnvdError::Call(e)) => Err(e),
            Err(EnvdError::Token(msg)) => Err(ProviderError::unauthorized(format!(
                "{msg}; E2B gave this provider a token envd does not accept"
            ))),
            Err(EnvdError::Unreachable(msg)) => Err(self.unreachable(id, msg).await),
        }
    }

    async fn unreachable(&self, id: &str, msg: String) -> ProviderError {
        match self.api.detail(id).await {
            Ok(None) => {
                self.forget(id);
                ProviderError::not_found(format!("{msg}; E2B sandbox {id} no longer exists"))
            }
            Ok(Some(d)) if d.listed.state != "running" => ProviderError::conflict(format!(
                "{msg}; E2B sandbox {id} is {}, not running — wake it first",
                d.listed.state
            )),
            Ok(Some(_)) => ProviderError::transient(msg),
            Err(e) => ProviderError::transient(format!("{msg} (and looking it up failed: {e})")),
        }
    }
}
