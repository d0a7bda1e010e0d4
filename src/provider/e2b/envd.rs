//! envd, the daemon inside every E2B sandbox: its HTTP file endpoints and its Connect
//! services, reached the way E2B's SDKs reach it.
//!
//! Addressing: with a shared `sandboxUrl` (E2B's `https://sandbox.<domain>`) every request
//! goes there and names the sandbox in `E2b-Sandbox-Id` / `E2b-Sandbox-Port: 49983`; without
//! one, each sandbox has its own host, `https://49983-<sandboxID>.<domain>` (the headers are
//! sent too; they are harmless there). A sandbox created with `secure: true` answers only
//! requests carrying its `envdAccessToken` in `X-Access-Token`. The user a call runs as is
//! the `username` parameter (files) or `Authorization: Basic <user:>` (Connect calls).
//!
//! This module only speaks the protocol. What an answer means for the sandbox — a refused
//! token, or a sandbox that cannot be reached because it is paused or gone — is decided by
//! the caller with the control-plane API (see [`EnvdError`]).

use std::time::Duration;

use base64::Engine as _;
use futures::stream::{BoxStream, StreamExt};
use reqwest::{Method, RequestBuilder, Response, StatusCode};
use serde_json::Value;

use super::api::map_status;
use super::process;
use crate::connect_json::{self as connect, Decoder, Frame};
use crate::provider::ProviderError;

/// The port envd listens on inside every sandbox.
pub const ENVD_PORT: u16 = 49983;
/// Bound on one file or unary call.
const CALL_TIMEOUT: Duration = Duration::from_secs(120);
/// Interval of envd's keep-alive events on a process stream, in seconds (the SDKs' value).
const KEEPALIVE_SECS: u64 = 50;

/// How to reach one sandbox's envd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Access {
    /// `X-Access-Token`, when the sandbox is secured.
    pub token: Option<String>,
    /// The sandbox's domain (for the per-sandbox host).
    pub domain: String,
}

/// Why an envd call failed.
#[derive(Debug)]
pub enum EnvdError {
    /// envd answered: this is the call's own outcome.
    Call(ProviderError),
    /// The sandbox could not be reached (proxy 502/503/504, connection failure). Whether it
    /// is paused, gone or merely unreachable is for the control-plane API to say.
    Unreachable(String),
    /// envd refused the access token (401).
    Token(String),
}

/// What a started process sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// It started with this pid (what later calls address it by).
    Start(u32),
    /// Output on stdout.
    Stdout(Vec<u8>),
    /// Output on stderr.
    Stderr(Vec<u8>),
    /// Output of its terminal (a PTY process: stdout and stderr together).
    Pty(Vec<u8>),
    /// It ended with this exit code (128 + N when signal N ended it, see
    /// [`process::end_code`]).
    End(i64),
}

/// The envd client.
#[derive(Clone)]
pub struct Envd {
    http: reqwest::Client,
    sandbox_url: Option<String>,
    user: String,
}

impl Envd {
    /// A client; `sandbox_url` is the shared host, if any; `user` is who calls run as.
    pub fn new(http: reqwest::Client, sandbox_url: Option<String>, user: String) -> Self {
        Envd {
            http,
            sandbox_url: sandbox_url.map(|u| u.trim_end_matches('/').to_string()),
            user,
        }
    }

    fn base(&self, id: &str, access: &Access) -> String {
        match &self.sandbox_url {
            Some(url) => url.clone(),
            None => format!("https://{ENVD_PORT}-{id}.{}", access.domain),
        }
    }

