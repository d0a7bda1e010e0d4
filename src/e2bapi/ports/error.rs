//! How a port URL request fails: E2B's proxy answers in JSON (`message`, `sandboxId`,
//! `port`) with the status it uses — 502 for a sandbox that is not found and for a port
//! with nothing listening, 403 for a missing or wrong traffic access token — and the
//! message names what to fix; `detail` carries the cause behind E2B's fixed wording.

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::access::status::AccessError;

/// E2B's message for a port with nothing listening.
pub const PORT_CLOSED: &str = "The sandbox is running but port is not open";
/// E2B's message for a sandbox id that names nothing.
pub const NOT_FOUND: &str = "The sandbox was not found";

/// A refused or failed port URL request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message} (sandbox {sid}, port {port})")]
pub struct PortError {
    /// The HTTP status.
    pub status: StatusCode,
    /// What the client reads first.
    pub message: String,
    /// The cause, when the message is E2B's fixed wording.
    pub detail: Option<String>,
    /// The sandbox id addressed.
    pub sid: String,
    /// The port addressed.
    pub port: u16,
}

impl PortError {
    fn new(status: StatusCode, sid: &str, port: u16, message: impl Into<String>) -> PortError {
        PortError {
            status,
            message: message.into(),
            detail: None,
            sid: sid.to_string(),
            port,
        }
    }

    fn with_detail(mut self, detail: impl Into<String>) -> PortError {
        self.detail = Some(detail.into());
        self
    }

    /// No such sandbox (or not one of this API's ids).
    pub fn not_found(sid: &str, port: u16, detail: impl Into<String>) -> PortError {
        PortError::new(StatusCode::BAD_GATEWAY, sid, port, NOT_FOUND).with_detail(detail)
    }

    /// Nothing listens on the port (the provider's words in `detail`).
    pub fn closed(sid: &str, port: u16, detail: impl Into<String>) -> PortError {
        PortError::new(StatusCode::BAD_GATEWAY, sid, port, PORT_CLOSED).with_detail(detail)
    }

    /// The port answered, but not as an HTTP server.
    pub fn bad_gateway(sid: &str, port: u16, detail: impl Into<String>) -> PortError {
        let message = format!(
            "port {port} of sandbox {sid} did not answer HTTP: {}",
            detail.into()
        );
        PortError::new(StatusCode::BAD_GATEWAY, sid, port, message)
    }

    /// The sandbox's provider cannot forward ports at all.
    pub fn no_port_forward(sid: &str, port: u16, provider: &str) -> PortError {
        let message = format!(
            "provider {provider:?} has no port-forward capability, so port URLs cannot reach \
             sandbox {sid}; run it on a provider that can forward ports"
        );
        PortError::new(StatusCode::BAD_GATEWAY, sid, port, message)
    }

    /// The sandbox's port URLs need its traffic access token, and the request has not got it.
    pub fn forbidden(sid: &str, port: u16, header_name: &str) -> PortError {
        let message = format!(
            "missing or invalid {header_name} header: the port URLs of sandbox {sid} need its \
             traffic access token; send the trafficAccessToken of its create or connect \
             answer, or create it with network.allowPublicTraffic: true to make them public"
        );
        PortError::new(StatusCode::FORBIDDEN, sid, port, message)
    }

    /// The access layer's refusal (not Ready, unreachable API server …), or not found.
    pub fn from_access(sid: &str, port: u16, e: &AccessError) -> PortError {
        match e {
            AccessError::NotFound(m) => PortError::not_found(sid, port, m.clone()),
            other => PortError::new(other.code_and_reason().0, sid, port, other.to_string()),
        }
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        let mut body = serde_json::json!({
            "code": self.status.as_u16(),
            "message": self.message,
            "sandboxId": self.sid,
            "port": self.port,
        });
        if let Some(d) = &self.detail {
            body["detail"] = serde_json::Value::String(d.clone());
        }
        body
    }
}

impl IntoResponse for PortError {
    fn into_response(self) -> Response {
        let body = self.body().to_string();
        (
            self.status,
            [(header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bodies_carry_e2b_fields_and_the_cause() {
        let closed = PortError::closed("abc-ns", 3000, "nothing listens on port 3000").body();
        assert_eq!(closed["code"], 502);
        assert_eq!(closed["message"], PORT_CLOSED);
        assert_eq!(closed["port"], 3000);
        assert_eq!(closed["sandboxId"], "abc-ns");
        assert!(closed["detail"].as_str().unwrap().contains("3000"));
        let gone = PortError::from_access("x", 1, &AccessError::NotFound("gone".into()));
        assert_eq!(
            (gone.status, gone.message.as_str()),
            (StatusCode::BAD_GATEWAY, NOT_FOUND)
        );
        let busy = PortError::from_access("x", 1, &AccessError::Conflict("not Ready".into()));
        assert_eq!(busy.status, StatusCode::CONFLICT);
        let denied = PortError::forbidden("x", 1, "e2b-traffic-access-token");
        assert_eq!(denied.status, StatusCode::FORBIDDEN);
        assert!(denied.message.contains("e2b-traffic-access-token"));
        let none = PortError::no_port_forward("x", 1, "fly");
        assert!(none.message.contains("\"fly\"") && none.message.contains("port-forward"));
    }
}
