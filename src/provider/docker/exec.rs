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

use std::collections::BTreeMap;
use std::time::Duration;

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bollard::models::ExecInspectResponse;
use futures::{Stream, StreamExt};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

use super::{DockerProvider, map_err};
use crate::provider::{ErrorKind, ExecOutput, ExecRequest, ProviderError, ProviderResult};

/// Output we are willing to hold in memory for one exec, stdout and stderr together.
///
/// Exec output is not a binary channel (the file capability is); a command that prints more
/// than this is refused rather than silently truncated, so nobody reads half a result as a
/// whole one.
pub(crate) const MAX_EXEC_OUTPUT: usize = 64 * 1024 * 1024;

/// How long the engine may take to start an exec's process once it has its connection.
const START_BOUND: Duration = Duration::from_secs(30);

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

    /// The three exec steps, without the wall-clock bound that
    /// [`run_exec_with_stdin`](Self::run_exec_with_stdin) puts around them.
    async fn exec_unbounded(
        &self,
        id: &str,
        request: &ExecRequest,
        stdin: Option<&[u8]>,
        deadline: Instant,
    ) -> ProviderResult<ExecOutput> {
        let (exec_id, started) = self
            .start_attached(id, exec_options(request, stdin.is_some()))
            .await?;
        let (stdout, stderr) = match started {
            StartExecResults::Attached { output, input } => {
                write_input(id, request, input, stdin).await?;
                read_output(id, request, output).await?
            }
            StartExecResults::Detached => (Vec::new(), Vec::new()),
        };
        let exit_code = exit_code(self.engine().await?, &exec_id, id, deadline).await?;
        Ok(ExecOutput {
            stdout,
            stderr,
            exit_code,
        })
    }
}

impl DockerProvider {
    /// Creates an exec in sandbox `id` and starts it attached (a TTY when `options` asks
    /// for one), never across a pause of it (see `freeze`); returns the exec's id and its
    /// connection.
    pub(crate) async fn start_attached(
        &self,
        id: &str,
        options: CreateExecOptions<String>,
    ) -> ProviderResult<(String, StartExecResults)> {
        let docker = self.engine().await?;
        let _gate = self.freeze.exec(id).await;
        let (exec_id, started) = start_attached(docker, id, options).await?;
        started_process(docker, &exec_id, id).await?;
        Ok((exec_id, started))
    }
}

/// Waits until the engine has started the exec's process (it has a pid) or recorded its
/// end. The engine answers an attached start as soon as it has taken the connection, and
/// starts the process only after that; a pause must not come in between (see `freeze`).
async fn started_process(docker: &Docker, exec_id: &str, id: &str) -> ProviderResult<()> {
    let started = |e: &ExecInspectResponse| {
        (e.pid.is_some_and(|p| p > 0) || e.exit_code.is_some()).then_some(())
    };
    let late = format!(
        "exec in sandbox {id}: the engine did not start the process within {START_BOUND:?}"
    );
    let deadline = Instant::now() + START_BOUND;
    let step = "waiting for an exec to start";
    poll_exec(docker, (exec_id, id), deadline, step, &late, started).await
}

