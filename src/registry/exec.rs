//! Interactive processes and whole-file writes through a provider handle: a process waiting
//! in the sandbox ([`super::warm`]) when there is one, else the provider's own call.
//!
//! Every caller that starts a process in a sandbox (the access layer's exec, envd's
//! `Start`, a file written through a shell) goes through [`ProviderHandle::exec_stream`], so
//! a waiting process is used by whichever comes first, and each process that ends leaves
//! one waiting for the next.

use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use futures::{FutureExt, StreamExt};

use super::ProviderHandle;
use super::warm::{self, Handed, LINGER};
use crate::provider::interactive::CHUNK;
use crate::provider::shellfs::{self, Shell, Transport};
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
        let exec = self.provider.streaming_exec().ok_or_else(|| {
            ProviderError::unsupported(format!(
                "provider {} cannot start interactive processes",
                self.name()
            ))
        })?;
        let session = match self.warm_start(id, request).await {
            Some(session) => session,
            None => {
                self.call("exec_stream", exec.exec_stream(id, request))
                    .await?
            }
        };
        Ok(self.rearm_after(id, session))
    }

    /// The request run by the sandbox's waiting process; `None` when it has none, or its
    /// reader did not take the command.
    async fn warm_start(&self, id: &str, request: &StreamExecRequest) -> Option<ExecSession> {
        let warm = self.warm.as_ref().filter(|_| request.tty.is_none())?;
        let asked = Instant::now();
        let taken = warm.take(id).await?;
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

    /// `session`, leaving a waiting process in the sandbox once it has ended.
    fn rearm_after(&self, id: &str, session: ExecSession) -> ExecSession {
        if self.warm.is_none() {
            return session;
        }
        let (handle, id) = (self.clone(), id.to_string());
        let exit = session.exit;
        ExecSession {
            exit: async move {
                let ended = exit.await;
                handle.prime(&id, Some(LINGER));
                ended
            }
            .boxed(),
            ..session
        }
    }

    /// Starts a process waiting in sandbox `id` unless one is there: kept until a request
    /// takes it, it ends, or (with `linger`) it has waited that long. Nothing for a provider
    /// that keeps none. Failures only mean the next request starts its process itself.
    pub fn prime(&self, id: &str, linger: Option<Duration>) {
        let Some(warm) = self.warm.clone() else {
            return;
        };
        let Some((serial, taken)) = warm.register(id) else {
            return;
        };
        let (handle, id) = (self.clone(), id.to_string());
        tokio::spawn(async move {
            if let Some(exec) = handle.provider.streaming_exec() {
                let reader = warm::reader_request();
                match handle
                    .call("exec_prime", exec.exec_stream(&id, &reader))
                    .await
                {
                    Ok(session) => warm::keep(session, taken, linger).await,
                    Err(e) => tracing::debug!(sandbox = %id, error = %e, "no waiting process"),
                }
            }
            warm.deregister(&id, serial);
        });
    }

    /// Whether sandbox `id` has a process waiting (or being started).
    pub fn is_primed(&self, id: &str) -> bool {
        self.warm.as_ref().is_some_and(|w| w.has(id))
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
            return shellfs::write_file(&Warmed(self), id, path, data, mode).await;
        }
        let files = self.provider.files().ok_or_else(|| {
            ProviderError::unsupported(format!("provider {} has no file API", self.name()))
        })?;
        self.call("write_file", files.write_file(id, path, data, mode))
            .await
    }
}

/// A handle as the shell file protocol's [`Shell`]: each command through
/// [`ProviderHandle::exec_stream`].
struct Warmed<'a>(&'a ProviderHandle);

#[async_trait]
impl Shell for Warmed<'_> {
    fn transport(&self) -> Transport {
        Transport::Binary
    }

    async fn shell_exec(
        &self,
        id: &str,
        argv: Vec<String>,
        stdin: Option<&[u8]>,
        timeout: Duration,
    ) -> ProviderResult<ExecOutput> {
        let request = StreamExecRequest {
            argv,
            env: Default::default(),
            cwd: None,
            stdin: stdin.is_some(),
            tty: None,
        };
        let run = async {
            let session = self.0.exec_stream(id, &request).await?;
            to_completion(session, stdin).await
        };
        tokio::time::timeout(timeout, run).await.map_err(|_| {
            ProviderError::transient(format!(
                "a file operation in sandbox {id} did not finish within {timeout:?}"
            ))
        })?
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
    let feed = async move {
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
    };
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
