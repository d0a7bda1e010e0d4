//! The E2B control-plane API client (`X-API-Key`): wire types, calls, and the mapping of its
//! `{code, message}` error bodies onto the seam's error kinds.
//!
//! Statuses map by the seam's one table ([`status_kind`]); on top of it, an `error_code` of
//! `sandbox_capacity_unavailable` / `sandbox_no_compatible_node` / `sandbox_placement_timeout`
//! is `Transient` with the reason `InsufficientCapacity`, a 401/403 names the `apiKey` setting
//! to fix, and a dropped or timed-out connection or an unreadable body is `Transient`.
//!
//! The key travels in a header and is never part of an error: errors are built from the
//! status and the response body only.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use reqwest::{Method, RequestBuilder, Response, StatusCode};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::provider::{
    ErrorKind, ProviderError, ProviderResult, from_status, parse_retry_after, status_kind,
};

/// Bound on one API call.
const API_TIMEOUT: Duration = Duration::from_secs(30);
/// Page size of the v2 list (E2B's maximum).
const PAGE_LIMIT: &str = "100";
/// Pages followed before a list is declared runaway (100 × 1,000 = 100,000 sandboxes).
const MAX_PAGES: usize = 1000;
/// What stays unescaped when a metadata key or value is encoded inside the filter.
const UNRESERVED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// The spec's `Sandbox`: what create, connect and resume return.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Created {
    /// The new sandbox's id.
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    /// Token for envd, when created with `secure: true`.
    #[serde(default)]
    pub envd_access_token: Option<String>,
    /// Where its traffic is served.
    #[serde(default)]
    pub domain: Option<String>,
}

/// The spec's `ListedSandbox`, and the common part of `SandboxDetail`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Listed {
    /// Sandbox id.
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    /// The template it runs.
    #[serde(rename = "templateID")]
    pub template_id: String,
    /// The template's alias, when it has one.
    #[serde(default)]
    pub alias: Option<String>,
    /// When it started. Optional here though the spec marks it required: a listing that
    /// omits it must still be read, as "started, time unknown" (rule 6), never refused.
    #[serde(default)]
    pub started_at: Option<DateTime<Utc>>,
    /// When it times out (running) or was paused (paused).
    #[serde(default)]
    pub end_at: Option<DateTime<Utc>>,
    /// vCPUs.
    #[serde(default)]
    pub cpu_count: Option<i64>,
    /// Memory in MiB.
    #[serde(default, rename = "memoryMB")]
    pub memory_mb: Option<i64>,
    /// Disk in MiB.
    #[serde(default, rename = "diskSizeMB")]
    pub disk_size_mb: Option<i64>,
    /// Metadata given at create.
    #[serde(default)]
    pub metadata: Option<BTreeMap<String, String>>,
    /// `running` or `paused`.
    pub state: String,
}

/// The spec's `SandboxNetworkConfig` (the part this provider sets).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Network {
    /// Allowed destinations.
    #[serde(default)]
    pub allow_out: Option<Vec<String>>,
    /// Denied CIDRs.
    #[serde(default)]
    pub deny_out: Option<Vec<String>>,
}

/// The spec's `SandboxDetail`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Detail {
    /// What the list would say.
    #[serde(flatten)]
    pub listed: Listed,
    /// Token for envd.
    #[serde(default)]
    pub envd_access_token: Option<String>,
    /// Where its traffic is served.
    #[serde(default)]
    pub domain: Option<String>,
    /// The stored network policy.
    #[serde(default)]
    pub network: Option<Network>,
}

#[derive(Debug, Default, Deserialize)]
struct ErrorBody {
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    error_code: Option<String>,
}

/// The `metadata` filter value: `k=v&k2=v2`, each key and value URL-encoded.
pub fn metadata_filter(filters: &BTreeMap<String, String>) -> String {
    filters
        .iter()
        .map(|(k, v)| {
            format!(
                "{}={}",
                utf8_percent_encode(k, UNRESERVED),
                utf8_percent_encode(v, UNRESERVED)
            )
        })
        .collect::<Vec<_>>()
        .join("&")
}

