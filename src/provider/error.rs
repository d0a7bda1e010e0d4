//! Typed provider errors.
//!
//! The category decides what a controller does next, so it is part of the type rather than
//! something parsed out of a message: `Transient` backs off and retries (no sooner than a
//! `retry_after` the provider asked for), `Invalid` and `Unsupported` stall until the spec
//! changes, `Unauthorized` stalls until the credentials are fixed, `NotFound` is the
//! dead-machine signal, and `Conflict` waits for the other party (an attached volume, an
//! in-use template, a lease held elsewhere) to let go.

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// What the caller should do about a provider failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The provider holds no state for this resource any more (removed, expired, never
    /// created). For a sandbox this is the dead-machine signal: distinct from an application
    /// error, and the controller keys its recreate-or-report decision on it.
    NotFound,
    /// The provider cannot do this at all (a capability or a field it cannot enforce).
    /// Retrying will not help; changing the spec or the provider will.
    Unsupported,
    /// The resource is in a state that forbids the operation right now (a volume still
    /// attached, a template still backing a sandbox, a name already taken by something else,
    /// a lease held by another client).
    Conflict,
    /// The attempt failed for a reason that may go away (engine unreachable, timeout, 5xx,
    /// 429, no capacity right now).
    Transient,
    /// The input is wrong and retrying the same input will fail the same way.
    Invalid,
    /// The provider refused our credentials (missing, wrong, revoked, or lacking a
    /// permission). Retrying fast only hammers the provider: the operator's credentials have
    /// to be fixed, so this stalls every object on the provider with one clear condition.
    Unauthorized,
}

impl ErrorKind {
    /// A stable CamelCase category, used as the Event/condition reason and as a metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::NotFound => "NotFound",
            ErrorKind::Unsupported => "Unsupported",
            ErrorKind::Conflict => "Conflict",
            ErrorKind::Transient => "Transient",
            ErrorKind::Invalid => "Invalid",
            ErrorKind::Unauthorized => "Unauthorized",
        }
    }
}

/// What went wrong at a provider, by what the caller should do about it.
///
/// Every message names what to fix (a field, a setting, a resource), because it ends up
/// verbatim in a `Stalled` condition and an Event that a user reads. The source chain is for
/// logs; it never carries credentials (providers build errors from status codes and response
/// bodies, never from request headers).
#[derive(Debug, Clone)]
pub struct ProviderError {
    kind: ErrorKind,
    message: String,
    /// A finer reason than the kind, when the provider has one (`InsufficientCapacity`,
    /// `LeaseHeld`). Becomes the condition/Event reason instead of the kind's.
    reason: Option<&'static str>,
    retry_after: Option<Duration>,
    source: Option<Arc<dyn StdError + Send + Sync>>,
}

impl ProviderError {
    /// An error of `kind` with a message that names what to fix.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        ProviderError {
            kind,
            message: message.into(),
            reason: None,
            retry_after: None,
            source: None,
        }
    }

    /// See [`ErrorKind::NotFound`].
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, message)
    }

    /// See [`ErrorKind::Unsupported`].
    pub fn unsupported(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unsupported, message)
    }

    /// See [`ErrorKind::Conflict`].
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Conflict, message)
    }

    /// See [`ErrorKind::Transient`].
    pub fn transient(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Transient, message)
    }

    /// See [`ErrorKind::Invalid`].
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Invalid, message)
    }

    /// See [`ErrorKind::Unauthorized`].
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unauthorized, message)
    }

    /// Attaches the underlying error (kept for `source()` and logs).
    pub fn with_source(mut self, source: impl StdError + Send + Sync + 'static) -> Self {
        self.source = Some(Arc::new(source));
        self
    }

    /// Records how long the provider asked us to wait (HTTP `Retry-After`, a body's
    /// `retry_after_seconds`). The controller's backoff never retries sooner.
    pub fn with_retry_after(mut self, after: Option<Duration>) -> Self {
        self.retry_after = after;
        self
    }

    /// A finer CamelCase reason than the kind (`InsufficientCapacity`, `LeaseHeld`).
    pub fn with_reason(mut self, reason: &'static str) -> Self {
        self.reason = Some(reason);
        self
    }

    /// The same error with `context: ` put before its message (kind, reason, retry hint and
    /// source are kept).
    pub fn context(mut self, context: impl fmt::Display) -> Self {
        self.message = format!("{context}: {}", self.message);
        self
    }

    /// What the caller should do.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// Whether this is of `kind`.
    pub fn is(&self, kind: ErrorKind) -> bool {
        self.kind == kind
    }

    /// The provider's own minimum wait before a retry, when it gave one.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// A stable CamelCase category, used as a metric label.
    pub fn category(&self) -> &'static str {
        self.kind.as_str()
    }

    /// The condition/Event reason: the finer reason when there is one, else the category.
    pub fn reason(&self) -> &'static str {
        self.reason.unwrap_or_else(|| self.kind.as_str())
    }

    /// Whether retrying the same request later can succeed without a spec change.
    pub fn is_retryable(&self) -> bool {
        matches!(self.kind, ErrorKind::Transient | ErrorKind::Conflict)
    }

    /// The human-readable part, without the category prefix.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for ProviderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let category = match self.kind {
            ErrorKind::NotFound => "not found",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::Conflict => "conflict",
            ErrorKind::Transient => "transient",
            ErrorKind::Invalid => "invalid",
            ErrorKind::Unauthorized => "unauthorized",
        };
        write!(f, "{category}: {}", self.message)
    }
}

