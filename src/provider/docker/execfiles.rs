//! File I/O through `exec`, for sandboxes under gVisor (see `runtime`).
//!
//! gVisor's kernel keeps its own view of the container's files: an archive `PUT` into a
//! running runsc container is not seen inside (worse, the directory it touched stops
//! working there), and an archive `GET` can miss what the workload wrote. So under gVisor
//! every file operation runs inside the sandbox, through its own kernel: `cat` out, `cat` in
//! (from the exec's stdin), `find` to list, `tar` for trees. The sandbox must be running
//! (`Conflict` otherwise, like exec), and the image needs a POSIX shell, `cat`, `mkdir`,
//! `mv`, `chmod`, GNU `find` and `tar` — every Debian-based image has them.
//!
//! The same rules as the archive path hold: absent is `NotFound`, a directory where a file
//! is expected is `Invalid`, a write replaces the whole file atomically (written beside it,
//! then renamed), modes are masked to `0o777`, imports are sanitised before any byte
//! reaches the sandbox.

use std::time::Duration;

use futures::stream::{self, BoxStream, StreamExt};

use super::DockerProvider;
use crate::provider::{DirEntry, ExecOutput, ExecRequest, ProviderError, ProviderResult, tarsafe};

/// Bound of one file operation.
const FILE_EXEC_TIMEOUT: Duration = Duration::from_secs(120);

/// Exit codes the scripts below use for what is not a plain failure.
const ABSENT: i64 = 20;
const IS_DIR: i64 = 21;
const NOT_REGULAR: i64 = 22;
const NOT_DIR: i64 = 23;
const IS_SYMLINK: i64 = 24;
const UNDER_A_FILE: i64 = 25;

const READ: &str =
    r#"[ -e "$1" ] || exit 20; [ -d "$1" ] && exit 21; [ -f "$1" ] || exit 22; exec cat -- "$1""#;
const WRITE: &str = r#"[ -d "$1" ] && exit 21; d=$(dirname -- "$1"); p=$d;
while [ "$p" != / ]; do [ -e "$p" ] && [ ! -d "$p" ] && exit 25; p=$(dirname -- "$p"); done;
mkdir -p -- "$d" || exit 1;
t="$d/.sbx-write.$$"; cat > "$t" && chmod "$2" "$t" && mv -f -- "$t" "$1" || { rm -f -- "$t"; exit 1; }"#;
const IS_DIRECTORY: &str = r#"[ -e "$1" ] || exit 20; [ -d "$1" ] || exit 23"#;
const EXPORT: &str = r#"[ -L "$1" ] && { readlink -- "$1"; exit 24; }; [ -e "$1" ] || exit 20;
cd -- "$(dirname -- "$1")" && exec tar -cf - -- "$(basename -- "$1")""#;
const IMPORT: &str = r#"mkdir -p -- "$1" && exec tar -x --no-same-owner -C "$1" -f -"#;

impl DockerProvider {
    /// Runs one of the scripts above with `args` (as `$1`, `$2`) and optional stdin.
    async fn file_exec(
        &self,
        id: &str,
        script: &str,
        args: &[&str],
        stdin: Option<&[u8]>,
    ) -> ProviderResult<ExecOutput> {
        let mut argv = vec!["sh".to_string(), "-c".into(), script.into(), "sh".into()];
        argv.extend(args.iter().map(|a| a.to_string()));
        let request = ExecRequest {
            argv,
            cwd: None,
            env: Default::default(),
            timeout: FILE_EXEC_TIMEOUT,
        };
        self.run_exec_with_stdin(id, &request, stdin).await
    }

    /// `read_file` under gVisor.
    pub(crate) async fn exec_read_file(&self, id: &str, path: &str) -> ProviderResult<Vec<u8>> {
        let out = self.file_exec(id, READ, &[path], None).await?;
        match out.exit_code {
            0 => Ok(out.stdout),
            ABSENT => Err(ProviderError::not_found(format!(
                "file {path} does not exist in sandbox {id}"
            ))),
            IS_DIR => Err(ProviderError::invalid(format!(
                "{path} in sandbox {id} is a directory, not a file; list it instead"
            ))),
            NOT_REGULAR => Err(ProviderError::invalid(format!(
                "{path} in sandbox {id} is not a regular file (device, fifo or socket)"
            ))),
            _ => Err(failed(id, "reading", path, &out)),
        }
    }

