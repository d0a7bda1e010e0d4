//! `GET /v2/sandboxes` (metadata query, state filter, order, `nextToken` paging) and the v1
//! `GET /sandboxes` (running only, one page). The metadata query selects on the index labels
//! at the API server, then every entry is compared exactly with the metadata annotation.
//!
//! A page is cut from the whole selection sorted by start time, so the order holds across
//! pages; `nextToken` is the last item's (start time, name) cursor. Each page is one list.

use std::collections::BTreeMap;

use axum::extract::RawQuery;
use axum::http::HeaderValue;
use axum::response::Response;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Utc};
use kube::ResourceExt;
use kube::api::ListParams;

use super::caller::Caller;
use super::error::{ApiError, json};
use super::mapping::{self, MANAGED_LABEL};
use super::view;
use crate::api::Sandbox;

/// Largest page (the spec's maximum, and its default).
const MAX_LIMIT: usize = 100;

/// A list request.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Query {
    /// Exact metadata entries wanted.
    pub metadata: BTreeMap<String, String>,
    /// `running` and/or `paused`; empty: both.
    pub states: Vec<String>,
    /// Oldest first when true (default newest first).
    pub ascending: bool,
    /// Page size.
    pub limit: usize,
    /// Cursor: the last item of the previous page.
    pub after: Option<(i64, String)>,
    /// Only sandboxes of this template id.
    pub template: Option<String>,
    /// Only sandboxes started at or after this time.
    pub started_after: Option<DateTime<Utc>>,
}

/// The query string of a v2 list.
pub fn parse(raw: &str) -> Result<Query, ApiError> {
    let mut q = Query {
        limit: MAX_LIMIT,
        ..Query::default()
    };
    for (k, v) in url::form_urlencoded::parse(raw.as_bytes()) {
        match k.as_ref() {
            "metadata" => q.metadata = metadata_query(&v)?,
            "state" => q.states = states(&v)?,
            "order" => q.ascending = order(&v)?,
            "limit" => q.limit = limit(&v)?,
            "nextToken" => q.after = Some(cursor(&v)?),
            "template" => q.template = Some(v.into_owned()),
            "startedAfter" => q.started_after = Some(time(&v)?),
            _ => {}
        }
    }
    Ok(q)
}

/// `k=v&k2=v2`, each key and value URL-encoded once more (as the SDKs send it).
fn metadata_query(v: &str) -> Result<BTreeMap<String, String>, ApiError> {
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8()
            .map(|c| c.into_owned())
            .map_err(|e| ApiError::bad_request(format!("metadata query: {e}")))
    };
    url::form_urlencoded::parse(v.as_bytes())
        .map(|(k, v)| Ok((decode(&k)?, decode(&v)?)))
        .collect()
}

fn states(v: &str) -> Result<Vec<String>, ApiError> {
    v.split(',')
        .filter(|s| !s.is_empty())
        .map(|s| match s {
            "running" | "paused" => Ok(s.to_string()),
            other => Err(ApiError::bad_request(format!(
                "state {other:?}: running or paused"
            ))),
        })
        .collect()
}

fn order(v: &str) -> Result<bool, ApiError> {
    match v {
        "asc" => Ok(true),
        "desc" => Ok(false),
        other => Err(ApiError::bad_request(format!(
            "order {other:?}: asc or desc"
        ))),
    }
}

fn limit(v: &str) -> Result<usize, ApiError> {
    v.parse::<usize>()
        .ok()
        .filter(|n| (1..=MAX_LIMIT).contains(n))
        .ok_or_else(|| ApiError::bad_request(format!("limit {v:?}: 1 to {MAX_LIMIT}")))
}

fn time(v: &str) -> Result<DateTime<Utc>, ApiError> {
    DateTime::parse_from_rfc3339(v)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| ApiError::bad_request(format!("startedAfter {v:?}: {e}")))
}

