//! Exec over the Sprites exec WebSocket.
//!
//! `GET /v1/sprites/{name}/exec?cmd=<argv0>&cmd=<argv1>…&path=<argv0>&env=K=V&dir=<cwd>&stdin=…`
//! upgraded to a WebSocket, without a TTY: every binary frame starts with a stream-id byte
//! (see `frames.rs`). Stdout and stderr are binary frames, so bytes cross unchanged. A socket
//! that closes before the exit frame is a `Transient` failure, never an exit code: the command
//! may or may not have finished.
//!
//! The URL and the handshake are shared with the interactive exec (`stream.rs`), which adds
//! `tty=true&cols=&rows=` for a terminal.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;

use super::client::{Client, api_error};
use super::frames::{self, Incoming};
use crate::provider::stream::TermSize;
use crate::provider::{ExecOutput, ExecRequest, ProviderError, ProviderResult};

/// Bytes of stdin per frame.
pub(super) const CHUNK: usize = 64 * 1024;

/// Runs `request` in sprite `name`, with `stdin` written then closed, bounded by the
/// request's timeout (a timeout is `Transient`).
pub async fn run(
    client: &Client,
    name: &str,
    request: &ExecRequest,
    stdin: Option<&[u8]>,
) -> ProviderResult<ExecOutput> {
    if request.argv.is_empty() {
        return Err(ProviderError::invalid(format!(
            "exec in sandbox {name}: the command is empty; give at least the program to run"
        )));
    }
    match tokio::time::timeout(request.timeout, exchange(client, name, request, stdin)).await {
        Ok(result) => result,
        Err(_) => Err(ProviderError::transient(format!(
            "exec in sandbox {name}: {:?} did not finish within its timeout of {:.1} s",
            request.argv,
            request.timeout.as_secs_f64()
        ))),
    }
}

/// What the exec URL carries: the argv, env and cwd, whether stdin is attached, and a TTY
/// with its initial size.
#[derive(Debug, Clone, Copy)]
pub(super) struct Launch<'a> {
    pub argv: &'a [String],
    pub env: &'a BTreeMap<String, String>,
    pub cwd: Option<&'a str>,
    pub stdin: bool,
    pub tty: Option<TermSize>,
}

impl<'a> Launch<'a> {
    /// A buffered exec's launch: no TTY.
    fn of(request: &'a ExecRequest, stdin: bool) -> Self {
        Launch {
            argv: &request.argv,
            env: &request.env,
            cwd: request.cwd.as_deref(),
            stdin,
            tty: None,
        }
    }
}

/// The exec URL: the API base with `ws`/`wss` and the launch as query parameters.
pub(super) fn exec_url(
    client: &Client,
    name: &str,
    launch: &Launch<'_>,
) -> ProviderResult<url::Url> {
    let mut url = ws_url(client, &format!("/v1/sprites/{name}/exec"))?;
    {
        let mut q = url.query_pairs_mut();
        for arg in launch.argv {
            q.append_pair("cmd", arg);
        }
        if let Some(program) = launch.argv.first() {
            q.append_pair("path", program);
        }
        for (k, v) in launch.env {
            q.append_pair("env", &format!("{k}={v}"));
        }
        if let Some(dir) = launch.cwd {
            q.append_pair("dir", dir);
        }
        q.append_pair("stdin", if launch.stdin { "true" } else { "false" });
        if let Some(size) = launch.tty {
            q.append_pair("tty", "true");
            q.append_pair("cols", &size.cols.to_string());
            q.append_pair("rows", &size.rows.to_string());
        }
    }
    Ok(url)
}

/// The WebSocket URL of the API path `path`: the API base with `ws`/`wss`.
pub(super) fn ws_url(client: &Client, path: &str) -> ProviderResult<url::Url> {
    let base = client
        .base()
        .replacen("https://", "wss://", 1)
        .replacen("http://", "ws://", 1);
    url::Url::parse(&format!("{base}{path}")).map_err(|e| {
        ProviderError::invalid(format!(
            "the Sprites API URL {} is not a URL: {e}",
            client.base()
        ))
    })
}

