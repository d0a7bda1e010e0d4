//! envd's `process.Process` service: `Start` (server streaming) and, by the pid its `start`
//! event carried, `SendInput`, `CloseStdin`, `SendSignal` and `Update`.
//!
//! Each process is one `docker exec`: attached to a stdin when the request asks for one
//! (`stdin` absent means yes, as envd keeps for old clients) and to a terminal with `pty`.
//! Like envd, which starts every process through `/bin/sh -c '… exec "$@"'`, the double
//! runs a small `sh` wrapper that prints its own pid (`$$`) as the first line of its output,
//! sets the terminal's initial size with `stty` (Docker's exec API before 1.42 cannot size a
//! terminal at creation, and a resize after the start may come after the program read its
//! size), and `exec`s the program, which keeps that pid. The double strips that line and
//! reports the pid in the `start` event: it is the program's own pid inside the sandbox, so
//! `kill <pid>` in the sandbox reaches it, as on E2B.
//!
//! Input, as envd: `input.stdin` for a pipe, `input.pty` for a terminal (the other is an
//! `internal` error), `CloseStdin` refused for a terminal; `SendSignal` knows only
//! `SIGNAL_SIGTERM` and `SIGNAL_SIGKILL` (else `unimplemented`) and is `kill -s` run as root
//! in the container; an unknown pid is `not_found`. Docker reports a process a signal ended
//! as exit code 128 + N, which a process could also return itself; the double reports envd's
//! signal ending (`exitCode: -1`, `exited: false`, `status: "signal: terminated"`) only when
//! it delivered that signal to that process itself, and the plain exit code otherwise.

use std::collections::{BTreeMap, HashMap};
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Response};
use axum::response::IntoResponse;
use base64::Engine as _;
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use super::connect::{self, ConnectError, envelope};
use super::engine::{Attach, Output, Started};
use super::envd::{Target, user_from_basic};
use super::faults::TruncateStream;
use super::state::Shared;

/// The wrapper: `$1` and `$2` are the terminal's rows and columns (empty without one), the
/// rest the program's argv.
const WRAPPER: &str = r#"echo $$
if [ -n "$1" ]; then stty rows "$1" cols "$2"; fi
shift 2
exec "$@""#;

type Stdin = Pin<Box<dyn AsyncWrite + Send>>;

/// Running processes by (sandbox id, pid).
type Table = HashMap<(String, u32), Arc<Process>>;

/// The running processes of every sandbox of one double.
#[derive(Clone, Default)]
pub(crate) struct Processes(Arc<Mutex<Table>>);

impl Processes {
    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn get(&self, sandbox: &str, pid: u32) -> Result<Arc<Process>, ConnectError> {
        self.lock()
            .get(&(sandbox.to_string(), pid))
            .cloned()
            .ok_or_else(|| {
                ConnectError::new("not_found", format!("process with pid {pid} not found"))
            })
    }
}

/// One running process.
struct Process {
    exec_id: String,
    container: String,
    tty: bool,
    stdin: tokio::sync::Mutex<Option<Stdin>>,
    /// The signal the double delivered to it last, if any.
    signalled: Mutex<Option<i64>>,
}

#[derive(Debug, Default, Deserialize)]
struct ProcessConfig {
    cmd: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    envs: BTreeMap<String, String>,
    cwd: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct Size {
    #[serde(default)]
    cols: u16,
    #[serde(default)]
    rows: u16,
}

#[derive(Debug, Default, Deserialize)]
struct Pty {
    #[serde(default)]
    size: Size,
}

#[derive(Debug, Default, Deserialize)]
struct StartRequest {
    process: Option<ProcessConfig>,
    pty: Option<Pty>,
    stdin: Option<bool>,
}

/// One `Start` to run, as the request and the routing said.
struct Launch {
    shared: Shared,
    target: Target,
    user: String,
    process: ProcessConfig,
    pty: Option<Pty>,
    stdin: bool,
    truncate: bool,
}

fn streaming_response(rx: mpsc::Receiver<Bytes>) -> Response<Body> {
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, std::io::Error>(b), rx))
    });
    let mut response = Response::new(Body::from_stream(stream));
    response.headers_mut().insert(
        "content-type",
        HeaderValue::from_static("application/connect+json"),
    );
    response
}

fn event(event: Value) -> Bytes {
    envelope(0, &json!({ "event": event }))
}

