//! The gateway's proxy: forwards a sandbox's connection only to a listed name.
//!
//! A connection to one of the gateway's ports is read up to its TLS SNI or HTTP Host; when
//! that name is on the source sandbox's list, the gateway resolves it itself through the
//! upstream and connects to one of its permitted addresses on the SAME port, replays the bytes it read,
//! and copies both ways. Anything else — no policy for the source, no name, an IP literal, an
//! unlisted name, a name the upstream does not know, a name that resolves only to addresses
//! the [`DialPolicy`] refuses (loopback, private, link-local, metadata, … — see
//! [`super::destination`]) — is closed (an HTTP client gets a 403 that says why). The
//! destination is never taken from the client: only from the name, and only the vetted
//! addresses of what it resolved to are dialled.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

use super::allow::normalise;
use super::destination::DialPolicy;
use super::policy::Policies;
use super::sniff::{self, Protocol};
use super::upstream::{Answer, Upstream};

/// Longest wait for an upstream connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a connection was not forwarded.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// The source address belongs to no sandbox with a policy.
    #[error("source {0} has no egress policy")]
    NoPolicy(IpAddr),
    /// The head could not be read or parsed.
    #[error("{0}")]
    Head(String),
    /// The request named no host, or an IP address.
    #[error("the request names no host (raw-IP connections are not forwarded)")]
    NoName,
    /// The name is not on the list.
    #[error("{0} is not on this sandbox's egress allow-list")]
    NotListed(String),
    /// The upstream did not resolve it.
    #[error("{0} does not resolve upstream: {1}")]
    Unresolved(String, String),
    /// Every address it resolves to is one the gateway does not dial.
    #[error("{0} resolves only to addresses the gateway does not connect to: {1}")]
    Destination(String, String),
    /// No address of it accepted the connection.
    #[error("cannot connect to {0}: {1}")]
    Connect(String, String),
}

/// How the proxy finds and vets where a name goes.
#[derive(Debug, Clone)]
pub struct Dial {
    /// Resolves listed names.
    pub upstream: Upstream,
    /// Which resolved addresses may be dialled.
    pub policy: DialPolicy,
}

/// Accepts connections on `listener` (one of the gateway's ports) until the process ends.
pub async fn serve(listener: TcpListener, policies: Arc<Policies>, dial: Dial) {
    loop {
        let (client, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                continue;
            }
        };
        let port = listener.local_addr().map(|a| a.port()).unwrap_or_default();
        let policies = policies.clone();
        let dial = dial.clone();
        tokio::spawn(async move {
            if let Err(refusal) = handle(client, peer, port, &policies, &dial).await {
                tracing::info!(source = %peer.ip(), port, %refusal, "connection not forwarded");
            }
        });
    }
}

async fn handle(
    mut client: TcpStream,
    peer: SocketAddr,
    port: u16,
    policies: &Policies,
    dial: &Dial,
) -> Result<(), Refusal> {
    let Some(list) = policies.for_source(peer.ip()).await else {
        return Err(Refusal::NoPolicy(peer.ip()));
    };
    let head = sniff::read_head(&mut client).await.map_err(Refusal::Head)?;
    let decided = match head.name.as_deref().and_then(normalise) {
        None => Err(Refusal::NoName),
        Some(name) if !list.allows(&name) => Err(Refusal::NotListed(name)),
        Some(name) => destinations(dial, &name).await.map(|ips| (name, ips)),
    };
    let (name, ips) = match decided {
        Ok(found) => found,
        Err(refusal) => {
            if head.protocol == Protocol::Http {
                forbid(&mut client, &refusal).await;
            }
            return Err(refusal);
        }
    };
    let mut server = connect_any(&ips, port)
        .await
        .map_err(|e| Refusal::Connect(name.clone(), e))?;
    server
        .write_all(&head.bytes)
        .await
        .map_err(|e| Refusal::Connect(name.clone(), e.to_string()))?;
    tracing::debug!(source = %peer.ip(), %name, port, "forwarding");
    // Either side closing ends the copy; errors after that are the peers' business.
    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
    Ok(())
}

/// The addresses of a listed name the gateway may dial: resolved here, then vetted, so
/// what is checked is exactly what is dialled (no second lookup a rebinding name could
/// answer differently).
async fn destinations(dial: &Dial, name: &str) -> Result<Vec<Ipv4Addr>, Refusal> {
    let ips = match dial.upstream.resolve_a(name).await {
        Ok(Answer::Found(ips, _)) => ips,
        Ok(Answer::Absent) => {
            return Err(Refusal::Unresolved(name.into(), "no A record".into()));
        }
        Err(e) => return Err(Refusal::Unresolved(name.into(), e)),
    };
    permitted(&dial.policy, name, ips)
}

/// The addresses `policy` permits; when it permits none, the refusal names the first.
fn permitted(
    policy: &DialPolicy,
    name: &str,
    ips: Vec<Ipv4Addr>,
) -> Result<Vec<Ipv4Addr>, Refusal> {
    let mut first_refusal = None;
    let allowed: Vec<Ipv4Addr> = ips
        .into_iter()
        .filter(|ip| match policy.check(IpAddr::V4(*ip)) {
            Ok(()) => true,
            Err(why) => {
                first_refusal.get_or_insert(why);
                false
            }
        })
        .collect();
    match (allowed.is_empty(), first_refusal) {
        (true, Some(why)) => Err(Refusal::Destination(name.into(), why)),
        _ => Ok(allowed),
    }
}

async fn connect_any(ips: &[Ipv4Addr], port: u16) -> Result<TcpStream, String> {
    let mut last = String::from("no address");
    for ip in ips {
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect((*ip, port))).await {
            Ok(Ok(stream)) => {
                let _ = stream.set_nodelay(true);
                return Ok(stream);
            }
            Ok(Err(e)) => last = format!("{ip}:{port}: {e}"),
            Err(_) => last = format!("{ip}:{port}: timed out after {CONNECT_TIMEOUT:?}"),
        }
    }
    Err(last)
}

/// Tells an HTTP client why, then closes.
async fn forbid(client: &mut TcpStream, refusal: &Refusal) {
    let body = format!("sandbox egress gateway: {refusal}\n");
    let response = format!(
        "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = client.write_all(response.as_bytes()).await;
    let _ = client.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::destination::Cidr;

    fn v4(s: &str) -> Ipv4Addr {
        s.parse().unwrap()
    }

    #[test]
    fn only_permitted_addresses_of_a_name_are_dialled() {
        let none = DialPolicy::default();
        // A name answering public and private addresses is dialled on the public ones only.
        let mixed = vec![v4("10.0.0.5"), v4("93.184.215.14"), v4("127.0.0.1")];
        assert_eq!(
            permitted(&none, "mixed.test", mixed).unwrap(),
            vec![v4("93.184.215.14")]
        );
        let refusal = permitted(&none, "x.test", vec![v4("127.0.0.1"), v4("10.0.0.5")])
            .unwrap_err()
            .to_string();
        assert!(
            refusal.contains("x.test") && refusal.contains("127.0.0.1 is a loopback address"),
            "{refusal}"
        );
        let meta = permitted(
            &none,
            "metadata.google.internal",
            vec![v4("169.254.169.254")],
        )
        .unwrap_err()
        .to_string();
        assert!(meta.contains("metadata endpoint"), "{meta}");
        let allowing = DialPolicy::new(vec![Cidr::parse("10.0.0.0/24").unwrap()]);
        assert_eq!(
            permitted(&allowing, "x.test", vec![v4("127.0.0.1"), v4("10.0.0.5")]).unwrap(),
            vec![v4("10.0.0.5")]
        );
    }
}
