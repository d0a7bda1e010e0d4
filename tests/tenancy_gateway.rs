//! Tenancy: the egress gateway never dials a private destination a listed name resolves to.
//!
//! The real gateway (`sandbox-operator gateway serve`, the binary this test is built with)
//! runs as a process on a loopback address of its own, with an upstream DNS server of the
//! test's that answers listed names with loopback addresses, the way `*.nip.io` or a
//! split-horizon corporate name would. A target server on 127.0.0.1 counts every connection
//! it accepts, so "never dialled" is observed, not inferred from the client's side. The
//! client connects from 127.0.0.1, which the policy file `localhost.json` maps to its list
//! (the gateway identifies sandboxes by resolving their names; `localhost` is 127.0.0.1).
//!
//! Nothing here leaves the loopback interface: every name resolves to 127.0.0.1, and the
//! classifier's other ranges (RFC 1918, link-local, metadata, …) are pinned by the unit
//! tests in `src/gateway/destination.rs`.

mod harness;

use std::net::{Ipv4Addr, SocketAddr};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{RData, Record, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, UdpSocket};

/// A name on the list that resolves to loopback (like `127.0.0.1.nip.io`).
const LOOPBACK_NAME: &str = "internal.nip.test";

/// Answers every A query with 127.0.0.1; returns its address.
async fn loopback_dns() -> SocketAddr {
    let socket = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))
        .await
        .expect("bind the test DNS");
    let addr = socket.local_addr().expect("its address");
    tokio::spawn(harness::dns::serve(socket, |request, reply| {
        reply.metadata.response_code = ResponseCode::NoError;
        if let Some(q) = request.queries.first()
            && q.query_type() == RecordType::A
        {
            let a = RData::A(A(Ipv4Addr::LOCALHOST));
            reply.add_answer(Record::from_rdata(q.name().clone(), 30, a));
        }
    }));
    addr
}

/// A server on 127.0.0.1 that counts connections and answers each with an HTTP 200.
async fn target() -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .await
        .expect("bind the target");
    let port = listener.local_addr().expect("its address").port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                continue;
            };
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let body = "private data\n";
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(head.as_bytes()).await;
                let _ = s.shutdown().await;
            });
        }
    });
    (port, accepted)
}

/// The gateway process; killed and reaped when dropped.
struct GatewayProcess {
    child: Child,
    listen: Ipv4Addr,
    port: u16,
    _policy: tempfile::TempDir,
}

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A loopback address of this test's own (127.x.y.z outside 127.0.0.0/24).
fn own_loopback() -> Ipv4Addr {
    Ipv4Addr::new(
        127,
        fastrand::u8(1..=254),
        fastrand::u8(..),
        fastrand::u8(2..=254),
    )
}

/// Starts the gateway proxying `port`, listing [`LOOPBACK_NAME`] for 127.0.0.1, with
/// `extra` arguments; returns once its proxy accepts connections.
async fn gateway(port: u16, extra: &[&str]) -> GatewayProcess {
    let policy = tempfile::tempdir().expect("policy dir");
    std::fs::write(
        policy.path().join("localhost.json"),
        format!(r#"{{"allowed":["{LOOPBACK_NAME}"]}}"#),
    )
    .expect("policy file");
    let dns = loopback_dns().await;
    let listen = own_loopback();
    let child = Command::new(env!("CARGO_BIN_EXE_sandbox-operator"))
        .args(["gateway", "serve", "--listen", &listen.to_string()])
        .args(["--policy-dir", &policy.path().display().to_string()])
        .args(["--upstream-dns", &dns.to_string()])
        .args(["--ports", &port.to_string(), "--refresh-ms", "100"])
        .args(extra)
        .stdout(Stdio::null())
        .spawn()
        .expect("start the gateway");
    let mut gw = GatewayProcess {
        child,
        listen,
        port,
        _policy: policy,
    };
    harness::wait_for("the gateway's proxy", Duration::from_secs(20), || {
        let exited = gw.child.try_wait().ok().flatten();
        async move {
            if let Some(status) = exited {
                panic!("the gateway exited: {status}");
            }
            tokio::net::TcpStream::connect((listen, port))
                .await
                .map(drop)
                .map_err(|e| e.to_string())
        }
    })
    .await;
    gw
}

/// Sends `request` to the gateway from 127.0.0.1 and returns everything it answered.
async fn through(gw: &GatewayProcess, request: &[u8]) -> String {
    let socket = TcpSocket::new_v4().expect("socket");
    socket
        .bind((Ipv4Addr::LOCALHOST, 0).into())
        .expect("bind the client to 127.0.0.1");
    let mut s = socket
        .connect((gw.listen, gw.port).into())
        .await
        .expect("connect to the gateway");
    s.write_all(request).await.expect("send");
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut out))
        .await
        .expect("the gateway answers or closes within 30 s")
        .ok();
    String::from_utf8_lossy(&out).into_owned()
}

fn http_get(host: &str) -> Vec<u8> {
    format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").into_bytes()
}

/// A TLS ClientHello naming `host`, as a sandbox's HTTPS client sends it first.
fn client_hello(host: &str) -> Vec<u8> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from(host.to_string()).expect("a name");
    let mut conn = rustls::ClientConnection::new(Arc::new(config), name).expect("a client");
    let mut hello = Vec::new();
    conn.write_tls(&mut hello).expect("the ClientHello");
    hello
}

#[tokio::test(flavor = "multi_thread")]
async fn a_listed_name_resolving_to_loopback_is_never_dialled_over_http() {
    let (port, accepted) = target().await;
    let gw = gateway(port, &[]).await;
    let answer = through(&gw, &http_get(LOOPBACK_NAME)).await;
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        0,
        "the gateway dialled 127.0.0.1 for a listed name; it answered: {answer:?}"
    );
    assert!(
        answer.starts_with("HTTP/1.1 403") && answer.contains("127.0.0.1"),
        "an HTTP client is told why, naming the address: {answer:?}"
    );
    assert!(
        answer.contains("loopback") && answer.contains("allowPrivateCidrs"),
        "the refusal names the class and the setting that allows it: {answer:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_listed_name_resolving_to_loopback_is_never_dialled_over_tls() {
    let (port, accepted) = target().await;
    let gw = gateway(port, &[]).await;
    let answer = through(&gw, &client_hello(LOOPBACK_NAME)).await;
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        0,
        "the gateway passed a ClientHello for a listed name through to 127.0.0.1; it \
         answered: {answer:?}"
    );
    assert!(answer.is_empty(), "a TLS client is closed: {answer:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cidr_allowed_explicitly_is_dialled() {
    let (port, accepted) = target().await;
    let gw = gateway(port, &["--allow-private-cidrs", "127.0.0.1/32"]).await;
    let answer = through(&gw, &http_get(LOOPBACK_NAME)).await;
    assert!(
        answer.starts_with("HTTP/1.1 200") && answer.contains("private data"),
        "{answer:?}"
    );
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
    // The allowance is for that CIDR only: an unlisted name still gets nothing.
    let answer = through(&gw, &http_get("unlisted.test")).await;
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer:?}");
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
}
