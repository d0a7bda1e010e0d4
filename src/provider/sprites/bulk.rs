//! Bulk files: POSIX tar through the exec WebSocket (the filesystem endpoints move one file at
//! a time), by the shell file protocol every exec-based provider shares
//! ([`shellfs`](crate::provider::shellfs)). Stdout and stdin are binary frames, so the archive
//! crosses unchanged with no re-encoding; its completeness is known from `tar`'s exit code,
//! which arrives in its own frame after the output (a socket closed before it is `Transient`,
//! never a short archive).

use std::time::Duration;

use async_trait::async_trait;
use futures::stream::BoxStream;

use super::{SpritesProvider, exec};
use crate::provider::shellfs::{self, Shell, Transport};
use crate::provider::{ArchiveStream, BulkFiles, ExecOutput, ExecRequest, ProviderResult};

#[async_trait]
impl Shell for SpritesProvider {
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
        let request = ExecRequest {
            argv,
            cwd: None,
            env: Default::default(),
            timeout,
        };
        exec::run(&self.client, id, &request, stdin).await
    }
}

#[async_trait]
impl BulkFiles for SpritesProvider {
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
