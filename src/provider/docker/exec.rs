//! Running a command inside a sandbox (`docker exec`).
//!
//! The exec API has three steps — create, start (attached: the output is multiplexed over the
//! hijacked connection), inspect (for the exit code) — and all three run inside ONE wall-clock
//! bound, the request's timeout. A timeout is `Transient` and names the command and the bound.
//!
//! Docker cannot kill an exec: there is no API for it, and the exec's pid that
//! `inspect` reports is a host pid, which an operator running in a pod cannot signal. When the
//! bound expires we close our end of the connection (the process then gets `SIGPIPE` on its
//! next write) and return; a process that neither writes nor exits may linger inside the
//! sandbox until the sandbox stops. Callers that need a hard stop wrap the command in the
//! image's own `timeout(1)`.

use std::time::Duration;

use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use futures::StreamExt;
use tokio::time::Instant;

use super::{DockerProvider, map_err};
use crate::provider::{ErrorKind, ExecOutput, ExecRequest, ProviderError, ProviderResult};

/// Output we are willing to hold in memory for one exec, stdout and stderr together.
///
/// Exec output is not a binary channel (the file capability is); a command that prints more
/// than this is refused rather than silently truncated, so nobody reads half a result as a
/// whole one.
pub(crate) const MAX_EXEC_OUTPUT: usize = 64 * 1024 * 1024;

/// How often the exit code is re-read when the output stream closed before the engine
/// recorded the exit (a short race inside dockerd).
const EXIT_POLL: Duration = Duration::from_millis(20);

impl DockerProvider {
    /// Runs `request` in the running sandbox `id` and returns its output and exit code.
    ///
    /// A non-zero exit code is data, not an error. Errors: the sandbox does not exist →
    /// `NotFound`; it exists but is not running (stopped, paused, restarting) → `Conflict`
    /// saying to start it; empty argv → `Invalid`; the timeout expired → `Transient` (see the
    /// module docs: the process may linger); output above [`MAX_EXEC_OUTPUT`] → `Invalid`.
    pub(crate) async fn run_exec(
        &self,
        id: &str,
        request: &ExecRequest,
    ) -> ProviderResult<ExecOutput> {
        if request.argv.is_empty() {
            return Err(ProviderError::invalid(format!(
                "exec in sandbox {id}: the command is empty; give at least the program to run"
            )));
        }
        self.run_exec_with_stdin(id, request, None).await
    }

    /// [`run_exec`](Self::run_exec) with `stdin` written to the process and then closed
    /// (end of file), for moving data in where the archive API cannot (gVisor).
    pub(crate) async fn run_exec_with_stdin(
        &self,
        id: &str,
        request: &ExecRequest,
        stdin: Option<&[u8]>,
    ) -> ProviderResult<ExecOutput> {
        let bound = request.timeout;
        match tokio::time::timeout(
            bound,
            self.exec_unbounded(id, request, stdin, Instant::now() + bound),
        )
        .await
        {
            Ok(result) => result,
            Err(_) => Err(ProviderError::transient(format!(
                "exec in sandbox {id}: {:?} did not finish within its timeout of {:.1} s; \
                 Docker cannot kill an exec, so the process may still be running in the sandbox",
                request.argv,
                bound.as_secs_f64()
            ))),
        }
    }

    async fn exec_unbounded(
        &self,
        id: &str,
        request: &ExecRequest,
        stdin: Option<&[u8]>,
        deadline: Instant,
    ) -> ProviderResult<ExecOutput> {
        let docker = self.engine().await?;
        let env: Vec<String> = request
            .env
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let options = CreateExecOptions::<String> {
            attach_stdin: Some(stdin.is_some()),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            tty: Some(false),
            env: (!env.is_empty()).then_some(env),
            cmd: Some(request.argv.clone()),
            working_dir: request.cwd.clone(),
            ..Default::default()
        };
        let created = docker
            .create_exec(id, options)
            .await
            .map_err(|e| exec_error(id, "creating an exec", e))?;

        let started = docker
            .start_exec(
                &created.id,
                Some(StartExecOptions {
                    detach: false,
                    tty: false,
                    // Frames are read whole; the capacity only sizes the read buffer.
                    output_capacity: Some(64 * 1024),
                }),
            )
            .await
            .map_err(|e| exec_error(id, "starting an exec", e))?;

        let mut stdout = Vec::new();
        let mut stderr = Vec::new();
        if let StartExecResults::Attached {
            mut output,
            mut input,
        } = started
        {
            // Without attached stdin, closing our half would not signal EOF anyway. With it,
            // the whole input is written first and our half shut down: the process reads
            // end of file. (Inputs here are small enough that the process never blocks on a
            // full output pipe meanwhile: file contents go in, a status comes out.)
            if let Some(data) = stdin {
                use tokio::io::AsyncWriteExt;
                let written = async {
                    input.write_all(data).await?;
                    input.shutdown().await
                };
                written.await.map_err(|e| {
                    ProviderError::transient(format!(
                        "exec in sandbox {id}: writing the input of {:?} failed: {e}",
                        request.argv
                    ))
                })?;
            }
            drop(input);
            while let Some(frame) = output.next().await {
                use bollard::container::LogOutput;
                let frame = frame.map_err(|e| {
                    ProviderError::transient(format!(
                        "exec in sandbox {id}: reading the output of {:?} failed: {e}",
                        request.argv
                    ))
                })?;
                match frame {
                    LogOutput::StdErr { message } => stderr.extend_from_slice(&message),
                    LogOutput::StdOut { message } | LogOutput::Console { message } => {
                        stdout.extend_from_slice(&message)
                    }
                    LogOutput::StdIn { .. } => {}
                }
                if stdout.len() + stderr.len() > MAX_EXEC_OUTPUT {
                    return Err(ProviderError::invalid(format!(
                        "exec in sandbox {id}: {:?} printed more than {} MiB; exec output is not a \
                         data channel — write the data to a file and read it with the file capability",
                        request.argv,
                        MAX_EXEC_OUTPUT / (1024 * 1024)
                    )));
                }
            }
        }

        // The attached stream closes when the process's output closes; the engine records the
        // exit a moment later. Re-read until it has (the outer timeout bounds this loop).
        loop {
            let inspected = docker
                .inspect_exec(&created.id)
                .await
                .map_err(|e| exec_error(id, "reading an exec's exit code", e))?;
            if inspected.running != Some(true)
                && let Some(code) = inspected.exit_code
            {
                return Ok(ExecOutput {
                    stdout,
                    stderr,
                    exit_code: code,
                });
            }
            if Instant::now() >= deadline {
                // Unreachable in practice: the caller's timeout fires first.
                return Err(ProviderError::transient(format!(
                    "exec in sandbox {id}: the engine did not report an exit code for {:?}",
                    request.argv
                )));
            }
            tokio::time::sleep(EXIT_POLL).await;
        }
    }
}

/// Maps an exec-step error: 404 is the sandbox being gone, 409 is it not running.
pub(crate) fn exec_error(id: &str, step: &str, err: bollard::errors::Error) -> ProviderError {
    let err = map_err(&format!("{step} in sandbox {id}"), err);
    match err.kind() {
        ErrorKind::NotFound => {
            ProviderError::not_found(format!("sandbox {id} does not exist ({})", err.message()))
        }
        ErrorKind::Conflict => ProviderError::conflict(format!(
            "sandbox {id} is not running; start it ({})",
            err.message()
        )),
        _ => err,
    }
}
