//! Interactive processes ([`StreamingExec`]) through envd's process service: `Start` with a
//! stdin pipe or a PTY (streaming the process's events), and then, by the pid its `start`
//! event carried, `SendInput` (stdin bytes, or the terminal's input with a PTY),
//! `CloseStdin`, `Update` (the terminal's size) and `SendSignal`. The messages are in
//! [`super::process`].
//!
//! Two tasks run per session: the *pump* moves the process's events into one bounded queue
//! per stream ([`QUEUE`] chunks each; when a queue is full the pump stops reading the
//! response, and the connection's flow control holds envd and the process back — a slow
//! reader never makes us buffer), then settles the exit status; the *feeder* applies the
//! caller's input in order, one unary call at a time (so stdin is bounded too), and ends
//! with the process. A failed input step is logged: the input queue has no answer channel.
//!
//! What envd cannot do, and what is done instead:
//! - **End of input on a terminal.** envd refuses `CloseStdin` for a PTY process; the
//!   terminal's own end of input, ^D ([`process::EOT`]), is sent instead, which a program
//!   reading the terminal sees as end of file at the start of a line.
//! - **Signals other than TERM and KILL.** envd's `Signal` enum has only those two, which go
//!   through `SendSignal` (envd then stops forwarding the process's output). `INT` and `HUP`
//!   are delivered by a second process, `kill -s NAME <pid>` in `sh` (its builtin `kill`):
//!   envd starts every process through `sh -c '… exec "$@"'`, so the pid it reports is the
//!   program's own. The sandbox needs `sh`, which every E2B template has.
//!
//! The caller should read both output streams (or drop the one it does not want, whose
//! output is then discarded): a full, unread stderr queue holds stdout back too, as a full
//! pipe would. Dropping [`ExecSession::input`] closes the process's stdin (^D with a TTY).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio::task::AbortHandle;

use super::envd::{self, Access, EnvdError, Event};
use super::{E2bProvider, Inner, process};
use crate::provider::interactive::{self, Queue};
use crate::provider::stream::{
    ExecInput, ExecSession, ExitStatus, Signal, StreamExecRequest, StreamingExec, TermSize,
};
use crate::provider::{ExecRequest, ProviderError, ProviderResult};

/// Bound on the process that delivers `INT` or `HUP`.
const SIGNALLER_BOUND: Duration = Duration::from_secs(15);

type Events = BoxStream<'static, Result<Event, EnvdError>>;

#[async_trait]
impl StreamingExec for E2bProvider {
    async fn exec_stream(
        &self,
        id: &str,
        request: &StreamExecRequest,
    ) -> ProviderResult<ExecSession> {
        interactive::check_argv(id, &request.argv)?;
        let process = process::config(&request.argv, &request.env, request.cwd.as_deref())
            .ok_or_else(|| ProviderError::invalid("exec: the command is empty"))?;
        let start = process::start_request(process, request.stdin, request.tty);
        let context = format!("exec {:?} in E2B sandbox {id}", request.argv);
        let inner = &self.inner;
        let (access, pid, events) = inner
            .envd_call(id, |access| {
                let (start, context) = (&start, context.clone());
                async move {
                    let mut events = inner
                        .envd
                        .start(id, &access, start, None, context.clone())
                        .await?;
                    let pid = first_pid(&mut events, &context).await?;
                    Ok((access, pid, events))
                }
            })
            .await?;
        let feeder = Feeder {
            inner: inner.clone(),
            id: id.to_string(),
            access,
            pid,
            tty: request.tty.is_some(),
            stdin_open: request.stdin || request.tty.is_some(),
        };
        Ok(session(feeder, events, context))
    }
}

/// Reads up to the `start` event and returns its pid; anything else first is an error.
async fn first_pid(events: &mut Events, context: &str) -> Result<u32, EnvdError> {
    match events.next().await {
        Some(Ok(Event::Start(pid))) => Ok(pid),
        Some(Err(e)) => Err(e),
        Some(Ok(other)) => Err(EnvdError::Call(ProviderError::transient(format!(
            "{context}: envd sent {other:?} before the process's start event"
        )))),
        None => Err(EnvdError::Unreachable(format!(
            "{context}: the stream ended before the process's start event"
        ))),
    }
}

/// Starts the feeder and the pump, and hands the caller its ends.
fn session(feeder: Feeder, events: Events, context: String) -> ExecSession {
    let (session, ends) = interactive::session(&feeder.id, feeder.tty);
    let (inner, id) = (feeder.inner.clone(), feeder.id.clone());
    let feeding = tokio::spawn(feeder.run(ends.input)).abort_handle();
    let pump = Pump {
        inner,
        id,
        context,
        stdout: ends.stdout,
        stderr: ends.stderr,
    };
    tokio::spawn(pump.run(events, ends.exit, feeding));
    session
}

/// Moves a process's events into the caller's queues.
struct Pump {
    inner: Arc<Inner>,
    id: String,
    context: String,
    stdout: Queue,
    stderr: Option<Queue>,
}