/// An open exec (or proxy) socket.
pub(super) type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Opens the exec socket at `url` with the bearer token; returns it and whether the service
/// advertised signals over it (`X-Sprite-Capabilities` lists `signal`).
pub(super) async fn connect(
    client: &Client,
    url: &url::Url,
    what: &str,
) -> ProviderResult<(Socket, bool)> {
    let mut handshake = url
        .as_str()
        .into_client_request()
        .map_err(|e| ProviderError::invalid(format!("{what}: {e}")))?;
    let bearer = HeaderValue::from_str(&format!("Bearer {}", client.token()))
        .map_err(|_| ProviderError::invalid("the Sprites token is not a valid header value"))?;
    handshake.headers_mut().insert("authorization", bearer);
    let (socket, response) = tokio_tungstenite::connect_async(handshake)
        .await
        .map_err(|e| handshake_error(what, e))?;
    let signals = response
        .headers()
        .get_all("x-sprite-capabilities")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|c| c.trim().eq_ignore_ascii_case("signal"));
    Ok((socket, signals))
}

async fn exchange(
    client: &Client,
    name: &str,
    request: &ExecRequest,
    stdin: Option<&[u8]>,
) -> ProviderResult<ExecOutput> {
    let what = format!("exec {:?} in sandbox {name}", request.argv);
    let url = exec_url(client, name, &Launch::of(request, stdin.is_some()))?;
    let (mut socket, _) = connect(client, &url, &what).await?;
    if let Some(data) = stdin {
        for chunk in data.chunks(CHUNK) {
            socket
                .send(frames::stdin(chunk, false))
                .await
                .map_err(|e| lost(&what, e))?;
        }
        socket
            .send(frames::stdin_eof(false))
            .await
            .map_err(|e| lost(&what, e))?;
    }
    let mut out = ExecOutput {
        stdout: Vec::new(),
        stderr: Vec::new(),
        exit_code: 0,
    };
    while let Some(message) = socket.next().await {
        let message = message.map_err(|e| closed_early(&what).with_source(e))?;
        match frames::decode(message, false) {
            Incoming::Stdout(data) => out.stdout.extend_from_slice(&data),
            Incoming::Stderr(data) => out.stderr.extend_from_slice(&data),
            Incoming::Exit(code) => {
                out.exit_code = code;
                let _ = socket.close(None).await;
                return Ok(out);
            }
            Incoming::Session(_) | Incoming::Other => {}
        }
    }
    Err(closed_early(&what))
}

/// The socket ended without an exit frame: not an exit code, and not known to have failed.
pub(super) fn closed_early(what: &str) -> ProviderError {
    ProviderError::transient(format!(
        "{what}: the exec connection closed before the exit code arrived; the command may or \
         may not have finished"
    ))
}

/// A handshake the API refused (its status mapped like any other call) or never answered.
fn handshake_error(what: &str, err: tungstenite::Error) -> ProviderError {
    match err {
        tungstenite::Error::Http(response) => {
            let status = reqwest::StatusCode::from_u16(response.status().as_u16())
                .unwrap_or(reqwest::StatusCode::BAD_GATEWAY);
            let mut headers = reqwest::header::HeaderMap::new();
            if let Some(v) = response.headers().get("retry-after")
                && let Ok(v) = reqwest::header::HeaderValue::from_bytes(v.as_bytes())
            {
                headers.insert(reqwest::header::RETRY_AFTER, v);
            }
            let body = response.body().clone().unwrap_or_default();
            api_error(status, &headers, &body, what)
        }
        other => lost(what, other),
    }
}

pub(super) fn lost(what: &str, err: tungstenite::Error) -> ProviderError {
    ProviderError::transient(format!("{what}: the exec connection failed")).with_source(err)
}

/// A short helper exec's bound.
pub const HELPER_TIMEOUT: Duration = Duration::from_secs(30);
