//! How the process service answers: request bodies in the Connect JSON codec (an enveloped
//! message for a stream, plain JSON for a unary call), and a process's event stream — the
//! start event, its output, its end — as an `application/connect+json` body, with
//! keepalives on an idle stream as often as the client's `Keepalive-Ping-Interval` asks.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Body;
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::{Bytes, BytesMut};
use futures::stream::{self, StreamExt};
use serde::de::DeserializeOwned;
use serde_json::json;

use super::table::{Event, Follower};
use super::wire;
use crate::connect_json::{Decoder, Frame, end_of_stream, envelope};
use crate::e2bapi::envd::error::{Code, EnvdError};

/// The header in which the SDKs ask for keepalives, in seconds.
const KEEPALIVE_HEADER: &str = "keepalive-ping-interval";

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

/// The message of a unary request: plain JSON (`{}` when empty).
pub fn unary<T: DeserializeOwned>(body: &Bytes) -> Result<T, EnvdError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return parse(json!({}));
    }
    serde_json::from_slice(body).map_err(|e| invalid(&format!("request body: {e}")))
}

/// A JSON message as `T`.
pub fn parse<T: DeserializeOwned>(message: serde_json::Value) -> Result<T, EnvdError> {
    serde_json::from_value(message).map_err(|e| invalid(&format!("request message: {e}")))
}

fn invalid(message: &str) -> EnvdError {
    EnvdError::new(Code::InvalidArgument, message)
}

/// A unary answer.
pub fn ok(message: serde_json::Value) -> Response {
    crate::e2bapi::error::json(StatusCode::OK, &message)
}

/// A streaming answer made of `frames`.
pub fn streaming<S>(frames: S) -> Response
where
    S: futures::Stream<Item = Bytes> + Send + 'static,
{
    let body = Body::from_stream(frames.map(Ok::<_, Infallible>));
    ([(CONTENT_TYPE, "application/connect+json")], body).into_response()
}

/// The keepalive interval the client asks for, if any.
pub fn keepalive(headers: &HeaderMap) -> Option<Duration> {
    let secs: u64 = headers.get(KEEPALIVE_HEADER)?.to_str().ok()?.parse().ok()?;
    Some(Duration::from_secs(secs.max(1)))
}

/// The event stream of process `pid`: its start event, then what `follower` reads, then the
/// stream's end. Dropping the body (the client went away) drops the follower.
pub fn events(pid: u32, follower: Follower, keepalive: Option<Duration>) -> Response {
    let first = envelope(&wire::start_event(pid));
    let rest = stream::unfold(Some(follower), move |state| async move {
        let mut follower = state?;
        let events = match keepalive {
            Some(every) => tokio::select! {
                events = follower.next() => Some(events),
                () = tokio::time::sleep(every) => None,
            },
            None => Some(follower.next().await),
        };
        Some(match events {
            None => (envelope(&wire::keepalive_event()), Some(follower)),
            Some(events) if events.is_empty() => (end_of_stream(&json!({})), None),
            Some(events) => (frames(&events), Some(follower)),
        })
    });
    streaming(stream::once(async move { first }).chain(rest))
}

/// Events as consecutive envelopes.
fn frames(events: &[Event]) -> Bytes {
    let mut out = BytesMut::new();
    for event in events {
        let message = match event {
            Event::Output(chunk) => wire::data_event(chunk),
            Event::End(end) => wire::end_event(end),
        };
        out.extend_from_slice(&envelope(&message));
    }
    out.freeze()
}