impl StdError for ProviderError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|s| s as &(dyn StdError + 'static))
    }
}

/// Equality by what a caller can act on (kind, reason, message, retry hint); the source is
/// diagnostic and not compared.
impl PartialEq for ProviderError {
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind
            && self.reason == other.reason
            && self.message == other.message
            && self.retry_after == other.retry_after
    }
}

impl Eq for ProviderError {}

/// Parses an HTTP `Retry-After` value: delay-seconds, or an HTTP date (as a delay from now).
/// `None` for anything else, so a malformed header falls back to the normal backoff.
pub fn parse_retry_after(value: &str) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = chrono::DateTime::parse_from_rfc2822(value).ok()?;
    let delta = at.with_timezone(&chrono::Utc) - chrono::Utc::now();
    Some(delta.to_std().unwrap_or(Duration::ZERO))
}

/// The seam's kind for an HTTP error status from a provider's REST API — the one table Fly
/// Machines, E2B and Sprites all answer by:
///
/// | status | kind |
/// |---|---|
/// | 400, 422 and every other 4xx not below | `Invalid` |
/// | 401, 403 | `Unauthorized` |
/// | 404, 410 | `NotFound` |
/// | 409, 412 | `Conflict` |
/// | 408, 425, 429 | `Transient` |
/// | 5xx, and anything that is not a 4xx | `Transient` |
///
/// "Other 4xx" is `Invalid`, not `Transient`: a 4xx is the API saying the request itself is
/// wrong (a method, a media type, a body too large), and the same request sent again gets the
/// same answer. As `Transient` it would be retried with backoff forever, and the object would
/// say "retrying" while the fix waits on a person; as `Invalid` it stalls with the API's own
/// words until the spec or the settings change. The 4xx that do pass by waiting are named: a
/// request timeout (408), too early (425), a rate limit (429). 410 is the API saying the
/// resource is gone for good, which is what `NotFound` means; 412 is a state that forbids the
/// operation now (Fly answers it for a machine in the wrong state), which is `Conflict`. Every
/// status that is not a 4xx — a 5xx, or a 1xx/3xx the client did not follow — is the service
/// failing, not the request, and may pass.
pub fn status_kind(status: u16) -> ErrorKind {
    match status {
        401 | 403 => ErrorKind::Unauthorized,
        404 | 410 => ErrorKind::NotFound,
        409 | 412 => ErrorKind::Conflict,
        408 | 425 | 429 => ErrorKind::Transient,
        400..=499 => ErrorKind::Invalid,
        _ => ErrorKind::Transient,
    }
}

/// An error of [`status_kind`]'s kind for `status` with `message`. A retryable one carries the
/// wait the API asked for; a 429 has the reason `RateLimited`. Providers add their own finer
/// reasons (capacity, a held lease) and hints (which setting holds the token) on top.
pub fn from_status(status: u16, message: String, retry_after: Option<Duration>) -> ProviderError {
    let err = ProviderError::new(status_kind(status), message);
    match err.kind {
        ErrorKind::Transient | ErrorKind::Conflict if status == 429 => {
            err.with_reason("RateLimited").with_retry_after(retry_after)
        }
        ErrorKind::Transient | ErrorKind::Conflict => err.with_retry_after(retry_after),
        _ => err,
    }
}