fn cursor(v: &str) -> Result<(i64, String), ApiError> {
    let bad = || ApiError::bad_request(format!("nextToken {v:?} is not one this API issued"));
    let text = URL_SAFE_NO_PAD.decode(v).map_err(|_| bad())?;
    let text = String::from_utf8(text).map_err(|_| bad())?;
    let (secs, name) = text.split_once('/').ok_or_else(bad)?;
    Ok((secs.parse().map_err(|_| bad())?, name.to_string()))
}

fn token(secs: i64, name: &str) -> String {
    URL_SAFE_NO_PAD.encode(format!("{secs}/{name}"))
}

/// The label selector: this API's sandboxes with every wanted metadata index label.
pub fn selector(q: &Query) -> String {
    let mut parts = vec![format!("{MANAGED_LABEL}=true")];
    parts.extend(q.metadata.iter().map(|(k, v)| {
        let (label, value) = mapping::metadata_label(k, v);
        format!("{label}={value}")
    }));
    parts.join(",")
}

/// The page of `items` that `q` asks for, and the token of the next one.
pub fn page(
    mut items: Vec<Sandbox>,
    q: &Query,
    now: DateTime<Utc>,
) -> (Vec<Sandbox>, Option<String>) {
    let key = |s: &Sandbox| {
        (
            view::created_at(s).map_or(0, |t| t.timestamp()),
            s.name_any(),
        )
    };
    items.retain(|s| wanted(s, q, now));
    items.sort_by_key(key);
    if !q.ascending {
        items.reverse();
    }
    if let Some(after) = &q.after {
        let past = |s: &Sandbox| match q.ascending {
            true => key(s) > *after,
            false => key(s) < *after,
        };
        items.retain(past);
    }
    let more = items.len() > q.limit;
    items.truncate(q.limit);
    let next = more
        .then(|| items.last().map(key))
        .flatten()
        .map(|(secs, name)| token(secs, &name));
    (items, next)
}

fn wanted(s: &Sandbox, q: &Query, now: DateTime<Utc>) -> bool {
    let metadata = mapping::metadata_of(s);
    let state = mapping::state_of(s, now);
    view::live(s)
        && q.metadata.iter().all(|(k, v)| metadata.get(k) == Some(v))
        && (q.states.is_empty() || q.states.iter().any(|w| w == state))
        && q.template
            .as_ref()
            .is_none_or(|t| *t == view::template_of(s))
        && q.started_after
            .is_none_or(|after| view::created_at(s).is_some_and(|c| c >= after))
}

/// `GET /v2/sandboxes`.
pub async fn list_v2(c: Caller, RawQuery(raw): RawQuery) -> Result<Response, ApiError> {
    let q = parse(raw.as_deref().unwrap_or_default())?;
    answer(&c, &q).await
}

/// `GET /sandboxes` (deprecated): the running sandboxes, with the metadata query.
pub async fn list_v1(c: Caller, RawQuery(raw): RawQuery) -> Result<Response, ApiError> {
    let mut q = Query {
        limit: usize::MAX,
        states: vec!["running".into()],
        ..Query::default()
    };
    for (k, v) in url::form_urlencoded::parse(raw.as_deref().unwrap_or_default().as_bytes()) {
        if k == "metadata" {
            q.metadata = metadata_query(&v)?;
        }
    }
    answer(&c, &q).await
}

async fn answer(c: &Caller, q: &Query) -> Result<Response, ApiError> {
    let listed = c
        .api
        .list(&ListParams::default().labels(&selector(q)))
        .await
        .map_err(|e| ApiError::from_kube("listing the Sandboxes", e))?;
    let now = Utc::now();
    let (items, next) = page(listed.items, q, now);
    let infos: Vec<_> = items
        .iter()
        .map(|i| view::info(i, &c.state.site, now))
        .collect();
    let mut response = json(axum::http::StatusCode::OK, &infos);
    if let Some(next) = next.and_then(|n| HeaderValue::from_str(&n).ok()) {
        response.headers_mut().insert("x-next-token", next);
    }
    Ok(response)
}

#[cfg(test)]
#[path = "list_tests.rs"]
mod tests;