/// Maps an error answer of the API to the seam (see the module docs).
pub fn map_status(
    status: StatusCode,
    body: &[u8],
    retry_after: Option<Duration>,
    context: &str,
) -> ProviderError {
    let parsed: ErrorBody = serde_json::from_slice(body).unwrap_or_default();
    let said = parsed
        .message
        .unwrap_or_else(|| String::from_utf8_lossy(body).chars().take(200).collect());
    let msg = format!("{context}: E2B answered {}: {said}", status.as_u16());
    let capacity = matches!(
        parsed.error_code.as_deref(),
        Some(
            "sandbox_capacity_unavailable"
                | "sandbox_no_compatible_node"
                | "sandbox_placement_timeout"
        )
    );
    if capacity {
        return ProviderError::transient(msg)
            .with_reason("InsufficientCapacity")
            .with_retry_after(retry_after);
    }
    match status_kind(status.as_u16()) {
        ErrorKind::Unauthorized => ProviderError::unauthorized(format!(
            "{msg}; check the API key this provider's `apiKey` names (it is missing, wrong, \
             revoked or lacks a permission)"
        )),
        _ => from_status(status.as_u16(), msg, retry_after),
    }
}

/// A transport failure (refused, reset, timed out, unreadable): always `Transient`.
pub fn transport_error(context: &str, err: reqwest::Error) -> ProviderError {
    let what = if err.is_timeout() {
        "timed out"
    } else if err.is_connect() {
        "could not connect"
    } else if err.is_decode() || err.is_body() {
        "answered with an unreadable body"
    } else {
        "failed"
    };
    // Strip the URL from the error: it is ours, but keeps messages short and stable.
    ProviderError::transient(format!("{context}: the request {what}"))
        .with_source(err.without_url())
}

/// The API client.
#[derive(Clone)]
pub struct Api {
    http: reqwest::Client,
    base: String,
    key: String,
}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("Api").field("base", &self.base).finish()
    }
}

impl Api {
    /// A client for `base` authenticating with `key`.
    pub fn new(http: reqwest::Client, base: &str, key: String) -> Self {
        Api {
            http,
            base: base.trim_end_matches('/').to_string(),
            key,
        }
    }

    fn request(&self, method: Method, path: &str) -> RequestBuilder {
        self.http
            .request(method, format!("{}{path}", self.base))
            .header("X-API-Key", &self.key)
            .timeout(API_TIMEOUT)
    }

    /// Sends, and returns the response when it is a success; otherwise the mapped error.
    async fn send(&self, request: RequestBuilder, context: &str) -> ProviderResult<Response> {
        let response = request
            .send()
            .await
            .map_err(|e| transport_error(context, e))?;
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status();
        let retry_after = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(parse_retry_after);
        let body = response.bytes().await.unwrap_or_default();
        Err(map_status(status, &body, retry_after, context))
    }

    async fn json<T: DeserializeOwned>(response: Response, context: &str) -> ProviderResult<T> {
        response
            .json()
            .await
            .map_err(|e| transport_error(context, e))
    }

    /// `POST /sandboxes`.
    pub async fn create(&self, body: &Value) -> ProviderResult<Created> {
        let context = "creating an E2B sandbox";
        let response = self
            .send(self.request(Method::POST, "/sandboxes").json(body), context)
            .await?;
        Self::json(response, context).await
    }

