//! `GET /sandboxes/{id}/logs` and `GET /v2/sandboxes/{id}/logs`: the sandbox's main-process
//! output, read through the provider seam's logs capability (as the access layer's `log`
//! subresource reads it), answered in E2B's shapes — v1 `SandboxLogs` (`logs` of
//! `{timestamp, line}` and the same lines as `logEntries`), v2 `SandboxLogsV2Response`.
//!
//! A provider without the capability is answered with a 500 naming the provider (a code the
//! spec lists for this path), never an empty list: an empty list means "read, and nothing
//! was written". The main process's output carries no levels; every line is `info`, so a
//! `level` filter above `info` is refused rather than answered with everything.

use axum::Router;
use axum::extract::Query;
use axum::extract::rejection::QueryRejection;
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::get;
use chrono::{DateTime, SecondsFormat, TimeZone, Utc};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::json;

use super::caller::Target;
use super::error::{ApiError, json};
use super::id;
use super::routes::E2bState;
use crate::access::lookup::Need;
use crate::provider::stream::LogRequest;

/// Lines answered when the request names no `limit`.
pub const DEFAULT_LIMIT: usize = 1000;
/// The most lines one answer carries.
pub const MAX_LIMIT: usize = 10_000;
/// The most log bytes read for one answer; a longer log must be narrowed with `start` or
/// `cursor`.
pub const MAX_BYTES: usize = 32 << 20;

/// The two log routes.
pub fn router() -> Router<E2bState> {
    Router::new()
        .route("/sandboxes/{id}/logs", get(v1))
        .route("/v2/sandboxes/{id}/logs", get(v2))
}

/// v1 query: `start` (ms since the epoch) and `limit`.
#[derive(Debug, Default, Deserialize)]
struct V1Query {
    start: Option<i64>,
    limit: Option<usize>,
}

/// v2 query: `cursor` (ms since the epoch), `direction`, `level`, `limit`, `search`.
#[derive(Debug, Default, Deserialize)]
struct V2Query {
    cursor: Option<i64>,
    direction: Option<Direction>,
    level: Option<Level>,
    limit: Option<usize>,
    search: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Direction {
    Forward,
    Backward,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Level {
    Debug,
    Info,
    Warn,
    Error,
}

/// One line of the log with the time the provider recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// When it was written.
    pub at: DateTime<Utc>,
    /// The text, without the newline.
    pub text: String,
}

/// Which lines an answer carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pick {
    /// Lines at or after (forward) or at or before (backward) this time.
    pub from: Option<DateTime<Utc>>,
    /// Newest first.
    pub backward: bool,
    /// At most this many.
    pub limit: usize,
    /// Only lines containing this (case-sensitive).
    pub search: Option<String>,
}

async fn v1(t: Target, q: Result<Query<V1Query>, QueryRejection>) -> Result<Response, ApiError> {
    let Query(q) = q.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let pick = Pick {
        from: q.start.map(millis).transpose()?,
        backward: false,
        limit: limit(q.limit)?,
        search: None,
    };
    let lines = select(read(&t, &pick).await?, &pick);
    let logs: Vec<_> = lines
        .iter()
        .map(|l| json!({"timestamp": stamp(l.at), "line": l.text}))
        .collect();
    let entries: Vec<_> = lines.iter().map(entry).collect();
    Ok(json(
        StatusCode::OK,
        &json!({"logs": logs, "logEntries": entries}),
    ))
}

async fn v2(t: Target, q: Result<Query<V2Query>, QueryRejection>) -> Result<Response, ApiError> {
    let Query(q) = q.map_err(|e| ApiError::bad_request(e.body_text()))?;
    if matches!(q.level, Some(Level::Warn | Level::Error)) {
        return Err(ApiError::bad_request(
            "level: the main process's output has no levels (every line is info); \
             ask for info or debug, or use search",
        ));
    }
    let pick = Pick {
        from: q.cursor.map(millis).transpose()?,
        backward: q.direction == Some(Direction::Backward),
        limit: limit(q.limit)?,
        search: q.search,
    };
    let lines = select(read(&t, &pick).await?, &pick);
    let logs: Vec<_> = lines.iter().map(entry).collect();
    Ok(json(StatusCode::OK, &json!({"logs": logs})))
}

/// A `SandboxLogEntry`.
fn entry(l: &Line) -> serde_json::Value {
    json!({"timestamp": stamp(l.at), "level": "info", "message": l.text, "fields": {}})
}

