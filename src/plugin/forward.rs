//! `port-forward`: a local listener per `LOCAL:REMOTE`, and one WebSocket (port-forward
//! channels, `v4.channel.k8s.io`) per accepted connection, as kubectl's WebSocket
//! port-forward does. The request names one port, so its data is channel 0 and its errors
//! channel 1; the server's first frame on each starts with the port (two bytes,
//! little-endian), which is checked and stripped.
//!
//! The protocol has no half-close: when the local client ends its side, the WebSocket is
//! closed (and with it the remote connection).

use futures::{Sink, SinkExt, Stream, StreamExt};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

use super::api::Subresource;
use super::cli::PortForwardArgs;
use super::connect::{At, Target, upgrade};
use super::errors::PluginError;
use crate::access::channel::{self, PORT_FORWARD_PROTOCOL};

/// How much of a local connection one frame carries at most.
const CHUNK: usize = 32 * 1024;

/// One `[LOCAL:]REMOTE`: `local` 0 means any free port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortSpec {
    /// The local port (0: the system picks).
    pub local: u16,
    /// The port in the Sandbox.
    pub remote: u16,
}

/// Reads `LOCAL:REMOTE`, `REMOTE` (the same port locally) or `:REMOTE` (any free local port).
pub fn parse_port_spec(s: &str) -> Result<PortSpec, PluginError> {
    let port = |p: &str, zero_ok: bool| {
        p.parse::<u16>()
            .ok()
            .filter(|n| zero_ok || *n > 0)
            .ok_or_else(|| {
                PluginError::Usage(format!(
                    "{s:?} is not LOCAL:REMOTE, REMOTE or :REMOTE (ports 1-65535)"
                ))
            })
    };
    match s.split_once(':') {
        None => port(s, false).map(|p| PortSpec {
            local: p,
            remote: p,
        }),
        Some(("", remote)) => Ok(PortSpec {
            local: 0,
            remote: port(remote, false)?,
        }),
        Some((local, remote)) => Ok(PortSpec {
            local: port(local, true)?,
            remote: port(remote, false)?,
        }),
    }
}

/// `port-forward`: listens on every local port and forwards until interrupted.
pub async fn port_forward(target: &Target, args: &PortForwardArgs) -> Result<i32, PluginError> {
    let specs = args
        .ports
        .iter()
        .map(|s| parse_port_spec(s))
        .collect::<Result<Vec<_>, _>>()?;
    let mut listeners = Vec::new();
    for spec in specs {
        let listener = TcpListener::bind((args.address.as_str(), spec.local))
            .await
            .map_err(|e| {
                PluginError::local(format!("listening on {}:{}", args.address, spec.local), e)
            })?;
        let local = listener
            .local_addr()
            .map_err(|e| PluginError::local("reading the listener's address", e))?;
        println!("Forwarding from {local} -> {}", spec.remote);
        listeners.push(tokio::spawn(serve(
            listener,
            target.clone(),
            args.name.clone(),
            spec.remote,
        )));
    }
    for listener in listeners {
        listener
            .await
            .map_err(|e| PluginError::Transport(format!("a listener stopped: {e}")))??;
    }
    Ok(0)
}

/// Accepts connections forever, each forwarded on its own WebSocket.
async fn serve(
    listener: TcpListener,
    target: Target,
    name: String,
    remote: u16,
) -> Result<(), PluginError> {
    loop {
        let (tcp, peer) = listener
            .accept()
            .await
            .map_err(|e| PluginError::local("accepting a connection", e))?;
        let (target, name) = (target.clone(), name.clone());
        tokio::spawn(async move {
            println!("Handling connection for {remote}");
            if let Err(e) = forward_one(&target, &name, remote, tcp).await {
                eprintln!("error forwarding {peer} to port {remote}: {e}");
            }
        });
    }
}

/// Opens the WebSocket for one connection and relays it.
pub async fn forward_one<T>(
    target: &Target,
    name: &str,
    remote: u16,
    tcp: T,
) -> Result<(), PluginError>
where
    T: AsyncRead + AsyncWrite + Send + 'static,
{
    let at = At {
        ns: &target.namespace,
        name,
        sub: Subresource::PortForward,
    };
    let url = at.url(&[("ports", remote.to_string())]);
    let (socket, _) = upgrade(target, at, url, &[PORT_FORWARD_PROTOCOL]).await?;
    relay(socket, tcp, remote).await
}

