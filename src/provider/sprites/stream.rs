//! Interactive processes ([`StreamingExec`]) over the Sprites exec WebSocket.
//!
//! One socket per session, opened with the request's argv, env, cwd and `stdin`, and, for a
//! terminal, `tty=true&cols=&rows=` (the service starts the TTY at that size). The frames are
//! in `frames.rs`. Input, in order: stdin bytes; the end of stdin (the EOF frame, or ^D on a
//! terminal, which has no EOF frame: what a terminal's reader sees as end of input); resizes
//! (a `resize` control message); signals — over the socket when the upgrade's
//! `X-Sprite-Capabilities` lists `signal`, otherwise through
//! `POST /v1/sprites/{name}/exec/{session_id}/kill?signal=SIGTERM` with the id the service
//! sent in `session_info`. The exit code is the exit frame (without a TTY) or the `exit` text
//! message (with one); a socket that ends before it is `Transient`, never a guessed code.
//!
//! Two tasks per session: the *reader* moves output into one bounded queue per stream
//! ([`QUEUE`] chunks; while a queue is full it stops reading the socket, so TCP holds the
//! service back and the process blocks on its full pipe — a slow reader never makes us
//! buffer) and then resolves the exit; the *feeder* applies the caller's input in order and
//! closes the socket once the process has ended. A caller that drops
//! [`ExecSession::input`] closes the process's stdin (without a TTY).
//!
//! Only a running sprite is used: the service wakes a parked sprite on any request, so an exec
//! would start one on the caller's behalf; a sprite that is not running is `Conflict`.

use std::time::Duration;

use async_trait::async_trait;
use futures::stream::{SplitSink, SplitStream};
use futures::{SinkExt, StreamExt};
use reqwest::Method;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_tungstenite::tungstenite::Message;

use super::SpritesProvider;
use super::client::Client;
use super::convert;
use super::exec::{CHUNK, Launch, Socket, closed_early, connect, exec_url, lost};
use super::frames::{self, Incoming};
use crate::provider::interactive::{self, Queue};
use crate::provider::stream::{
    ExecInput, ExecSession, ExitStatus, Signal, StreamExecRequest, StreamingExec,
};
use crate::provider::{ProviderError, ProviderResult, SandboxState};

/// How long a signal waits for the service's `session_info` (the kill endpoint needs its id).
const SESSION_ID_BOUND: Duration = Duration::from_secs(10);

type Sink = SplitSink<Socket, Message>;

#[async_trait]
impl StreamingExec for SpritesProvider {
    async fn exec_stream(
        &self,
        id: &str,
        request: &StreamExecRequest,
    ) -> ProviderResult<ExecSession> {
        interactive::check_argv(id, &request.argv)?;
        self.must_run(id).await?;
        let launch = Launch {
            argv: &request.argv,
            env: &request.env,
            cwd: request.cwd.as_deref(),
            stdin: request.stdin,
            tty: request.tty,
        };
        let what = format!("exec {:?} in sandbox {id}", request.argv);
        let url = exec_url(&self.client, id, &launch)?;
        let (socket, signals) = connect(&self.client, &url, &what).await?;
        let session = Session {
            client: self.client.clone(),
            id: id.to_string(),
            what,
            tty: request.tty.is_some(),
            signals,
        };
        Ok(session.run(socket, request.stdin))
    }
}

impl SpritesProvider {
    /// `NotFound` for an absent sprite, `Conflict` for one that is not running.
    pub(super) async fn must_run(&self, id: &str) -> ProviderResult<()> {
        let info = self.must_exist(id).await?;
        let state = convert::descriptor(&info, convert::Answer::Record).state;
        if state != SandboxState::Running {
            return Err(ProviderError::conflict(format!(
                "sandbox {id}: the sprite is not running (it is {state:?}); start or \
                 wake it first (the service parks an idle sprite by itself)"
            )));
        }
        Ok(())
    }
}

/// One interactive exec and what its tasks need.
#[derive(Clone)]
struct Session {
    client: Client,
    id: String,
    /// Names the exec in messages.
    what: String,
    tty: bool,
    /// The service takes signals over the socket.
    signals: bool,
}

impl Session {
    /// Spawns the reader and the feeder and hands the caller its ends.
    fn run(self, socket: Socket, stdin: bool) -> ExecSession {
        let (sink, stream) = socket.split();
        let (session, ends) = interactive::session(&self.id, self.tty);
        let (ended_tx, ended_rx) = oneshot::channel();
        let (session_tx, session_rx) = watch::channel(None);
        let feeder = Feeder {
            session: self.clone(),
            sink,
            stdin_open: stdin,
            session_id: session_rx,
        };
        tokio::spawn(feeder.feed(ends.input, ended_rx));
        let reader = self.clone();
        tokio::spawn(async move {
            let exit = reader
                .read(stream, ends.stdout, ends.stderr, session_tx)
                .await;
            let _ = ended_tx.send(());
            let _ = ends.exit.send(exit);
        });
        session
    }

