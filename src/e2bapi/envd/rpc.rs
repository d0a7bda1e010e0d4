//! The Connect protocol with the JSON codec, as the SDKs speak it to both envd services:
//! a unary call's body is the request message's JSON (proto3 JSON: camelCase names, the
//! proto names accepted where a type aliases them, absent fields at their defaults) and is
//! answered with the response message's JSON or an [`EnvdError`]; a server-streaming call's
//! body is one enveloped message and is answered with an `application/connect+json` stream
//! of envelopes, with keepalives as often as the client's `Keepalive-Ping-Interval` asks.
//! Also the one check every envd call makes on the user it asks to act as.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use futures::stream::StreamExt;
use serde::de::DeserializeOwned;

use super::error::{Code, EnvdError};
use crate::connect_json::{Decoder, Frame};

/// The header in which the SDKs ask for keepalives, in seconds.
const KEEPALIVE_HEADER: &str = "keepalive-ping-interval";

/// The message of a unary request (`{}` when the body is empty).
pub fn unary<T: DeserializeOwned>(body: &Bytes) -> Result<T, EnvdError> {
    let body: &[u8] = if body.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        body
    };
    serde_json::from_slice(body).map_err(|e| invalid(&format!("request message: {e}")))
}

/// The message of a server-streaming request: one envelope.
pub fn enveloped<T: DeserializeOwned>(body: &Bytes) -> Result<T, EnvdError> {
    let mut decoder = Decoder::default();
    decoder.push(body);
    match decoder.next_frame() {
        Ok(Some(Frame::Message(message))) => parse(message),
        Ok(_) => Err(invalid("the request carries no enveloped message")),
        Err(e) => Err(invalid(&e)),
    }
}

/// A JSON message (one envelope's) as `T`.
pub fn parse<T: DeserializeOwned>(message: serde_json::Value) -> Result<T, EnvdError> {
    serde_json::from_value(message).map_err(|e| invalid(&format!("request message: {e}")))
}

fn invalid(message: &str) -> EnvdError {
    EnvdError::new(Code::InvalidArgument, message)
}

/// A unary answer: the response message.
pub fn ok(message: serde_json::Value) -> Response {
    crate::e2bapi::error::json(StatusCode::OK, &message)
}

/// A streaming answer made of `frames` (envelopes, the last one the end of the stream).
pub fn streaming<S>(frames: S) -> Response
where
    S: futures::Stream<Item = Bytes> + Send + 'static,
{
    let body = Body::from_stream(frames.map(Ok::<_, Infallible>));
    ([(header::CONTENT_TYPE, "application/connect+json")], body).into_response()
}

/// A streaming call that failed before its first message. A Connect stream answers HTTP 200
/// whatever happens and carries its error in the end-of-stream message: a client maps any
/// other status to a code of its own (the JS SDK reads a 404 as `unimplemented`).
pub fn stream_failed(e: &EnvdError) -> Response {
    let end = crate::connect_json::end_of_stream(&e.end_of_stream());
    streaming(futures::stream::once(async move { end }))
}

/// The keepalive interval the client asks for, if any.
pub fn keepalive(headers: &HeaderMap) -> Option<Duration> {
    let secs: u64 = headers.get(KEEPALIVE_HEADER)?.to_str().ok()?.parse().ok()?;
    Some(Duration::from_secs(secs.max(1)))
}

/// The user a call asks to act as (HTTP Basic `user:` in `Authorization`, or the
/// `username` query parameter of `/files`) is refused rather than ignored: processes and
/// file operations run as the sandbox image's user, and the seam's exec has no user to
/// switch to.
pub fn refuse_other_user(headers: &HeaderMap, username: Option<&str>) -> Result<(), EnvdError> {
    let basic = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Basic "))
        .and_then(|v| STANDARD.decode(v.trim()).ok())
        .map(|v| {
            String::from_utf8_lossy(&v)
                .split(':')
                .next()
                .unwrap_or_default()
                .to_string()
        });
    match basic.as_deref().or(username).filter(|u| !u.is_empty()) {
        None => Ok(()),
        Some(user) => Err(EnvdError::new(
            Code::InvalidArgument,
            format!(
                "acting as user {user:?} is not supported: processes and file operations run \
                 as the sandbox image's user; leave the user unset"
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;
    use serde_json::json;

    #[derive(serde::Deserialize, Default)]
    #[serde(default, rename_all = "camelCase")]
    struct Req {
        path: String,
        #[serde(alias = "watcher_id")]
        watcher_id: String,
    }

    #[test]
    fn unary_messages_read_camel_case_and_proto_names_with_defaults() {
        let r: Req = unary(&Bytes::from_static(br#"{"watcher_id": "w"}"#)).unwrap();
        assert_eq!((r.path.as_str(), r.watcher_id.as_str()), ("", "w"));
        let r: Req = unary(&Bytes::from_static(br#"{"watcherId": "x", "path": "/a"}"#)).unwrap();
        assert_eq!((r.path.as_str(), r.watcher_id.as_str()), ("/a", "x"));
        let r: Req = unary(&Bytes::new()).unwrap();
        assert_eq!(r.path, "");
        let bad = unary::<Req>(&Bytes::from_static(b"{")).err().unwrap();
        assert_eq!(bad.code, Code::InvalidArgument);
    }

    #[test]
    fn a_streaming_request_is_one_envelope() {
        let body = crate::connect_json::envelope(&json!({"path": "/p"}));
        let r: Req = enveloped(&body).unwrap();
        assert_eq!(r.path, "/p");
        let bare = enveloped::<Req>(&Bytes::from_static(br#"{"path": "/p"}"#));
        assert_eq!(bare.err().map(|e| e.code), Some(Code::InvalidArgument));
        assert!(
            enveloped::<Req>(&Bytes::new()).is_err(),
            "no message at all"
        );
    }

    #[test]
    fn a_stream_that_fails_first_is_http_200_with_the_error_at_its_end() {
        let answer = stream_failed(&EnvdError::new(Code::NotFound, "no pid 7"));
        assert_eq!(answer.status(), StatusCode::OK);
        assert_eq!(
            answer.headers()[header::CONTENT_TYPE],
            "application/connect+json"
        );
    }

    #[test]
    fn the_keepalive_interval_is_the_clients_in_whole_seconds_at_least_one() {
        let mut h = HeaderMap::new();
        assert_eq!(keepalive(&h), None);
        h.insert(KEEPALIVE_HEADER, HeaderValue::from_static("50"));
        assert_eq!(keepalive(&h), Some(Duration::from_secs(50)));
        h.insert(KEEPALIVE_HEADER, HeaderValue::from_static("0"));
        assert_eq!(keepalive(&h), Some(Duration::from_secs(1)));
    }

    #[test]
    fn another_user_is_refused_and_none_passes() {
        assert!(refuse_other_user(&HeaderMap::new(), None).is_ok());
        assert!(refuse_other_user(&HeaderMap::new(), Some("")).is_ok());
        assert!(refuse_other_user(&HeaderMap::new(), Some("root")).is_err());
        let mut h = HeaderMap::new();
        let basic = format!("Basic {}", STANDARD.encode("user:"));
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_str(&basic).unwrap(),
        );
        let e = refuse_other_user(&h, None).unwrap_err();
        assert!(e.message.contains("\"user\""), "{e}");
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Basic Og=="),
        );
        assert!(
            refuse_other_user(&h, None).is_ok(),
            "an empty user is the default"
        );
    }
}