/// Re-reads exec `exec_id` (in sandbox `id`) until `done` says what it waited for: first
/// after 1 ms, doubling up to [`EXIT_POLL`] (the engine's races are usually over within a
/// millisecond or two). Past `deadline` the wait is `Transient`, with `late` as its message.
async fn poll_exec<T>(
    docker: &Docker,
    (exec_id, id): (&str, &str),
    deadline: Instant,
    step: &str,
    late: &str,
    done: impl Fn(&ExecInspectResponse) -> Option<T>,
) -> ProviderResult<T> {
    let mut pause = Duration::from_millis(1);
    loop {
        let inspected = docker
            .inspect_exec(exec_id)
            .await
            .map_err(|e| exec_error(id, step, e))?;
        if let Some(found) = done(&inspected) {
            return Ok(found);
        }
        if Instant::now() >= deadline {
            return Err(ProviderError::transient(late));
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(EXIT_POLL);
    }
}

/// Creates an exec in sandbox `id` and starts it attached; see
/// [`DockerProvider::start_attached`], the one caller.
async fn start_attached(
    docker: &Docker,
    id: &str,
    options: CreateExecOptions<String>,
) -> ProviderResult<(String, StartExecResults)> {
    let tty = options.tty == Some(true);
    let created = docker
        .create_exec(id, options)
        .await
        .map_err(|e| exec_error(id, "creating an exec", e))?;
    let started = docker
        .start_exec(
            &created.id,
            Some(StartExecOptions {
                detach: false,
                tty,
                // Frames are read whole; the capacity only sizes the read buffer.
                output_capacity: Some(64 * 1024),
            }),
        )
        .await
        .map_err(|e| exec_error(id, "starting an exec", e))?;
    Ok((created.id, started))
}

/// The exec's configuration: output always attached and untouched by a terminal, stdin only
/// when there is input to send.
fn exec_options(request: &ExecRequest, with_stdin: bool) -> CreateExecOptions<String> {
    attached_options(
        request.argv.clone(),
        &request.env,
        request.cwd.clone(),
        with_stdin,
        false,
    )
}

/// An exec of `argv` with stdout and stderr attached, stdin when `stdin`, a TTY when `tty`.
pub(crate) fn attached_options(
    argv: Vec<String>,
    env: &BTreeMap<String, String>,
    cwd: Option<String>,
    stdin: bool,
    tty: bool,
) -> CreateExecOptions<String> {
    let env: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    CreateExecOptions::<String> {
        attach_stdin: Some(stdin),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        tty: Some(tty),
        env: (!env.is_empty()).then_some(env),
        cmd: Some(argv),
        working_dir: cwd,
        ..Default::default()
    }
}

/// Writes `stdin` (if any) to the process and closes our half, so the process reads end of
/// file. Without attached stdin, closing our half would not signal EOF anyway. The whole
/// input goes in before any output is read: inputs here are small enough that the process
/// never blocks on a full output pipe meanwhile (file contents go in, a status comes out).
async fn write_input(
    id: &str,
    request: &ExecRequest,
    mut input: impl AsyncWrite + Unpin,
    stdin: Option<&[u8]>,
) -> ProviderResult<()> {
    let Some(data) = stdin else {
        return Ok(());
    };
    let written = async {
        input.write_all(data).await?;
        input.shutdown().await
    };
    written.await.map_err(|e| {
        ProviderError::transient(format!(
            "exec in sandbox {id}: writing the input of {:?} failed: {e}",
            request.argv
        ))
    })
}

/// Reads the multiplexed output until the process closes it, refusing more than
/// [`MAX_EXEC_OUTPUT`] so a huge result is never held in memory nor half-returned.
async fn read_output(
    id: &str,
    request: &ExecRequest,
    mut output: impl Stream<Item = Result<LogOutput, bollard::errors::Error>> + Unpin,
) -> ProviderResult<(Vec<u8>, Vec<u8>)> {
    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
    while let Some(frame) = output.next().await {
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
    Ok((stdout, stderr))
}

/// The exec's exit code. The attached stream closes when the process's output closes; the
/// engine records the exit a moment later, so this re-reads until it has — first after
/// 1 ms, doubling up to [`EXIT_POLL`]: the race is usually over within a millisecond or
/// two, and a fixed 20 ms wait was most of a short exec's time. An engine that records no
/// exit by `deadline` is `Transient`.
pub(super) async fn exit_code(
    docker: &Docker,
    exec_id: &str,
    id: &str,
    deadline: Instant,
) -> ProviderResult<i64> {
    let ended = |e: &ExecInspectResponse| e.exit_code.filter(|_| e.running != Some(true));
    let late =
        format!("exec in sandbox {id}: the engine recorded no exit code after the output ended");
    let step = "reading an exec's exit code";
    poll_exec(docker, (exec_id, id), deadline, step, &late, ended).await
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
