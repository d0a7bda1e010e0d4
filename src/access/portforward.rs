//! `portforward`: TCP connections to ports inside the sandbox over one WebSocket, in the
//! channel layout of Pod port-forward over WebSocket ([`super::channel`]): the i-th port of
//! `ports` has data channel 2i and error channel 2i+1, and the first frame on each carries the
//! port. One connection per port per WebSocket; when any side of it ends, the WebSocket
//! closes, which is how the client learns that the connection ended.

use axum::body::Body;
use axum::http::{Request, Response};
use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_tungstenite::tungstenite::Message;

use super::channel;
use super::lookup::Target;
use super::params;
use super::status::AccessError;
use super::upgrade::{self, Socket};
use crate::provider::stream::TunnelStream;

/// The most ports one WebSocket can carry (two channels each, in one byte).
const MAX_PORTS: usize = 127;

/// Answers the upgrade and forwards in the background.
pub async fn serve(
    target: Target,
    mut request: Request<Body>,
) -> Result<Response<Body>, AccessError> {
    let ports = params::ports(request.uri().query())?;
    if ports.len() > MAX_PORTS {
        return Err(AccessError::BadRequest(format!(
            "at most {MAX_PORTS} ports per connection"
        )));
    }
    if target.handle.provider.port_forward().is_none() {
        return Err(AccessError::NotImplemented(format!(
            "provider {} cannot forward ports",
            target.handle.name()
        )));
    }
    let protocol = channel::PORT_FORWARD_PROTOCOL;
    let offered = upgrade::offered(request.headers());
    if !offered
        .iter()
        .flat_map(|h| h.split(','))
        .any(|p| p.trim() == protocol)
    {
        return Err(AccessError::BadRequest(format!(
            "port-forward speaks the WebSocket subprotocol {protocol}"
        )));
    }
    let accept = upgrade::check(request.headers(), protocol)?;
    let (response, on) = upgrade::switch(&mut request, &accept, protocol)?;
    tokio::spawn(async move {
        if let Some(socket) = upgrade::socket(on).await {
            bridge(socket, target, ports).await;
        }
    });
    Ok(response)
}

type Writers = Vec<Option<WriteHalf<TunnelStream>>>;

/// Opens every port, then moves bytes both ways until either side ends.
async fn bridge(socket: Socket, target: Target, ports: Vec<u16>) {
    let (mut sink, mut stream) = socket.split();
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(16);
    let writer = tokio::spawn(async move {
        while let Some(frame) = rx.recv().await {
            if sink.send(Message::Binary(frame.into())).await.is_err() {
                break;
            }
        }
        let _ = sink.close().await;
    });
    let mut readers = JoinSet::new();
    let writers = open(&target, &ports, &tx, &mut readers).await;
    drop(tx);
    forward(&mut stream, writers, &mut readers).await;
    readers.abort_all();
    let _ = writer.await;
}

/// Connects each port and starts its reader; a port that cannot be reached says so on its
/// error channel.
async fn open(
    target: &Target,
    ports: &[u16],
    tx: &mpsc::Sender<Vec<u8>>,
    readers: &mut JoinSet<()>,
) -> Writers {
    let mut writers = Vec::with_capacity(ports.len());
    for (i, &port) in ports.iter().enumerate() {
        let data = u8::try_from(2 * i).unwrap_or(u8::MAX);
        let prefix = channel::port_prefix(port);
        let _ = tx.send(channel::frame(data, &prefix)).await;
        let _ = tx.send(channel::frame(data + 1, &prefix)).await;
        let connected = match target.handle.provider.port_forward() {
            Some(pf) => {
                target
                    .handle
                    .call("port_forward", pf.connect(&target.id, port))
                    .await
            }
            None => continue,
        };
        match connected {
            Ok(tunnel) => {
                let (r, w) = tokio::io::split(tunnel);
                readers.spawn(read_tunnel(r, data, tx.clone()));
                writers.push(Some(w));
            }
            Err(e) => {
                let message = format!("error forwarding port {port} to sandbox: {e}");
                let _ = tx.send(channel::frame(data + 1, message.as_bytes())).await;
                writers.push(None);
            }
        }
    }
    writers
}

/// The tunnel's bytes as frames on its data channel, until it ends.
async fn read_tunnel(mut r: ReadHalf<TunnelStream>, ch: u8, tx: mpsc::Sender<Vec<u8>>) {
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if tx.send(channel::frame(ch, &buf[..n])).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// The client's data frames into the tunnels, until the client closes or a tunnel ends.
async fn forward<S, E>(stream: &mut S, mut writers: Writers, readers: &mut JoinSet<()>)
where
    S: futures::Stream<Item = Result<Message, E>> + Unpin,
{
    loop {
        tokio::select! {
            message = stream.next() => {
                let data = match message {
                    Some(Ok(Message::Binary(data))) => data,
                    Some(Ok(Message::Close(_))) | Some(Err(_)) | None => return,
                    Some(Ok(_)) => continue,
                };
                let Some((ch, payload)) = channel::split(&data) else { continue };
                let index = usize::from(ch / 2);
                if ch % 2 != 0 {
                    continue;
                }
                if let Some(slot) = writers.get_mut(index)
                    && let Some(w) = slot
                    && w.write_all(payload).await.is_err()
                {
                    *slot = None;
                }
            }
            Some(_) = readers.join_next(), if !readers.is_empty() => return,
            else => return,
        }
    }
}
