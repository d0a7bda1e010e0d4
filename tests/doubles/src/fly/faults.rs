//! Per-test fault injection and the request log.
//!
//! A test arms rules (`rate_limit`, `fail`, `delay`, `drop_connection`, `truncate`) that match
//! requests by method and path substring and fire a given number of times. The server's gate
//! consults them before routing, and records every request (faulted or not) so a test can
//! count what a client really sent — for example that it waited as `Retry-After` said.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{Method, StatusCode};

use crate::{History, HistoryMode};

/// Which requests a rule applies to.
#[derive(Debug, Clone, Default)]
pub struct Matcher {
    /// Only this method (`None` = any).
    pub method: Option<Method>,
    /// Only paths containing this (`None` = any).
    pub path_contains: Option<String>,
    /// Only query strings containing this (`None` = any).
    pub query_contains: Option<String>,
}

impl Matcher {
    /// Every request.
    pub fn any() -> Self {
        Matcher::default()
    }

    /// Requests of `method` whose path contains `part`.
    pub fn on(method: Method, part: &str) -> Self {
        Matcher {
            method: Some(method),
            path_contains: Some(part.to_string()),
            query_contains: None,
        }
    }

    /// Any method, path containing `part`.
    pub fn path(part: &str) -> Self {
        Matcher {
            method: None,
            path_contains: Some(part.to_string()),
            query_contains: None,
        }
    }

    /// Narrows to query strings containing `part` (`cursor=` matches every later page).
    pub fn with_query(mut self, part: &str) -> Self {
        self.query_contains = Some(part.to_string());
        self
    }

    fn matches(&self, method: &Method, path: &str, query: &str) -> bool {
        self.method.as_ref().is_none_or(|m| m == method)
            && self
                .path_contains
                .as_deref()
                .is_none_or(|p| path.contains(p))
            && self
                .query_contains
                .as_deref()
                .is_none_or(|q| query.contains(q))
    }
}

/// What happens to a matched request.
#[derive(Debug, Clone)]
pub enum Fault {
    /// Answer with this status and `{error, status}` body instead of routing, with an
    /// optional `Retry-After` (seconds).
    Status {
        code: StatusCode,
        message: String,
        classification: Option<String>,
        retry_after: Option<u64>,
    },
    /// Route normally after this delay.
    Delay(Duration),
    /// Close the connection without any response.
    Drop,
    /// Route normally, send the headers, then cut the body halfway.
    Truncate,
}

#[derive(Debug)]
struct Rule {
    matcher: Matcher,
    fault: Fault,
    remaining: Option<usize>,
}

/// The armed rules. Cloning shares them.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    rules: Arc<Mutex<Vec<Rule>>>,
    history: Arc<HistoryMode>,
}

impl Faults {
    /// Arms `fault` for the next `times` matching requests (`None` = until cleared).
    pub fn arm(&self, matcher: Matcher, fault: Fault, times: Option<usize>) {
        lock(&self.rules).push(Rule {
            matcher,
            fault,
            remaining: times,
        });
    }

    /// The next `times` matching requests get 429 with `Retry-After: retry_after_secs`.
    pub fn rate_limit(&self, matcher: Matcher, times: usize, retry_after_secs: u64) {
        self.arm(
            matcher,
            Fault::Status {
                code: StatusCode::TOO_MANY_REQUESTS,
                message: "rate limit exceeded".into(),
                classification: None,
                retry_after: Some(retry_after_secs),
            },
            Some(times),
        );
    }

    /// The next `times` matching requests get `code` with a plain error body.
    pub fn fail(&self, matcher: Matcher, times: usize, code: StatusCode) {
        self.arm(
            matcher,
            Fault::Status {
                code,
                message: format!("injected failure ({code})"),
                classification: None,
                retry_after: None,
            },
            Some(times),
        );
    }

