//! The exec WebSocket: `GET /v1/sprites/{name}/exec?cmd=..&cmd=..&env=K=V&dir=..&stdin=..
//! &tty=..&cols=..&rows=..`, upgraded. Each exec is a real `docker exec` in the sprite's
//! container (see `session.rs` for how it is signalled).
//!
//! The upgrade's `X-Sprite-Capabilities: signal` header says the socket takes signals. Then the
//! server sends a text frame `{"type":"session_info","session_id":N,…}`. Without a TTY, binary
//! frames start with a stream-id byte: 0 stdin, 1 stdout, 2 stderr, 3 exit (payload: the exit
//! code as one byte), 4 stdin EOF. With a TTY (`tty=true`, initial `cols`×`rows`, default
//! 80×24, stdin on unless `stdin=false`), binary frames are the terminal's raw bytes both ways
//! and the exit is a text frame `{"type":"exit","exit_code":N}`. Text frames from the client
//! are control messages: `{"type":"resize","cols":C,"rows":R}` and
//! `{"type":"signal","signal":"INT"}`.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, RawQuery, State as AxState};
use axum::http::{HeaderValue, StatusCode};
use axum::response::Response;
use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, ResizeExecOptions, StartExecOptions, StartExecResults};
use futures::{Stream, StreamExt};
use serde::Deserialize;
use tokio::io::{AsyncWrite, AsyncWriteExt};

use super::api::{all, engine, error, first, no_sprite, pairs};
use super::session::Session;
use super::state::State;

const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const EXIT: u8 = 3;
const STDIN_EOF: u8 = 4;

type Output = Pin<Box<dyn Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>>;
type Input = Pin<Box<dyn AsyncWrite + Send>>;

/// One command to run.
struct Command {
    argv: Vec<String>,
    env: Vec<String>,
    dir: Option<String>,
    stdin: bool,
    /// Rows and columns of its terminal; `None` without a TTY.
    tty: Option<(u16, u16)>,
}

/// A control message from the client (a text frame).
#[derive(Deserialize)]
struct Control {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    cols: u16,
    #[serde(default)]
    rows: u16,
    #[serde(default)]
    signal: String,
}

/// The command the query asks for, or what is wrong with the query (a 400).
fn command(raw: Option<&str>) -> Result<Command, String> {
    let q = pairs(raw);
    let tty = first(&q, "tty") == Some("true");
    let size = |key: &str, default: u16| match first(&q, key) {
        None => Ok(default),
        Some(v) => v
            .parse::<u16>()
            .map_err(|_| format!("{key}={v:?} is not a terminal size")),
    };
    let command = Command {
        argv: all(&q, "cmd").into_iter().map(String::from).collect(),
        env: all(&q, "env").into_iter().map(String::from).collect(),
        dir: first(&q, "dir").map(String::from),
        stdin: first(&q, "stdin").map_or(tty, |v| v == "true"),
        tty: if tty {
            Some((size("rows", 24)?, size("cols", 80)?))
        } else {
            None
        },
    };
    if command.argv.is_empty() {
        return Err("give the command as cmd query parameters".into());
    }
    Ok(command)
}

pub async fn upgrade(
    AxState(state): AxState<Arc<State>>,
    Path(name): Path<String>,
    RawQuery(raw): RawQuery,
    ws: WebSocketUpgrade,
) -> Response {
    let command = match command(raw.as_deref()) {
        Ok(c) => c,
        Err(e) => return error(StatusCode::BAD_REQUEST, "invalid_command", e),
    };
    let container = match state.wake(&name).await {
        Ok(Some(c)) => c,
        Ok(None) => return no_sprite(&name),
        Err(e) => return engine(e),
    };
    let signals = !state
        .faults
        .no_ws_signals
        .load(std::sync::atomic::Ordering::SeqCst);
    let session = Session::new(&name, &container);
    let mut response = ws.on_upgrade(move |socket| run(state, session, command, socket));
    if signals {
        response
            .headers_mut()
            .insert("x-sprite-capabilities", HeaderValue::from_static("signal"));
    }
    response
}

