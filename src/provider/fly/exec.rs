//! Exec, exact file I/O and bulk tar transfer, all through `POST .../exec`.
//!
//! The exec API carries `stdin`, `stdout` and `stderr` as JSON strings, so bytes that are not
//! UTF-8 would not survive. Plain `exec` returns what the API gives (text); every capability
//! that moves bytes (`Files`, `BulkFiles`) goes through the shell file protocol every
//! exec-based provider shares ([`shellfs`](crate::provider::shellfs)) over its base64
//! transport, so all 256 byte values cross unchanged.
//!
//! `ExecRequest.cwd` and `env` have no field in the API: the argv is wrapped
//! ([`shellfs::wrap`](crate::provider::shellfs::wrap)) to apply them.

use std::time::Duration;

use async_trait::async_trait;
use futures::stream::BoxStream;

use super::FlyProvider;
use crate::provider::shellfs::{self, Shell, Transport, wrap};
use crate::provider::{
    ArchiveStream, BulkFiles, DirEntry, ErrorKind, ExecOutput, ExecRequest, Files, ProviderError,
    ProviderResult,
};

impl FlyProvider {
    /// Runs `request` through the exec API (see the module docs for cwd/env).
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
        let argv = wrap(request);
        self.exec_text(id, &argv, None, request.timeout).await
    }

    /// One exec; a 408 is `Transient` naming the timeout, a machine that is not running is
    /// `Conflict`.
    async fn exec_text(
        &self,
        id: &str,
        argv: &[String],
        stdin: Option<&str>,
        timeout: Duration,
    ) -> ProviderResult<ExecOutput> {
        let reply = self
            .exec_call(id, argv, stdin, timeout)
            .await
            .map_err(|e| match e.kind() {
                ErrorKind::Conflict => ProviderError::conflict(format!(
                    "exec in sandbox {id}: it is not running; start it ({})",
                    e.message()
                )),
                ErrorKind::NotFound => ProviderError::not_found(format!(
                    "sandbox {id} does not exist ({})",
                    e.message()
                )),
                _ => e.context(format!("exec of {argv:?} in sandbox {id}")),
            })?;
        Ok(ExecOutput {
            stdout: reply.stdout.into_bytes(),
            stderr: reply.stderr.into_bytes(),
            exit_code: reply.exit_code,
        })
    }
}

#[async_trait]
impl Shell for FlyProvider {
    fn transport(&self) -> Transport {
        Transport::Base64
    }

    /// Stdin is the base64 text `shellfs` sends (ASCII, so the conversion is lossless).
    async fn shell_exec(
        &self,
        id: &str,
        argv: Vec<String>,
        stdin: Option<&[u8]>,
        timeout: Duration,
    ) -> ProviderResult<ExecOutput> {
        let stdin = stdin.map(String::from_utf8_lossy);
        self.exec_text(id, &argv, stdin.as_deref(), timeout).await
    }
}

#[async_trait]
impl Files for FlyProvider {
    async fn read_file(&self, id: &str, path: &str) -> ProviderResult<Vec<u8>> {
        shellfs::read_file(self, id, path).await
    }

    async fn write_file(&self, id: &str, path: &str, data: &[u8], mode: u32) -> ProviderResult<()> {
        shellfs::write_file(self, id, path, data, mode).await
    }

    async fn list_dir(&self, id: &str, path: &str) -> ProviderResult<Vec<DirEntry>> {
        shellfs::list_dir(self, id, path).await
    }

    async fn delete_path(&self, id: &str, path: &str) -> ProviderResult<()> {
        shellfs::delete_path(self, id, path).await
    }
}

#[async_trait]
impl BulkFiles for FlyProvider {
    async fn export(
        &self,
        id: &str,
        path: &str,
    ) -> ProviderResult<BoxStream<'static, ProviderResult<bytes::Bytes>>> {
        shellfs::export(self, id, path).await
    }

    async fn import(&self, id: &str, path: &str, archive: ArchiveStream) -> ProviderResult<()> {
        shellfs::import(self, id, path, archive).await
    }
}
