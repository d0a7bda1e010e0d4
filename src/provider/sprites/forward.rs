//! TCP port-forward ([`PortForward`]) through the Sprites port proxy.
//!
//! `GET /v1/sprites/{name}/proxy`, upgraded to a WebSocket, carries one TCP connection: our
//! first frame is the text `{"host":"localhost","port":N}`, the service answers
//! `{"status":"connected","target":…}` (anything else means nothing answered there:
//! `Transient`), and then binary frames carry the connection's bytes both ways. A task bridges
//! the socket to one end of a bounded in-memory pipe ([`CHUNK`] bytes each way) whose other end
//! is the caller's tunnel, so a slow side holds the other back.
//!
//! A WebSocket has no half-close: when the caller shuts down its writing side, nothing more is
//! sent, but the answer keeps arriving until the service closes the socket (the remote end
//! closed its connection).

use std::time::Duration;

use async_trait::async_trait;
use futures::{SinkExt, StreamExt};
use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio_tungstenite::tungstenite::Message;

use super::SpritesProvider;
use super::exec::{CHUNK, Socket, connect, lost, ws_url};
use crate::provider::stream::{PortForward, TunnelStream};
use crate::provider::{ProviderError, ProviderResult};

/// How long the service may take to answer the hello.
const HELLO_BOUND: Duration = Duration::from_secs(30);

/// The service's answer to the hello.
#[derive(Deserialize)]
struct Reply {
    #[serde(default)]
    status: String,
    #[serde(default)]
    message: Option<String>,
}

#[async_trait]
impl PortForward for SpritesProvider {
    async fn connect(&self, id: &str, port: u16) -> ProviderResult<TunnelStream> {
        self.must_run(id).await?;
        let what = format!("port-forward to port {port} of sandbox {id}");
        let url = ws_url(&self.client, &format!("/v1/sprites/{id}/proxy"))?;
        let (mut socket, _) = connect(&self.client, &url, &what).await?;
        let hello = serde_json::json!({"host": "localhost", "port": port});
        socket
            .send(Message::text(hello.to_string()))
            .await
            .map_err(|e| lost(&what, e))?;
        let reply = tokio::time::timeout(HELLO_BOUND, first_text(&mut socket))
            .await
            .map_err(|_| {
                ProviderError::transient(format!(
                    "{what}: the proxy did not answer within {HELLO_BOUND:?}"
                ))
            })?;
        check_reply(&what, reply.as_deref())?;
        let (ours, theirs) = tokio::io::duplex(CHUNK);
        tokio::spawn(bridge(socket, ours));
        Ok(Box::pin(theirs))
    }
}

/// The first text frame, if one comes before the socket ends.
async fn first_text(socket: &mut Socket) -> Option<String> {
    while let Some(Ok(message)) = socket.next().await {
        match message {
            Message::Text(text) => return Some(text.to_string()),
            Message::Close(_) => return None,
            _ => {}
        }
    }
    None
}

/// `Ok` when the proxy said `connected`; otherwise `Transient`, with what it said.
fn check_reply(what: &str, reply: Option<&str>) -> ProviderResult<()> {
    let parsed = reply.and_then(|r| serde_json::from_str::<Reply>(r).ok());
    match parsed {
        Some(r) if r.status == "connected" => Ok(()),
        Some(r) => Err(ProviderError::transient(format!(
            "{what}: nothing answered there ({}{})",
            r.status,
            r.message.map(|m| format!(": {m}")).unwrap_or_default()
        ))),
        None => Err(ProviderError::transient(format!(
            "{what}: the proxy closed without saying it connected"
        ))),
    }
}

/// Copies between the socket and our end of the pipe until the socket ends (or the caller
/// drops its tunnel); the caller's end of input stops only the sending half.
async fn bridge(socket: Socket, local: DuplexStream) {
    let (mut sink, mut stream) = socket.split();
    let (mut rd, mut wr) = tokio::io::split(local);
    let up = tokio::spawn(async move {
        let mut buf = vec![0u8; CHUNK];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if sink.send(Message::binary(buf[..n].to_vec())).await.is_err() {
                        break;
                    }
                }
            }
        }
        sink
    });
    while let Some(Ok(message)) = stream.next().await {
        match message {
            Message::Binary(data) if wr.write_all(&data).await.is_err() => break,
            Message::Close(_) => break,
            _ => {}
        }
    }
    let _ = wr.shutdown().await;
    up.abort();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_connected_reply_opens_the_tunnel() {
        assert!(check_reply("x", Some(r#"{"status":"connected","target":"a:1"}"#)).is_ok());
        let refused = check_reply("x", Some(r#"{"status":"error","message":"refused"}"#))
            .expect_err("refused");
        assert!(refused.message().contains("refused"), "{refused}");
        assert!(check_reply("x", None).is_err());
        assert!(check_reply("x", Some("garbage")).is_err());
    }
}
