//! The Machines API client: one reqwest client per provider, the bearer token, and the one
//! mapping from the API's answers to [`ProviderError`].
//!
//! Error mapping (the body is `{"error": "...", "status": "..."}`):
//!
//! Statuses map by the seam's one table ([`status_kind`]: 412 is `Conflict` because Fly answers
//! it for a machine whose state forbids the operation right now). On top of it:
//!
//! | answer | kind | why |
//! |---|---|---|
//! | `status: insufficient_capacity` (any code) | `Transient`, reason `InsufficientCapacity` | Fly may have room later or elsewhere |
//! | 401, 403 | `Unauthorized`, naming the `token` setting | the token is missing, wrong, revoked or lacks a permission |
//! | 409 about a lease | `Conflict`, reason `LeaseHeld` | another client holds the machine |
//! | no answer, a timeout, a cut-off body | `Transient` | |
//!
//! Messages carry the method, the path and the API's own message, never the token (errors are
//! built from the status and the body, never from request headers).
//!
//! **Retry-After is honoured by the client itself.** After an answer that carries it (429, a
//! 503), no request of this provider is sent until that time has passed: a call made meanwhile
//! waits out the rest (up to [`MAX_HOLD_WAIT`]; beyond that it fails at once with `Transient`
//! and the remaining wait). The controllers back off by it too, but a second caller (a
//! reconcile queued by the failing one's own status write, the drift scan, the sweeper) must
//! not be the one that hammers a rate-limited API — and waiting, rather than failing, keeps
//! those callers from counting failures they did not have. Fly's limits are per organization
//! and token, so the pause covers every call.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::{Method, Response, StatusCode};
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::wire::ErrorBody;
use crate::provider::{
    ErrorKind, ProviderError, ProviderResult, from_status, parse_retry_after, status_kind,
};

/// The lease nonce header.
pub const NONCE_HEADER: &str = "fly-machine-lease-nonce";
/// Bound on one ordinary request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Extra time a long-poll (wait, exec) gets beyond its own server-side timeout.
const LONG_POLL_SLACK: Duration = Duration::from_secs(10);
/// Longest a call waits out another call's `Retry-After` before failing instead.
pub const MAX_HOLD_WAIT: Duration = Duration::from_secs(30);
/// How much of an unexpected body an error message quotes.
const QUOTE_LIMIT: usize = 300;

/// One request to the API.
pub struct Call<'a> {
    method: Method,
    path: String,
    query: Vec<(String, String)>,
    body: Option<&'a Value>,
    nonce: Option<&'a str>,
    timeout: Duration,
}

impl<'a> Call<'a> {
    /// `method` on `path` (below `/v1`).
    pub fn new(method: Method, path: impl Into<String>) -> Self {
        Call {
            method,
            path: path.into(),
            query: Vec::new(),
            body: None,
            nonce: None,
            timeout: REQUEST_TIMEOUT,
        }
    }

    /// Adds a query parameter.
    pub fn query(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.query.push((key.into(), value.into()));
        self
    }

    /// Sends `body` as JSON.
    pub fn json(mut self, body: &'a Value) -> Self {
        self.body = Some(body);
        self
    }

    /// Sends the lease nonce.
    pub fn nonce(mut self, nonce: Option<&'a str>) -> Self {
        self.nonce = nonce;
        self
    }

    /// A long poll whose server side may take `server_side` before answering.
    pub fn long_poll(mut self, server_side: Duration) -> Self {
        self.timeout = server_side + LONG_POLL_SLACK;
        self
    }
}

/// The API client of one provider.
#[derive(Clone)]
pub struct Api {
    http: reqwest::Client,
    base: String,
    token: String,
    /// No request before this instant (the API's last `Retry-After`).
    hold_until: Arc<Mutex<Option<Instant>>>,
}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Api")
            .field("base", &self.base)
            .field("token", &"<redacted>")
            .finish()
    }
}

impl Api {
    /// A client of the API at `api_url` (without `/v1`) using `token`.
    pub fn new(api_url: &str, token: String) -> ProviderResult<Api> {
        let http = reqwest::Client::builder()
            .user_agent(concat!("sandbox-operator/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| {
                ProviderError::invalid(format!("cannot build the Fly API client: {e}"))
                    .with_source(e)
            })?;
        Ok(Api {
            http,
            base: format!("{}/v1", api_url.trim_end_matches('/')),
            token,
            hold_until: Arc::new(Mutex::new(None)),
        })
    }