fn stamp(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

fn millis(ms: i64) -> Result<DateTime<Utc>, ApiError> {
    Utc.timestamp_millis_opt(ms)
        .single()
        .ok_or_else(|| ApiError::bad_request(format!("{ms} is not a time in milliseconds")))
}

fn limit(asked: Option<usize>) -> Result<usize, ApiError> {
    match asked.unwrap_or(DEFAULT_LIMIT) {
        0 => Err(ApiError::bad_request("limit must be at least 1")),
        n => Ok(n.min(MAX_LIMIT)),
    }
}

/// The sandbox's whole log (from `pick.from` on, going forward), through its provider's
/// logs capability.
async fn read(t: &Target, pick: &Pick) -> Result<Vec<Line>, ApiError> {
    let object = id::parse(&t.sid).ok_or_else(|| ApiError::sandbox_not_found(&t.sid))?;
    let target = t
        .caller
        .state
        .sandboxes
        .find(&object.namespace, &object.name, Need::Existing)
        .await
        .map_err(access_error)?;
    read_target(&target, pick).await
}

/// The log of `target` (from `pick.from` on, going forward).
pub async fn read_target(
    target: &crate::access::lookup::Target,
    pick: &Pick,
) -> Result<Vec<Line>, ApiError> {
    let handle = &target.handle;
    let Some(logs) = handle.provider.logs() else {
        return Err(ApiError::internal(format!(
            "provider {} cannot read a sandbox's log (it has no logs capability)",
            handle.name()
        )));
    };
    let since_seconds = match (pick.backward, pick.from) {
        (false, Some(from)) => Some((Utc::now() - from).num_seconds().max(0) as u64 + 1),
        _ => None,
    };
    let request = LogRequest {
        follow: false,
        tail_lines: None,
        since_seconds,
        timestamps: true,
    };
    let stream = handle
        .call("logs", logs.logs(&target.id, &request))
        .await
        .map_err(|e| access_error(crate::access::status::AccessError::from_provider("log", &e)))?;
    let bytes = collect(stream, handle.name()).await?;
    parse(&bytes, handle.name())
}

/// The stream's bytes, at most [`MAX_BYTES`].
async fn collect(
    mut stream: futures::stream::BoxStream<'static, crate::provider::ProviderResult<bytes::Bytes>>,
    provider: &str,
) -> Result<Vec<u8>, ApiError> {
    let mut out = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| {
            access_error(crate::access::status::AccessError::from_provider("log", &e))
        })?;
        out.extend_from_slice(&chunk);
        if out.len() > MAX_BYTES {
            return Err(ApiError::internal(format!(
                "provider {provider}: the log is larger than {MAX_BYTES} bytes; narrow it with \
                 start or cursor"
            )));
        }
    }
    Ok(out)
}

/// Lines as the seam writes them with `timestamps`: an RFC 3339 time, a space, the text.
pub fn parse(bytes: &[u8], provider: &str) -> Result<Vec<Line>, ApiError> {
    let text = String::from_utf8_lossy(bytes);
    text.lines()
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (at, rest) = l.split_once(' ').unwrap_or((l, ""));
            let at = DateTime::parse_from_rfc3339(at).map_err(|_| {
                ApiError::internal(format!(
                    "provider {provider} gave a log line without a timestamp: {l:?}"
                ))
            })?;
            Ok(Line {
                at: at.with_timezone(&Utc),
                text: rest.trim_end_matches('\r').to_string(),
            })
        })
        .collect()
}

/// The lines `pick` asks for, in its direction.
pub fn select(mut lines: Vec<Line>, pick: &Pick) -> Vec<Line> {
    lines.retain(|l| match (pick.from, pick.backward) {
        (Some(from), false) => l.at >= from,
        (Some(from), true) => l.at <= from,
        (None, _) => true,
    });
    if let Some(s) = &pick.search {
        lines.retain(|l| l.text.contains(s.as_str()));
    }
    if pick.backward {
        lines.reverse();
    }
    lines.truncate(pick.limit);
    lines
}

/// The access layer's error as this API's `{code, message}`.
fn access_error(e: crate::access::status::AccessError) -> ApiError {
    let (status, _) = e.code_and_reason();
    ApiError {
        status,
        message: e.to_string(),
    }
}

#[cfg(test)]
#[path = "logs_tests.rs"]
mod tests;
