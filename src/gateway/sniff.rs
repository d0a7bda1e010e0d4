//! What name a connection asks for: the TLS ClientHello's SNI, or the HTTP Host header.
//!
//! The first bytes decide: a TLS handshake record starts with 0x16, anything else is read
//! as HTTP/1. The ClientHello is parsed by rustls' `Acceptor` (already in the tree), the
//! request head by `httparse`; both only ever see bytes the client sent first, which the
//! proxy replays to the upstream unchanged.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};

/// Most bytes read before the name must be known.
pub const MAX_HEAD: usize = 16 * 1024;
/// Longest wait for the client's first bytes.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(10);

/// The protocol a connection spoke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// A TLS ClientHello.
    Tls,
    /// An HTTP/1 request.
    Http,
}

/// A connection's head: protocol, requested name (if any) and the bytes read so far.
#[derive(Debug)]
pub struct Head {
    /// What it spoke.
    pub protocol: Protocol,
    /// SNI or Host (port stripped); `None` when it named no host.
    pub name: Option<String>,
    /// Everything read from the client so far, to replay upstream.
    pub bytes: Vec<u8>,
}

/// Reads the client's head.
pub async fn read_head<R: AsyncRead + Unpin>(client: &mut R) -> Result<Head, String> {
    tokio::time::timeout(HEAD_TIMEOUT, read_head_unbounded(client))
        .await
        .map_err(|_| format!("the client sent no request within {HEAD_TIMEOUT:?}"))?
}

async fn read_head_unbounded<R: AsyncRead + Unpin>(client: &mut R) -> Result<Head, String> {
    let mut bytes = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    let mut acceptor: Option<rustls::server::Acceptor> = None;
    loop {
        let n = client.read(&mut chunk).await.map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("the client closed before naming a host".into());
        }
        bytes.extend_from_slice(&chunk[..n]);
        if bytes[0] == 0x16 {
            let acceptor = acceptor.get_or_insert_with(Default::default);
            if let Some(name) = feed_tls(acceptor, &chunk[..n])? {
                return Ok(Head {
                    protocol: Protocol::Tls,
                    name,
                    bytes,
                });
            }
        } else if let Some(name) = http_host(&bytes)? {
            return Ok(Head {
                protocol: Protocol::Http,
                name,
                bytes,
            });
        }
        if bytes.len() > MAX_HEAD {
            return Err(format!("no host named in the first {MAX_HEAD} bytes"));
        }
    }
}

/// Feeds bytes to the acceptor: `Some(sni)` once the ClientHello is complete.
fn feed_tls(
    acceptor: &mut rustls::server::Acceptor,
    mut input: &[u8],
) -> Result<Option<Option<String>>, String> {
    while !input.is_empty() {
        acceptor
            .read_tls(&mut input)
            .map_err(|e| format!("reading the TLS ClientHello: {e}"))?;
        match acceptor.accept() {
            Ok(Some(accepted)) => {
                return Ok(Some(
                    accepted.client_hello().server_name().map(str::to_owned),
                ));
            }
            Ok(None) => {}
            Err((e, _)) => return Err(format!("not a TLS ClientHello: {e}")),
        }
    }
    Ok(None)
}

/// `Some(host)` once the request head is complete (`Some(None)`: it named no host).
fn http_host(bytes: &[u8]) -> Result<Option<Option<String>>, String> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(bytes) {
        Ok(httparse::Status::Partial) => Ok(None),
        Ok(httparse::Status::Complete(_)) => {
            let host = request
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case("host"))
                .and_then(|h| std::str::from_utf8(h.value).ok())
                .map(strip_port);
            Ok(Some(host))
        }
        Err(e) => Err(format!("not an HTTP/1 request: {e}")),
    }
}

/// `example.com:8080` → `example.com`; `[::1]:80` → `[::1]`.
fn strip_port(host: &str) -> String {
    let host = host.trim();
    if host.starts_with('[') {
        return host
            .split(']')
            .next()
            .map(|h| format!("{h}]"))
            .unwrap_or_default();
    }
    host.split(':').next().unwrap_or(host).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_http_request_names_its_host() {
        let req = b"GET / HTTP/1.1\r\nHost: Example.com:8080\r\nAccept: */*\r\n\r\nbody";
        let head = read_head(&mut &req[..]).await.unwrap();
        assert_eq!(head.protocol, Protocol::Http);
        assert_eq!(head.name.as_deref(), Some("Example.com"));
        assert_eq!(
            head.bytes,
            req.to_vec(),
            "every byte is kept for the replay"
        );

        let head = read_head(&mut &b"GET / HTTP/1.0\r\n\r\n"[..])
            .await
            .unwrap();
        assert_eq!(head.name, None);
        assert!(
            read_head(&mut &b"\x00\x01garbage\r\n\r\n"[..])
                .await
                .is_err()
        );
        assert!(read_head(&mut &b"GET / HTTP/1.1\r\n"[..]).await.is_err());
        assert_eq!(strip_port("[::1]:80"), "[::1]");
    }

    #[tokio::test]
    async fn a_tls_client_hello_names_its_server() {
        use std::sync::Arc;
        let roots = rustls::RootCertStore::empty();
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let name = rustls::pki_types::ServerName::try_from("files.example.org").unwrap();
        let mut conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
        let mut hello = Vec::new();
        conn.write_tls(&mut hello).unwrap();
        // Delivered in two pieces, as a slow client would.
        let (a, b) = hello.split_at(7);
        let (mut rx, mut tx) = tokio::io::duplex(64 * 1024);
        use tokio::io::AsyncWriteExt;
        tx.write_all(a).await.unwrap();
        let b = b.to_vec();
        tokio::spawn(async move {
            tokio::task::yield_now().await;
            tx.write_all(&b).await.unwrap();
            tx
        });
        let head = read_head(&mut rx).await.unwrap();
        assert_eq!(head.protocol, Protocol::Tls);
        assert_eq!(head.name.as_deref(), Some("files.example.org"));
        assert_eq!(head.bytes, hello);
    }
}