    /// Moves output into the queues until the exit arrives; the queues close (the streams
    /// end) before the exit is returned. A queue whose reader is gone is skipped, so the
    /// other stream still flows.
    async fn read(
        &self,
        mut stream: SplitStream<Socket>,
        stdout: Queue,
        stderr: Option<Queue>,
        session_id: watch::Sender<Option<u64>>,
    ) -> ProviderResult<ExitStatus> {
        while let Some(message) = stream.next().await {
            let message = message.map_err(|e| closed_early(&self.what).with_source(e))?;
            match frames::decode(message, self.tty) {
                Incoming::Stdout(data) => {
                    let _ = stdout.send(Ok(data)).await;
                }
                Incoming::Stderr(data) => {
                    let _ = stderr.as_ref().unwrap_or(&stdout).send(Ok(data)).await;
                }
                Incoming::Exit(code) => return Ok(ExitStatus { code }),
                Incoming::Session(id) => {
                    let _ = session_id.send(Some(id));
                }
                Incoming::Other => {}
            }
        }
        Err(closed_early(&self.what))
    }

    /// Signals the process through the kill endpoint, with the session's id.
    async fn kill(&self, session_id: &mut watch::Receiver<Option<u64>>, signal: Signal) -> Check {
        let known = tokio::time::timeout(SESSION_ID_BOUND, session_id.wait_for(Option::is_some));
        let sid = match known.await {
            Ok(Ok(id)) => id.unwrap_or_default(),
            _ => {
                return Err(ProviderError::transient(format!(
                    "{}: cannot signal: the service did not say the session's id within {:?}",
                    self.what, SESSION_ID_BOUND
                )));
            }
        };
        let what = format!("{}: sending SIG{}", self.what, signal.name());
        let request = self
            .client
            .request(
                Method::POST,
                &format!("/v1/sprites/{}/exec/{sid}/kill", self.id),
            )
            .query(&[("signal", format!("SIG{}", signal.name()))]);
        let mut response = self.client.send(request, &what).await?;
        let mut first = Vec::new();
        while !first.contains(&b'\n') {
            match response.chunk().await {
                Ok(Some(chunk)) => first.extend_from_slice(&chunk),
                _ => break,
            }
        }
        kill_verdict(&what, &first)
    }
}

type Check = ProviderResult<()>;

/// The kill endpoint's first NDJSON event: an `error` event is a failure, carrying its
/// message; anything else (the `signal` event) says the signal was sent.
fn kill_verdict(what: &str, body: &[u8]) -> Check {
    let line = body.split(|b| *b == b'\n').next().unwrap_or_default();
    let event: serde_json::Value = serde_json::from_slice(line).unwrap_or_default();
    if event["type"] == "error" {
        return Err(ProviderError::transient(format!(
            "{what}: the service said: {}",
            event["message"].as_str().unwrap_or("(no message)")
        )));
    }
    Ok(())
}

/// The task that applies the caller's input.
struct Feeder {
    session: Session,
    sink: Sink,
    stdin_open: bool,
    session_id: watch::Receiver<Option<u64>>,
}

impl Feeder {
    /// Applies input in order until the process ends (`ended`), then closes the socket. A
    /// caller that hangs up closes stdin. A failed step is logged: the input queue has no
    /// answer channel, and the process's own output says the rest.
    async fn feed(mut self, mut inputs: mpsc::Receiver<ExecInput>, ended: oneshot::Receiver<()>) {
        tokio::pin!(ended);
        loop {
            let input = tokio::select! {
                input = inputs.recv() => input,
                _ = &mut ended => break,
            };
            let step = match input {
                Some(input) => self.apply(input).await,
                None => {
                    if !self.session.tty {
                        let _ = self.close_stdin().await;
                    }
                    let _ = (&mut ended).await;
                    break;
                }
            };
            if let Err(e) = step {
                tracing::warn!(sandbox = %self.session.id, error = %e, "interactive exec input failed");
            }
        }
        let _ = self.sink.close().await;
    }

    async fn apply(&mut self, input: ExecInput) -> Check {
        match input {
            ExecInput::Stdin(bytes) if self.stdin_open => {
                for chunk in bytes.chunks(CHUNK) {
                    self.send(frames::stdin(chunk, self.session.tty)).await?;
                }
                Ok(())
            }
            ExecInput::Stdin(_) => Ok(()),
            ExecInput::CloseStdin => self.close_stdin().await,
            ExecInput::Resize(size) if self.session.tty => self.send(frames::resize(size)).await,
            ExecInput::Resize(_) => Ok(()),
            ExecInput::Signal(signal) if self.session.signals => {
                self.send(frames::signal(signal)).await
            }
            ExecInput::Signal(signal) => self.session.kill(&mut self.session_id, signal).await,
        }
    }

    async fn close_stdin(&mut self) -> Check {
        if !std::mem::take(&mut self.stdin_open) {
            return Ok(());
        }
        self.send(frames::stdin_eof(self.session.tty)).await
    }

    async fn send(&mut self, message: Message) -> Check {
        self.sink
            .send(message)
            .await
            .map_err(|e| lost(&self.session.what, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kill_endpoint_s_error_event_is_a_failure() {
        let ok = br#"{"type":"signal","message":"Signaling SIGTERM","signal":"SIGTERM","pid":7}
{"type":"exited","message":"Process exited"}
"#;
        assert!(kill_verdict("x", ok).is_ok());
        let failed = br#"{"type":"error","message":"no such process"}
"#;
        let err = kill_verdict("x", failed).expect_err("an error event");
        assert!(err.message().contains("no such process"), "{err}");
    }
}
