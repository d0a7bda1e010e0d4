//! Commands in a sandbox through the Pod `exec` subresource (WebSocket, `v5.channel.k8s.io`):
//! stdin, stdout and stderr are binary channels, so bytes cross unchanged; the exit code
//! comes from the status channel.
//!
//! The exec API has no working directory or environment: the argv is wrapped
//! ([`shellfs::wrap`](crate::provider::shellfs::wrap)) to apply them.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use kube::Api;
use kube::api::AttachParams;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use super::KubernetesProvider;
use super::errors::from_kube;
use super::pod::{self, CONTAINER};
use crate::provider::shellfs::wrap;
use crate::provider::{ExecOutput, ExecRequest, ProviderError, ProviderResult, SandboxState};

impl KubernetesProvider {
    /// Runs `request` (see the module docs for cwd/env).
    pub(super) async fn run_exec(
        &self,
        id: &str,
        request: &ExecRequest,
    ) -> ProviderResult<ExecOutput> {
        if request.argv.is_empty() {
            return Err(ProviderError::invalid(format!(
                "exec in sandbox {id}: the command is empty; give at least the program to run"
            )));
        }
        self.exec_raw(id, &wrap(request), None, request.timeout)
            .await
    }

    /// One exec of `argv` with optional stdin, bounded by `timeout` (past it: `Transient`,
    /// naming the command). A sandbox whose Pod does not run is `Conflict` (not absent).
    pub(super) async fn exec_raw(
        &self,
        id: &str,
        argv: &[String],
        stdin: Option<&[u8]>,
        timeout: Duration,
    ) -> ProviderResult<ExecOutput> {
        self.must_be_running(id, "exec").await?;
        bounded_exec(&self.pods(), id, argv, stdin, timeout).await
    }

    /// `NotFound` for an absent sandbox, `Conflict` for one whose Pod does not run; `what`
    /// names the operation refused.
    pub(super) async fn must_be_running(&self, id: &str, what: &str) -> ProviderResult<()> {
        let pod = self.must_get_pod(id).await?;
        let state = pod::state(&pod);
        if state != SandboxState::Running {
            return Err(ProviderError::conflict(format!(
                "{what} in sandbox {id}: it is not running ({state:?}); start it first"
            )));
        }
        Ok(())
    }
}

/// One exec of `argv` through `pods`, run to completion within `timeout` (past it:
/// `Transient`, naming the command). No check of the Pod's state.
pub(super) async fn bounded_exec(
    pods: &Api<Pod>,
    id: &str,
    argv: &[String],
    stdin: Option<&[u8]>,
    timeout: Duration,
) -> ProviderResult<ExecOutput> {
    match tokio::time::timeout(timeout, attach(pods, id, argv, stdin)).await {
        Ok(result) => result,
        Err(_) => Err(ProviderError::transient(format!(
            "exec of {:?} in sandbox {id} did not finish within {timeout:?}",
            argv.join(" ")
        ))),
    }
}

async fn attach(
    pods: &Api<Pod>,
    id: &str,
    argv: &[String],
    stdin: Option<&[u8]>,
) -> ProviderResult<ExecOutput> {
    let params = AttachParams::default()
        .container(CONTAINER)
        .stdin(stdin.is_some())
        .stdout(true)
        .stderr(true);
    let what = format!("exec of {:?} in sandbox {id}", argv.join(" "));
    let mut process = pods
        .exec(id, argv.to_vec(), &params)
        .await
        .map_err(|e| from_kube(e, &what))?;
    let status = process.take_status();
    let input = process.stdin();
    let feed = async move {
        if let (Some(mut writer), Some(data)) = (input, stdin) {
            writer.write_all(data).await?;
            writer.shutdown().await?;
        }
        Ok::<(), std::io::Error>(())
    };
    let (fed, stdout, stderr) =
        tokio::join!(feed, read_all(process.stdout()), read_all(process.stderr()));
    let io = |e: std::io::Error| {
        ProviderError::transient(format!("{what}: the stream broke ({e})")).with_source(e)
    };
    fed.map_err(io)?;
    let (stdout, stderr) = (stdout.map_err(io)?, stderr.map_err(io)?);
    let status = match status {
        Some(status) => status.await,
        None => None,
    };
    let exit_code = exit_code(status.as_ref())
        .map_err(|why| ProviderError::transient(format!("{what}: {why}")))?;
    Ok(ExecOutput {
        stdout,
        stderr,
        exit_code,
    })
}

async fn read_all(reader: Option<impl AsyncRead + Unpin>) -> std::io::Result<Vec<u8>> {
    let mut buffer = Vec::new();
    if let Some(mut reader) = reader {
        reader.read_to_end(&mut buffer).await?;
    }
    Ok(buffer)
}

/// The exit code the status channel reports: `Success` is 0, a `NonZeroExitCode` carries
/// its code as an `ExitCode` cause, and a program the runtime could not start is 127 (not
/// found) or 126 (not executable), as a shell would say.
pub(super) fn exit_code(status: Option<&Status>) -> Result<i64, String> {
    let Some(status) = status else {
        return Err("the connection ended without an exit status".into());
    };
    if status.status.as_deref() == Some("Success") {
        return Ok(0);
    }
    let from_cause = status
        .details
        .as_ref()
        .and_then(|d| d.causes.as_ref())
        .and_then(|causes| {
            causes
                .iter()
                .find(|c| c.reason.as_deref() == Some("ExitCode"))
        })
        .and_then(|c| c.message.as_deref())
        .and_then(|m| m.trim().parse().ok());
    if let Some(code) = from_cause {
        return Ok(code);
    }
    let message = status.message.clone().unwrap_or_default();
    let lower = message.to_ascii_lowercase();
    if lower.contains("not found") || lower.contains("no such file") {
        return Ok(127);
    }
    if lower.contains("permission denied") {
        return Ok(126);
    }
    Err(format!("the command could not run: {message}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{StatusCause, StatusDetails};

    #[test]
    fn exit_codes_come_from_the_status_channel() {
        let ok = Status {
            status: Some("Success".into()),
            ..Default::default()
        };
        assert_eq!(exit_code(Some(&ok)), Ok(0));
        let three = Status {
            status: Some("Failure".into()),
            reason: Some("NonZeroExitCode".into()),
            details: Some(StatusDetails {
                causes: Some(vec![StatusCause {
                    reason: Some("ExitCode".into()),
                    message: Some("3".into()),
                    field: None,
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(exit_code(Some(&three)), Ok(3));
        let missing = Status {
            status: Some("Failure".into()),
            message: Some("exec: \"nope\": executable file not found in $PATH".into()),
            ..Default::default()
        };
        assert_eq!(exit_code(Some(&missing)), Ok(127));
        assert!(exit_code(None).is_err());
    }
}
