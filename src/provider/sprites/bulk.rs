//! Bulk files: POSIX tar through the exec WebSocket (the filesystem endpoints move one file at
//! a time). Stdout and stdin are binary frames, so the archive crosses unchanged with no
//! re-encoding; its completeness is known from `tar`'s exit code, which arrives in its own
//! frame after the output (a socket closed before it is `Transient`, never a short archive).
//!
//! Scripts take the path as a positional argument (`sh -c SCRIPT sh PATH`), never spliced into
//! the script text, so no path can inject shell. Exit codes they use to say what they found:
//! 20 = absent, 22 = a symbolic link.

use std::time::Duration;

use async_trait::async_trait;
use futures::stream::{self, BoxStream, StreamExt};

use super::{SpritesProvider, exec};
use crate::provider::{
    BulkFiles, ExecOutput, ExecRequest, ProviderError, ProviderResult, tarsafe, validate,
};

/// Bound on one archive transfer.
const TRANSFER_TIMEOUT: Duration = Duration::from_secs(300);
const ABSENT: i64 = 20;
const SYMLINK: i64 = 22;

/// `tar` of `$1` rooted at its last segment, to stdout.
const EXPORT: &str = r#"[ -L "$1" ] && exit 22; [ -e "$1" ] || exit 20; exec tar -C "$(dirname -- "$1")" -cf - -- "$(basename -- "$1")""#;
/// The archive on stdin extracted at `$1` (created when missing), ownership not restored.
const IMPORT: &str = r#"mkdir -p -- "$1" && exec tar -C "$1" -xf - --no-same-owner"#;

impl SpritesProvider {
    /// Runs `script` with `path` as `$1` and `stdin`, mapping the scripts' exit codes.
    async fn tar_script(
        &self,
        id: &str,
        script: &str,
        path: &str,
        stdin: Option<&[u8]>,
    ) -> ProviderResult<ExecOutput> {
        let request = ExecRequest {
            argv: ["sh", "-c", script, "sh", path]
                .iter()
                .map(|s| s.to_string())
                .collect(),
            cwd: None,
            env: Default::default(),
            timeout: TRANSFER_TIMEOUT,
        };
        let out = exec::run(&self.client, id, &request, stdin).await?;
        match out.exit_code {
            0 => Ok(out),
            ABSENT => Err(ProviderError::not_found(format!(
                "{path} does not exist in sandbox {id}"
            ))),
            SYMLINK => Err(ProviderError::invalid(format!(
                "{path} in sandbox {id} is a symbolic link; name what it points to"
            ))),
            code => Err(ProviderError::transient(format!(
                "tar on {path} in sandbox {id} failed with exit code {code}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ))),
        }
    }
}

#[async_trait]
impl BulkFiles for SpritesProvider {
    /// `tar -cf -` of the path rooted at its last segment. Absent = `NotFound`; a symbolic
    /// link = `Invalid`; `/` = `Invalid`.
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
        let out = self.tar_script(id, EXPORT, &path, None).await?;
        let archive = bytes::Bytes::from(out.stdout);
        Ok(stream::once(async move { Ok(archive) }).boxed())
    }

    /// The archive is re-written by the one sanitiser (`provider::tarsafe`) first — traversal,
    /// absolute names and writes through its own symlinks refused, devices dropped,
    /// setuid/setgid/sticky cleared, ownership reset — then streamed to `tar -xf -` on stdin.
    async fn import(&self, id: &str, path: &str, archive: Vec<u8>) -> ProviderResult<()> {
        let path = validate::sandbox_path("import path", path)?;
        let sanitised = tokio::task::spawn_blocking(move || tarsafe::sanitise(&archive, ""))
            .await
            .map_err(|e| ProviderError::transient(format!("sanitising the archive failed: {e}")))?
            .map_err(|e| {
                ProviderError::invalid(format!(
                    "refusing to import into {path} in sandbox {id}: {e}"
                ))
            })?;
        self.tar_script(id, IMPORT, &path, Some(&sanitised.archive))
            .await
            .map(|_| ())
    }
}
