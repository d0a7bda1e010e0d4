//! Interactive processes ([`StreamingExec`]) through the Pod `exec` subresource (WebSocket):
//! stdin, stdout and stderr are channels of their own, a TTY has a resize channel, and the
//! exit code comes from the status channel. The exec API has no environment, working
//! directory or signal: the argv is wrapped for env and cwd
//! ([`shellfs::wrap`](crate::provider::shellfs::wrap)) and then for signals by the shared
//! token wrapper ([`crate::provider::interactive`]), whose signals are second execs.
//!
//! Backpressure: the connection's pipes hold at most [`CHUNK`] bytes per stream; when the
//! caller does not read, the connection is not read either, and the API server's and the
//! kubelet's flow control hold the process back. The caller should read both streams (a
//! dropped stream ends the connection). Dropping [`ExecSession::input`] closes stdin.

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{AttachParams, AttachedProcess, TerminalSize};
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, oneshot};

use super::KubernetesProvider;
use super::errors::from_kube;
use super::exec::{bounded_exec, exit_code};
use super::pod::CONTAINER;
use crate::provider::interactive::{self, CHUNK, QUEUE, Wrapped};
use crate::provider::shellfs::wrap;
use crate::provider::stream::{
    ExecInput, ExecSession, ExitStatus, StreamExecRequest, StreamingExec,
};
use crate::provider::{ExecRequest, ProviderError, ProviderResult};

/// Bound on the exec that delivers a signal.
const HELPER_BOUND: std::time::Duration = std::time::Duration::from_secs(15);

type Stdin = tokio::io::WriteHalf<tokio::io::SimplexStream>;
type Resizer = futures::channel::mpsc::Sender<TerminalSize>;

#[async_trait]
impl StreamingExec for KubernetesProvider {
    async fn exec_stream(
        &self,
        id: &str,
        request: &StreamExecRequest,
    ) -> ProviderResult<ExecSession> {
        interactive::check_argv(id, &request.argv)?;
        self.must_be_running(id, "exec").await?;
        let with_env = wrap(&ExecRequest {
            argv: request.argv.clone(),
            cwd: request.cwd.clone(),
            env: request.env.clone(),
            timeout: HELPER_BOUND,
        });
        let wrapped = interactive::wrap(&with_env, request.tty);
        let params = AttachParams {
            container: Some(CONTAINER.to_string()),
            stdin: request.stdin,
            stdout: true,
            stderr: request.tty.is_none(),
            tty: request.tty.is_some(),
            max_stdin_buf_size: Some(CHUNK),
            max_stdout_buf_size: Some(CHUNK),
            max_stderr_buf_size: Some(CHUNK),
        };
        let pods = self.pods();
        let process = pods
            .exec(id, wrapped.argv.clone(), &params)
            .await
            .map_err(|e| from_kube(e, &format!("exec in sandbox {id}")))?;
        let session = Session {
            pods,
            id: id.to_string(),
            wrapped,
        };
        Ok(session.run(request, process).await)
    }
}

/// One running exec and what its tasks need.
#[derive(Clone)]
struct Session {
    pods: Api<Pod>,
    id: String,
    wrapped: Wrapped,
}

impl Session {
    /// Hands the caller its ends; a task holds the connection until the exit status came
    /// (dropping the process would abort it).
    async fn run(self, request: &StreamExecRequest, mut process: AttachedProcess) -> ExecSession {
        let what = format!("exec in sandbox {}", self.id);
        let stdout = process
            .stdout()
            .map(|r| interactive::read_stream(r, what.clone()));
        let stderr = process
            .stderr()
            .map(|r| interactive::read_stream(r, what.clone()));
        let mut resizer = process.terminal_size();
        if let (Some(resizer), Some(size)) = (resizer.as_mut(), request.tty) {
            let _ = resizer.try_send(TerminalSize {
                width: size.cols,
                height: size.rows,
            });
        }
        let (input_tx, input_rx) = mpsc::channel(QUEUE);
        let feeder = tokio::spawn(self.clone().feed(input_rx, process.stdin(), resizer));
        let (exit_tx, exit_rx) = oneshot::channel();
        let status = process.take_status();
        tokio::spawn(async move {
            let status = match status {
                Some(status) => status.await,
                None => None,
            };
            let _ = process.join().await;
            feeder.abort();
            let exit = exit_code(status.as_ref())
                .map(|code| ExitStatus { code })
                .map_err(|why| ProviderError::transient(format!("{what}: {why}")));
            let _ = exit_tx.send(exit);
        });
        ExecSession {
            input: input_tx,
            stdout: stdout.unwrap_or_else(|| futures::StreamExt::boxed(futures::stream::empty())),
            stderr,
            exit: interactive::exit_future(&self.id, exit_rx),
        }
    }

    /// Applies the caller's input in order until it hangs up (which closes stdin) or the
    /// process ends (the holder aborts this task). A failed step is logged: the input queue
    /// has no answer channel.
    async fn feed(
        self,
        mut inputs: mpsc::Receiver<ExecInput>,
        mut stdin: Option<Stdin>,
        mut resizer: Option<Resizer>,
    ) {
        while let Some(input) = inputs.recv().await {
            let step = match input {
                ExecInput::Stdin(bytes) => match stdin.as_mut() {
                    Some(w) => w.write_all(&bytes).await.map_err(stdin_error),
                    None => Ok(()),
                },
                ExecInput::CloseStdin => close(&mut stdin).await,
                ExecInput::Resize(size) => resize(resizer.as_mut(), size).await,
                ExecInput::Signal(signal) => {
                    self.helper(interactive::signal_argv(&self.wrapped.token, signal))
                        .await
                }
            };
            if let Err(e) = step {
                tracing::warn!(sandbox = %self.id, error = %e, "interactive exec input failed");
            }
        }
        let _ = close(&mut stdin).await;
    }

    /// Runs a helper command (a signal) to completion; a non-zero exit is an error
    /// carrying its stderr.
    async fn helper(&self, argv: Vec<String>) -> ProviderResult<()> {
        let out = bounded_exec(&self.pods, &self.id, &argv, None, HELPER_BOUND).await?;
        interactive::helper_verdict(&self.id, &argv, &out)
    }
}

/// Closes the process's stdin (the connection sends the channel's close message).
async fn close(stdin: &mut Option<Stdin>) -> ProviderResult<()> {
    match stdin.take() {
        Some(mut writer) => writer.shutdown().await.map_err(stdin_error),
        None => Ok(()),
    }
}

async fn resize(
    resizer: Option<&mut Resizer>,
    size: crate::provider::stream::TermSize,
) -> ProviderResult<()> {
    use futures::SinkExt;
    let Some(resizer) = resizer else {
        return Ok(());
    };
    resizer
        .send(TerminalSize {
            width: size.cols,
            height: size.rows,
        })
        .await
        .map_err(|e| ProviderError::transient(format!("resizing the terminal: {e}")))
}

fn stdin_error(e: std::io::Error) -> ProviderError {
    ProviderError::transient(format!("writing to the process's stdin: {e}"))
}
