//! Per-test fault injection, request counters, and the listener loop that applies both.
//!
//! The double is served with hyper directly rather than `axum::serve`, because one of the
//! faults is a connection dropped without any response: the service returns an error, and
//! hyper closes the socket without writing a status line. Every other fault is an ordinary
//! response (an error body, a delay before the real answer, a stream cut short).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{MatchedPath, Request};
use axum::http::{HeaderValue, Response, StatusCode};
use axum::middleware::Next;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tower::ServiceExt;

/// What an injected fault does to the request it matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FaultAction {
    /// Answer with this status and the API's `{code, message}` error body (plus
    /// `error_code` when given, and `Retry-After` when given) instead of handling the request.
    Status {
        /// HTTP status, e.g. 429, 500, 503.
        status: u16,
        /// `Retry-After` in seconds.
        retry_after: Option<u64>,
        /// The body's machine-readable `error_code`, e.g. `sandbox_capacity_unavailable`.
        error_code: Option<String>,
    },
    /// Wait this long, then handle the request normally.
    Delay(Duration),
    /// Close the connection without writing any response.
    Drop,
    /// For a server-streaming RPC: send what the process printed, then end the body without
    /// the `end` event or the end-of-stream message (a connection lost mid-stream).
    TruncateStream,
}

impl FaultAction {
    /// A plain error status with no `Retry-After` and no `error_code`.
    pub fn status(status: u16) -> Self {
        FaultAction::Status {
            status,
            retry_after: None,
            error_code: None,
        }
    }
}

#[derive(Debug, Clone)]
struct Fault {
    method: Option<String>,
    /// `/`-separated segments; `*` matches exactly one segment, a final `**` any rest.
    path: Vec<String>,
    action: FaultAction,
    /// Matching requests to let through before this fault fires.
    skip: usize,
    remaining: usize,
}

impl Fault {
    fn matches(&self, method: &str, path: &str) -> bool {
        if self.method.as_deref().is_some_and(|m| m != method) {
            return false;
        }
        let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
        if let Some((last, head)) = self.path.split_last()
            && last == "**"
        {
            return segments.len() >= head.len()
                && head
                    .iter()
                    .zip(&segments)
                    .all(|(want, got)| want == "*" || want == got);
        }
        segments.len() == self.path.len()
            && self
                .path
                .iter()
                .zip(&segments)
                .all(|(want, got)| want == "*" || want == got)
    }
}

/// The fault queue shared by a double's listeners. Faults are consumed in the order they
/// were injected; each applies to `times` matching requests and is then gone.
#[derive(Debug, Clone, Default)]
pub struct Faults(Arc<Mutex<Vec<Fault>>>, Arc<crate::HistoryMode>);

impl Faults {
    /// From now on, listings carry `history` (see [`crate::History`]): `startedAt` and
    /// `endAt` left out of every entry, or of those older than [`crate::RECENT`].
    pub fn set_history(&self, history: crate::History) {
        self.1.set(history);
    }

    /// The history mode, for the handlers.
    pub(crate) fn history(&self) -> &crate::HistoryMode {
        &self.1
    }

    /// Makes the next `times` requests matching `method` (`None` = any) and `path` fail with
    /// `action`. `path` is a request path whose `*` segments match any one segment and whose
    /// final `**` matches any rest, e.g. `/sandboxes/*/timeout`, `/process.Process/Start`,
    /// `/**` (everything).
    pub fn inject(&self, method: Option<&str>, path: &str, action: FaultAction, times: usize) {
        self.inject_after(method, path, action, 0, times);
    }

    /// Like [`Faults::inject`], letting the first `skip` matching requests through (e.g. the
    /// second page of a list).
    pub fn inject_after(
        &self,
        method: Option<&str>,
        path: &str,
        action: FaultAction,
        skip: usize,
        times: usize,
    ) {
        let fault = Fault {
            method: method.map(str::to_uppercase),
            path: path
                .trim_matches('/')
                .split('/')
                .map(String::from)
                .collect(),
            action,
            skip,
            remaining: times,
        };
        lock(&self.0).push(fault);
    }

    /// Removes every pending fault.
    pub fn clear(&self) {
        lock(&self.0).clear();
    }

    /// How many injected faults have not fired yet (summed over their remaining counts).
    pub fn pending(&self) -> usize {
        lock(&self.0).iter().map(|f| f.remaining).sum()
    }

    fn take(&self, method: &str, path: &str) -> Option<FaultAction> {
        let mut faults = lock(&self.0);
        let index = faults.iter().position(|f| f.matches(method, path))?;
        if faults[index].skip > 0 {
            faults[index].skip -= 1;
            return None;
        }
        let action = faults[index].action.clone();
        faults[index].remaining -= 1;
        if faults[index].remaining == 0 {
            faults.remove(index);
        }
        Some(action)
    }
}

/// Requests handled, by `METHOD /route` with the route's own placeholders
/// (`POST /sandboxes/{sandboxID}/timeout`), so a test can count calls per operation.
#[derive(Debug, Clone, Default)]
pub struct Counters(Arc<Mutex<BTreeMap<String, u64>>>);

