//! The API's errors and their one wire form, E2B's `{code, message}` body with `code` equal
//! to the HTTP status.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// An error answered to the client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct ApiError {
    /// HTTP status (and the body's `code`).
    pub status: StatusCode,
    /// What went wrong, and what to do about it.
    pub message: String,
}

impl ApiError {
    /// 400: the request asks for something that cannot be mapped or is malformed.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    /// 401: no key, or a key that matches none.
    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "invalid or missing API key in the X-API-KEY header",
        )
    }

    /// 404: the sandbox is unknown (to this key).
    pub fn sandbox_not_found(id: &str) -> Self {
        Self::new(StatusCode::NOT_FOUND, format!("sandbox {id:?} not found"))
    }

    /// 409: the sandbox is not in a state the request can act on.
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, message)
    }

    /// 500: the API server failed us.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }

    /// 503: not ready yet (the API keys are still being read).
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, message)
    }

    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
        }
    }

    /// A Kubernetes API error on behalf of the key's ServiceAccount: its own status where
    /// it has one (403 says which RBAC permission the ServiceAccount lacks), else 500.
    pub fn from_kube(what: &str, e: kube::Error) -> Self {
        match e {
            kube::Error::Api(s) => {
                let status = StatusCode::from_u16(s.code)
                    .ok()
                    .filter(|s| s.is_client_error() || s.is_server_error())
                    .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
                Self::new(status, format!("{what}: {}", s.message))
            }
            other => Self::internal(format!("{what}: {other}")),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({"code": self.status.as_u16(), "message": self.message});
        json(self.status, &body)
    }
}

/// `value` as a JSON response with `status` (the one JSON writer of this API).
pub fn json<T: serde::Serialize>(status: StatusCode, value: &T) -> Response {
    match serde_json::to_vec(value) {
        Ok(bytes) => (
            status,
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            bytes,
        )
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_body_is_code_and_message() {
        let response = ApiError::sandbox_not_found("x").into_response();
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .unwrap();
        let body: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(body["code"], 404);
        assert!(body["message"].as_str().unwrap().contains("\"x\""));
    }
}
