//! Interactive processes ([`StreamingExec`]) through the Pod `exec` subresource (WebSocket):
//! stdin, stdout and stderr are channels of their own, a TTY has a resize channel, and the
//! exit code comes from the status channel. The exec API has no environment, working
//! directory or signal: the argv is wrapped for env and cwd
//! ([`shellfs::wrap`](crate::provider::shellfs::wrap)) and then for signals by the shared
//! token wrapper ([`crate::provider::interactive`]), whose signals are second execs.
//!
//! When the caller asked for neither a TTY nor stdin, the wrapper also marks the end of each
//! output stream and waits for our word that both marks arrived before it exits: a line on
//! the exec's stdin, which we attach for that. [`crate::provider::end_mark`] says why: the
//! exec path can lose an output's tail and still report success. A stream that ended
//! without its mark turns a success into an error. Sessions with stdin or a TTY are not
//! marked: their stdin is the program's, and a word by a second exec made each session an
//! exec longer, which a Sandbox parked by a short idle timeout right after waking did not
//! survive (exit 137 in `tests/idle.rs`).
//!
//! Backpressure: the connection's pipes hold at most [`CHUNK`] bytes per stream and the
//! session's queues [`QUEUE`](interactive::QUEUE) chunks; when the caller does not read, the
//! connection is not read either, and the API server's and the kubelet's flow control hold
//! the process back. A stream the caller dropped is read and discarded, so the other still
//! flows. Dropping [`ExecSession::input`] closes stdin.

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{AttachParams, AttachedProcess, TerminalSize};
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use super::KubernetesProvider;
use super::errors::from_kube;
use super::exec::{bounded_exec, exit_code};
use super::pod::CONTAINER;
use crate::provider::end_mark::EndMark;
use crate::provider::interactive::{self, CHUNK, Queue, Wrapped};
use crate::provider::shellfs::wrap;
use crate::provider::stream::{
    ExecInput, ExecSession, ExitStatus, StreamExecRequest, StreamingExec,
};
use crate::provider::{ExecRequest, ProviderError, ProviderResult};

/// Bound on the exec that delivers a signal.
const HELPER_BOUND: std::time::Duration = std::time::Duration::from_secs(15);