    /// Waits out the API's last `Retry-After`, or fails when more than [`MAX_HOLD_WAIT`] of
    /// it is left (see the module docs).
    async fn honour_hold(&self, what: &str) -> ProviderResult<()> {
        let hold = *self.hold_until.lock().unwrap_or_else(|e| e.into_inner());
        match hold.map(|until| until.saturating_duration_since(Instant::now())) {
            Some(left) if left > MAX_HOLD_WAIT => Err(ProviderError::transient(format!(
                "{what}: not sent: the Machines API asked to wait (Retry-After), {:.0} s left",
                left.as_secs_f64()
            ))
            .with_retry_after(Some(left))),
            Some(left) if !left.is_zero() => {
                tokio::time::sleep(left).await;
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn hold(&self, after: Duration) {
        let until = Instant::now() + after;
        let mut hold = self.hold_until.lock().unwrap_or_else(|e| e.into_inner());
        if hold.is_none_or(|h| h < until) {
            *hold = Some(until);
        }
    }

    /// Sends `call` and decodes a 2xx JSON answer; anything else becomes a [`ProviderError`].
    pub async fn json<T: DeserializeOwned>(&self, call: Call<'_>) -> ProviderResult<T> {
        let what = format!("{} {}", call.method, call.path);
        let response = self.send(call).await?;
        let bytes = response.bytes().await.map_err(|e| {
            ProviderError::transient(format!("{what}: the answer was cut off: {e}"))
        })?;
        serde_json::from_slice(&bytes).map_err(|e| {
            ProviderError::transient(format!(
                "{what}: the answer is not the expected JSON ({e}): {}",
                quote(&bytes)
            ))
        })
    }

    /// Sends `call` and discards a 2xx answer's body.
    pub async fn unit(&self, call: Call<'_>) -> ProviderResult<()> {
        self.send(call).await.map(|_| ())
    }

    /// Sends `call`; a non-2xx answer becomes a [`ProviderError`] (see the module docs).
    async fn send(&self, call: Call<'_>) -> ProviderResult<Response> {
        let what = format!("{} {}", call.method, call.path);
        self.honour_hold(&what).await?;
        let mut request = self
            .http
            .request(call.method, format!("{}{}", self.base, call.path))
            .bearer_auth(&self.token)
            .timeout(call.timeout)
            .query(&call.query);
        if let Some(body) = call.body {
            request = request.json(body);
        }
        if let Some(nonce) = call.nonce {
            request = request.header(NONCE_HEADER, nonce);
        }
        let response = request.send().await.map_err(|e| {
            let why = if e.is_timeout() {
                format!("no answer within {} s", call.timeout.as_secs())
            } else {
                "the Machines API could not be reached or closed the connection".to_string()
            };
            ProviderError::transient(format!("{what}: {why}")).with_source(e)
        })?;
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status();
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(parse_retry_after);
        if let Some(after) = retry_after {
            self.hold(after);
        }
        let body = response.bytes().await.unwrap_or_default();
        Err(error_of(status, &body, retry_after, &what))
    }
}

/// Maps a non-2xx answer to the seam's error (see the module docs).
pub fn error_of(
    status: StatusCode,
    body: &[u8],
    retry_after: Option<Duration>,
    what: &str,
) -> ProviderError {
    let parsed: ErrorBody = serde_json::from_slice(body).unwrap_or_default();
    let said = if parsed.error.is_empty() {
        quote(body)
    } else {
        parsed.error.clone()
    };
    let message = format!("{what}: {} {said}", status.as_u16());
    if parsed.status.as_deref() == Some("insufficient_capacity") {
        return ProviderError::transient(format!(
            "{message} (Fly has no capacity for this machine in the region right now; it is \
             retried, or set a different region in the provider's settings)"
        ))
        .with_reason("InsufficientCapacity")
        .with_retry_after(retry_after);
    }
    match status.as_u16() {
        code if status_kind(code) == ErrorKind::Unauthorized => {
            ProviderError::unauthorized(format!(
                "{message}: the Fly API refused the token; put a valid token where the \
                 provider's `token` setting points (FLY_API_TOKEN by default)"
            ))
        }
        409 if said.contains("lease") => ProviderError::conflict(format!(
            "{message}: another client (a second operator replica or a person with flyctl) \
             holds this machine's lease; retried once it is released or expires"
        ))
        .with_reason("LeaseHeld"),
        code => from_status(code, message, retry_after),
    }
}

fn quote(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let mut quoted: String = text.chars().take(QUOTE_LIMIT).collect();
    if text.chars().count() > QUOTE_LIMIT {
        quoted.push('…');
    }
    if quoted.trim().is_empty() {
        "(empty body)".into()
    } else {
        quoted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(code: u16, body: &str) -> ProviderError {
        error_of(
            StatusCode::from_u16(code).unwrap(),
            body.as_bytes(),
            Some(Duration::from_secs(4)),
            "GET /apps/a/machines",
        )
    }

    #[test]
    fn every_status_maps_to_what_the_caller_should_do() {
        let cases = [
            (401, ErrorKind::Unauthorized),
            (403, ErrorKind::Unauthorized),
            (404, ErrorKind::NotFound),
            (409, ErrorKind::Conflict),
            (412, ErrorKind::Conflict),
            (400, ErrorKind::Invalid),
            (422, ErrorKind::Invalid),
            (408, ErrorKind::Transient),
            (429, ErrorKind::Transient),
            (500, ErrorKind::Transient),
            (503, ErrorKind::Transient),
        ];
        for (code, kind) in cases {
            assert_eq!(err(code, r#"{"error":"x"}"#).kind(), kind, "{code}");
        }
        assert_eq!(
            err(429, "{}").retry_after(),
            Some(Duration::from_secs(4)),
            "Retry-After is kept"
        );
    }

    #[test]
    fn classified_failures_get_their_own_reason() {
        let e = err(
            412,
            r#"{"error":"insufficient resources","status":"insufficient_capacity"}"#,
        );
        assert!(e.is(ErrorKind::Transient));
        assert_eq!(e.reason(), "InsufficientCapacity");
        let lease = err(409, r#"{"error":"lease currently held by another client"}"#);
        assert_eq!(lease.reason(), "LeaseHeld");
    }

    #[test]
    fn messages_quote_the_api_and_name_the_call() {
        let e = err(422, r#"{"error":"image not found"}"#);
        assert!(e.message().contains("GET /apps/a/machines"), "{e}");
        assert!(e.message().contains("422 image not found"), "{e}");
        let html = err(502, "<html>bad gateway</html>");
        assert!(html.message().contains("<html>bad gateway"), "{html}");
    }

    #[test]
    fn the_client_never_prints_its_token() {
        let api = Api::new("https://api.machines.dev", "fo1_SECRET".into()).unwrap();
        assert!(!format!("{api:?}").contains("fo1_SECRET"));
    }
}
