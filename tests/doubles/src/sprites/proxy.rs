//! The port proxy WebSocket: `GET /v1/sprites/{name}/proxy`, upgraded. The client's first
//! frame is the text `{"host":"localhost","port":N}`; the double dials that port on the
//! sprite's container (its address on the engine's network; `localhost` means the sprite
//! itself) and answers `{"status":"connected","target":"IP:PORT"}`, or
//! `{"status":"error","message":…}` and closes when nothing answers there. Then binary frames
//! carry the TCP connection's bytes both ways; either side's end closes both.

use std::sync::Arc;

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, State as AxState};
use axum::response::Response;
use bollard::query_parameters::InspectContainerOptions;
use futures::{SinkExt, StreamExt};
use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::api::{engine, no_sprite};
use super::state::State;

/// The client's hello.
#[derive(Deserialize)]
struct Hello {
    #[serde(default)]
    host: String,
    port: u16,
}

pub async fn upgrade(
    AxState(state): AxState<Arc<State>>,
    Path(name): Path<String>,
    ws: WebSocketUpgrade,
) -> Response {
    let container = match state.wake(&name).await {
        Ok(Some(c)) => c,
        Ok(None) => return no_sprite(&name),
        Err(e) => return engine(e),
    };
    ws.on_upgrade(move |socket| run(state, container, socket))
}

async fn run(state: Arc<State>, container: String, mut socket: WebSocket) {
    let hello = match socket.recv().await {
        Some(Ok(Message::Text(text))) => serde_json::from_str::<Hello>(&text).ok(),
        _ => None,
    };
    let dialled = match hello {
        Some(hello) => dial(&state, &container, &hello).await,
        None => Err("the first frame must be {\"host\":…,\"port\":…}".to_string()),
    };
    let tcp = match dialled {
        Ok(tcp) => tcp,
        Err(e) => {
            let reply = serde_json::json!({"status": "error", "message": e});
            let _ = socket.send(Message::Text(reply.to_string().into())).await;
            let _ = socket.send(Message::Close(None)).await;
            return;
        }
    };
    let target = tcp.peer_addr().map(|a| a.to_string()).unwrap_or_default();
    let reply = serde_json::json!({"status": "connected", "target": target});
    if socket
        .send(Message::Text(reply.to_string().into()))
        .await
        .is_ok()
    {
        relay(socket, tcp).await;
    }
}

/// Connects to the hello's port on the sprite's container.
async fn dial(state: &State, container: &str, hello: &Hello) -> Result<TcpStream, String> {
    if !matches!(hello.host.as_str(), "" | "localhost" | "127.0.0.1") {
        return Err(format!(
            "the double proxies only to the sprite itself, not {:?}",
            hello.host
        ));
    }
    let inspected = state
        .docker
        .inspect_container(container, None::<InspectContainerOptions>)
        .await
        .map_err(|e| e.to_string())?;
    let ip = inspected
        .network_settings
        .and_then(|n| n.networks)
        .and_then(|n| n.into_values().find_map(|e| e.ip_address))
        .filter(|ip| !ip.is_empty())
        .ok_or("the sprite's container has no network address")?;
    TcpStream::connect((ip.as_str(), hello.port))
        .await
        .map_err(|e| format!("connecting to port {}: {e}", hello.port))
}

/// Copies bytes both ways until either side ends.
async fn relay(socket: WebSocket, tcp: TcpStream) {
    let (mut sink, mut stream) = socket.split();
    let (mut rd, mut wr) = tcp.into_split();
    let up = async {
        while let Some(Ok(message)) = stream.next().await {
            match message {
                Message::Binary(data) if wr.write_all(&data).await.is_err() => break,
                Message::Close(_) => break,
                _ => {}
            }
        }
    };
    let down = async {
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if sink
                        .send(Message::Binary(buf[..n].to_vec().into()))
                        .await
                        .is_err()
                    {
                        break;
                    }
                }
            }
        }
    };
    tokio::select! {
        _ = up => {}
        _ = down => {}
    }
    let _ = sink.send(Message::Close(None)).await;
}