type Stdin = tokio::io::WriteHalf<tokio::io::SimplexStream>;
type Output = tokio::io::ReadHalf<tokio::io::SimplexStream>;
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
        // Marked only when the exec's stdin is free to carry our word (see the module docs).
        let wrapped = match (request.tty, request.stdin) {
            (None, false) => interactive::wrap_marked(&with_env),
            (tty, _) => interactive::wrap(&with_env, tty),
        };
        let params = AttachParams {
            container: Some(CONTAINER.to_string()),
            stdin: request.stdin || wrapped.end_mark.is_some(),
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

/// An output pump: its task (which says whether the stream ended whole) and the word that
/// the end mark went by.
struct Pump {
    task: JoinHandle<bool>,
    marked: oneshot::Receiver<()>,
}

impl Session {
    /// Hands the caller its ends; a task holds the connection until the exit status came
    /// (dropping the process would abort it).
    async fn run(self, request: &StreamExecRequest, mut process: AttachedProcess) -> ExecSession {
        let (session, ends) = interactive::session(&self.id, request.tty.is_some());
        let mut resizer = process.terminal_size();
        if let (Some(resizer), Some(size)) = (resizer.as_mut(), request.tty) {
            let _ = resizer.try_send(TerminalSize {
                width: size.cols,
                height: size.rows,
            });
        }
        // Without the caller's stdin, the exec's stdin carries our word to the wrapper.
        let (callers, word) = match request.stdin {
            true => (process.stdin(), None),
            false => (None, process.stdin()),
        };
        let feeder = tokio::spawn(self.clone().feed(ends.input, callers, resizer));
        let mut pumps = vec![self.pump(process.stdout(), Some(ends.stdout))];
        if ends.stderr.is_some() {
            pumps.push(self.pump(process.stderr(), ends.stderr));
        }
        tokio::spawn(async move {
            let exit = self.finish(process, pumps, word).await;
            feeder.abort();
            let _ = ends.exit.send(exit);
        });
        session
    }

    /// Moves one output stream into its queue until the connection ends, taking the end mark
    /// out. A queue whose reader is gone is skipped, so the mark is still looked for.
    fn pump(&self, reader: Option<Output>, queue: Option<Queue>) -> Pump {
        let (marked_tx, marked) = oneshot::channel();
        let mut marked_tx = Some(marked_tx);
        let mut end = self.wrapped.end_mark.clone().map(EndMark::new);
        let what = format!("exec in sandbox {}", self.id);
        let task = tokio::spawn(async move {
            let mut chunks = match reader {
                Some(reader) => interactive::read_stream(reader, what),
                None => futures::stream::empty().boxed(),
            };
            while let Some(chunk) = chunks.next().await {
                let chunk = match (chunk, end.as_mut()) {
                    (Ok(bytes), Some(end)) => Ok(end.pass(&bytes)),
                    (other, _) => other,
                };
                if end.as_ref().is_some_and(EndMark::seen) {
                    marked_tx.take().map(|tx| tx.send(()));
                }
                deliver(queue.as_ref(), chunk).await;
            }
            let Some(mut end) = end else {
                return true;
            };
            deliver(queue.as_ref(), Ok(end.finish())).await;
            end.seen()
        });
        Pump { task, marked }
    }

    /// Once every stream's end mark went by, tells the wrapper it may exit; then waits for
    /// the exit status and the streams' ends, and judges them together.
    async fn finish(
        &self,
        mut process: AttachedProcess,
        pumps: Vec<Pump>,
        mut word: Option<Stdin>,
    ) -> ProviderResult<ExitStatus> {
        let status = process.take_status();
        let (tasks, marks): (Vec<_>, Vec<_>) =
            pumps.into_iter().map(|p| (p.task, p.marked)).unzip();
        self.acknowledge(marks, word.as_mut()).await;
        let status = match status {
            Some(status) => status.await,
            None => None,
        };
        // Held open until the status came: closing stdin over the older protocol (before
        // `v5.channel.k8s.io`) closes the whole connection.
        drop(word);
        let _ = process.join().await;
        let whole = futures::future::join_all(tasks)
            .await
            .into_iter()
            .all(|t| t.unwrap_or(false));
        verdict(&self.id, exit_code(status.as_ref()), whole)
    }

    /// Tells a marking wrapper, by a line on the exec's stdin (`word`, ours when the session
    /// is marked), that every stream's end mark arrived, once they have. A stream that ended
    /// without its mark needs no word: the wrapper is gone.
    async fn acknowledge(&self, marks: Vec<oneshot::Receiver<()>>, word: Option<&mut Stdin>) {
        let all_marked = futures::future::join_all(marks)
            .await
            .iter()
            .all(Result::is_ok);
        let (true, Some(stdin), Some(_)) = (all_marked, word, &self.wrapped.end_mark) else {
            return;
        };
        if let Err(e) = stdin.write_all(interactive::ACK_LINE).await {
            tracing::warn!(sandbox = %self.id, error = %stdin_error(e), "acknowledging an exec's end failed");
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

/// Passes a chunk on unless the caller stopped reading; an empty one is not passed.
async fn deliver(queue: Option<&Queue>, chunk: ProviderResult<Bytes>) {
    if let (Some(queue), false) = (queue, chunk.as_ref().is_ok_and(Bytes::is_empty)) {
        let _ = queue.send(chunk).await;
    }
}

/// The session's exit: the code the status carried, unless a stream ended without its end
/// mark while the status says success — the connection was cut and the API server could not
/// tell (a real non-zero code means the status came through, and the wrapper itself ended).
fn verdict(id: &str, code: Result<i64, String>, whole: bool) -> ProviderResult<ExitStatus> {
    match code {
        Ok(0) if !whole => Err(ProviderError::transient(format!(
            "exec in sandbox {id}: the connection ended before the output did (its tail is \
             missing), so the exit status is unknown"
        ))),
        Ok(code) => Ok(ExitStatus { code }),
        Err(why) => Err(ProviderError::transient(format!(
            "exec in sandbox {id}: {why}"
        ))),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_success_without_every_end_mark_is_an_error_and_a_real_code_stands() {
        assert_eq!(verdict("s", Ok(0), true).map(|e| e.code).ok(), Some(0));
        let cut = verdict("s", Ok(0), false).expect_err("a cut output");
        assert!(cut.to_string().contains("tail is missing"), "{cut}");
        assert_eq!(verdict("s", Ok(137), false).map(|e| e.code).ok(), Some(137));
        assert!(verdict("s", Err("no status".into()), true).is_err());
    }
}