impl Counters {
    /// How many requests reached `key` (`"POST /sandboxes"`).
    pub fn get(&self, key: &str) -> u64 {
        lock(&self.0).get(key).copied().unwrap_or(0)
    }

    /// Every counter.
    pub fn snapshot(&self) -> BTreeMap<String, u64> {
        lock(&self.0).clone()
    }

    fn bump(&self, key: String) {
        *lock(&self.0).entry(key).or_insert(0) += 1;
    }
}

/// Marker a handler of a streaming RPC finds in its request when a
/// [`FaultAction::TruncateStream`] fault matched it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TruncateStream;

/// Axum middleware counting every routed request under its matched route.
pub(crate) async fn count(counters: Counters, request: Request, next: Next) -> Response<Body> {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "(unrouted)".to_string());
    counters.bump(format!("{} {route}", request.method()));
    next.run(request).await
}

/// The API's error body, `{code, message}` (plus `error_code` when given).
pub(crate) fn error_response(
    status: u16,
    message: &str,
    error_code: Option<&str>,
) -> Response<Body> {
    let mut body = serde_json::json!({ "code": status, "message": message });
    if let Some(code) = error_code {
        body["error_code"] = serde_json::Value::String(code.to_string());
    }
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
    response
        .headers_mut()
        .insert("content-type", HeaderValue::from_static("application/json"));
    response
}

#[derive(Debug)]
struct Dropped;

impl std::fmt::Display for Dropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("connection dropped by an injected fault")
    }
}

impl std::error::Error for Dropped {}

/// Serves `router` on `listener` until the returned task is aborted; aborting it also aborts
/// every open connection.
pub(crate) fn serve(listener: TcpListener, router: Router, faults: Faults) -> JoinSet<()> {
    let mut outer = JoinSet::new();
    outer.spawn(async move {
        let mut connections = JoinSet::new();
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let router = router.clone();
            let faults = faults.clone();
            connections.spawn(async move {
                let service =
                    hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
                        handle(router.clone(), faults.clone(), request)
                    });
                // A dropped connection or a client that went away is not worth reporting.
                let _ = hyper::server::conn::http1::Builder::new()
                    .keep_alive(true)
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
            // Reap finished connections so the set does not grow without bound.
            while connections.try_join_next().is_some() {}
        }
    });
    outer
}

async fn handle(
    router: Router,
    faults: Faults,
    request: hyper::Request<Incoming>,
) -> Result<Response<Body>, Dropped> {
    let mut request = request.map(Body::new);
    let method = request.method().as_str().to_string();
    let path = request.uri().path().to_string();
    match faults.take(&method, &path) {
        None => {}
        Some(FaultAction::Drop) => return Err(Dropped),
        Some(FaultAction::Delay(delay)) => tokio::time::sleep(delay).await,
        Some(FaultAction::TruncateStream) => {
            request.extensions_mut().insert(TruncateStream);
        }
        Some(FaultAction::Status {
            status,
            retry_after,
            error_code,
        }) => {
            let mut response = error_response(
                status,
                &format!("injected fault: {method} {path} answered {status}"),
                error_code.as_deref(),
            );
            if let Some(secs) = retry_after {
                response
                    .headers_mut()
                    .insert("retry-after", HeaderValue::from(secs));
            }
            return Ok(response);
        }
    }
    let response: Result<Response<Body>, Infallible> = router.oneshot(request).await;
    Ok(match response {
        Ok(r) => r,
        Err(never) => match never {},
    })
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A test that panicked while holding the lock must not wedge every later request.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_match_by_method_and_segment_glob_and_run_out() {
        let faults = Faults::default();
        faults.inject(Some("post"), "/sandboxes/*/timeout", FaultAction::Drop, 2);
        assert_eq!(faults.take("GET", "/sandboxes/abc/timeout"), None);
        assert_eq!(faults.take("POST", "/sandboxes/abc"), None);
        assert_eq!(faults.take("POST", "/sandboxes/abc/timeout/x"), None);
        assert_eq!(
            faults.take("POST", "/sandboxes/abc/timeout"),
            Some(FaultAction::Drop)
        );
        assert_eq!(faults.pending(), 1);
        assert_eq!(
            faults.take("POST", "/sandboxes/def/timeout"),
            Some(FaultAction::Drop)
        );
        assert_eq!(faults.take("POST", "/sandboxes/def/timeout"), None);
        assert_eq!(faults.pending(), 0);
    }

    #[test]
    fn a_double_star_matches_any_rest_and_skips_let_requests_through() {
        let faults = Faults::default();
        faults.inject_after(None, "/**", FaultAction::status(503), 1, 1);
        assert_eq!(faults.take("GET", "/v2/sandboxes"), None, "skipped");
        assert_eq!(faults.take("GET", "/a/b/c"), Some(FaultAction::status(503)));
        assert_eq!(faults.take("GET", "/a"), None);
    }
}