async fn run(state: Arc<State>, session: Session, command: Command, mut socket: WebSocket) {
    let tty = command.tty.is_some();
    let code = match relay(&state, &session, command, &mut socket).await {
        Ok(code) => code,
        Err(e) => {
            let stream = (!tty).then_some(STDERR);
            let _ = send(&mut socket, stream, e.as_bytes()).await;
            126
        }
    };
    session.cleanup(&state).await;
    if state.faults.take_dropped_exit(&session.sprite) {
        return; // dropped: the socket closes without an exit frame
    }
    let exit = if tty {
        let text = serde_json::json!({"type": "exit", "exit_code": code}).to_string();
        Message::Text(text.into())
    } else {
        let byte = u8::try_from(code.clamp(0, 255)).unwrap_or(255);
        Message::Binary(vec![EXIT, byte].into())
    };
    let _ = socket.send(exit).await;
    let _ = socket.send(Message::Close(None)).await;
    closing_handshake(&mut socket).await;
}

/// How long the double waits for the client's side of the close: as long as a slow client
/// may take to read what came before it (the operator's access layer waits as long).
const CLOSE_BOUND: Duration = Duration::from_secs(60);

/// Reads (and drops) what the client still sends until its close frame, bounded: a socket
/// dropped with the client's frames unread (a stdin EOF sent late) resets the connection,
/// and the client loses the output and the exit it had not read yet.
async fn closing_handshake(socket: &mut WebSocket) {
    let _ = tokio::time::timeout(CLOSE_BOUND, async {
        while let Some(Ok(message)) = socket.recv().await {
            if matches!(message, Message::Close(_)) {
                break;
            }
        }
    })
    .await;
}

/// Runs the command, relaying frames both ways; returns its exit code.
async fn relay(
    state: &Arc<State>,
    session: &Session,
    command: Command,
    socket: &mut WebSocket,
) -> Result<i64, String> {
    let tty = command.tty;
    let stdin = command.stdin;
    let (exec_id, output, input) = start(state, session, command).await?;
    let id = state.add_session(session.clone());
    let info = serde_json::json!({
        "type": "session_info",
        "session_id": id,
        "command": session.sprite,
        "created": chrono::Utc::now().timestamp(),
        "cols": tty.map_or(0, |(_, cols)| cols),
        "rows": tty.map_or(0, |(rows, _)| rows),
        "is_owner": true,
        "tty": tty.is_some(),
    });
    let pumped = match socket.send(Message::Text(info.to_string().into())).await {
        Ok(()) => {
            let link = Link {
                state,
                session,
                exec_id: &exec_id,
                tty: tty.is_some(),
            };
            link.pump(output, stdin.then_some(input), socket).await
        }
        Err(e) => Err(e.to_string()),
    };
    state.end_session(id);
    pumped?;
    exit_code(state, &exec_id).await
}

/// Creates and starts the (wrapped) exec, attached.
async fn start(
    state: &State,
    session: &Session,
    command: Command,
) -> Result<(String, Output, Input), String> {
    let tty = command.tty.is_some();
    let options = CreateExecOptions::<String> {
        attach_stdin: Some(command.stdin),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        tty: Some(tty),
        env: Some(command.env),
        cmd: Some(session.wrap(command.argv, command.tty)),
        working_dir: command.dir,
        ..Default::default()
    };
    let created = state
        .docker
        .create_exec(&session.container, options)
        .await
        .map_err(|e| e.to_string())?;
    let started = state
        .docker
        .start_exec(
            &created.id,
            Some(StartExecOptions {
                detach: false,
                tty,
                output_capacity: None,
            }),
        )
        .await
        .map_err(|e| e.to_string())?;
    match started {
        StartExecResults::Attached { output, input } => Ok((created.id, output, input)),
        StartExecResults::Detached => Err("exec detached".into()),
    }
}