    /// The next `times` machine creates are refused for lack of capacity, the way the API
    /// classifies it (`status: insufficient_capacity`).
    pub fn insufficient_capacity(&self, times: usize) {
        self.arm(
            Matcher::on(Method::POST, "/machines"),
            Fault::Status {
                code: StatusCode::PRECONDITION_FAILED,
                message: "insufficient resources available to fulfill request".into(),
                classification: Some("insufficient_capacity".into()),
                retry_after: None,
            },
            Some(times),
        );
    }

    /// The next `times` matching requests are answered only after `delay`.
    pub fn delay(&self, matcher: Matcher, times: usize, delay: Duration) {
        self.arm(matcher, Fault::Delay(delay), Some(times));
    }

    /// The next `times` matching requests see their connection closed without a response.
    pub fn drop_connection(&self, matcher: Matcher, times: usize) {
        self.arm(matcher, Fault::Drop, Some(times));
    }

    /// The next `times` matching responses are cut off halfway through the body.
    pub fn truncate(&self, matcher: Matcher, times: usize) {
        self.arm(matcher, Fault::Truncate, Some(times));
    }

    /// Disarms everything (history is complete again).
    pub fn clear(&self) {
        lock(&self.rules).clear();
        self.history.set(History::Complete);
    }

    /// From now on, machine answers carry `history` (until changed or [`Faults::clear`]).
    pub fn set_history(&self, history: History) {
        self.history.set(history);
    }

    /// Cuts a machine's JSON down to what the history mode lets an answer carry (`listing`:
    /// it is an entry of a listing rather than a `GET` of the machine).
    pub(crate) fn shape_history(&self, machine: &mut serde_json::Value, listing: bool) {
        match self.history.get() {
            History::Complete => {}
            History::OmittedFromListings if listing => {
                if let Some(fields) = machine.as_object_mut() {
                    fields.remove("events");
                }
            }
            History::OmittedFromListings => {}
            History::Truncated => {
                // Events are listed newest first: the first one is the newest.
                if let Some(events) = machine["events"].as_array_mut() {
                    events.truncate(1);
                }
            }
        }
    }

    /// The fault for this request, consuming one firing of the first matching rule.
    pub(crate) fn take(&self, method: &Method, path: &str, query: &str) -> Option<Fault> {
        let mut rules = lock(&self.rules);
        let index = rules
            .iter()
            .position(|r| r.remaining != Some(0) && r.matcher.matches(method, path, query))?;
        let rule = &mut rules[index];
        if let Some(n) = rule.remaining.as_mut() {
            *n -= 1;
        }
        Some(rule.fault.clone())
    }
}

/// One request the double received.
#[derive(Debug, Clone)]
pub struct RequestRecord {
    /// Method.
    pub method: Method,
    /// Path without the query.
    pub path: String,
    /// Raw query string.
    pub query: String,
    /// When it arrived.
    pub at: Instant,
    /// Whether it carried a valid token.
    pub authorized: bool,
}

/// Every request received, in order. Cloning shares it.
#[derive(Debug, Clone, Default)]
pub struct RequestLog {
    records: Arc<Mutex<Vec<RequestRecord>>>,
}

impl RequestLog {
    pub(crate) fn push(&self, record: RequestRecord) {
        lock(&self.records).push(record);
    }

    /// A copy of every record so far.
    pub fn all(&self) -> Vec<RequestRecord> {
        lock(&self.records).clone()
    }

    /// Records matching `matcher`.
    pub fn matching(&self, matcher: &Matcher) -> Vec<RequestRecord> {
        lock(&self.records)
            .iter()
            .filter(|r| matcher.matches(&r.method, &r.path, &r.query))
            .cloned()
            .collect()
    }

    /// How many requests matched `matcher`.
    pub fn count(&self, matcher: &Matcher) -> usize {
        self.matching(matcher).len()
    }

    /// Forgets everything recorded so far.
    pub fn clear(&self) {
        lock(&self.records).clear();
    }
}

/// Locks a mutex, recovering the data if a panicking test thread poisoned it.
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
