//! The upstream resolver: the only way a name leaves the gateway, and only for listed names.
//!
//! A plain DNS client over UDP (hickory-proto messages): one A query, answered by the
//! upstream server the gateway was started with, retried once on silence. Used both to
//! answer a sandbox's query for a listed name and to find where a proxied connection goes,
//! so a connection reaches exactly what the listed name resolves to.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};
use tokio::net::UdpSocket;

/// How long one attempt waits for the upstream's answer.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);
/// Attempts per query.
const ATTEMPTS: usize = 2;

/// What the upstream said about a name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Addresses, with the smallest TTL among them.
    Found(Vec<Ipv4Addr>, u32),
    /// The name does not exist, or has no A record.
    Absent,
}

/// An upstream DNS server.
#[derive(Debug, Clone)]
pub struct Upstream {
    server: SocketAddr,
}

impl Upstream {
    /// The server at `server`.
    pub fn new(server: SocketAddr) -> Self {
        Upstream { server }
    }

    /// The first `nameserver` of a resolv.conf text, on port 53.
    pub fn from_resolv_conf(text: &str) -> Option<Self> {
        text.lines()
            .filter_map(|l| l.trim().strip_prefix("nameserver"))
            .filter_map(|rest| rest.trim().parse::<std::net::IpAddr>().ok())
            .map(|ip| Upstream::new(SocketAddr::new(ip, 53)))
            .next()
    }

    /// The server's address.
    pub fn server(&self) -> SocketAddr {
        self.server
    }

    /// Resolves `name` to IPv4 addresses.
    pub async fn resolve_a(&self, name: &str) -> Result<Answer, String> {
        let fqdn = Name::from_ascii(format!("{name}."))
            .map_err(|e| format!("{name:?} is not a DNS name: {e}"))?;
        let mut query = Message::new(fastrand::u16(..), MessageType::Query, OpCode::Query);
        query.metadata.recursion_desired = true;
        query.add_query(Query::query(fqdn, RecordType::A));
        let wire = query.to_vec().map_err(|e| e.to_string())?;
        let mut last = String::from("no attempt made");
        for _ in 0..ATTEMPTS {
            match self.exchange(&wire, query.metadata.id).await {
                Ok(reply) => return Ok(answer_of(&reply)),
                Err(e) => last = e,
            }
        }
        Err(format!("upstream DNS {} failed: {last}", self.server))
    }

    async fn exchange(&self, wire: &[u8], id: u16) -> Result<Message, String> {
        let bind: SocketAddr = if self.server.is_ipv4() {
            (Ipv4Addr::UNSPECIFIED, 0).into()
        } else {
            (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
        };
        let socket = UdpSocket::bind(bind).await.map_err(|e| e.to_string())?;
        socket
            .connect(self.server)
            .await
            .map_err(|e| e.to_string())?;
        socket.send(wire).await.map_err(|e| e.to_string())?;
        let mut buf = vec![0u8; 4096];
        let deadline = tokio::time::Instant::now() + ATTEMPT_TIMEOUT;
        loop {
            let n = tokio::time::timeout_at(deadline, socket.recv(&mut buf))
                .await
                .map_err(|_| format!("no answer within {ATTEMPT_TIMEOUT:?}"))?
                .map_err(|e| e.to_string())?;
            match Message::from_vec(&buf[..n]) {
                Ok(reply) if reply.metadata.id == id => return Ok(reply),
                // Not ours (a late answer to an earlier attempt): keep waiting.
                _ => continue,
            }
        }
    }
}

/// The A records of a reply (a CNAME chain's final addresses included).
fn answer_of(reply: &Message) -> Answer {
    if reply.metadata.response_code != ResponseCode::NoError {
        return Answer::Absent;
    }
    let mut ttl = u32::MAX;
    let ips: Vec<Ipv4Addr> = reply
        .answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => {
                ttl = ttl.min(r.ttl);
                Some(a.0)
            }
            _ => None,
        })
        .collect();
    if ips.is_empty() {
        Answer::Absent
    } else {
        Answer::Found(ips, ttl)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolv_conf_names_the_first_nameserver() {
        let up =
            Upstream::from_resolv_conf("search x\nnameserver 127.0.0.11\nnameserver 1.1.1.1\n")
                .unwrap();
        assert_eq!(up.server(), "127.0.0.11:53".parse().unwrap());
        assert!(Upstream::from_resolv_conf("options ndots:0\n").is_none());
    }
}
