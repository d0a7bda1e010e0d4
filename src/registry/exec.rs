//! Interactive processes and whole-file writes through a provider handle: a process waiting
//! in the sandbox ([`super::warm`]) when there is one, else the provider's own call.
//!
//! Every caller that starts a process in a sandbox (the access layer's exec, envd's
//! `Start`, a file written through a shell) goes through [`ProviderHandle::exec_stream`], so
//! a waiting process is used by whichever comes first, and each process that ends leaves
//! one waiting for the next.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::{FutureExt, StreamExt};

use super::ProviderHandle;
use super::warm::{self, Handed, LINGER};
use crate::provider::interactive::CHUNK;
use crate::provider::shellfs::{self, FILE_TIMEOUT};
use crate::provider::stream::{ExecInput, ExecSession, StreamExecRequest};
use crate::provider::{ExecOutput, ProviderError, ProviderResult};

impl ProviderHandle {
    /// Whether the provider can start interactive processes at all.
    pub fn can_exec_stream(&self) -> bool {
        self.provider.streaming_exec().is_some()
    }

    /// Starts `request` in the running sandbox `id`: handed to its waiting process when it
    /// has one (not for a TTY, whose terminal is set up as the process starts), else
    /// started by the provider. Either way, once the process ends one is left waiting.
    pub async fn exec_stream(
        &self,
        id: &str,
        request: &StreamExecRequest,
    ) -> ProviderResult<ExecSession> {
        match self.warm_start(id, request).await {
            Some(session) => Ok(self.rearm_after(id, session)),
            None => self.exec_started(id, request).await,
        }
    }

    /// `request` started by the provider itself, not by a waiting process.
    async fn exec_started(
        &self,
        id: &str,
        request: &StreamExecRequest,
    ) -> ProviderResult<ExecSession> {
        let exec = self.provider.streaming_exec().ok_or_else(|| {
            ProviderError::unsupported(format!(
                "provider {} cannot start interactive processes",
                self.name()
            ))
        })?;
        let session = self
            .call("exec_stream", exec.exec_stream(id, request))
            .await?;
        Ok(self.rearm_after(id, session))
    }

    /// The request run by the sandbox's waiting process; `None` when it has none, or its
    /// reader did not take the command.
    async fn warm_start(&self, id: &str, request: &StreamExecRequest) -> Option<ExecSession> {
        let warm = self.warm.as_ref().filter(|_| request.tty.is_none())?;
        let asked = Instant::now();
        let taken = warm.take(id).await?;
        // The last waiting one is gone: start the next now, not when this request ends, so a
        // request that follows closely finds it started (an exec start costs ~60 ms on a
        // hardened container, more than a short command takes).
        if !self.is_primed(id) {
            self.prime(id, Some(LINGER));
        }
        let started = Instant::now();
        let handed = warm::hand(taken, request).await;
        tracing::debug!(sandbox = id, taken = ?started - asked, handed = ?started.elapsed(), "warm process");
        let outcome = match &handed {
            Handed::Running(_) => "ok",
            Handed::Refused => "refused",
        };
        let secs = started.elapsed().as_secs_f64();
        self.metrics
            .provider_call(self.name(), "exec_warm", outcome, secs);
        match handed {
            Handed::Running(session) => Some(session),
            Handed::Refused => None,
        }
    }

    /// `session`, leaving processes waiting in the sandbox once it has ended if none waits
    /// there any more (a request that took the last one has started the next already). While
    /// one still waits, none is started: that one serves the next request, and a start now
    /// would compete for the engine with whatever follows this one (see [`warm::DEPTH`]).
    fn rearm_after(&self, id: &str, session: ExecSession) -> ExecSession {
        if self.warm.is_none() {
            return session;
        }
        let (handle, id) = (self.clone(), id.to_string());
        let exit = session.exit;
        ExecSession {
            exit: async move {
                let ended = exit.await;
                if !handle.is_primed(&id) {
                    handle.prime(&id, Some(LINGER));
                }
                ended
            }
            .boxed(),
            ..session
        }
    }

    /// Starts processes waiting in sandbox `id` until it has [`warm::DEPTH`]: each kept until
    /// a request takes it, it ends, or (with `linger`) it has waited that long. Nothing for a
    /// provider that keeps none. Failures only mean a later request starts its process itself.
    pub fn prime(&self, id: &str, linger: Option<Duration>) {
        let Some(warm) = self.warm.clone() else {
            return;
        };
        while let Some(keeper) = warm.register(id) {
            let (handle, warm, id) = (self.clone(), warm.clone(), id.to_string());
            tokio::spawn(async move {
                let started = match handle.provider.streaming_exec() {
                    Some(exec) => {
                        let reader = warm::reader_request();
                        handle
                            .call("exec_prime", exec.exec_stream(&id, &reader))
                            .await
                    }
                    None => Err(ProviderError::unsupported("no streaming exec")),
                };
                match started {
                    Ok(session) => {
                        keeper.answered.store(true, Ordering::Release);
                        warm::keep(session, keeper.taken, linger).await;
                    }
                    Err(e) => tracing::debug!(sandbox = %id, error = %e, "no waiting process"),
                }
                warm.deregister(&id, keeper.serial);
            });
        }
    }