/// What relaying one session needs.
struct Link<'a> {
    state: &'a Arc<State>,
    session: &'a Session,
    exec_id: &'a str,
    tty: bool,
}

impl Link<'_> {
    /// Relays output to the socket and the socket's frames to the process until the output
    /// ends. While a send to the socket waits, no more output is read: a slow client holds
    /// the process back.
    async fn pump(
        &self,
        mut output: Output,
        mut input: Option<Input>,
        socket: &mut WebSocket,
    ) -> Result<(), String> {
        let mut open = true;
        loop {
            tokio::select! {
                frame = output.next() => match frame {
                    Some(Ok(LogOutput::StdErr { message })) if !self.tty => {
                        send(socket, Some(STDERR), &message).await?;
                    }
                    Some(Ok(other)) => {
                        let stream = (!self.tty).then_some(STDOUT);
                        send(socket, stream, &other.into_bytes()).await?;
                    }
                    Some(Err(e)) => return Err(e.to_string()),
                    None => return Ok(()),
                },
                message = socket.recv(), if open => match message {
                    Some(Ok(message)) => self.incoming(message, &mut input).await?,
                    _ => open = false,
                },
            }
        }
    }

    /// One frame from the client: stdin bytes, stdin's end, or a control message.
    async fn incoming(&self, message: Message, input: &mut Option<Input>) -> Result<(), String> {
        match message {
            Message::Binary(data) if self.tty => write(input, &data).await,
            Message::Binary(data) => match data.first() {
                Some(&STDIN) => write(input, &data[1..]).await,
                Some(&STDIN_EOF) => {
                    if let Some(mut w) = input.take() {
                        let _ = w.shutdown().await;
                    }
                    Ok(())
                }
                _ => Ok(()),
            },
            Message::Text(text) => {
                if let Ok(control) = serde_json::from_str::<Control>(&text) {
                    self.control(control).await;
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// A resize (TTY only) or a signal (delivered beside the relay, so output keeps flowing).
    async fn control(&self, control: Control) {
        match control.kind.as_str() {
            "resize" if self.tty => {
                let size = ResizeExecOptions {
                    height: control.rows,
                    width: control.cols,
                };
                let _ = self.state.docker.resize_exec(self.exec_id, size).await;
            }
            "signal" => {
                let (state, session) = (self.state.clone(), self.session.clone());
                tokio::spawn(async move {
                    if let Err(e) = session.signal(&state, &control.signal).await {
                        tracing::warn!(error = %e, "the Sprites double could not signal");
                    }
                });
            }
            _ => {}
        }
    }
}

/// Writes stdin bytes (dropped when stdin is not attached or already closed).
async fn write(input: &mut Option<Input>, data: &[u8]) -> Result<(), String> {
    match input.as_mut() {
        Some(w) => {
            w.write_all(data).await.map_err(|e| e.to_string())?;
            w.flush().await.map_err(|e| e.to_string())
        }
        None => Ok(()),
    }
}

/// The exec's exit code, once the engine has recorded it (a moment after the output ends).
async fn exit_code(state: &State, exec_id: &str) -> Result<i64, String> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let inspected = state
            .docker
            .inspect_exec(exec_id)
            .await
            .map_err(|e| e.to_string())?;
        if inspected.running != Some(true) || tokio::time::Instant::now() >= deadline {
            return Ok(inspected.exit_code.unwrap_or(-1));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Sends `data` as a binary frame, prefixed with `stream` unless on a TTY.
async fn send(socket: &mut WebSocket, stream: Option<u8>, data: &[u8]) -> Result<(), String> {
    let frame = match stream {
        Some(id) => [&[id][..], data].concat(),
        None => data.to_vec(),
    };
    socket
        .send(Message::Binary(frame.into()))
        .await
        .map_err(|e| e.to_string())
}
