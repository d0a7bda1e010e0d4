//! Connect unary calls with the JSON codec, as the SDKs send them: a POST whose body is the
//! request message's JSON (proto3 JSON: camelCase names, the proto names accepted too,
//! absent fields at their defaults), answered with the response message's JSON or an
//! [`EnvdError`].

use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use serde::de::DeserializeOwned;

use crate::e2bapi::envd::error::{Code, EnvdError};

/// The request message in `body` (`{}` when empty).
pub fn request<T: DeserializeOwned>(body: &Bytes) -> Result<T, EnvdError> {
    let body: &[u8] = if body.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        body
    };
    serde_json::from_slice(body)
        .map_err(|e| EnvdError::new(Code::InvalidArgument, format!("request message: {e}")))
}

/// The response message.
pub fn reply(message: serde_json::Value) -> Response {
    crate::e2bapi::error::json(StatusCode::OK, &message)
}

/// The user a call asks to act as (HTTP Basic `user:` in `Authorization`, or the
/// `username` query parameter of `/files`). Every operation runs as the sandbox's own user,
/// so asking for another one is refused rather than ignored.
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
                "acting as user {user:?} is not supported: file operations run as the \
                 sandbox's own user; leave the user unset"
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[derive(serde::Deserialize, Default)]
    #[serde(default, rename_all = "camelCase")]
    struct Req {
        path: String,
        #[serde(alias = "watcher_id")]
        watcher_id: String,
    }

    #[test]
    fn messages_read_camel_case_and_proto_names_with_defaults() {
        let r: Req = request(&Bytes::from_static(br#"{"watcher_id": "w"}"#)).unwrap();
        assert_eq!((r.path.as_str(), r.watcher_id.as_str()), ("", "w"));
        let r: Req = request(&Bytes::from_static(br#"{"watcherId": "x", "path": "/a"}"#)).unwrap();
        assert_eq!((r.path.as_str(), r.watcher_id.as_str()), ("/a", "x"));
        let r: Req = request(&Bytes::new()).unwrap();
        assert_eq!(r.path, "");
        let bad = request::<Req>(&Bytes::from_static(b"{")).err().unwrap();
        assert_eq!(bad.code, Code::InvalidArgument);
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
    }
}
