//! A double of the Fly Sprites API: sprites, the exec WebSocket, the filesystem endpoints,
//! checkpoints and the network policy, each sprite a real local Docker container.
//!
//! Written from the published API (paths under `/v1/sprites`, the JSON field names of the
//! official SDKs' wire types, the exec WebSocket's binary framing). What it models and what it
//! does not is listed in `tests/doubles/README.md` ("Sprites double").
//!
//! ```text
//! POST   /v1/sprites                          create (201; 409 when the name is taken)
//! GET    /v1/sprites?prefix&max_results&continuation_token
//! GET    /v1/sprites/{name}                   (404 when absent)
//! PUT    /v1/sprites/{name}                   url_settings, labels
//! DELETE /v1/sprites/{name}                   (204; 404 when absent)
//! GET    /v1/sprites/{name}/exec              WebSocket: cmd (repeated), env (repeated), dir, stdin,
//!                                             tty, cols, rows (see exec.rs)
//! POST   /v1/sprites/{name}/exec/{session_id}/kill?signal=   NDJSON (see session.rs)
//! GET    /v1/sprites/{name}/proxy             WebSocket: one TCP connection (see proxy.rs)
//! GET    /v1/sprites/{name}/fs/read|list      PUT fs/write   DELETE fs/delete   (?path=)
//! POST   /v1/sprites/{name}/checkpoint        NDJSON progress; a `docker commit`
//! GET    /v1/sprites/{name}/checkpoints[/{id}]   POST checkpoints/{id}/restore
//! GET|POST /v1/sprites/{name}/policy/network
//! ```

mod api;
mod exec;
mod fs;
mod proxy;
mod session;
mod state;
mod wire;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::task::JoinHandle;

pub use state::{Faults, Park};

/// How to start a double.
#[derive(Debug, Clone)]
pub struct SpritesOptions {
    /// The bearer token the double accepts.
    pub token: String,
    /// Image every sprite's container runs (a Debian base with a shell and coreutils).
    pub image: String,
    /// Sprites per page of `GET /v1/sprites` when the client asks for more (small, so paging
    /// is exercised).
    pub page_size: usize,
    /// A label put on every container, so a test can remove what a crashed run left.
    pub tag: String,
}

impl SpritesOptions {
    /// Options with a random token and tag, two sprites per page.
    pub fn new(image: impl Into<String>) -> Self {
        SpritesOptions {
            token: format!("sprites-double-{:016x}", fastrand::u64(..)),
            image: image.into(),
            page_size: 2,
            tag: format!("sprites-double-{:012x}", fastrand::u64(..) >> 16),
        }
    }
}

/// A running double. [`SpritesDouble::shutdown`] stops the server and removes every container
/// and checkpoint image it made; dropping it without a shutdown (a test that panicked) does the
/// same, blocking until the engine has answered.
pub struct SpritesDouble {
    /// `http://127.0.0.1:PORT` (no trailing slash).
    pub base_url: String,
    /// The accepted bearer token.
    pub token: String,
    state: Arc<state::State>,
    server: JoinHandle<()>,
    cleaned: bool,
}

/// The Docker label every container of a double carries, with the double's tag as value.
pub const TAG_LABEL: &str = "sprites-double.tag";

/// Starts a double on a free loopback port.
pub async fn spawn(opts: SpritesOptions) -> SpritesDouble {
    let docker = bollard::Docker::connect_with_defaults().expect("a Docker engine");
    let state = Arc::new(state::State::new(docker, opts.clone()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let addr: SocketAddr = listener.local_addr().expect("bound address");
    let app = api::router(state.clone());
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    SpritesDouble {
        base_url: format!("http://{addr}"),
        token: opts.token,
        state,
        server,
        cleaned: false,
    }
}

impl SpritesDouble {
    /// The tag on every container of this double (the value of [`TAG_LABEL`]).
    pub fn tag(&self) -> &str {
        &self.state.opts.tag
    }

    /// Fault injection for the following requests.
    pub fn faults(&self) -> &Faults {
        &self.state.faults
    }

    /// Requests answered so far (every endpoint, WebSocket upgrades included).
    pub fn requests(&self) -> u64 {
        self.state.requests.load(Ordering::SeqCst)
    }

    /// Requests answered so far with `method` whose path ends with `path_suffix`, in order.
    pub fn requests_to(&self, method: &str, path_suffix: &str) -> Vec<String> {
        self.state
            .log
            .lock()
            .expect("log lock")
            .iter()
            .filter(|(m, p)| m == method && p.ends_with(path_suffix))
            .map(|(_, p)| p.clone())
            .collect()
    }

    /// Names of the sprites that exist now.
    pub async fn sprite_names(&self) -> Vec<String> {
        self.state.sprites.lock().await.keys().cloned().collect()
    }

    /// Sprites created so far (successful `POST /v1/sprites`).
    pub fn creates(&self) -> u64 {
        self.state.creates.load(Ordering::SeqCst)
    }

    /// Sprites deleted so far (successful `DELETE /v1/sprites/{name}`).
    pub fn deletes(&self) -> u64 {
        self.state.deletes.load(Ordering::SeqCst)
    }

    /// Parks a sprite as the service does on its own when the sprite idles: `Warm` freezes
    /// its processes (docker pause), `Cold` stops them (docker stop). The next request that
    /// needs the sprite wakes it.
    pub async fn park(&self, name: &str, park: Park) -> Result<(), String> {
        self.state.park(name, park).await
    }

    /// Replaces the accepted token (a revoked token: every request with the old one is 401).
    pub fn rotate_token(&self, token: &str) {
        *self.state.token.lock().expect("token lock") = token.to_string();
    }

    /// Stops the server and removes every container and checkpoint image of this double.
    pub async fn shutdown(mut self) {
        self.server.abort();
        self.state.remove_everything().await;
        self.cleaned = true;
    }
}

impl Drop for SpritesDouble {
    fn drop(&mut self) {
        self.server.abort();
        if self.cleaned {
            return;
        }
        // A test that panicked never reached `shutdown`. Drop cannot await and the test's
        // runtime may be going away: clean up on a thread of our own, with an engine client of
        // that thread's runtime (pooled connections belong to the runtime that made them).
        let opts = self.state.opts.clone();
        let sprites = self
            .state
            .sprites
            .try_lock()
            .map(|s| s.clone())
            .unwrap_or_default();
        let cleanup = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async move {
                let Ok(docker) = bollard::Docker::connect_with_defaults() else {
                    return;
                };
                let state = state::State::new(docker, opts);
                *state.sprites.lock().await = sprites;
                state.remove_everything().await;
            });
        });
        let _ = cleanup.join();
    }
}
