//! The operator's small HTTP server: `/metrics`, `/healthz`, `/readyz`.
//!
//! - `/healthz` (liveness) answers 200 while the process is alive and nothing has declared it
//!   broken through [`Liveness::set_failed`]; a 503 there makes the kubelet restart the pod,
//!   so only unrecoverable states flip it: `run` does when leadership is lost or a supervised
//!   task ended, for the bounded time it takes to stop and exit (the body says why).
//! - `/readyz` (readiness) answers 200 only once [`Readiness::set_ready`] was called — by
//!   `run`, after the kube client has reached the API server and the CRDs are served (see
//!   [`probe_api`]). Otherwise 503 with a one-line reason, so `kubectl describe pod` says why.
//!   Followers of the leader election are ready too: they are hot standbys.
//! - `/metrics` renders [`Metrics`] in the Prometheus text format.
//!
//! The server is plain HTTP/1: it is scraped and probed from inside the cluster only.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::net::TcpListener;

use crate::metrics::{self, Metrics};

/// Default listen address (all interfaces, port 8080) — what the Helm chart's probes and
/// ServiceMonitor point at.
pub const DEFAULT_ADDR: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 8080);

/// Why the server could not run.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The listen address could not be bound (in use, no permission …).
    #[error("cannot listen on {addr}: {source}; choose another address")]
    Bind {
        /// Requested address.
        addr: SocketAddr,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The accept loop failed.
    #[error("HTTP server on {addr} failed: {source}")]
    Serve {
        /// Listening address.
        addr: String,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// A shared "OK, or not OK because …" flag.
#[derive(Clone, Debug)]
struct Flag(Arc<RwLock<Result<(), String>>>);

impl Flag {
    fn new(initial: Result<(), String>) -> Self {
        Flag(Arc::new(RwLock::new(initial)))
    }

    fn set(&self, value: Result<(), String>) {
        // A poisoned lock only means a writer panicked mid-assignment of a plain value;
        // the value is still a valid Result, so keep using it.
        let mut guard = self.0.write().unwrap_or_else(|e| e.into_inner());
        *guard = value;
    }

    fn get(&self) -> Result<(), String> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Readiness shared between `run` (which sets it) and `/readyz` (which reports it). Starts
/// not ready with reason `starting`.
#[derive(Clone, Debug)]
pub struct Readiness(Flag);

impl Default for Readiness {
    fn default() -> Self {
        Readiness::new()
    }
}

impl Readiness {
    /// Not ready, reason `starting`.
    pub fn new() -> Self {
        Readiness(Flag::new(Err("starting".into())))
    }

    /// Mark ready.
    pub fn set_ready(&self) {
        self.0.set(Ok(()));
    }

    /// Mark not ready; `reason` is shown in the `/readyz` body (keep it to one line).
    pub fn set_not_ready(&self, reason: impl Into<String>) {
        self.0.set(Err(reason.into()));
    }

    /// `Ok` when ready, else the reason.
    pub fn status(&self) -> Result<(), String> {
        self.0.get()
    }

    /// Whether ready.
    pub fn is_ready(&self) -> bool {
        self.status().is_ok()
    }
}

/// Liveness shared between the process and `/healthz`. Starts alive.
#[derive(Clone, Debug)]
pub struct Liveness(Flag);

impl Default for Liveness {
    fn default() -> Self {
        Liveness::new()
    }
}

impl Liveness {
    /// Alive.
    pub fn new() -> Self {
        Liveness(Flag::new(Ok(())))
    }

    /// Declare the process broken beyond self-repair (e.g. a controller loop ended
    /// unexpectedly); `/healthz` then answers 503 and the kubelet restarts the pod.
    pub fn set_failed(&self, reason: impl Into<String>) {
        self.0.set(Err(reason.into()));
    }

    /// `Ok` while alive, else the reason.
    pub fn status(&self) -> Result<(), String> {
        self.0.get()
    }
}

/// What the handlers read.
#[derive(Clone, Debug, Default)]
pub struct ServerState {
    /// Rendered at `/metrics`.
    pub metrics: Metrics,
    /// Reported at `/readyz`.
    pub readiness: Readiness,
    /// Reported at `/healthz`.
    pub liveness: Liveness,
}

/// The routes, for embedding or testing without a socket.
pub fn router(state: ServerState) -> Router {
    Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(state)
}

async fn metrics_handler(State(state): State<ServerState>) -> Response {
    (
        [(header::CONTENT_TYPE, metrics::CONTENT_TYPE)],
        state.metrics.render(),
    )
        .into_response()
}

fn probe_response(status: Result<(), String>) -> Response {
    match status {
        Ok(()) => (StatusCode::OK, "ok\n").into_response(),
        Err(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {reason}\n"),
        )
            .into_response(),
    }
}

async fn healthz(State(state): State<ServerState>) -> Response {
    match state.liveness.status() {
        Ok(()) => probe_response(Ok(())),
        Err(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("unhealthy: {reason}\n"),
        )
            .into_response(),
    }
}

async fn readyz(State(state): State<ServerState>) -> Response {
    probe_response(state.readiness.status())
}

/// Bind `addr`. Separate from [`serve_on`] so callers (and tests, with port 0) learn the
/// actual address before serving.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, ServerError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Bind { addr, source })
}

/// Bind `addr` and serve until `shutdown` resolves; then stop accepting, let in-flight
/// requests finish, and return.
pub async fn serve(
    addr: SocketAddr,
    state: ServerState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    let listener = bind(addr).await?;
    serve_on(listener, state, shutdown).await
}

/// Serve on an already bound listener until `shutdown` resolves (graceful).
pub async fn serve_on(
    listener: TcpListener,
    state: ServerState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    let addr = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| "<unknown>".into());
    tracing::info!(%addr, "serving /metrics, /healthz and /readyz");
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(|source| ServerError::Serve { addr, source })
}

/// Readiness probe of the API side: the client can reach the API server and it serves
/// `api_version` (e.g. `sandboxes.dev/v1alpha1`) with every kind in `kinds`. Uses discovery
/// only, which every authenticated client may read, so it needs no RBAC on CRDs.
/// The `Err` is a one-line reason suitable for [`Readiness::set_not_ready`].
pub async fn probe_api(
    client: &kube::Client,
    api_version: &str,
    kinds: &[&str],
) -> Result<(), String> {
    let resources = client
        .list_api_group_resources(api_version)
        .await
        .map_err(|e| match &e {
            kube::Error::Api(status) if status.code == 404 => format!(
                "API {api_version} is not served; install the CRDs (`sandbox-operator crds | \
                 kubectl apply -f -`)"
            ),
            _ => format!("cannot reach the Kubernetes API for {api_version}: {e}"),
        })?;
    let missing: Vec<&str> = kinds
        .iter()
        .copied()
        .filter(|kind| !resources.resources.iter().any(|r| r.kind == *kind))
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "API {api_version} does not serve {}; install or update the CRDs",
            missing.join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// One real HTTP/1.1 request over TCP; returns (status code, headers+body text).
    async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        let status = response
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap();
        (status, response)
    }

    #[tokio::test]
    async fn serves_probes_and_metrics_over_tcp_and_shuts_down() {
        let state = ServerState::default();
        state.metrics.reconcile_error("Sandbox", "invalid");
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_on(listener, state.clone(), async {
            let _ = stop_rx.await;
        }));

        let (code, body) = get(addr, "/healthz").await;
        assert_eq!(code, 200, "{body}");

        let (code, body) = get(addr, "/readyz").await;
        assert_eq!(code, 503, "{body}");
        assert!(body.ends_with("not ready: starting\n"), "{body}");

        state.readiness.set_not_ready("CRDs not installed");
        let (code, body) = get(addr, "/readyz").await;
        assert_eq!(code, 503);
        assert!(body.contains("CRDs not installed"), "{body}");

        state.readiness.set_ready();
        let (code, body) = get(addr, "/readyz").await;
        assert_eq!(code, 200, "{body}");
        assert!(body.ends_with("\r\n\r\nok\n"), "{body}");

        let (code, body) = get(addr, "/metrics").await;
        assert_eq!(code, 200);
        assert!(
            body.to_ascii_lowercase()
                .contains("content-type: text/plain; version=0.0.4"),
            "{body}"
        );
        assert!(
            body.contains(
                "sandbox_operator_reconcile_errors_total{kind=\"Sandbox\",category=\"invalid\"} 1"
            ),
            "{body}"
        );

        let (code, _) = get(addr, "/nope").await;
        assert_eq!(code, 404);

        state.liveness.set_failed("controller stopped");
        let (code, body) = get(addr, "/healthz").await;
        assert_eq!(code, 503);
        assert!(body.contains("unhealthy: controller stopped"), "{body}");

        stop_tx.send(()).unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(10), server)
            .await
            .expect("server did not stop after shutdown")
            .unwrap()
            .unwrap();
        assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    }

    #[tokio::test]
    async fn bind_error_names_the_address() {
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let err = bind(addr).await.unwrap_err().to_string();
        assert!(err.contains(&addr.to_string()), "{err}");
    }
}