/// Result alias for provider calls.
pub type ProviderResult<T> = Result<T, ProviderError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn categories_and_retryability_follow_the_kind() {
        let cases = [
            (ProviderError::not_found("x"), "NotFound", false),
            (ProviderError::unsupported("x"), "Unsupported", false),
            (ProviderError::conflict("x"), "Conflict", true),
            (ProviderError::transient("x"), "Transient", true),
            (ProviderError::invalid("x"), "Invalid", false),
            (ProviderError::unauthorized("x"), "Unauthorized", false),
        ];
        for (err, category, retryable) in cases {
            assert_eq!(err.category(), category);
            assert_eq!(err.reason(), category);
            assert_eq!(err.is_retryable(), retryable, "{category}");
        }
    }

    #[test]
    fn a_finer_reason_replaces_the_category_as_reason_only() {
        let err = ProviderError::transient("no room in iad").with_reason("InsufficientCapacity");
        assert_eq!(err.reason(), "InsufficientCapacity");
        assert_eq!(err.category(), "Transient");
        assert!(err.is_retryable());
    }

    #[test]
    fn source_chain_and_context_are_kept() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let err = ProviderError::transient("engine unreachable")
            .with_source(io)
            .with_retry_after(Some(Duration::from_secs(3)))
            .context("creating sbx-1");
        assert_eq!(err.message(), "creating sbx-1: engine unreachable");
        assert_eq!(
            err.to_string(),
            "transient: creating sbx-1: engine unreachable"
        );
        assert_eq!(err.retry_after(), Some(Duration::from_secs(3)));
        let source = err.source().expect("source kept");
        assert_eq!(source.to_string(), "refused");
    }

    #[test]
    fn retry_after_parses_seconds_and_dates_and_ignores_garbage() {
        assert_eq!(parse_retry_after(" 7 "), Some(Duration::from_secs(7)));
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"),
            Some(Duration::ZERO),
            "a date in the past means now"
        );
        let soon = (chrono::Utc::now() + chrono::Duration::seconds(30)).to_rfc2822();
        let parsed = parse_retry_after(&soon).expect("future date");
        assert!(parsed <= Duration::from_secs(30) && parsed >= Duration::from_secs(28));
        assert_eq!(parse_retry_after("soon"), None);
        assert_eq!(parse_retry_after("-1"), None);
    }

    #[test]
    fn http_statuses_map_by_one_table() {
        let cases = [
            (400, ErrorKind::Invalid),
            (422, ErrorKind::Invalid),
            (405, ErrorKind::Invalid),
            (413, ErrorKind::Invalid),
            (415, ErrorKind::Invalid),
            (401, ErrorKind::Unauthorized),
            (403, ErrorKind::Unauthorized),
            (404, ErrorKind::NotFound),
            (410, ErrorKind::NotFound),
            (409, ErrorKind::Conflict),
            (412, ErrorKind::Conflict),
            (408, ErrorKind::Transient),
            (425, ErrorKind::Transient),
            (429, ErrorKind::Transient),
            (500, ErrorKind::Transient),
            (502, ErrorKind::Transient),
            (503, ErrorKind::Transient),
            (504, ErrorKind::Transient),
            (302, ErrorKind::Transient),
        ];
        for (status, kind) in cases {
            assert_eq!(status_kind(status), kind, "{status}");
            assert_eq!(
                from_status(status, "m".into(), None).kind(),
                kind,
                "{status}"
            );
        }
    }

    #[test]
    fn http_errors_keep_the_wait_only_where_waiting_helps() {
        let wait = Some(Duration::from_secs(4));
        let limited = from_status(429, "slow down".into(), wait);
        assert_eq!(limited.reason(), "RateLimited");
        assert_eq!(limited.retry_after(), wait);
        assert_eq!(limited.message(), "slow down");
        assert_eq!(from_status(503, "m".into(), wait).retry_after(), wait);
        assert_eq!(from_status(503, "m".into(), wait).reason(), "Transient");
        assert_eq!(from_status(400, "m".into(), wait).retry_after(), None);
    }
}
