//! Bulk tar transfer of directory trees through Docker's archive API.
//!
//! `export` is the engine's own `GET /containers/{id}/archive`, streamed: its shape is already
//! the contract's — rooted at the LAST segment of the path (`/workspace/app` → `app/…`).
//!
//! `import` never hands the caller's archive to the engine as it is. The archive is tenant
//! data, so it is re-written by [`tarsafe::sanitise`](crate::provider::tarsafe::sanitise)
//! first: traversal and absolute names refused, writes through an archive's own symlinks
//! refused, devices dropped, setuid/setgid/sticky cleared, ownership reset to root, PAX
//! records (xattrs, file capabilities) not carried. Docker then extracts inside the
//! container's root. That is the boundary for `import` (and for the template capture's copies
//! of mounted paths, which go through the same sanitiser); restoring a template from a shared
//! store is a separate, stronger boundary (capture paths only, asserted after extraction).

use bollard::query_parameters::DownloadFromContainerOptionsBuilder;
use futures::StreamExt;
use futures::stream::BoxStream;

use super::DockerProvider;
use super::files::is_symlink;
use super::map_err;
use crate::provider::shellfs;
use crate::provider::validate;
use crate::provider::{ArchiveStream, BulkFiles, ProviderError, ProviderResult};

#[async_trait::async_trait]
impl BulkFiles for DockerProvider {
    /// Streams `path` as a tar rooted at its last segment. `/` → `Invalid` (name a directory);
    /// absent → `NotFound` before any byte is sent; a symlink → `Invalid` naming its target
    /// (exporting it would root the archive at the link, not at what it points to).
    async fn export(
        &self,
        id: &str,
        path: &str,
    ) -> ProviderResult<BoxStream<'static, ProviderResult<bytes::Bytes>>> {
        let path = validate::sandbox_path("export path", path)?;
        if path == "/" {
            return Err(ProviderError::invalid(format!(
                "refusing to export \"/\" of sandbox {id}: archives are rooted at the path's last \
                 segment, so name a directory below \"/\""
            )));
        }
        if self.is_gvisor() {
            return shellfs::export(self, id, &path).await;
        }
        // Probe first: the download stream would only report a 404 as its first item, after
        // the caller has started consuming it.
        let Some(stat) = self.stat_path(id, &path).await? else {
            return Err(ProviderError::not_found(format!(
                "{path} does not exist in sandbox {id}"
            )));
        };
        if is_symlink(&stat) {
            return Err(ProviderError::invalid(format!(
                "{path} in sandbox {id} is a symbolic link to {}; export that path instead",
                stat.link_target
            )));
        }
        let docker = self.engine().await?;
        let options = DownloadFromContainerOptionsBuilder::default()
            .path(&path)
            .build();
        let context = format!("exporting {path} from sandbox {id}");
        Ok(docker
            .download_from_container(id, Some(options))
            .map(move |chunk| chunk.map_err(|e| map_err(&context, e)))
            .boxed())
    }

    /// Extracts `archive` at `path` after sanitising it (see the module docs). Missing
    /// directories on the way to `path` are created (`0o755`, root-owned). The archive is
    /// sanitised as it arrives and handed to the engine only once its last member has been
    /// checked: a hostile or broken archive is refused whole with `Invalid`, before anything
    /// is written.
    async fn import(&self, id: &str, path: &str, archive: ArchiveStream) -> ProviderResult<()> {
        let path = validate::sandbox_path("import path", path)?;
        if self.is_gvisor() {
            return shellfs::import(self, id, &path, archive).await;
        }
        let (anchor, missing) = self.existing_anchor(id, &path, &path).await?;
        let prefix = missing.join("/");
        let sanitised = shellfs::sanitise(archive, prefix, id, &path).await?;
        let report = &sanitised.report;
        if !report.dropped.is_empty() || report.special_bits_cleared > 0 {
            tracing::info!(
                sandbox = id,
                path = %path,
                dropped = ?report.dropped,
                special_bits_cleared = report.special_bits_cleared,
                ownership_reset = report.ownership_reset,
                "import archive sanitised"
            );
        }
        self.upload_archive(id, &anchor, sanitised.pieces, &path)
            .await
    }
}
