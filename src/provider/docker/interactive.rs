//! Interactive processes ([`StreamingExec`]) through Docker's exec API, attached.
//!
//! One exec per session: created with stdin, stdout and stderr attached (and a TTY when asked
//! for), started attached (the engine hijacks the connection: multiplexed output one way,
//! raw stdin the other), resized with the exec resize call, and its exit code read from
//! `inspect` once the output has ended. Signals go through the shared token wrapper (see
//! [`crate::provider::interactive`]): Docker has no call that signals an exec.
//!
//! Three tasks run per session, each bounded: the *pump* moves output frames from the
//! connection into one queue per stream ([`QUEUE`] chunks each; when a queue is full the pump
//! stops reading, the engine stops copying, and the process blocks on its full pipe — a slow
//! reader never makes us buffer), then reads the exit code; the *feeder* applies the caller's
//! input in order (stdin bytes, EOF as a half-close of our side of the connection — the engine
//! then closes the process's stdin —, resizes, signals) and ends with the process.
//!
//! The caller should read both output streams (or drop the one it does not want, whose
//! output is then discarded): a full, unread stderr queue holds stdout back too, as a full
//! pipe would. Dropping [`ExecSession::input`] closes the process's stdin.

use std::pin::Pin;
use std::time::Duration;

use async_trait::async_trait;
use bollard::Docker;
use bollard::container::LogOutput;
use bollard::exec::{ResizeExecOptions, StartExecResults};
use futures::{Stream, StreamExt};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use super::DockerProvider;
use super::exec::{self, attached_options, exec_error};
use crate::provider::interactive::{self, Queue, Wrapped};
use crate::provider::stream::{
    ExecInput, ExecSession, ExitStatus, Signal, StreamExecRequest, StreamingExec, TermSize,
};
use crate::provider::{ExecRequest, ProviderError, ProviderResult};

/// How long the engine may take to record an exec's exit after its output ended.
const EXIT_BOUND: Duration = Duration::from_secs(30);
/// Bound on the exec that delivers a signal.
const HELPER_BOUND: Duration = Duration::from_secs(15);

type Output = Pin<Box<dyn Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>>;
type Input = Pin<Box<dyn AsyncWrite + Send>>;

#[async_trait]
impl StreamingExec for DockerProvider {
    async fn exec_stream(
        &self,
        id: &str,
        request: &StreamExecRequest,
    ) -> ProviderResult<ExecSession> {
        interactive::check_argv(id, &request.argv)?;
        let docker = self.engine().await?.clone();
        let wrapped = interactive::wrap(&request.argv, request.tty);
        let options = attached_options(
            wrapped.argv.clone(),
            &request.env,
            request.cwd.clone(),
            request.stdin,
            request.tty.is_some(),
        );
        let (exec_id, started) = self.start_attached(id, options).await?;
        let StartExecResults::Attached { output, input } = started else {
            return Err(ProviderError::transient(format!(
                "exec in sandbox {id}: the engine started the exec detached"
            )));
        };
        let session = Session {
            provider: self.clone(),
            docker,
            id: id.to_string(),
            exec_id,
            wrapped,
        };
        Ok(session.run(request, output, input))
    }
}

/// One running exec and what its tasks need.
#[derive(Clone)]
struct Session {
    provider: DockerProvider,
    docker: Docker,
    id: String,
    exec_id: String,
    wrapped: Wrapped,
}

impl Session {
    /// Spawns the pump and the feeder and hands the caller its ends.
    fn run(self, request: &StreamExecRequest, output: Output, input: Input) -> ExecSession {
        let (session, ends) = interactive::session(&self.id, request.tty.is_some());
        let feeder = tokio::spawn(self.clone().feed(ends.input, input, request.stdin));
        let pump = self.clone();
        tokio::spawn(async move {
            pump.pump(output, ends.stdout, ends.stderr).await;
            let exit = pump.exit_code().await;
            feeder.abort();
            let _ = ends.exit.send(exit);
        });
        session
    }

