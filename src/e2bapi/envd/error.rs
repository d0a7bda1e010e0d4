//! envd's errors: a Connect code and a message. Unary calls and plain HTTP answers carry
//! them as an HTTP status with a `{code, message}` body; a server stream ends with them.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::access::status::AccessError;

/// The Connect codes envd answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// A malformed request.
    InvalidArgument,
    /// No or a wrong access token.
    Unauthenticated,
    /// No such sandbox, process, file or watcher.
    NotFound,
    /// It exists already.
    AlreadyExists,
    /// The sandbox cannot serve this now (not running).
    FailedPrecondition,
    /// The provider cannot do this.
    Unimplemented,
    /// The provider or the API server could not be reached.
    Unavailable,
    /// A failure of ours.
    Internal,
}

impl Code {
    /// The code's name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Code::InvalidArgument => "invalid_argument",
            Code::Unauthenticated => "unauthenticated",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::FailedPrecondition => "failed_precondition",
            Code::Unimplemented => "unimplemented",
            Code::Unavailable => "unavailable",
            Code::Internal => "internal",
        }
    }

    /// The HTTP status the Connect protocol pairs with the code.
    pub fn status(self) -> StatusCode {
        match self {
            Code::InvalidArgument | Code::FailedPrecondition => StatusCode::BAD_REQUEST,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::AlreadyExists => StatusCode::CONFLICT,
            Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// An envd error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {message}", code.as_str())]
pub struct EnvdError {
    /// What kind.
    pub code: Code,
    /// What went wrong, and what to do about it.
    pub message: String,
}

impl EnvdError {
    /// An error of `code`.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        EnvdError {
            code,
            message: message.into(),
        }
    }

    /// The Connect end-of-stream form, `{"error": {code, message}}`.
    pub fn end_of_stream(&self) -> serde_json::Value {
        serde_json::json!({"error": {"code": self.code.as_str(), "message": self.message}})
    }
}

impl From<AccessError> for EnvdError {
    fn from(e: AccessError) -> Self {
        let code = match &e {
            AccessError::Unauthorized(_) | AccessError::Forbidden(_) => Code::Unauthenticated,
            AccessError::NotFound(_) => Code::NotFound,
            AccessError::Conflict(_) => Code::FailedPrecondition,
            AccessError::BadRequest(_) | AccessError::TooLarge(_) => Code::InvalidArgument,
            AccessError::NotImplemented(_) => Code::Unimplemented,
            AccessError::Unavailable(_) => Code::Unavailable,
            AccessError::Internal(_) => Code::Internal,
        };
        EnvdError::new(code, e.to_string())
    }
}

impl IntoResponse for EnvdError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({"code": self.code.as_str(), "message": self.message});
        super::super::error::json(self.code.status(), &body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_pair_with_the_connect_statuses() {
        assert_eq!(Code::NotFound.status(), StatusCode::NOT_FOUND);
        assert_eq!(Code::Unauthenticated.status(), StatusCode::UNAUTHORIZED);
        let e = EnvdError::from(AccessError::Conflict("not Ready".into()));
        assert_eq!(e.code, Code::FailedPrecondition);
        assert_eq!(e.end_of_stream()["error"]["code"], "failed_precondition");
    }
}
