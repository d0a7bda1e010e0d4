//! The HTTP half of the Sprites API: bearer auth, one timeout per call, and the error body
//! mapped onto the seam's error kinds.

use std::fmt;
use std::time::Duration;

use reqwest::header::{HeaderMap, RETRY_AFTER};
use reqwest::{Method, RequestBuilder, Response, StatusCode};
use serde::de::DeserializeOwned;

use super::wire::ApiError;
use crate::provider::{
    ErrorKind, ProviderError, ProviderResult, from_status, parse_retry_after, status_kind,
};

/// Bound on one REST call (a create included).
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// A Sprites API client. The token is only ever put in the `Authorization` header; `Debug`
/// leaves it out.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client").field("base", &self.base).finish()
    }
}

impl Client {
    /// A client of the API at `base` (no trailing slash needed).
    pub fn new(base: &str, token: String) -> ProviderResult<Self> {
        let http = reqwest::Client::builder()
            .timeout(CALL_TIMEOUT)
            .build()
            .map_err(|e| {
                ProviderError::invalid(format!("building the Sprites HTTP client: {e}"))
            })?;
        Ok(Client {
            http,
            base: base.trim_end_matches('/').to_string(),
            token,
        })
    }

    /// The API base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// The bearer token, for the exec WebSocket's handshake.
    pub(super) fn token(&self) -> &str {
        &self.token
    }

    /// A request to `path` (which starts with `/v1/`), authorised.
    pub fn request(&self, method: Method, path: &str) -> RequestBuilder {
        self.http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.token)
    }

    /// Sends, and maps a failed status to its error; `what` names the call in messages.
    pub async fn send(&self, request: RequestBuilder, what: &str) -> ProviderResult<Response> {
        let response = request.send().await.map_err(|e| transport(what, e))?;
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status();
        let headers = response.headers().clone();
        let body = response.bytes().await.unwrap_or_default();
        Err(api_error(status, &headers, &body, what))
    }

    /// Sends and decodes a JSON answer.
    pub async fn json<T: DeserializeOwned>(
        &self,
        request: RequestBuilder,
        what: &str,
    ) -> ProviderResult<T> {
        let response = self.send(request, what).await?;
        response.json::<T>().await.map_err(|e| {
            ProviderError::transient(format!("{what}: the Sprites API answered unreadable JSON"))
                .with_source(e)
        })
    }
}

/// A request that got no answer.
fn transport(what: &str, err: reqwest::Error) -> ProviderError {
    let why = if err.is_timeout() {
        "timed out"
    } else {
        "could not reach the Sprites API"
    };
    ProviderError::transient(format!("{what}: {why}")).with_source(err.without_url())
}

/// Maps a failed answer (status, headers, error body) onto the seam's error kinds by the one
/// table ([`status_kind`]); a retryable one carries the wait the API asked for
/// (`retry_after_seconds`, else the `Retry-After` header).
pub fn api_error(
    status: StatusCode,
    headers: &HeaderMap,
    body: &[u8],
    what: &str,
) -> ProviderError {
    let parsed: ApiError = serde_json::from_slice(body).unwrap_or_default();
    let detail = parsed
        .message
        .clone()
        .or(parsed.error.clone())
        .unwrap_or_else(|| String::from_utf8_lossy(body).chars().take(200).collect());
    let message = format!("{what}: HTTP {}: {detail}", status.as_u16());
    let retry_after = parsed
        .retry_after_seconds
        .map(Duration::from_secs)
        .or_else(|| {
            headers
                .get(RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(parse_retry_after)
        });
    match status_kind(status.as_u16()) {
        ErrorKind::Unauthorized => ProviderError::unauthorized(format!(
            "{message}; the Sprites API refused the token: set a valid one in the provider's \
             sprites.token"
        )),
        _ => from_status(status.as_u16(), message, retry_after),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_error_body_decides_kind_and_wait() {
        let headers = HeaderMap::new();
        let body = br#"{"error":"sprite_creation_rate_limited","message":"slow down","retry_after_seconds":7}"#;
        let err = api_error(StatusCode::TOO_MANY_REQUESTS, &headers, body, "creating x");
        assert!(err.is(ErrorKind::Transient));
        assert_eq!(err.retry_after(), Some(Duration::from_secs(7)));
        assert!(err.message().contains("slow down"), "{err}");

        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, "3".parse().expect("header"));
        let err = api_error(StatusCode::SERVICE_UNAVAILABLE, &headers, b"", "listing");
        assert_eq!(err.retry_after(), Some(Duration::from_secs(3)));

        for (status, kind) in [
            (StatusCode::UNAUTHORIZED, ErrorKind::Unauthorized),
            (StatusCode::FORBIDDEN, ErrorKind::Unauthorized),
            (StatusCode::NOT_FOUND, ErrorKind::NotFound),
            (StatusCode::CONFLICT, ErrorKind::Conflict),
            (StatusCode::BAD_REQUEST, ErrorKind::Invalid),
        ] {
            let err = api_error(status, &HeaderMap::new(), b"{}", "x");
            assert!(err.is(kind), "{status}: {err}");
        }
    }

    #[test]
    fn debug_never_shows_the_token() {
        let client = Client::new("http://127.0.0.1:1", "s3cr3t-token".into()).expect("client");
        assert!(!format!("{client:?}").contains("s3cr3t"));
    }
}
