//! The API server's answers as provider errors: its status code decides what the controller
//! does next.

use crate::provider::{ErrorKind, ProviderError};

/// Maps a failed API call about `what` to the provider error of its kind. A refusal keeps
/// the API server's own message, which names the field (`spec.containers[0].image`) or the
/// permission that is missing.
pub fn from_kube(e: kube::Error, what: &str) -> ProviderError {
    let kind = match &e {
        kube::Error::Api(status) => match status.code {
            404 => ErrorKind::NotFound,
            409 => ErrorKind::Conflict,
            400 | 422 => ErrorKind::Invalid,
            401 | 403 => ErrorKind::Unauthorized,
            _ => ErrorKind::Transient,
        },
        _ => ErrorKind::Transient,
    };
    let detail = match &e {
        kube::Error::Api(status) => status.message.clone(),
        other => other.to_string(),
    };
    let hint = match kind {
        ErrorKind::Unauthorized => {
            "; grant the operator's account the provider's RBAC (the chart renders a Role \
             in the provider's namespace for each kubernetes provider)"
        }
        ErrorKind::Transient => "; the API server will be asked again",
        _ => "",
    };
    ProviderError::new(kind, format!("{what}: {detail}{hint}")).with_source(e)
}

/// `Ok(None)` for a 404, the value otherwise.
pub fn absent_ok<T>(
    result: Result<T, kube::Error>,
    what: &str,
) -> Result<Option<T>, ProviderError> {
    match result {
        Ok(v) => Ok(Some(v)),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
        Err(e) => Err(from_kube(e, what)),
    }
}