/// Relays one connection over an upgraded port-forward `socket` until either side ends.
pub async fn relay<S, T>(socket: S, tcp: T, port: u16) -> Result<(), PluginError>
where
    S: Stream<Item = Result<Message, WsError>> + Sink<Message, Error = WsError> + Send + 'static,
    T: AsyncRead + AsyncWrite + Send + 'static,
{
    let (sink, mut incoming) = socket.split();
    let (tcp_in, mut tcp_out) = tokio::io::split(tcp);
    let uplink = tokio::spawn(uplink(tcp_in, sink));
    let mut channels = Channels::new(port);
    let mut result = Ok(());
    while let Some(message) = incoming.next().await {
        let data = match message {
            Ok(Message::Binary(data)) => data,
            Ok(Message::Close(_)) => break,
            Ok(_) => continue,
            // The local side ended and we closed: however the server ends it now is fine.
            Err(_) if uplink.is_finished() => break,
            Err(e) => {
                result = Err(PluginError::Transport(format!("the connection broke: {e}")));
                break;
            }
        };
        match channels.accept(&data) {
            Ok(Some((0, bytes))) if !bytes.is_empty() => {
                if tcp_out.write_all(bytes).await.is_err() {
                    break;
                }
            }
            Ok(Some((_, bytes))) if !bytes.is_empty() => {
                result = Err(PluginError::Remote(
                    String::from_utf8_lossy(bytes).into_owned(),
                ));
                break;
            }
            Ok(_) => {}
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    uplink.abort();
    let _ = tcp_out.shutdown().await;
    result
}

/// The local connection to channel 0; at its end, a close of the WebSocket.
async fn uplink<R, K>(mut tcp_in: R, mut sink: K)
where
    R: AsyncRead + Unpin,
    K: Sink<Message, Error = WsError> + Unpin,
{
    let mut buf = vec![0u8; CHUNK];
    let data = channel::port_data_channel(0).unwrap_or(0);
    loop {
        match tcp_in.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let frame = channel::frame(data, &buf[..n]);
                if sink.send(Message::Binary(frame.into())).await.is_err() {
                    return;
                }
            }
        }
    }
    let _ = sink.send(Message::Close(None)).await;
}

/// The two channels of one forwarded port, and whether each has had its port prefix.
struct Channels {
    port: u16,
    seen_prefix: [bool; 2],
}

impl Channels {
    fn new(port: u16) -> Self {
        Channels {
            port,
            seen_prefix: [false; 2],
        }
    }

    /// A frame's channel (0 data, 1 error) and its bytes, without the port prefix.
    fn accept<'a>(&mut self, frame: &'a [u8]) -> Result<Option<(u8, &'a [u8])>, PluginError> {
        let Some((ch, bytes)) = channel::split(frame) else {
            return Ok(None);
        };
        let Some(seen) = self.seen_prefix.get_mut(usize::from(ch)) else {
            return Ok(None);
        };
        if *seen {
            return Ok(Some((ch, bytes)));
        }
        if bytes.len() < 2 || bytes[..2] != channel::port_prefix(self.port) {
            return Err(PluginError::Transport(format!(
                "the server's first frame on channel {ch} does not name port {}",
                self.port
            )));
        }
        *seen = true;
        Ok(Some((ch, &bytes[2..])))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_specs_parse_like_kubectls() {
        let p = |s| parse_port_spec(s).unwrap();
        assert_eq!(
            p("8080:80"),
            PortSpec {
                local: 8080,
                remote: 80
            }
        );
        assert_eq!(
            p("80"),
            PortSpec {
                local: 80,
                remote: 80
            }
        );
        assert_eq!(
            p(":80"),
            PortSpec {
                local: 0,
                remote: 80
            }
        );
        assert_eq!(
            p("0:80"),
            PortSpec {
                local: 0,
                remote: 80
            }
        );
        for bad in ["", "x", "80:", "80:0", "70000", "1:2:3"] {
            assert!(parse_port_spec(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_port_prefix_is_checked_and_stripped_once_per_channel() {
        let mut c = Channels::new(8080);
        let prefix = channel::port_prefix(8080);
        assert_eq!(
            c.accept(&[0, prefix[0], prefix[1]]).unwrap(),
            Some((0, &[][..]))
        );
        assert_eq!(c.accept(&[0, 1, 2]).unwrap(), Some((0, &[1, 2][..])));
        assert_eq!(
            c.accept(&[1, prefix[0], prefix[1], b'x']).unwrap(),
            Some((1, &b"x"[..]))
        );
        assert!(
            Channels::new(81)
                .accept(&[0, prefix[0], prefix[1]])
                .is_err()
        );
        assert_eq!(c.accept(&[7, 1]).unwrap(), None);
    }
}
