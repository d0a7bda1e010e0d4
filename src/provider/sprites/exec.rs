//! Exec over the Sprites exec WebSocket.
//!
//! `GET /v1/sprites/{name}/exec?cmd=<argv0>&cmd=<argv1>…&path=<argv0>&env=K=V&dir=<cwd>&stdin=…`
//! upgraded to a WebSocket. Every binary frame starts with a stream-id byte: 0 stdin,
//! 1 stdout, 2 stderr, 3 exit (the next byte is the exit code), 4 stdin EOF. Stdout and stderr
//! are binary frames, so bytes cross unchanged. A socket that closes before the exit frame is
//! a `Transient` failure, never an exit code: the command may or may not have finished.

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::{self, Message};

use super::client::{Client, api_error};
use crate::provider::{ExecOutput, ExecRequest, ProviderError, ProviderResult};

const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const EXIT: u8 = 3;
const STDIN_EOF: u8 = 4;

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

/// The exec URL: the API base with `ws`/`wss` and the argv, env and cwd as query parameters.
fn exec_url(
    client: &Client,
    name: &str,
    request: &ExecRequest,
    stdin: bool,
) -> ProviderResult<url::Url> {
    let base = client
        .base()
        .replacen("https://", "wss://", 1)
        .replacen("http://", "ws://", 1);
    let mut url = url::Url::parse(&format!("{base}/v1/sprites/{name}/exec")).map_err(|e| {
        ProviderError::invalid(format!(
            "the Sprites API URL {} is not a URL: {e}",
            client.base()
        ))
    })?;
    {
        let mut q = url.query_pairs_mut();
        for arg in &request.argv {
            q.append_pair("cmd", arg);
        }
        q.append_pair("path", &request.argv[0]);
        for (k, v) in &request.env {
            q.append_pair("env", &format!("{k}={v}"));
        }
        if let Some(dir) = &request.cwd {
            q.append_pair("dir", dir);
        }
        q.append_pair("stdin", if stdin { "true" } else { "false" });
    }
    Ok(url)
}

async fn exchange(
    client: &Client,
    name: &str,
    request: &ExecRequest,
    stdin: Option<&[u8]>,
) -> ProviderResult<ExecOutput> {
    let what = format!("exec {:?} in sandbox {name}", request.argv);
    let url = exec_url(client, name, request, stdin.is_some())?;
    let mut handshake = url
        .as_str()
        .into_client_request()
        .map_err(|e| ProviderError::invalid(format!("{what}: {e}")))?;
    let bearer = HeaderValue::from_str(&format!("Bearer {}", client.token()))
        .map_err(|_| ProviderError::invalid("the Sprites token is not a valid header value"))?;
    handshake.headers_mut().insert("authorization", bearer);
    let (mut socket, _) = tokio_tungstenite::connect_async(handshake)
        .await
        .map_err(|e| handshake_error(&what, e))?;
    if let Some(data) = stdin {
        for chunk in data.chunks(64 * 1024) {
            let frame = [&[STDIN][..], chunk].concat();
            socket
                .send(Message::binary(frame))
                .await
                .map_err(|e| lost(&what, e))?;
        }
        socket
            .send(Message::binary(vec![STDIN_EOF]))
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
        let Message::Binary(data) = message else {
            continue;
        };
        match data.first() {
            Some(&STDOUT) => out.stdout.extend_from_slice(&data[1..]),
            Some(&STDERR) => out.stderr.extend_from_slice(&data[1..]),
            Some(&EXIT) => {
                out.exit_code = i64::from(data.get(1).copied().unwrap_or(0));
                let _ = socket.close(None).await;
                return Ok(out);
            }
            _ => {}
        }
    }
    Err(closed_early(&what))
}

/// The socket ended without an exit frame: not an exit code, and not known to have failed.
fn closed_early(what: &str) -> ProviderError {
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

fn lost(what: &str, err: tungstenite::Error) -> ProviderError {
    ProviderError::transient(format!("{what}: the exec connection failed")).with_source(err)
}

/// A short helper exec's bound.
pub const HELPER_TIMEOUT: Duration = Duration::from_secs(30);