    /// Whether sandbox `id` has a process waiting (or being started).
    pub fn is_primed(&self, id: &str) -> bool {
        self.warm.as_ref().is_some_and(|w| w.has(id))
    }

    /// Whether no process is still being started in sandbox `id` (always, for a provider
    /// that keeps none): a pool counts a member ready once it is, so that the claims that
    /// follow a pool's readiness do not meet the starts of its waiting processes.
    pub fn is_settled(&self, id: &str) -> bool {
        self.warm.as_ref().is_none_or(|w| w.settled(id))
    }

    /// Creates or replaces the whole file `path` in sandbox `id`: through the shell file
    /// protocol in its waiting process when it has one (no runtime exec), else through the
    /// provider's file API.
    pub async fn write_file(
        &self,
        id: &str,
        path: &str,
        data: &[u8],
        mode: u32,
    ) -> ProviderResult<()> {
        if self.is_primed(id) {
            return self.write_reported(id, path, data, mode).await;
        }
        let files = self.provider.files().ok_or_else(|| {
            ProviderError::unsupported(format!("provider {} has no file API", self.name()))
        })?;
        self.call("write_file", files.write_file(id, path, data, mode))
            .await
    }
}

impl ProviderHandle {
    /// A whole-file write through an exec (see [`Self::start_write`]) that returns as soon as
    /// the script has written its status (see [`shellfs::reported_write`]): the streams'
    /// close and the exit record (~4 ms on Docker) are awaited in the background, where the
    /// process's end leaves another waiting. A failure waits for its stderr, which says why.
    async fn write_reported(
        &self,
        id: &str,
        path: &str,
        data: &[u8],
        mode: u32,
    ) -> ProviderResult<()> {
        let (argv, path) = shellfs::reported_write(id, path, mode)?;
        let by_stdin = write_request(argv, Default::default(), true);
        let by_env = shellfs::reported_write_from_env(id, &path, mode, data)?
            .map(|(argv, env)| write_request(argv, env, false));
        let run = async {
            let (session, stdin) = self.start_write(id, by_env, by_stdin, data).await?;
            reported(id, &path, session, stdin).await
        };
        within_file_timeout(id, &path, run).await
    }

    /// Stages a whole-file write in sandbox `id` through a waiting process: the data is
    /// written beside `path` and waits there for [`StagedWrite::commit`] to put it in place.
    /// Dropped uncommitted — or with its connection broken, the operator gone — the staged
    /// file is removed and `path` never touched (see `shellfs::scripts::WRITE`). `None` when
    /// no process waits or the data is not small text: write it with [`Self::write_file`]
    /// then. Why: a claim stages its environment while the ledger write that makes the
    /// member its own is under way, and only the rename is left for after it.
    pub async fn stage_write(
        &self,
        id: &str,
        path: &str,
        data: &[u8],
        mode: u32,
    ) -> ProviderResult<Option<StagedWrite>> {
        let (_, checked) = shellfs::reported_write(id, path, mode)?;
        let Some((argv, env)) = shellfs::staged_write_from_env(id, &checked, mode, data)? else {
            return Ok(None);
        };
        if !self.is_primed(id) {
            return Ok(None);
        }
        let request = write_request(argv, env, true);
        let started = Instant::now();
        let staged = self.warm_start(id, &request).await;
        let outcome = if staged.is_some() { "ok" } else { "none" };
        let secs = started.elapsed().as_secs_f64();
        self.metrics
            .provider_call(self.name(), "stage_write", outcome, secs);
        Ok(staged.map(|session| StagedWrite {
            id: id.to_string(),
            path: checked,
            session: self.rearm_after(id, session),
        }))
    }
}

/// A whole-file write waiting in its sandbox for [`Self::commit`] (see
/// [`ProviderHandle::stage_write`]); dropping it abandons the write.
pub struct StagedWrite {
    id: String,
    path: String,
    session: ExecSession,
}

impl StagedWrite {
    /// The sandbox it waits in.
    pub fn sandbox(&self) -> &str {
        &self.id
    }

    /// Puts the staged file in place, returning once the script has said so; the script's
    /// own reason when it could not (its staging failed, say).
    pub async fn commit(self) -> ProviderResult<()> {
        let Self { id, path, session } = self;
        let run = reported(&id, &path, session, Some(shellfs::scripts::COMMIT));
        within_file_timeout(&id, &path, run).await
    }
}

