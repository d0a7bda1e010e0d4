//! A local fake internet for egress tests: a Docker network of its own ("the outside" the
//! egress gateway is attached to), and, bound in the test process to that network's host
//! address, a DNS server (hickory-proto messages) that knows a few names and counts every
//! query it receives, an HTTP server on port 80 and a TLS server on port 443 (a self-signed
//! certificate for those names) that answer `hello <host>`. Nothing leaves this machine.
//!
//! Binding ports 80 and 443 on the test network's own host address collides with no one:
//! that address exists only while the test runs.

// Each test binary uses only part of it.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{RData, Record, RecordType};
use sandbox_operator::provider::docker::EgressGatewaySettings;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UdpSocket};

/// Names the fake DNS knows (all point at the host address of the fake internet).
pub const NAMES: &[&str] = &["allowed.test", "other.test", "x.wild.test", "wild.test"];

/// The fake internet; dropping it removes the network (the servers end with the runtime).
pub struct FakeNet {
    /// The Docker network's name.
    pub network: String,
    /// The host's address on it, where every server listens.
    pub host: Ipv4Addr,
    /// The DNS server's address.
    pub dns: SocketAddr,
    /// Every name the DNS server was asked for, in order.
    pub queries: Arc<Mutex<Vec<String>>>,
}

impl FakeNet {
    /// Creates the network and starts the servers.
    pub async fn start(network: &str, label: (&str, &str)) -> FakeNet {
        let out = std::process::Command::new("docker")
            .args([
                "network",
                "create",
                "--label",
                &format!("{}={}", label.0, label.1),
                network,
            ])
            .output()
            .expect("docker network create");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let out = std::process::Command::new("docker")
            .args([
                "network",
                "inspect",
                network,
                "--format",
                "{{(index .IPAM.Config 0).Gateway}}",
            ])
            .output()
            .expect("docker network inspect");
        let host: Ipv4Addr = String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .expect("the fake internet's host address");
        let queries = Arc::new(Mutex::new(Vec::new()));
        let udp = UdpSocket::bind((host, 0)).await.expect("bind the fake DNS");
        let dns = udp.local_addr().unwrap();
        tokio::spawn(serve_dns(udp, host, queries.clone()));
        let http = TcpListener::bind((host, 80))
            .await
            .expect("bind fake HTTP on :80");
        tokio::spawn(serve_http(http, None));
        let tls = TcpListener::bind((host, 443))
            .await
            .expect("bind fake TLS on :443");
        tokio::spawn(serve_http(tls, Some(acceptor())));
        FakeNet {
            network: network.to_string(),
            host,
            dns,
            queries,
        }
    }

    /// Every name the upstream DNS was asked for.
    pub fn asked(&self) -> Vec<String> {
        self.queries.lock().unwrap().clone()
    }
}

impl Drop for FakeNet {
    fn drop(&mut self) {
        let _ = std::process::Command::new("docker")
            .args(["network", "rm", &self.network])
            .output();
    }
}

/// The fake internet's DNS: `NAMES` resolve to the host address, everything else is
/// NXDOMAIN, and every name asked for is counted.
async fn serve_dns(socket: UdpSocket, host: Ipv4Addr, queries: Arc<Mutex<Vec<String>>>) {
    crate::harness::dns::serve(socket, move |request, reply| {
        reply.metadata.recursion_available = true;
        let Some(q) = request.queries.first() else {
            return;
        };
        let name = q
            .name()
            .to_ascii()
            .trim_end_matches('.')
            .to_ascii_lowercase();
        queries.lock().unwrap().push(name.clone());
        if NAMES.contains(&name.as_str()) {
            if q.query_type() == RecordType::A {
                reply.add_answer(Record::from_rdata(q.name().clone(), 60, RData::A(A(host))));
            }
        } else {
            reply.metadata.response_code = ResponseCode::NXDomain;
        }
    })
    .await
}

fn acceptor() -> tokio_rustls::TlsAcceptor {
    let names: Vec<String> = NAMES.iter().map(|s| s.to_string()).collect();
    let cert = rcgen::generate_simple_self_signed(names).expect("a self-signed certificate");
    let der = cert.cert.der().clone();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(cert.signing_key.serialize_der().into());
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![der], key)
        .expect("a TLS server config");
    tokio_rustls::TlsAcceptor::from(Arc::new(config))
}

/// Answers each request with `hello <Host>` (plain or over TLS), bulk bytes for
/// `GET /bytes/<n>`.
async fn serve_http(listener: TcpListener, tls: Option<tokio_rustls::TlsAcceptor>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let tls = tls.clone();
        tokio::spawn(async move {
            match tls {
                Some(acceptor) => {
                    if let Ok(s) = acceptor.accept(stream).await {
                        answer(s).await;
                    }
                }
                None => answer(stream).await,
            }
        });
    }
}

async fn answer<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(mut s: S) {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let text = String::from_utf8_lossy(&head);
    let headers: BTreeMap<String, String> = text
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let host = headers.get("host").cloned().unwrap_or_default();
    let path = text.split_whitespace().nth(1).unwrap_or("/").to_string();
    let body: Vec<u8> = match path
        .strip_prefix("/bytes/")
        .and_then(|n| n.parse::<usize>().ok())
    {
        Some(n) => vec![b'x'; n],
        None => format!("hello {host}\n").into_bytes(),
    };
    let head = format!(
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = s.write_all(head.as_bytes()).await;
    let _ = s.write_all(&body).await;
    let _ = s.shutdown().await;
}

/// The gateway's settings for a test: the test binary's sibling operator binary, the fake
/// internet as outside network and upstream DNS. The fake internet's host address is a
/// private one (a Docker network's), so it is allowed explicitly.
pub fn gateway_settings(
    net: &FakeNet,
    name: &str,
    base_image: String,
    check_secs: u64,
) -> EgressGatewaySettings {
    EgressGatewaySettings {
        host_binary: Some(env!("CARGO_BIN_EXE_sandbox-operator").to_string()),
        name: Some(name.to_string()),
        network: net.network.clone(),
        upstream_dns: Some(net.dns.to_string()),
        check_interval_seconds: check_secs,
        allow_private_cidrs: vec![format!("{}/32", net.host)],
        ..EgressGatewaySettings::with_image(base_image)
    }
}

/// Removes a gateway's container, network and volume (they carry no instance label).
pub struct GatewayGuard(pub String);

impl Drop for GatewayGuard {
    fn drop(&mut self) {
        let run = |args: &[&str]| {
            let _ = std::process::Command::new("docker").args(args).output();
        };
        run(&["rm", "-f", &self.0]);
        // The engine may still be detaching the last endpoints: a few tries.
        for _ in 0..10 {
            let removed = std::process::Command::new("docker")
                .args(["network", "rm", &format!("{}-net", self.0)])
                .output()
                .map(|o| {
                    o.status.success() || String::from_utf8_lossy(&o.stderr).contains("not found")
                })
                .unwrap_or(true);
            if removed {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(300));
        }
        run(&["volume", "rm", "-f", &format!("{}-policy", self.0)]);
    }
}