    fn request(&self, method: Method, id: &str, access: &Access, path: &str) -> RequestBuilder {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.base(id, access)))
            .header("E2b-Sandbox-Id", id)
            .header("E2b-Sandbox-Port", ENVD_PORT.to_string());
        if let Some(token) = &access.token {
            request = request.header("X-Access-Token", token);
        }
        request
    }

    fn basic_auth(&self) -> String {
        let encoded = base64::engine::general_purpose::STANDARD.encode(format!("{}:", self.user));
        format!("Basic {encoded}")
    }

    /// Sends and sorts the outcome: a success response, or why not.
    async fn send(&self, request: RequestBuilder, context: &str) -> Result<Response, EnvdError> {
        let response = request
            .send()
            .await
            .map_err(|e| EnvdError::Unreachable(format!("{context}: {}", e.without_url())))?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let body = response.bytes().await.unwrap_or_default();
        Err(classify(status, &body, context))
    }

    /// `GET /files?path=`: the file's exact bytes.
    pub async fn read_file(
        &self,
        id: &str,
        access: &Access,
        path: &str,
    ) -> Result<Vec<u8>, EnvdError> {
        let context = format!("reading {path} in E2B sandbox {id}");
        let request = self
            .request(Method::GET, id, access, "/files")
            .query(&[("path", path), ("username", &self.user)])
            .timeout(CALL_TIMEOUT);
        let response = self.send(request, &context).await?;
        let bytes = response
            .bytes()
            .await
            .map_err(|e| EnvdError::Unreachable(format!("{context}: {}", e.without_url())))?;
        Ok(bytes.to_vec())
    }

    /// `POST /files?path=` with one multipart `file` part (the SDKs' upload): creates or
    /// replaces the whole file, creating parent directories.
    pub async fn write_file(
        &self,
        id: &str,
        access: &Access,
        path: &str,
        data: Vec<u8>,
    ) -> Result<(), EnvdError> {
        let context = format!("writing {path} in E2B sandbox {id}");
        let part = reqwest::multipart::Part::bytes(data)
            .file_name(path.to_string())
            .mime_str("application/octet-stream")
            .map_err(|e| EnvdError::Call(ProviderError::invalid(format!("{context}: {e}"))))?;
        let form = reqwest::multipart::Form::new().part("file", part);
        let request = self
            .request(Method::POST, id, access, "/files")
            .query(&[("path", path), ("username", &self.user)])
            .multipart(form)
            .timeout(CALL_TIMEOUT);
        self.send(request, &context).await.map(drop)
    }

    /// A unary Connect call, e.g. `filesystem.Filesystem/ListDir`.
    pub async fn unary(
        &self,
        id: &str,
        access: &Access,
        method: &str,
        body: &Value,
        context: &str,
    ) -> Result<Value, EnvdError> {
        let request = self
            .request(Method::POST, id, access, &format!("/{method}"))
            .header("Connect-Protocol-Version", "1")
            .header("Authorization", self.basic_auth())
            .json(body)
            .timeout(CALL_TIMEOUT);
        let response = self.send(request, context).await?;
        response
            .json()
            .await
            .map_err(|e| EnvdError::Unreachable(format!("{context}: {}", e.without_url())))
    }

    /// `process.Process/Start` with `start` (a `StartRequest`, see [`process::start_request`]),
    /// server streaming: the process's events until its end, bounded by `timeout` when given
    /// (an interactive process has none). envd sends a keep-alive event every
    /// [`KEEPALIVE_SECS`], so that no proxy cuts a quiet stream. A stream that stops before
    /// the end-of-stream message yields an `Unreachable` error last.
    pub async fn start(
        &self,
        id: &str,
        access: &Access,
        start: &Value,
        timeout: Option<Duration>,
        context: String,
    ) -> Result<BoxStream<'static, Result<Event, EnvdError>>, EnvdError> {
        let mut request = self
            .request(Method::POST, id, access, "/process.Process/Start")
            .header("Content-Type", "application/connect+json")
            .header("Connect-Protocol-Version", "1")
            .header("Keepalive-Ping-Interval", KEEPALIVE_SECS.to_string())
            .header("Authorization", self.basic_auth())
            .body(connect::envelope(start));
        if let Some(timeout) = timeout {
            request = request.header("Connect-Timeout-Ms", timeout.as_millis().to_string());
        }
        let response = self.send(request, &context).await?;
        Ok(events(response, context))
    }
}