    /// `write_file` under gVisor.
    pub(crate) async fn exec_write_file(
        &self,
        id: &str,
        path: &str,
        data: &[u8],
        mode: u32,
    ) -> ProviderResult<()> {
        let mode = format!("{:o}", mode & 0o777);
        let out = self
            .file_exec(id, WRITE, &[path, &mode], Some(data))
            .await?;
        match out.exit_code {
            0 => Ok(()),
            IS_DIR => Err(ProviderError::invalid(format!(
                "{path} in sandbox {id} is a directory; a file cannot replace it"
            ))),
            UNDER_A_FILE => Err(ProviderError::invalid(format!(
                "a parent of {path} in sandbox {id} is a file, not a directory; write elsewhere \
                 or delete that file first"
            ))),
            _ => Err(failed(id, "writing", path, &out)),
        }
    }

    /// `list_dir` under gVisor.
    pub(crate) async fn exec_list_dir(
        &self,
        id: &str,
        path: &str,
    ) -> ProviderResult<Vec<DirEntry>> {
        let out = self.file_exec(id, IS_DIRECTORY, &[path], None).await?;
        match out.exit_code {
            0 => {}
            ABSENT => {
                return Err(ProviderError::not_found(format!(
                    "directory {path} does not exist in sandbox {id}"
                )));
            }
            NOT_DIR => {
                return Err(ProviderError::invalid(format!(
                    "{path} in sandbox {id} is not a directory; read it as a file instead"
                )));
            }
            _ => return Err(failed(id, "listing", path, &out)),
        }
        let mut entries = self.list_dir_exec(id, path).await?.ok_or_else(|| {
            ProviderError::unsupported(format!(
                "listing {path} in sandbox {id} needs GNU find in the image under gVisor (the \
                 archive API cannot see the sandbox's files there)"
            ))
        })?;
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(entries)
    }

    /// `export` under gVisor: the tar `tar` writes, as one chunk (bounded by the exec output
    /// ceiling).
    pub(crate) async fn exec_export(
        &self,
        id: &str,
        path: &str,
    ) -> ProviderResult<BoxStream<'static, ProviderResult<bytes::Bytes>>> {
        let out = self.file_exec(id, EXPORT, &[path], None).await?;
        match out.exit_code {
            0 => Ok(stream::once(async move { Ok(bytes::Bytes::from(out.stdout)) }).boxed()),
            ABSENT => Err(ProviderError::not_found(format!(
                "{path} does not exist in sandbox {id}"
            ))),
            IS_SYMLINK => Err(ProviderError::invalid(format!(
                "{path} in sandbox {id} is a symbolic link to {}; export that path instead",
                String::from_utf8_lossy(&out.stdout).trim()
            ))),
            _ => Err(failed(id, "exporting", path, &out)),
        }
    }

    /// `import` under gVisor: sanitised exactly as on the archive path, then unpacked by
    /// `tar` inside the sandbox.
    pub(crate) async fn exec_import(
        &self,
        id: &str,
        path: &str,
        archive: Vec<u8>,
    ) -> ProviderResult<()> {
        let sanitised = tokio::task::spawn_blocking(move || tarsafe::sanitise(&archive, ""))
            .await
            .map_err(|e| ProviderError::transient(format!("sanitising the archive failed: {e}")))?
            .map_err(|e| {
                ProviderError::invalid(format!(
                    "refusing to import into {path} in sandbox {id}: {e}"
                ))
            })?;
        let out = self
            .file_exec(id, IMPORT, &[path], Some(&sanitised.archive))
            .await?;
        match out.exit_code {
            0 => Ok(()),
            _ => Err(failed(id, "importing into", path, &out)),
        }
    }
}

/// A script that failed for a reason of its own (a full disk, a read-only path).
fn failed(id: &str, what: &str, path: &str, out: &ExecOutput) -> ProviderError {
    ProviderError::transient(format!(
        "{what} {path} in sandbox {id} failed (exit {}): {}",
        out.exit_code,
        String::from_utf8_lossy(&out.stderr).trim()
    ))
}
