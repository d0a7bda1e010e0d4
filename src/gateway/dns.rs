//! The gateway's DNS server: the only resolver a sandbox behind it has.
//!
//! - A query for a name on the sandbox's list, type A: the upstream is asked (the name
//!   leaves the gateway only then) and, when the name exists, the answer is the GATEWAY's own
//!   address, so every connection to a listed name comes to the gateway's proxy. That holds
//!   for a name that resolves to a private or metadata address too: the sandbox never learns
//!   the upstream's addresses, and the proxy refuses to dial such an address when the
//!   connection comes (see [`super::destination`]), where an HTTP client is told why.
//! - Any other type for a listed name (AAAA included: the gateway proxies IPv4 only) is
//!   answered locally with no data.
//! - A name that is not listed, or a query from an address with no policy, is answered
//!   locally with NXDOMAIN and never forwarded: a sandbox cannot smuggle data out in the
//!   names it looks up.
//!
//! UDP only: the engine's embedded resolver, which is what sandboxes talk to, forwards
//! ordinary queries over UDP, and answers here are one A record, far below any size that
//! would need TCP.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{RData, Record, RecordType};
use tokio::net::UdpSocket;

use super::allow::{AllowList, normalise};
use super::policy::Policies;
use super::upstream::{Answer, Upstream};

/// Longest TTL handed to a sandbox, so a changed list (or upstream) takes effect soon.
const MAX_TTL: u32 = 30;

/// What to do with one query.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Answer locally with this code and no records.
    Local(ResponseCode),
    /// Ask the upstream for this (normalised, listed) name's A records.
    Forward(String),
}

/// Decides a query from its message and the source's allow-list. Pure.
pub fn verdict(request: &Message, list: Option<&AllowList>) -> Verdict {
    if request.metadata.message_type != MessageType::Query
        || request.metadata.op_code != OpCode::Query
        || request.queries.len() != 1
    {
        return Verdict::Local(ResponseCode::Refused);
    }
    let query = &request.queries[0];
    let name = query.name().to_ascii();
    let listed = list.is_some_and(|l| l.allows(&name));
    match (listed, normalise(&name)) {
        (true, Some(name)) if query.query_type() == RecordType::A => Verdict::Forward(name),
        (true, Some(_)) => Verdict::Local(ResponseCode::NoError),
        _ => Verdict::Local(ResponseCode::NXDomain),
    }
}

/// The reply to `request`: `code`, and an A record per address in `answers`.
pub fn reply(request: &Message, code: ResponseCode, answers: &[(Ipv4Addr, u32)]) -> Message {
    let mut out = Message::response(request.metadata.id, request.metadata.op_code);
    out.metadata.response_code = code;
    out.metadata.recursion_desired = request.metadata.recursion_desired;
    out.metadata.recursion_available = true;
    out.add_queries(request.queries.iter().cloned());
    if let Some(query) = request.queries.first() {
        for (ip, ttl) in answers {
            out.add_answer(Record::from_rdata(
                query.name().clone(),
                *ttl,
                RData::A(A(*ip)),
            ));
        }
    }
    out
}

/// Serves DNS on `socket` until the process ends.
pub async fn serve(
    socket: UdpSocket,
    gateway_ip: Ipv4Addr,
    policies: Arc<Policies>,
    upstream: Upstream,
) {
    let socket = Arc::new(socket);
    let mut buf = vec![0u8; 4096];
    loop {
        let (n, peer) = match socket.recv_from(&mut buf).await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(error = %e, "DNS receive failed");
                continue;
            }
        };
        let Ok(request) = Message::from_vec(&buf[..n]) else {
            continue;
        };
        let socket = socket.clone();
        let policies = policies.clone();
        let upstream = upstream.clone();
        tokio::spawn(async move {
            let out = answer(&request, peer, gateway_ip, &policies, &upstream).await;
            if let Ok(wire) = out.to_vec() {
                let _ = socket.send_to(&wire, peer).await;
            }
        });
    }
}

async fn answer(
    request: &Message,
    peer: SocketAddr,
    gateway_ip: Ipv4Addr,
    policies: &Policies,
    upstream: &Upstream,
) -> Message {
    let list = policies.for_source(peer.ip()).await;
    match verdict(request, list.as_deref()) {
        Verdict::Local(code) => {
            if code == ResponseCode::NXDomain {
                let name = request.queries.first().map(|q| q.name().to_ascii());
                tracing::debug!(source = %peer.ip(), ?name, "DNS query refused: not on the allow-list");
            }
            reply(request, code, &[])
        }
        Verdict::Forward(name) => match upstream.resolve_a(&name).await {
            Ok(Answer::Found(_, ttl)) => reply(
                request,
                ResponseCode::NoError,
                &[(gateway_ip, ttl.min(MAX_TTL))],
            ),
            Ok(Answer::Absent) => reply(request, ResponseCode::NXDomain, &[]),
            Err(e) => {
                tracing::warn!(%name, error = %e, "upstream DNS failed");
                reply(request, ResponseCode::ServFail, &[])
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::Query;
    use hickory_proto::rr::Name;

    fn query(name: &str, rtype: RecordType) -> Message {
        let mut m = Message::new(7, MessageType::Query, OpCode::Query);
        m.add_query(Query::query(Name::from_ascii(name).unwrap(), rtype));
        m
    }

    #[test]
    fn only_listed_a_queries_are_forwarded() {
        let (list, _) = AllowList::new(&["a.test", "*.b.test"]);
        assert_eq!(
            verdict(&query("A.test.", RecordType::A), Some(&list)),
            Verdict::Forward("a.test".into())
        );
        assert_eq!(
            verdict(&query("x.b.test.", RecordType::A), Some(&list)),
            Verdict::Forward("x.b.test".into())
        );
        assert_eq!(
            verdict(&query("a.test.", RecordType::AAAA), Some(&list)),
            Verdict::Local(ResponseCode::NoError)
        );
        assert_eq!(
            verdict(&query("secret-data.evil.test.", RecordType::A), Some(&list)),
            Verdict::Local(ResponseCode::NXDomain)
        );
        assert_eq!(
            verdict(&query("b.test.", RecordType::TXT), Some(&list)),
            Verdict::Local(ResponseCode::NXDomain)
        );
        assert_eq!(
            verdict(&query("a.test.", RecordType::A), None),
            Verdict::Local(ResponseCode::NXDomain),
            "a source without a policy gets nothing"
        );
        let mut two = query("a.test.", RecordType::A);
        two.add_query(Query::query(
            Name::from_ascii("a.test.").unwrap(),
            RecordType::A,
        ));
        assert_eq!(
            verdict(&two, Some(&list)),
            Verdict::Local(ResponseCode::Refused)
        );
    }

    #[test]
    fn a_reply_answers_the_question_with_the_given_addresses() {
        let q = query("a.test.", RecordType::A);
        let r = reply(
            &q,
            ResponseCode::NoError,
            &[(Ipv4Addr::new(10, 0, 0, 2), 30)],
        );
        let back = Message::from_vec(&r.to_vec().unwrap()).unwrap();
        assert_eq!(back.metadata.id, 7);
        assert_eq!(back.metadata.message_type, MessageType::Response);
        assert_eq!(back.answers.len(), 1);
        assert_eq!(
            &back.answers[0].data,
            &RData::A(A(Ipv4Addr::new(10, 0, 0, 2)))
        );
    }
}