/// The exec of a whole-file write script, with stdin open when it reads any.
fn write_request(
    argv: Vec<String>,
    env: std::collections::BTreeMap<String, String>,
    stdin: bool,
) -> StreamExecRequest {
    StreamExecRequest {
        argv,
        env,
        cwd: None,
        stdin,
        tty: None,
    }
}

/// Feeds `stdin` to a reported write script's process and waits for the status it writes
/// (see [`shellfs::reported_write`]): the rest of its end is awaited in the background on
/// success, and for its stderr on failure.
async fn reported(
    id: &str,
    path: &str,
    session: ExecSession,
    stdin: Option<&[u8]>,
) -> ProviderResult<()> {
    let ExecSession {
        input,
        mut stdout,
        stderr,
        exit,
    } = session;
    let status = async {
        let mut out = Vec::new();
        while let Some(chunk) = stdout.next().await {
            out.extend_from_slice(&chunk?);
            if let Some(code) = shellfs::reported_status(&out) {
                return Ok(Some(code));
            }
        }
        Ok::<_, ProviderError>(None)
    };
    let ((), status) = tokio::join!(feed(input, stdin), status);
    let rest = ExecSession {
        input: tokio::sync::mpsc::channel(1).0,
        stdout,
        stderr,
        exit,
    };
    match status? {
        Some(0) => {
            tokio::spawn(to_completion(rest, None));
            Ok(())
        }
        _ => {
            let out = to_completion(rest, None).await?;
            shellfs::reported_outcome(id, path, out.exit_code, out.stderr)
        }
    }
}

/// `run`, bounded by [`FILE_TIMEOUT`].
async fn within_file_timeout(
    id: &str,
    path: &str,
    run: impl std::future::Future<Output = ProviderResult<()>>,
) -> ProviderResult<()> {
    tokio::time::timeout(FILE_TIMEOUT, run).await.map_err(|_| {
        ProviderError::transient(format!(
            "writing {path} in sandbox {id} did not finish within {FILE_TIMEOUT:?}"
        ))
    })?
}

impl ProviderHandle {
    /// Starts a reported write: with its data in the environment (`by_env`) when a waiting
    /// process takes it, else on stdin (`by_stdin`); with what is left to feed on stdin.
    ///
    /// The environment goes to a waiting process over its stdin, in the header. A process
    /// the provider starts gets the data on stdin instead: a provider may carry an exec's
    /// environment where it is logged (the Kubernetes exec has it in its URL), and the
    /// data is a Secret's values.
    async fn start_write<'d>(
        &self,
        id: &str,
        by_env: Option<StreamExecRequest>,
        by_stdin: StreamExecRequest,
        data: &'d [u8],
    ) -> ProviderResult<(ExecSession, Option<&'d [u8]>)> {
        let warm = match &by_env {
            Some(request) => self.warm_start(id, request).await.map(|s| (s, None)),
            None => self
                .warm_start(id, &by_stdin)
                .await
                .map(|s| (s, Some(data))),
        };
        match warm {
            Some((session, stdin)) => Ok((self.rearm_after(id, session), stdin)),
            None => Ok((self.exec_started(id, &by_stdin).await?, Some(data))),
        }
    }
}

/// Feeds `stdin` (then its end) to a process while reading its output, to its exit.
async fn to_completion(session: ExecSession, stdin: Option<&[u8]>) -> ProviderResult<ExecOutput> {
    let ExecSession {
        input,
        stdout,
        stderr,
        exit,
    } = session;
    let feed = feed(input, stdin);
    let gather = |s: futures::stream::BoxStream<'static, ProviderResult<Bytes>>| async move {
        let mut all = Vec::new();
        let mut s = s;
        while let Some(chunk) = s.next().await {
            all.extend_from_slice(&chunk?);
        }
        Ok::<_, ProviderError>(all)
    };
    let errors = async move {
        match stderr {
            Some(s) => gather(s).await,
            None => Ok(Vec::new()),
        }
    };
    let ((), stdout, stderr) = tokio::join!(feed, gather(stdout), errors);
    Ok(ExecOutput {
        stdout: stdout?,
        stderr: stderr?,
        exit_code: exit.await?.code,
    })
}

/// Sends `stdin` (then its end) to a process's input.
async fn feed(input: tokio::sync::mpsc::Sender<ExecInput>, stdin: Option<&[u8]>) {
    for chunk in stdin.unwrap_or_default().chunks(CHUNK) {
        if input
            .send(ExecInput::Stdin(Bytes::copy_from_slice(chunk)))
            .await
            .is_err()
        {
            return;
        }
    }
    let _ = input.send(ExecInput::CloseStdin).await;
}