    /// Moves output frames into the queues until the connection ends. A queue whose reader
    /// is gone is skipped, so the other stream still flows.
    async fn pump(&self, mut output: Output, stdout: Queue, stderr: Option<Queue>) {
        while let Some(frame) = output.next().await {
            let (queue, message) = match frame {
                Ok(LogOutput::StdErr { message }) => (stderr.as_ref().unwrap_or(&stdout), message),
                Ok(LogOutput::StdOut { message } | LogOutput::Console { message }) => {
                    (&stdout, message)
                }
                Ok(LogOutput::StdIn { .. }) => continue,
                Err(e) => {
                    let broke = ProviderError::transient(format!(
                        "exec in sandbox {}: the output stream broke ({e})",
                        self.id
                    ));
                    let _ = stdout.send(Err(broke)).await;
                    return;
                }
            };
            let _ = queue.send(Ok(message)).await;
        }
    }

    /// Applies the caller's input in order until it hangs up (which closes stdin) or the
    /// process ends (the pump aborts this task). A failed step is logged: the caller's input
    /// queue has no answer channel, and the process's own output says the rest.
    async fn feed(self, mut inputs: mpsc::Receiver<ExecInput>, stdin: Input, attached: bool) {
        let mut stdin = attached.then_some(stdin);
        while let Some(input) = inputs.recv().await {
            let step = match input {
                ExecInput::Stdin(bytes) => write(&mut stdin, &bytes).await,
                ExecInput::CloseStdin => close(&mut stdin).await,
                ExecInput::Resize(size) => self.resize(size).await,
                ExecInput::Signal(signal) => self.signal(signal).await,
            };
            if let Err(e) = step {
                tracing::warn!(sandbox = %self.id, error = %e, "interactive exec input failed");
            }
        }
        let _ = close(&mut stdin).await;
    }

    async fn resize(&self, size: TermSize) -> ProviderResult<()> {
        let options = ResizeExecOptions {
            height: size.rows,
            width: size.cols,
        };
        self.docker
            .resize_exec(&self.exec_id, options)
            .await
            .map_err(|e| exec_error(&self.id, "resizing an exec's terminal", e))
    }

    async fn signal(&self, signal: Signal) -> ProviderResult<()> {
        self.helper(interactive::signal_argv(&self.wrapped.token, signal))
            .await
    }

    /// Runs a helper command (a signal) to completion; a non-zero exit is an error
    /// carrying its stderr.
    async fn helper(&self, argv: Vec<String>) -> ProviderResult<()> {
        let request = ExecRequest {
            argv,
            cwd: None,
            env: Default::default(),
            timeout: HELPER_BOUND,
        };
        let out = self.provider.run_exec(&self.id, &request).await?;
        interactive::helper_verdict(&self.id, &request.argv, &out)
    }

    /// The exit code, once the engine has recorded it (a moment after the output ends).
    async fn exit_code(&self) -> ProviderResult<ExitStatus> {
        let deadline = tokio::time::Instant::now() + EXIT_BOUND;
        let code = exec::exit_code(&self.docker, &self.exec_id, &self.id, deadline).await?;
        Ok(ExitStatus { code })
    }
}

/// Writes `bytes` to the process's stdin; dropped after EOF or without attached stdin.
async fn write(stdin: &mut Option<Input>, bytes: &[u8]) -> ProviderResult<()> {
    let Some(writer) = stdin.as_mut() else {
        return Ok(());
    };
    let written = async {
        writer.write_all(bytes).await?;
        writer.flush().await
    };
    written
        .await
        .map_err(|e| ProviderError::transient(format!("writing to the process's stdin: {e}")))
}

/// Half-closes our side of the connection: the engine closes the process's stdin (EOF).
async fn close(stdin: &mut Option<Input>) -> ProviderResult<()> {
    let Some(mut writer) = stdin.take() else {
        return Ok(());
    };
    writer
        .shutdown()
        .await
        .map_err(|e| ProviderError::transient(format!("closing the process's stdin: {e}")))
}
