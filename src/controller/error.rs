//! Reconcile errors, by category. The category becomes the Event reason and a metric label.

use crate::provider::{ErrorKind, ProviderError};

/// Why a reconcile did not complete.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Kubernetes API failed (transient from our side: retried with backoff).
    #[error("Kubernetes API error: {0}")]
    Kube(#[from] kube::Error),
    /// A provider call failed.
    #[error("{0}")]
    Provider(#[from] ProviderError),
    /// The spec cannot be acted on; waits for a spec change.
    #[error("{0}")]
    InvalidSpec(String),
    /// A referenced object is missing or not ready yet.
    #[error("{0}")]
    Dependency(String),
    /// The finalizer machinery failed.
    #[error("finalizer: {0}")]
    Finalizer(String),
}

impl Error {
    /// CamelCase category for Event reasons and metric labels.
    pub fn category(&self) -> &'static str {
        match self {
            Error::Kube(_) => "KubeApiError",
            Error::Provider(e) => provider_category(e),
            Error::InvalidSpec(_) => "InvalidSpec",
            Error::Dependency(_) => "DependencyNotReady",
            Error::Finalizer(_) => "FinalizerError",
        }
    }
}

/// The Event/condition reason of a provider failure: a provider's finer reason
/// (`InsufficientCapacity`, `LeaseHeld`) when it gave one, else one per kind.
fn provider_category(e: &ProviderError) -> &'static str {
    if e.reason() != e.category() {
        return e.reason();
    }
    match e.kind() {
        ErrorKind::NotFound => "ProviderNotFound",
        ErrorKind::Unsupported => "ProviderUnsupported",
        ErrorKind::Conflict => "ProviderConflict",
        ErrorKind::Transient => "ProviderUnavailable",
        ErrorKind::Invalid => "ProviderRejected",
        ErrorKind::Unauthorized => "ProviderUnauthorized",
    }
}

/// Every category [`Error::category`] gives without a provider's finer reason (for metrics
/// that exist from the start).
pub const CATEGORIES: &[&str] = &[
    "KubeApiError",
    "InvalidSpec",
    "DependencyNotReady",
    "FinalizerError",
    "ProviderNotFound",
    "ProviderUnsupported",
    "ProviderConflict",
    "ProviderUnavailable",
    "ProviderRejected",
    "ProviderUnauthorized",
];

/// Result alias for reconcilers.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_errors_map_to_distinct_reasons() {
        let cases = [
            (ProviderError::not_found("x"), "ProviderNotFound"),
            (ProviderError::unsupported("x"), "ProviderUnsupported"),
            (ProviderError::conflict("x"), "ProviderConflict"),
            (ProviderError::transient("x"), "ProviderUnavailable"),
            (ProviderError::invalid("x"), "ProviderRejected"),
            (ProviderError::unauthorized("x"), "ProviderUnauthorized"),
            (
                ProviderError::transient("no room").with_reason("InsufficientCapacity"),
                "InsufficientCapacity",
            ),
        ];
        for (err, reason) in cases {
            let category = Error::Provider(err).category();
            assert_eq!(category, reason);
            assert!(
                CATEGORIES.contains(&category) || category == "InsufficientCapacity",
                "{category} is missing from CATEGORIES"
            );
        }
        for err in [
            Error::InvalidSpec("x".into()),
            Error::Dependency("x".into()),
            Error::Finalizer("x".into()),
        ] {
            assert!(CATEGORIES.contains(&err.category()), "{err:?}");
        }
    }
}
