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
