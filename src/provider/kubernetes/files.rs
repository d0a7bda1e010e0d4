//! Exact file I/O and bulk tar transfer through Pod exec, by the shell file protocol every
//! exec-based provider shares ([`shellfs`](crate::provider::shellfs)). The exec channels are
//! binary, so bytes go in on stdin and come back on stdout unchanged (no re-encoding).

use std::time::Duration;

use async_trait::async_trait;
use futures::stream::BoxStream;

use super::KubernetesProvider;
use crate::provider::shellfs::{self, Shell, Transport};
use crate::provider::{ArchiveStream, BulkFiles, DirEntry, ExecOutput, Files, ProviderResult};

#[async_trait]
impl Shell for KubernetesProvider {
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
        self.exec_raw(id, &argv, stdin, timeout).await
    }
}

#[async_trait]
impl Files for KubernetesProvider {
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
impl BulkFiles for KubernetesProvider {
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
