//! The Connect protocol's JSON codec, as envd serves it.
//!
//! Unary calls are a plain `application/json` POST; an error is an HTTP status with
//! `{"code": "<connect code>", "message": …}`. Server-streaming calls use
//! `application/connect+json`: the request and every response message are *enveloped* — one
//! flag byte, a 4-byte big-endian length, then the JSON — and the stream ends with an envelope
//! whose flag has bit `0x02` set, carrying `{}` or `{"error": {code, message}}`.

use axum::body::Body;
use axum::http::{HeaderValue, Response, StatusCode};
use bytes::{BufMut, Bytes, BytesMut};
use serde_json::{Value, json};

/// Flag of the end-of-stream envelope.
pub const END_STREAM: u8 = 0x02;

/// A Connect error code and message.
#[derive(Debug, Clone)]
pub struct ConnectError {
    /// `not_found`, `invalid_argument`, `unauthenticated`, …
    pub code: &'static str,
    /// Human-readable text.
    pub message: String,
}

impl ConnectError {
    /// An error with `code`.
    pub fn new(code: &'static str, message: impl Into<String>) -> Self {
        ConnectError {
            code,
            message: message.into(),
        }
    }

    /// The HTTP status a unary call answers with for this code.
    fn http_status(&self) -> StatusCode {
        match self.code {
            "invalid_argument" | "failed_precondition" | "out_of_range" => StatusCode::BAD_REQUEST,
            "unauthenticated" => StatusCode::UNAUTHORIZED,
            "permission_denied" => StatusCode::FORBIDDEN,
            "not_found" => StatusCode::NOT_FOUND,
            "already_exists" | "aborted" => StatusCode::CONFLICT,
            "resource_exhausted" => StatusCode::TOO_MANY_REQUESTS,
            "unimplemented" => StatusCode::NOT_IMPLEMENTED,
            "unavailable" => StatusCode::SERVICE_UNAVAILABLE,
            "deadline_exceeded" => StatusCode::GATEWAY_TIMEOUT,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn json(&self) -> Value {
        json!({ "code": self.code, "message": self.message })
    }

    /// The unary error response.
    pub fn unary_response(&self) -> Response<Body> {
        let mut response = Response::new(Body::from(self.json().to_string()));
        *response.status_mut() = self.http_status();
        response
            .headers_mut()
            .insert("content-type", HeaderValue::from_static("application/json"));
        response
    }

    /// The end-of-stream envelope carrying this error.
    pub fn end_stream(&self) -> Bytes {
        envelope(END_STREAM, &json!({ "error": self.json() }))
    }
}

/// One enveloped message.
pub fn envelope(flags: u8, message: &Value) -> Bytes {
    let payload = message.to_string();
    let mut out = BytesMut::with_capacity(5 + payload.len());
    out.put_u8(flags);
    out.put_u32(payload.len() as u32);
    out.put_slice(payload.as_bytes());
    out.freeze()
}

/// The successful end-of-stream envelope.
pub fn end_stream_ok() -> Bytes {
    envelope(END_STREAM, &json!({}))
}

/// The single enveloped message of a server-streaming request.
pub fn unwrap_request(body: &[u8]) -> Result<Value, ConnectError> {
    if body.len() < 5 {
        return Err(ConnectError::new(
            "invalid_argument",
            "streaming request is not an enveloped message",
        ));
    }
    if body[0] & 0x01 != 0 {
        return Err(ConnectError::new(
            "unimplemented",
            "compressed messages are not supported",
        ));
    }
    let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    let payload = body
        .get(5..5 + len)
        .ok_or_else(|| ConnectError::new("invalid_argument", "envelope shorter than its length"))?;
    serde_json::from_slice(payload)
        .map_err(|e| ConnectError::new("invalid_argument", format!("request is not JSON: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_carry_flag_and_big_endian_length() {
        let bytes = envelope(0, &json!({"a": 1}));
        assert_eq!(bytes[0], 0);
        assert_eq!(&bytes[1..5], &[0, 0, 0, 7]);
        assert_eq!(&bytes[5..], br#"{"a":1}"#);
        assert_eq!(unwrap_request(&bytes).unwrap(), json!({"a": 1}));
        assert_eq!(end_stream_ok()[0], END_STREAM);
        assert!(unwrap_request(&bytes[..6]).is_err());
    }
}