/// Sorts an error answer of envd or of the proxy in front of it.
fn classify(status: StatusCode, body: &[u8], context: &str) -> EnvdError {
    match status.as_u16() {
        401 => EnvdError::Token(format!("{context}: envd refused the access token")),
        502..=504 => EnvdError::Unreachable(format!(
            "{context}: the sandbox did not answer ({}: {})",
            status.as_u16(),
            String::from_utf8_lossy(body)
                .chars()
                .take(200)
                .collect::<String>()
        )),
        _ => {
            // Connect errors carry a string code; envd's HTTP errors an integer one.
            if let Ok(err) = serde_json::from_slice::<connect::ConnectError>(body)
                && !err.code.is_empty()
                && !err.code.chars().all(|c| c.is_ascii_digit())
            {
                return EnvdError::Call(err.to_provider(context));
            }
            EnvdError::Call(map_status(status, body, None, context))
        }
    }
}

/// Decodes a Process.Start response body into events.
fn events(response: Response, context: String) -> BoxStream<'static, Result<Event, EnvdError>> {
    struct State {
        body: BoxStream<'static, reqwest::Result<bytes::Bytes>>,
        decoder: Decoder,
        done: bool,
        context: String,
    }
    let state = State {
        body: response.bytes_stream().boxed(),
        decoder: Decoder::default(),
        done: false,
        context,
    };
    futures::stream::unfold(state, |mut s| async move {
        loop {
            if s.done {
                return None;
            }
            match s.decoder.next_frame() {
                Err(e) => {
                    s.done = true;
                    let err = ProviderError::transient(format!("{}: {e}", s.context));
                    return Some((Err(EnvdError::Call(err)), s));
                }
                Ok(Some(Frame::End(Ok(())))) => return None,
                Ok(Some(Frame::End(Err(e)))) => {
                    s.done = true;
                    return Some((Err(EnvdError::Call(e.to_provider(&s.context))), s));
                }
                Ok(Some(Frame::Message(message))) => match event(&message) {
                    Some(event) => return Some((Ok(event), s)),
                    None => continue,
                },
                Ok(None) => {}
            }
            match s.body.next().await {
                Some(Ok(chunk)) => s.decoder.push(&chunk),
                Some(Err(e)) => {
                    s.done = true;
                    let msg = format!("{}: the stream broke: {}", s.context, e.without_url());
                    return Some((Err(EnvdError::Unreachable(msg)), s));
                }
                None => {
                    s.done = true;
                    let cut = if s.decoder.has_partial() {
                        " in the middle of a message"
                    } else {
                        ""
                    };
                    let msg = format!(
                        "{}: the stream ended{cut} before envd's end-of-stream message",
                        s.context
                    );
                    return Some((Err(EnvdError::Unreachable(msg)), s));
                }
            }
        }
    })
    .boxed()
}

/// One `ProcessEvent` (`{"event": {"start"|"data"|"end"|"keepalive": …}}`); `None` for what
/// carries nothing for us (keep-alives, empty data).
fn event(message: &Value) -> Option<Event> {
    let event = message.get("event")?;
    let b64 = |v: &Value| {
        v.as_str()
            .and_then(|s| base64::engine::general_purpose::STANDARD.decode(s).ok())
    };
    if let Some(start) = event.get("start") {
        // proto3 JSON omits zero values: a missing pid is 0.
        let pid = start.get("pid").and_then(Value::as_u64).unwrap_or(0);
        return Some(Event::Start(u32::try_from(pid).unwrap_or(0)));
    }
    if let Some(data) = event.get("data") {
        if let Some(out) = data.get("stdout").and_then(b64) {
            return Some(Event::Stdout(out));
        }
        if let Some(err) = data.get("stderr").and_then(b64) {
            return Some(Event::Stderr(err));
        }
        if let Some(out) = data.get("pty").and_then(b64) {
            return Some(Event::Pty(out));
        }
        return None;
    }
    event
        .get("end")
        .map(|end| Event::End(process::end_code(end)))
}