/// `process.Process/Start`.
pub(crate) async fn start(
    State(shared): State<Shared>,
    axum::Extension(target): axum::Extension<Target>,
    truncate: Option<axum::Extension<TruncateStream>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response<Body> {
    let (tx, rx) = mpsc::channel(16);
    let request = connect::unwrap_request(&body).and_then(|v| {
        serde_json::from_value::<StartRequest>(v)
            .map_err(|e| ConnectError::new("invalid_argument", e.to_string()))
    });
    let request = match request {
        Ok(r) if r.process.as_ref().is_some_and(|p| !p.cmd.is_empty()) => r,
        Ok(_) => {
            let e = ConnectError::new("invalid_argument", "process.cmd is required");
            return refuse_start(tx, rx, e);
        }
        Err(e) => return refuse_start(tx, rx, e),
    };
    let Some(process) = request.process else {
        return streaming_response(rx);
    };
    let launch = Launch {
        shared,
        target,
        user: user_from_basic(&headers),
        process,
        stdin: request.stdin.unwrap_or(true),
        pty: request.pty,
        truncate: truncate.is_some(),
    };
    tokio::spawn(launch.run(tx));
    streaming_response(rx)
}

/// A stream that ends at once with `e`: the request runs nothing.
fn refuse_start(
    tx: mpsc::Sender<Bytes>,
    rx: mpsc::Receiver<Bytes>,
    e: ConnectError,
) -> Response<Body> {
    let _ = tx.try_send(e.end_stream());
    streaming_response(rx)
}

impl Launch {
    fn argv(&mut self) -> Vec<String> {
        let (rows, cols) = match &self.pty {
            Some(p) => (p.size.rows.to_string(), p.size.cols.to_string()),
            None => (String::new(), String::new()),
        };
        let mut argv = vec![
            "sh".into(),
            "-c".into(),
            WRAPPER.into(),
            "sh".into(),
            rows,
            cols,
        ];
        argv.push(std::mem::take(&mut self.process.cmd));
        argv.append(&mut self.process.args);
        argv
    }

    /// Starts the exec, reports its pid, streams its output and then its end; the process
    /// is addressable by its pid in between.
    async fn run(mut self, tx: mpsc::Sender<Bytes>) {
        let tty = self.pty.is_some();
        let attach = Attach {
            stdin: self.stdin || tty,
            tty,
        };
        let argv = self.argv();
        let envs = std::mem::take(&mut self.process.envs);
        let cwd = self.process.cwd.take();
        let container = self.target.container.clone();
        let exec = self
            .shared
            .engine
            .exec(&container, &self.user, argv, &envs, cwd, attach);
        let started = exec
            .await
            .map_err(|e| ConnectError::new("internal", format!("failed to start process: {e}")));
        let mut started = match started {
            Ok(s) => s,
            Err(e) => return drop(tx.send(e.end_stream()).await),
        };
        let (pid, rest) = match read_pid(&mut started).await {
            Ok(found) => found,
            Err(e) => return drop(tx.send(e.end_stream()).await),
        };
        let process = Arc::new(Process {
            exec_id: started.exec_id.clone(),
            container,
            tty,
            stdin: tokio::sync::Mutex::new(started.input.take()),
            signalled: Mutex::new(None),
        });
        let key = (self.target.id.clone(), pid);
        self.shared
            .processes
            .lock()
            .insert(key.clone(), process.clone());
        if tx
            .send(event(json!({ "start": { "pid": pid } })))
            .await
            .is_ok()
        {
            self.stream(started, rest, &process, &tx).await;
        }
        self.shared.processes.lock().remove(&key);
    }

    /// Forwards output (what came with the pid line first), then the end.
    async fn stream(
        &self,
        mut started: Started,
        rest: Vec<Output>,
        process: &Process,
        tx: &mpsc::Sender<Bytes>,
    ) {
        let mut pending = futures::stream::iter(rest.into_iter().map(Ok));
        let mut frames = (&mut pending).chain(&mut started.output);
        while let Some(frame) = frames.next().await {
            let data = match frame {
                Ok(output) => data(output, process.tty),
                Err(e) => {
                    let _ = tx
                        .send(ConnectError::new("internal", e.to_string()).end_stream())
                        .await;
                    return;
                }
            };
            if tx.send(event(json!({ "data": data }))).await.is_err() {
                return;
            }
        }
        if self.truncate {
            // The fault: the body ends here, without the `end` event or the end of stream.
            return;
        }
        let end = match self.shared.engine.exit_code(&started.exec_id).await {
            Ok(code) => end_event(code, *lock(&process.signalled)),
            Err(e) => {
                let _ = tx
                    .send(ConnectError::new("internal", e.to_string()).end_stream())
                    .await;
                return;
            }
        };
        let _ = tx.send(event(json!({ "end": end }))).await;
        let _ = tx.send(connect::end_stream_ok()).await;
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// A `DataEvent`: the terminal's output with a TTY, else stdout or stderr.
fn data(output: Output, tty: bool) -> Value {
    let b64 = base64::engine::general_purpose::STANDARD;
    match output {
        Output::Stdout(b) | Output::Stderr(b) if tty => json!({ "pty": b64.encode(&b) }),
        Output::Stdout(b) => json!({ "stdout": b64.encode(&b) }),
        Output::Stderr(b) => json!({ "stderr": b64.encode(&b) }),
    }
}

/// envd's `EndEvent` for Docker's exit `code` (see the module docs for `signalled`).
fn end_event(code: i64, signalled: Option<i64>) -> Value {
    let name = match signalled {
        Some(n) if code == 128 + n => signal_text(n),
        _ => None,
    };
    match name {
        Some(name) => {
            json!({ "exitCode": -1, "exited": false, "status": format!("signal: {name}") })
        }
        None => {
            json!({ "exitCode": code, "exited": true, "status": format!("exit status {code}") })
        }
    }
}

fn signal_text(n: i64) -> Option<&'static str> {
    match n {
        9 => Some("killed"),
        15 => Some("terminated"),
        _ => None,
    }
}

/// Splits the wrapper's pid line off the front of the output: the pid, and the output that
/// came with or before it (stderr), in order. Output that ends without a pid line is the
/// engine's own refusal to start (no such directory, no such user).
async fn read_pid(started: &mut Started) -> Result<(u32, Vec<Output>), ConnectError> {
    let mut line = Vec::new();
    let mut early = Vec::new();
    while let Some(frame) = started.output.next().await {
        let frame = frame.map_err(|e| ConnectError::new("internal", e.to_string()))?;
        let bytes = match frame {
            Output::Stdout(b) => b,
            stderr => {
                early.push(stderr);
                continue;
            }
        };
        line.extend_from_slice(&bytes);
        if let Some(at) = line.iter().position(|b| *b == b'\n') {
            let text = String::from_utf8_lossy(&line[..at]).trim().to_string();
            let pid = text.parse::<u32>().map_err(|_| refused(&line))?;
            let rest = line.split_off(at + 1);
            if !rest.is_empty() {
                early.push(Output::Stdout(Bytes::from(rest)));
            }
            return Ok((pid, early));
        }
    }
    Err(refused(&line))
}

fn refused(output: &[u8]) -> ConnectError {
    ConnectError::new(
        "internal",
        format!(
            "failed to start process: {}",
            String::from_utf8_lossy(output).trim()
        ),
    )
}

#[derive(Debug, Default, Deserialize)]
struct Selector {
    pid: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
struct Input {
    stdin: Option<String>,
    pty: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct UnaryRequest {
    #[serde(default)]
    process: Selector,
    input: Option<Input>,
    signal: Option<Value>,
    pty: Option<Pty>,
}

/// `process.Process/{SendInput, CloseStdin, SendSignal, Update}`; other methods are
/// `unimplemented`.
pub(crate) async fn unary(
    State(shared): State<Shared>,
    axum::Extension(target): axum::Extension<Target>,
    axum::extract::Path(method): axum::extract::Path<String>,
    body: Bytes,
) -> Response<Body> {
    let outcome = async {
        let request: UnaryRequest = serde_json::from_slice(&body)
            .map_err(|e| ConnectError::new("invalid_argument", e.to_string()))?;
        let pid = request
            .process
            .pid
            .ok_or_else(|| ConnectError::new("invalid_argument", "process.pid is required"))?;
        let process = shared.processes.get(&target.id, pid)?;
        match method.as_str() {
            "SendInput" => send_input(&process, request.input).await,
            "CloseStdin" => close_stdin(&process).await,
            "SendSignal" => send_signal(&shared, &process, pid, request.signal).await,
            "Update" => update(&shared, &process, request.pty).await,
            other => Err(ConnectError::new(
                "unimplemented",
                format!("process.Process/{other} is not served by the double"),
            )),
        }
    };
    match outcome.await {
        Ok(()) => axum::Json(json!({})).into_response(),
        Err(e) => e.unary_response(),
    }
}

async fn send_input(process: &Process, input: Option<Input>) -> Result<(), ConnectError> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let (encoded, for_tty) = match input.unwrap_or_default() {
        Input { pty: Some(b), .. } => (b, true),
        Input { stdin: Some(b), .. } => (b, false),
        _ => return Err(ConnectError::new("unimplemented", "invalid input type")),
    };
    if for_tty != process.tty {
        let why = match process.tty {
            true => "tty assigned to process — input should be written to the pty, not the stdin",
            false => {
                "tty not assigned to process — input should be written to the stdin, not the tty"
            }
        };
        return Err(ConnectError::new(
            "internal",
            format!("error writing input: {why}"),
        ));
    }
    let bytes = b64
        .decode(encoded)
        .map_err(|e| ConnectError::new("invalid_argument", format!("input is not base64: {e}")))?;
    let mut stdin = process.stdin.lock().await;
    let writer = stdin.as_mut().ok_or_else(|| {
        ConnectError::new(
            "internal",
            "error writing to stdin: stdin not enabled or closed",
        )
    })?;
    let written = async {
        writer.write_all(&bytes).await?;
        writer.flush().await
    };
    written
        .await
        .map_err(|e| ConnectError::new("internal", format!("error writing to stdin: {e}")))
}

async fn close_stdin(process: &Process) -> Result<(), ConnectError> {
    if process.tty {
        return Err(ConnectError::new(
            "unknown",
            "error closing stdin: cannot close stdin for PTY process — send Ctrl+D (0x04) instead",
        ));
    }
    let writer = process.stdin.lock().await.take();
    match writer {
        Some(mut writer) => writer
            .shutdown()
            .await
            .map_err(|e| ConnectError::new("unknown", format!("error closing stdin: {e}"))),
        None => Ok(()),
    }
}

/// The signal number of a `Signal` enum value, by name or by number.
fn signal_of(value: Option<&Value>) -> Option<i64> {
    match value? {
        Value::String(name) if name == "SIGNAL_SIGTERM" => Some(15),
        Value::String(name) if name == "SIGNAL_SIGKILL" => Some(9),
        Value::Number(n) => n.as_i64().filter(|n| *n == 9 || *n == 15),
        _ => None,
    }
}

async fn send_signal(
    shared: &Shared,
    process: &Process,
    pid: u32,
    signal: Option<Value>,
) -> Result<(), ConnectError> {
    let number = signal_of(signal.as_ref())
        .ok_or_else(|| ConnectError::new("unimplemented", format!("invalid signal: {signal:?}")))?;
    *lock(&process.signalled) = Some(number);
    let name = if number == 9 { "KILL" } else { "TERM" };
    // The shell's builtin `kill`: minimal images have no `kill` program.
    let argv = ["sh", "-c", r#"kill -s "$0" "$1""#, name, &pid.to_string()]
        .map(str::to_string)
        .to_vec();
    let (code, _, stderr) = shared
        .engine
        .run(&process.container, "root", argv)
        .await
        .map_err(|e| ConnectError::new("internal", format!("error sending signal: {e}")))?;
    if code != 0 {
        return Err(ConnectError::new(
            "internal",
            format!(
                "error sending signal: {}",
                String::from_utf8_lossy(&stderr).trim()
            ),
        ));
    }
    Ok(())
}

async fn update(shared: &Shared, process: &Process, pty: Option<Pty>) -> Result<(), ConnectError> {
    let Some(pty) = pty else {
        return Ok(());
    };
    if !process.tty {
        return Err(ConnectError::new(
            "internal",
            "error resizing tty: tty not assigned to process",
        ));
    }
    shared
        .engine
        .resize(&process.exec_id, pty.size.cols, pty.size.rows)
        .await
        .map_err(|e| ConnectError::new("internal", format!("error resizing tty: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signal_the_double_delivered_ends_the_envd_way() {
        assert_eq!(
            end_event(143, Some(15)),
            json!({"exitCode": -1, "exited": false, "status": "signal: terminated"})
        );
        assert_eq!(end_event(137, Some(9))["status"], "signal: killed");
        assert_eq!(end_event(143, None)["exitCode"], 143);
        assert_eq!(end_event(3, Some(15))["exitCode"], 3);
        assert_eq!(signal_of(Some(&json!("SIGNAL_SIGTERM"))), Some(15));
        assert_eq!(signal_of(Some(&json!(9))), Some(9));
        assert_eq!(signal_of(Some(&json!("SIGNAL_SIGINT"))), None);
        assert_eq!(signal_of(None), None);
    }

    #[test]
    fn terminal_output_is_pty_data() {
        let out = data(Output::Stderr(Bytes::from_static(b"x")), true);
        assert_eq!(out, json!({"pty": "eA=="}));
        let out = data(Output::Stderr(Bytes::from_static(b"x")), false);
        assert_eq!(out, json!({"stderr": "eA=="}));
    }
}
