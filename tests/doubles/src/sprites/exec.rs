//! The exec WebSocket: `GET /v1/sprites/{name}/exec?cmd=..&cmd=..&env=K=V&dir=..&stdin=..`,
//! upgraded, then binary frames whose first byte names the stream: 0 stdin, 1 stdout,
//! 2 stderr, 3 exit (payload: the exit code as one byte), 4 stdin EOF. Each exec is a real
//! `docker exec` in the sprite's container.

use std::sync::Arc;

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, RawQuery, State as AxState};
use axum::http::StatusCode;
use axum::response::Response;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use futures::StreamExt;
use tokio::io::AsyncWriteExt;

use super::api::{all, engine, error, first, no_sprite, pairs};
use super::state::{Faults, State};

const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const EXIT: u8 = 3;
const STDIN_EOF: u8 = 4;

/// One command to run.
struct Command {
    argv: Vec<String>,
    env: Vec<String>,
    dir: Option<String>,
    stdin: bool,
}

pub async fn upgrade(
    AxState(state): AxState<Arc<State>>,
    Path(name): Path<String>,
    RawQuery(raw): RawQuery,
    ws: WebSocketUpgrade,
) -> Response {
    let q = pairs(raw.as_deref());
    let command = Command {
        argv: all(&q, "cmd").into_iter().map(String::from).collect(),
        env: all(&q, "env").into_iter().map(String::from).collect(),
        dir: first(&q, "dir").map(String::from),
        stdin: first(&q, "stdin") == Some("true"),
    };
    if command.argv.is_empty() {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_command",
            "give the command as cmd query parameters",
        );
    }
    let container = match state.wake(&name).await {
        Ok(Some(c)) => c,
        Ok(None) => return no_sprite(&name),
        Err(e) => return engine(e),
    };
    ws.on_upgrade(move |socket| run(state, container, command, socket))
}

async fn run(state: Arc<State>, container: String, command: Command, mut socket: WebSocket) {
    let code = match relay(&state, &container, command, &mut socket).await {
        Ok(code) => code,
        Err(e) => {
            let _ = socket
                .send(Message::Binary(
                    [&[STDERR][..], e.as_bytes()].concat().into(),
                ))
                .await;
            126
        }
    };
    if Faults::take(&state.faults.drop_exec_before_exit) {
        return; // dropped: the socket closes without an exit frame
    }
    let byte = u8::try_from(code.clamp(0, 255)).unwrap_or(255);
    let _ = socket.send(Message::Binary(vec![EXIT, byte].into())).await;
    let _ = socket.send(Message::Close(None)).await;
}

/// Runs the command, relaying frames both ways; returns its exit code.
async fn relay(
    state: &State,
    container: &str,
    command: Command,
    socket: &mut WebSocket,
) -> Result<i64, String> {
    let options = CreateExecOptions::<String> {
        attach_stdin: Some(command.stdin),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        tty: Some(false),
        env: Some(command.env),
        cmd: Some(command.argv),
        working_dir: command.dir,
        ..Default::default()
    };
    let created = state
        .docker
        .create_exec(container, options)
        .await
        .map_err(|e| e.to_string())?;
    let started = state
        .docker
        .start_exec(
            &created.id,
            Some(StartExecOptions {
                detach: false,
                tty: false,
                output_capacity: None,
            }),
        )
        .await
        .map_err(|e| e.to_string())?;
    let StartExecResults::Attached { mut output, input } = started else {
        return Err("exec detached".into());
    };
    let mut input = command.stdin.then_some(input);
    loop {
        tokio::select! {
            frame = output.next() => match frame {
                Some(Ok(bollard::container::LogOutput::StdErr { message })) => {
                    send(socket, STDERR, &message).await?;
                }
                Some(Ok(other)) => send(socket, STDOUT, &other.into_bytes()).await?,
                Some(Err(e)) => return Err(e.to_string()),
                None => break,
            },
            msg = socket.recv(), if input.is_some() => match msg {
                Some(Ok(Message::Binary(data))) if !data.is_empty() => match data[0] {
                    STDIN => {
                        if let Some(w) = input.as_mut() {
                            w.write_all(&data[1..]).await.map_err(|e| e.to_string())?;
                        }
                    }
                    STDIN_EOF => {
                        if let Some(mut w) = input.take() {
                            let _ = w.shutdown().await;
                        }
                    }
                    _ => {}
                },
                Some(Ok(_)) => {}
                _ => { input = None; }
            },
        }
    }
    let inspected = state
        .docker
        .inspect_exec(&created.id)
        .await
        .map_err(|e| e.to_string())?;
    Ok(inspected.exit_code.unwrap_or(-1))
}

async fn send(socket: &mut WebSocket, stream: u8, data: &[u8]) -> Result<(), String> {
    let frame = [&[stream][..], data].concat();
    socket
        .send(Message::Binary(frame.into()))
        .await
        .map_err(|e| e.to_string())
}