/// Collected output of a finished process.
#[derive(Debug, Default)]
pub struct Collected {
    /// stdout bytes.
    pub stdout: Vec<u8>,
    /// stderr bytes.
    pub stderr: Vec<u8>,
    /// Exit code, once the `end` event arrived.
    pub exit_code: Option<i64>,
}

/// Drains a process's events into memory, refusing more than `max` bytes of output.
pub async fn collect(
    mut events: BoxStream<'static, Result<Event, EnvdError>>,
    max: usize,
    context: &str,
) -> Result<Collected, EnvdError> {
    let mut out = Collected::default();
    while let Some(event) = events.next().await {
        match event? {
            Event::Start(_) => {}
            Event::Stdout(b) | Event::Pty(b) => out.stdout.extend_from_slice(&b),
            Event::Stderr(b) => out.stderr.extend_from_slice(&b),
            Event::End(code) => out.exit_code = Some(code),
        }
        if out.stdout.len() + out.stderr.len() > max {
            return Err(EnvdError::Call(ProviderError::invalid(format!(
                "{context}: the command printed more than {} MiB; exec output is not a data \
                 channel — write the data to a file and read it with the file capability",
                max / (1024 * 1024)
            ))));
        }
    }
    if out.exit_code.is_none() {
        return Err(EnvdError::Unreachable(format!(
            "{context}: the stream ended without the process's end event"
        )));
    }
    Ok(out)
}

/// Turns a definitive envd outcome into the seam's error, for callers that have already
/// consulted the API about reachability.
pub fn call_error(err: EnvdError) -> ProviderError {
    match err {
        EnvdError::Call(e) => e,
        EnvdError::Unreachable(msg) => ProviderError::transient(msg),
        EnvdError::Token(msg) => ProviderError::unauthorized(msg),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::ErrorKind;
    use serde_json::json;

    #[test]
    fn process_events_decode_and_default_the_exit_code() {
        assert_eq!(
            event(&json!({"event": {"start": {"pid": 3}}})),
            Some(Event::Start(3))
        );
        assert_eq!(
            event(&json!({"event": {"data": {"pty": "aGk="}}})),
            Some(Event::Pty(b"hi".to_vec()))
        );
        assert_eq!(
            event(&json!({"event": {"data": {"stdout": "aGk="}}})),
            Some(Event::Stdout(b"hi".to_vec()))
        );
        assert_eq!(
            event(&json!({"event": {"data": {"stderr": "AP8="}}})),
            Some(Event::Stderr(vec![0, 255]))
        );
        assert_eq!(
            event(&json!({"event": {"end": {"exited": true}}})),
            Some(Event::End(0))
        );
        assert_eq!(
            event(&json!({"event": {"end": {"exitCode": -1, "status": "signal: killed"}}})),
            Some(Event::End(137))
        );
        assert_eq!(event(&json!({"event": {"keepalive": {}}})), None);
    }

    #[test]
    fn answers_are_sorted_by_who_gave_them() {
        let c = "reading /x";
        assert!(matches!(
            classify(StatusCode::UNAUTHORIZED, b"{}", c),
            EnvdError::Token(_)
        ));
        assert!(matches!(
            classify(StatusCode::BAD_GATEWAY, b"paused", c),
            EnvdError::Unreachable(_)
        ));
        let EnvdError::Call(e) = classify(
            StatusCode::NOT_FOUND,
            br#"{"code":404,"message":"path '/x' does not exist"}"#,
            c,
        ) else {
            panic!("a 404 from envd is its answer");
        };
        assert!(e.is(ErrorKind::NotFound));
        let EnvdError::Call(e) = classify(
            StatusCode::BAD_REQUEST,
            br#"{"code":"invalid_argument","message":"not a dir"}"#,
            c,
        ) else {
            panic!("a Connect error is envd's answer");
        };
        assert!(e.is(ErrorKind::Invalid));
        assert!(e.message().contains("invalid_argument"));
    }
}
