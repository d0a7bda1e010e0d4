//! Every refusal and failure of the aggregated API, and how it reaches the client: a
//! `metav1.Status` JSON body with the HTTP code a Kubernetes client expects, so kubectl and
//! client libraries show the message as they show an API server's own.

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::provider::{ErrorKind, ProviderError};

/// Why a request was refused or failed. The message is shown to the user as is: it names
/// what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AccessError {
    /// No valid front-proxy identity.
    #[error("{0}")]
    Unauthorized(String),
    /// The SubjectAccessReview denied it.
    #[error("{0}")]
    Forbidden(String),
    /// No such Sandbox, or nothing left of it at the provider.
    #[error("{0}")]
    NotFound(String),
    /// The Sandbox exists but cannot serve this now (not Ready).
    #[error("{0}")]
    Conflict(String),
    /// A malformed request (parameters, protocol).
    #[error("{0}")]
    BadRequest(String),
    /// The request body is larger than the configured limit.
    #[error("{0}")]
    TooLarge(String),
    /// The provider cannot do this at all.
    #[error("{0}")]
    NotImplemented(String),
    /// Something that may go away (the provider or the API server unreachable).
    #[error("{0}")]
    Unavailable(String),
    /// A failure of ours.
    #[error("{0}")]
    Internal(String),
}

impl AccessError {
    /// The HTTP status and the `metav1.Status` reason (the API server's one table).
    pub fn code_and_reason(&self) -> (StatusCode, &'static str) {
        match self {
            AccessError::Unauthorized(_) => (StatusCode::UNAUTHORIZED, "Unauthorized"),
            AccessError::Forbidden(_) => (StatusCode::FORBIDDEN, "Forbidden"),
            AccessError::NotFound(_) => (StatusCode::NOT_FOUND, "NotFound"),
            AccessError::Conflict(_) => (StatusCode::CONFLICT, "Conflict"),
            AccessError::BadRequest(_) => (StatusCode::BAD_REQUEST, "BadRequest"),
            AccessError::TooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "RequestEntityTooLarge"),
            AccessError::NotImplemented(_) => (StatusCode::NOT_IMPLEMENTED, "NotImplemented"),
            AccessError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailable"),
            AccessError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "InternalError"),
        }
    }

    /// A provider's failure while serving `what` for the user (`exec`, `log` …).
    pub fn from_provider(what: &str, error: &ProviderError) -> AccessError {
        let message = format!("{what}: {error}");
        match error.kind() {
            ErrorKind::NotFound => AccessError::NotFound(message),
            ErrorKind::Unsupported => AccessError::NotImplemented(message),
            ErrorKind::Conflict => AccessError::Conflict(message),
            ErrorKind::Invalid => AccessError::BadRequest(message),
            ErrorKind::Transient => AccessError::Unavailable(message),
            _ => AccessError::Internal(message),
        }
    }

    /// The `metav1.Status` body.
    pub fn status_json(&self) -> serde_json::Value {
        let (code, reason) = self.code_and_reason();
        serde_json::json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.to_string(),
            "reason": reason,
            "code": code.as_u16(),
        })
    }
}

impl IntoResponse for AccessError {
    fn into_response(self) -> Response {
        let (code, _) = self.code_and_reason();
        let body = self.status_json().to_string();
        (code, [(header::CONTENT_TYPE, "application/json")], body).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_kinds_map_to_the_codes_clients_expect() {
        let gone =
            AccessError::from_provider("exec", &ProviderError::not_found("no such container"));
        assert_eq!(gone.code_and_reason().0, StatusCode::NOT_FOUND);
        assert!(gone.to_string().starts_with("exec: "), "{gone}");
        let busy = AccessError::from_provider("log", &ProviderError::transient("engine down"));
        assert_eq!(busy.code_and_reason().0, StatusCode::SERVICE_UNAVAILABLE);
        let body = AccessError::Forbidden("no".into()).status_json();
        assert_eq!(body["code"], 403);
        assert_eq!(body["reason"], "Forbidden");
        assert_eq!(body["kind"], "Status");
    }
}