    /// `GET /sandboxes/{id}`; `None` on 404.
    pub async fn detail(&self, id: &str) -> ProviderResult<Option<Detail>> {
        let context = format!("reading E2B sandbox {id}");
        match self
            .send(
                self.request(Method::GET, &format!("/sandboxes/{id}")),
                &context,
            )
            .await
        {
            Ok(response) => Self::json(response, &context).await.map(Some),
            Err(e) if e.is(crate::provider::ErrorKind::NotFound) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// `GET /v2/sandboxes`, every page (`X-Next-Token`). Any failed page fails the whole
    /// list: a partial list is never returned as a complete one.
    pub async fn list(&self, metadata: &str, states: &[&str]) -> ProviderResult<Vec<Listed>> {
        let context = "listing E2B sandboxes";
        let mut all = Vec::new();
        let mut token: Option<String> = None;
        for _ in 0..MAX_PAGES {
            let mut query: Vec<(&str, &str)> = vec![("limit", PAGE_LIMIT)];
            let state = states.join(",");
            if !states.is_empty() {
                query.push(("state", &state));
            }
            if !metadata.is_empty() {
                query.push(("metadata", metadata));
            }
            if let Some(t) = &token {
                query.push(("nextToken", t));
            }
            let request = self.request(Method::GET, "/v2/sandboxes").query(&query);
            let response = self.send(request, context).await?;
            let next = response
                .headers()
                .get("x-next-token")
                .and_then(|v| v.to_str().ok())
                .filter(|t| !t.trim().is_empty())
                .map(str::to_string);
            let page: Vec<Listed> = Self::json(response, context).await?;
            all.extend(page);
            match next {
                Some(next) if Some(&next) == token.as_ref() => {
                    return Err(ProviderError::transient(format!(
                        "{context}: E2B returned the same page token twice; not trusting a partial list"
                    )));
                }
                Some(next) => token = Some(next),
                None => return Ok(all),
            }
        }
        Err(ProviderError::transient(format!(
            "{context}: more than {MAX_PAGES} pages; not trusting a partial list"
        )))
    }

    /// `DELETE /sandboxes/{id}`; `false` when it was already gone.
    pub async fn kill(&self, id: &str) -> ProviderResult<bool> {
        let context = format!("killing E2B sandbox {id}");
        match self
            .send(
                self.request(Method::DELETE, &format!("/sandboxes/{id}")),
                &context,
            )
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if e.is(crate::provider::ErrorKind::NotFound) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// `POST /sandboxes/{id}/pause`; `memory: false` keeps only the filesystem.
    pub async fn pause(&self, id: &str, memory: bool) -> ProviderResult<()> {
        let context = format!("pausing E2B sandbox {id}");
        let body = serde_json::json!({ "memory": memory });
        self.send(
            self.request(Method::POST, &format!("/sandboxes/{id}/pause"))
                .json(&body),
            &context,
        )
        .await
        .map(drop)
    }

    /// `POST /sandboxes/{id}/connect`: resumes a paused sandbox (`true`), or extends a running
    /// one's timeout (`false`).
    pub async fn connect(&self, id: &str, timeout_secs: u64) -> ProviderResult<(bool, Created)> {
        let context = format!("connecting to E2B sandbox {id}");
        let body = serde_json::json!({ "timeout": timeout_secs });
        let response = self
            .send(
                self.request(Method::POST, &format!("/sandboxes/{id}/connect"))
                    .json(&body),
                &context,
            )
            .await?;
        let resumed = response.status() == StatusCode::CREATED;
        Ok((resumed, Self::json(response, &context).await?))
    }

    /// `POST /sandboxes/{id}/timeout`: it now expires `secs` from now.
    pub async fn set_timeout(&self, id: &str, secs: u64) -> ProviderResult<()> {
        let context = format!("refreshing the timeout of E2B sandbox {id}");
        let body = serde_json::json!({ "timeout": secs });
        self.send(
            self.request(Method::POST, &format!("/sandboxes/{id}/timeout"))
                .json(&body),
            &context,
        )
        .await
        .map(drop)
    }

    /// `PUT /sandboxes/{id}/network`: replaces the egress rules (omitted fields are cleared).
    pub async fn update_network(&self, id: &str, body: &Value) -> ProviderResult<()> {
        let context = format!("updating the network policy of E2B sandbox {id}");
        self.send(
            self.request(Method::PUT, &format!("/sandboxes/{id}/network"))
                .json(body),
            &context,
        )
        .await
        .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_filters_encode_keys_and_values() {
        let filters = BTreeMap::from([
            ("sandboxes.dev/owner".to_string(), "ns.a&b=c".to_string()),
            ("x".to_string(), "1".to_string()),
        ]);
        assert_eq!(
            metadata_filter(&filters),
            "sandboxes.dev%2Fowner=ns.a%26b%3Dc&x=1"
        );
    }

    #[test]
    fn error_bodies_map_to_the_seam() {
        let body = br#"{"code":429,"message":"slow down"}"#;
        let err = map_status(
            StatusCode::TOO_MANY_REQUESTS,
            body,
            Some(Duration::from_secs(3)),
            "creating",
        );
        assert!(err.is(ErrorKind::Transient));
        assert_eq!(err.reason(), "RateLimited");
        assert_eq!(err.retry_after(), Some(Duration::from_secs(3)));
        assert_eq!(err.message(), "creating: E2B answered 429: slow down");

        let capacity =
            br#"{"code":503,"message":"full","error_code":"sandbox_capacity_unavailable"}"#;
        let err = map_status(StatusCode::SERVICE_UNAVAILABLE, capacity, None, "c");
        assert_eq!(err.reason(), "InsufficientCapacity");
        assert!(err.is(ErrorKind::Transient));

        for (status, kind) in [
            (400, ErrorKind::Invalid),
            (401, ErrorKind::Unauthorized),
            (403, ErrorKind::Unauthorized),
            (404, ErrorKind::NotFound),
            (409, ErrorKind::Conflict),
            (500, ErrorKind::Transient),
            (502, ErrorKind::Transient),
            (504, ErrorKind::Transient),
        ] {
            let status = StatusCode::from_u16(status).unwrap();
            assert_eq!(
                map_status(status, b"not json", None, "x").kind(),
                kind,
                "{status}"
            );
        }
        let unauthorized = map_status(StatusCode::UNAUTHORIZED, b"{}", None, "listing");
        assert!(unauthorized.message().contains("apiKey"));
    }
}
