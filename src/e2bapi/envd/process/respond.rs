//! A process's event stream — the start event, its output, its end — as a Connect stream
//! ([`rpc::streaming`]), with keepalives on an idle stream as often as the client asks.

use std::time::Duration;

use axum::response::Response;
use bytes::{Bytes, BytesMut};
use futures::stream::{self, StreamExt};
use serde_json::json;

use super::table::{Event, Follower};
use super::wire;
use crate::connect_json::{end_of_stream, envelope};
use crate::e2bapi::envd::rpc;

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
    rpc::streaming(stream::once(async move { first }).chain(rest))
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
