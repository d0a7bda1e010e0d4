//! A counting proxy in front of the Docker engine: a loopback TCP listener that forwards
//! every connection to the engine's unix socket and counts the HTTP requests that pass, by
//! method and path (API version and ids folded: `GET /containers/{id}/json`). Point a
//! provider at it with `endpoint: tcp://127.0.0.1:<port>` to count the engine work an
//! operator does — requests are counted, never timed.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, UnixStream};

/// The engine socket the proxy forwards to.
const ENGINE_SOCKET: &str = "/var/run/docker.sock";

/// A running proxy; it stops with the test process.
pub struct EngineProxy {
    /// `tcp://127.0.0.1:<port>`.
    pub endpoint: String,
    counts: Arc<Mutex<BTreeMap<String, u64>>>,
}

impl EngineProxy {
    /// Starts listening on a free loopback port.
    pub async fn start() -> EngineProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let endpoint = format!("tcp://{}", listener.local_addr().expect("addr"));
        let counts: Arc<Mutex<BTreeMap<String, u64>>> = Arc::default();
        let shared = counts.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let counts = shared.clone();
                tokio::spawn(async move {
                    if let Ok(engine) = UnixStream::connect(ENGINE_SOCKET).await {
                        let _ = relay(client, engine, counts).await;
                    }
                });
            }
        });
        EngineProxy { endpoint, counts }
    }

    /// Requests so far, by `METHOD /path`.
    pub fn counts(&self) -> BTreeMap<String, u64> {
        self.counts.lock().expect("counts").clone()
    }

    /// Requests so far.
    pub fn total(&self) -> u64 {
        self.counts().values().sum()
    }

    /// Requests so far whose `METHOD /path` satisfies `pick`.
    pub fn count(&self, pick: impl Fn(&str) -> bool) -> u64 {
        self.counts()
            .iter()
            .filter(|(k, _)| pick(k))
            .map(|(_, v)| v)
            .sum()
    }
}

/// Copies the engine's answers back verbatim and parses the client's side request by request
/// (head, then a `Content-Length` or chunked body), counting each; after an `Upgrade` (attach,
/// exec) the rest is copied verbatim.
async fn relay(
    client: tokio::net::TcpStream,
    engine: UnixStream,
    counts: Arc<Mutex<BTreeMap<String, u64>>>,
) -> std::io::Result<()> {
    let (client_read, mut client_write) = client.into_split();
    let (engine_read, mut engine_write) = engine.into_split();
    let mut engine_read = engine_read;
    tokio::spawn(async move {
        let _ = tokio::io::copy(&mut engine_read, &mut client_write).await;
        let _ = client_write.shutdown().await;
    });
    let mut reader = BufReader::new(client_read);
    loop {
        let mut head = Vec::new();
        loop {
            let mut line = Vec::new();
            if reader.read_until(b'\n', &mut line).await? == 0 {
                return Ok(());
            }
            let end = line == b"\r\n" || line == b"\n";
            head.extend_from_slice(&line);
            if end {
                break;
            }
        }
        let text = String::from_utf8_lossy(&head).into_owned();
        let mut lines = text.lines();
        let request_line = lines.next().unwrap_or_default().to_string();
        let mut length = 0u64;
        let mut chunked = false;
        let mut upgrade = false;
        for h in lines {
            let Some((k, v)) = h.split_once(':') else {
                continue;
            };
            let (k, v) = (k.trim().to_ascii_lowercase(), v.trim().to_ascii_lowercase());
            match k.as_str() {
                "content-length" => length = v.parse().unwrap_or(0),
                "transfer-encoding" => chunked = v.contains("chunked"),
                "upgrade" => upgrade = true,
                _ => {}
            }
        }
        *counts
            .lock()
            .expect("counts")
            .entry(key(&request_line))
            .or_default() += 1;
        engine_write.write_all(&head).await?;
        if upgrade {
            tokio::io::copy(&mut reader, &mut engine_write).await?;
            return Ok(());
        }
        if chunked {
            copy_chunked(&mut reader, &mut engine_write).await?;
        } else if length > 0 {
            let mut body = (&mut reader).take(length);
            tokio::io::copy(&mut body, &mut engine_write).await?;
        }
    }
}

async fn copy_chunked(
    reader: &mut BufReader<tokio::net::tcp::OwnedReadHalf>,
    out: &mut tokio::net::unix::OwnedWriteHalf,
) -> std::io::Result<()> {
    loop {
        let mut size_line = Vec::new();
        reader.read_until(b'\n', &mut size_line).await?;
        out.write_all(&size_line).await?;
        let size = u64::from_str_radix(
            String::from_utf8_lossy(&size_line)
                .trim()
                .split(';')
                .next()
                .unwrap_or("0"),
            16,
        )
        .unwrap_or(0);
        // The chunk and its CRLF (the last chunk: just the CRLF after any trailers).
        let mut chunk = (&mut *reader).take(size + 2);
        tokio::io::copy(&mut chunk, out).await?;
        if size == 0 {
            return Ok(());
        }
    }
}

/// `GET /v1.47/containers/abc/json?all=1` → `GET /containers/{id}/json`.
fn key(request_line: &str) -> String {
    let mut parts = request_line.split_whitespace();
    let method = parts.next().unwrap_or("?");
    let target = parts.next().unwrap_or("/");
    let path = target.split('?').next().unwrap_or("/");
    let mut segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    if segments
        .first()
        .is_some_and(|s| s.starts_with('v') && s.contains('.'))
    {
        segments.remove(0);
    }
    const WORDS: &[&str] = &[
        "json", "create", "prune", "events", "info", "version", "_ping",
    ];
    let folded: Vec<&str> = segments
        .iter()
        .enumerate()
        .map(|(i, s)| {
            if i == 1 && !WORDS.contains(s) {
                "{id}"
            } else {
                s
            }
        })
        .collect();
    format!("{method} /{}", folded.join("/"))
}
