//! Typed provider errors.
//!
//! The category decides what a controller does next, so it is part of the type rather than
//! something parsed out of a message: `Transient` backs off and retries, `Invalid` and
//! `Unsupported` stall until the spec changes, `NotFound` is the dead-machine signal, and
//! `Conflict` waits for the other party (an attached volume, an in-use template) to let go.

/// What went wrong at a provider, by what the caller should do about it.
///
/// Every message names what to fix (a field, a setting, a resource), because it ends up
/// verbatim in a `Stalled` condition and an Event that a user reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    /// The provider holds no state for this resource any more (removed, expired, never
    /// created). For a sandbox this is the dead-machine signal: distinct from an application
    /// error, and the controller keys its recreate-or-report decision on it.
    #[error("not found: {0}")]
    NotFound(String),
    /// The provider cannot do this at all (a capability or a field it cannot enforce).
    /// Retrying will not help; changing the spec or the provider will.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The resource is in a state that forbids the operation right now (a volume still
    /// attached, a template still backing a sandbox, a name already taken by something else).
    #[error("conflict: {0}")]
    Conflict(String),
    /// The attempt failed for a reason that may go away (engine unreachable, timeout, 5xx).
    #[error("transient: {0}")]
    Transient(String),
    /// The input is wrong and retrying the same input will fail the same way.
    #[error("invalid: {0}")]
    Invalid(String),
}

impl ProviderError {
    /// A stable CamelCase category, used as the Event/condition reason and as a metric label.
    pub fn category(&self) -> &'static str {
        match self {
            ProviderError::NotFound(_) => "NotFound",
            ProviderError::Unsupported(_) => "Unsupported",
            ProviderError::Conflict(_) => "Conflict",
            ProviderError::Transient(_) => "Transient",
            ProviderError::Invalid(_) => "Invalid",
        }
    }

    /// Whether retrying the same request later can succeed without a spec change.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            ProviderError::Transient(_) | ProviderError::Conflict(_)
        )
    }

    /// The human-readable part, without the category prefix.
    pub fn message(&self) -> &str {
        match self {
            ProviderError::NotFound(m)
            | ProviderError::Unsupported(m)
            | ProviderError::Conflict(m)
            | ProviderError::Transient(m)
            | ProviderError::Invalid(m) => m,
        }
    }
}

/// Result alias for provider calls.
pub type ProviderResult<T> = Result<T, ProviderError>;