impl Pump {
    /// Delivers output until the process's end, then its exit status (after the output
    /// streams have ended), and stops the feeder.
    async fn run(
        self,
        mut events: Events,
        exit: oneshot::Sender<ProviderResult<ExitStatus>>,
        feeder: AbortHandle,
    ) {
        let mut code = None;
        let mut failure = None;
        while let Some(event) = events.next().await {
            match event {
                Ok(Event::Stdout(b) | Event::Pty(b)) => deliver(&self.stdout, b).await,
                Ok(Event::Stderr(b)) => match &self.stderr {
                    Some(queue) => deliver(queue, b).await,
                    None => deliver(&self.stdout, b).await,
                },
                Ok(Event::End(c)) => code = Some(c),
                Ok(Event::Start(_)) => {}
                Err(e) => {
                    failure = Some(self.failure(e).await);
                    break;
                }
            }
        }
        let status = match (code, failure) {
            (_, Some(e)) => {
                let _ = self.stdout.send(Err(e.clone())).await;
                Err(e)
            }
            (Some(code), None) => Ok(ExitStatus { code }),
            (None, None) => Err(ProviderError::transient(format!(
                "{}: the stream ended without the process's end event",
                self.context
            ))),
        };
        drop(self.stdout);
        drop(self.stderr);
        let _ = exit.send(status);
        feeder.abort();
    }

    /// What a broken stream means: a sandbox that is gone or paused says so (as every other
    /// envd call does), anything else is `Transient`.
    async fn failure(&self, e: EnvdError) -> ProviderError {
        match e {
            EnvdError::Unreachable(msg) => self.inner.unreachable(&self.id, msg).await,
            other => envd::call_error(other),
        }
    }
}

/// Queues one chunk; a caller that dropped the stream has its output discarded.
async fn deliver(queue: &Queue, bytes: Vec<u8>) {
    let _ = queue.send(Ok(Bytes::from(bytes))).await;
}

/// Applies the caller's input to one process.
struct Feeder {
    inner: Arc<Inner>,
    id: String,
    access: Access,
    pid: u32,
    tty: bool,
    /// Whether input still reaches the process (a stdin pipe or a terminal not yet closed).
    stdin_open: bool,
}

impl Feeder {
    /// Applies the caller's input in order until it hangs up, which closes stdin, or the
    /// process ends (the pump aborts this task).
    async fn run(mut self, mut inputs: mpsc::Receiver<ExecInput>) {
        while let Some(input) = inputs.recv().await {
            let step = match input {
                ExecInput::Stdin(bytes) => self.stdin(&bytes).await,
                ExecInput::CloseStdin => self.close_stdin().await,
                ExecInput::Resize(size) => self.resize(size).await,
                ExecInput::Signal(signal) => self.signal(signal).await,
            };
            if let Err(e) = step {
                tracing::warn!(sandbox = %self.id, pid = self.pid, error = %e, "interactive exec input failed");
            }
        }
        let _ = self.close_stdin().await;
    }

    async fn stdin(&self, bytes: &[u8]) -> ProviderResult<()> {
        if !self.stdin_open || bytes.is_empty() {
            return Ok(());
        }
        let body = process::input_request(self.pid, self.tty, bytes);
        self.call("SendInput", &body).await
    }

    /// Closes stdin once: `CloseStdin`, or ^D on a terminal (see the module docs).
    async fn close_stdin(&mut self) -> ProviderResult<()> {
        if !std::mem::replace(&mut self.stdin_open, false) {
            return Ok(());
        }
        match self.tty {
            true => {
                let body = process::input_request(self.pid, true, &[process::EOT]);
                self.call("SendInput", &body).await
            }
            false => {
                let body = process::close_stdin_request(self.pid);
                self.call("CloseStdin", &body).await
            }
        }
    }

    async fn resize(&self, size: TermSize) -> ProviderResult<()> {
        if !self.tty {
            return Ok(());
        }
        let body = process::resize_request(self.pid, size);
        self.call("Update", &body).await
    }

    /// TERM and KILL through `SendSignal`; INT and HUP by `kill` (see the module docs).
    async fn signal(&self, signal: Signal) -> ProviderResult<()> {
        if let Some(body) = process::signal_request(self.pid, signal) {
            return self.call("SendSignal", &body).await;
        }
        let argv: Vec<String> = vec![
            "sh".into(),
            "-c".into(),
            r#"kill -s "$0" "$1""#.into(),
            signal.name().into(),
            self.pid.to_string(),
        ];
        let request = ExecRequest {
            argv: argv.clone(),
            cwd: None,
            env: Default::default(),
            timeout: SIGNALLER_BOUND,
        };
        let out = self.inner.exec_request(&self.id, &request).await?;
        interactive::helper_verdict(&self.id, &argv, &out)
    }

    /// One unary call of the process service.
    async fn call(&self, method: &str, body: &Value) -> ProviderResult<()> {
        let context = format!(
            "{method} to process {} in E2B sandbox {}",
            self.pid, self.id
        );
        let path = format!("process.Process/{method}");
        self.inner
            .envd
            .unary(&self.id, &self.access, &path, body, &context)
            .await
            .map(drop)
            .map_err(envd::call_error)
    }
}
