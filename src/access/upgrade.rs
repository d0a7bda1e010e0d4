//! The server half of a WebSocket handshake on a hyper connection: the `101` answer with the
//! negotiated subprotocol, then the upgraded connection as a WebSocket.

use axum::body::Body;
use axum::http::{HeaderMap, Request, Response, StatusCode, header};
use hyper::upgrade::{OnUpgrade, Upgraded};
use hyper_util::rt::TokioIo;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;

use super::status::AccessError;

/// The WebSocket a handler bridges.
pub type Socket = WebSocketStream<TokioIo<Upgraded>>;

/// The subprotocols the client offers (every `Sec-WebSocket-Protocol` header).
pub fn offered(headers: &HeaderMap) -> Vec<&str> {
    headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect()
}

/// Checks that `headers` ask for a WebSocket upgrade and returns the `Sec-WebSocket-Accept`
/// answer; a request that is no upgrade is a 400 naming the protocol.
pub fn check(headers: &HeaderMap, protocol: &'static str) -> Result<String, AccessError> {
    let is_websocket = headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    match headers.get(header::SEC_WEBSOCKET_KEY) {
        Some(key) if is_websocket => Ok(derive_accept_key(key.as_bytes())),
        _ => Err(AccessError::BadRequest(format!(
            "this subresource is served over a WebSocket upgrade with subprotocol {protocol} (SPDY is not served)"
        ))),
    }
}

/// Switches `request` (checked by [`check`], which gave `accept`) to `protocol`: the `101`
/// response to return, and the pending connection.
pub fn switch(
    request: &mut Request<Body>,
    accept: &str,
    protocol: &'static str,
) -> Result<(Response<Body>, OnUpgrade), AccessError> {
    let on = hyper::upgrade::on(&mut *request);
    let response = Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, "websocket")
        .header(header::SEC_WEBSOCKET_ACCEPT, accept)
        .header(header::SEC_WEBSOCKET_PROTOCOL, protocol)
        .body(Body::empty())
        .map_err(|e| AccessError::Internal(e.to_string()))?;
    Ok((response, on))
}

/// The WebSocket, once the client has switched; `None` when it went away first.
pub async fn socket(on: OnUpgrade) -> Option<Socket> {
    let upgraded = on.await.ok()?;
    Some(WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await)
}

/// How long a handler waits for the client's answer to its close.
const CLOSE_BOUND: std::time::Duration = std::time::Duration::from_secs(60);

/// Waits, bounded by [`CLOSE_BOUND`], for `reader` — the task reading the client's side of
/// the socket — to see the client's answer to our close (or the socket's end), then lets the
/// socket go. Dropped at once, a socket with the client's frames unread in it (a ping, a
/// keystroke sent after the process ended) is reset, and the API server's proxy between us
/// and the client, whose write into it then fails, closes both of its sides: what it had not
/// yet passed on to a slow client — the output's tail and the exit status — is lost. A
/// client answers our close only once it has read everything before it.
pub async fn await_close(reader: tokio::task::JoinHandle<()>) {
    let abort = reader.abort_handle();
    if tokio::time::timeout(CLOSE_BOUND, reader).await.is_err() {
        abort.abort();
    }
}
