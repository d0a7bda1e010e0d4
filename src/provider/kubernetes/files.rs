//! Exact file I/O and bulk tar transfer through Pod exec. The exec channels are binary, so
//! bytes go in on stdin and come back on stdout unchanged (no re-encoding). Scripts take
//! their paths as positional arguments (`sh -c SCRIPT sh PATH`), never spliced into the
//! script text, so no path can inject shell.
//!
//! Exit codes the scripts use to say what they found: 20 = absent, 21 = wrong kind (a
//! directory where a file was expected, or the reverse), 22 = a symbolic link.

use std::time::Duration;

use async_trait::async_trait;
use futures::stream::{self, BoxStream, StreamExt};

use super::KubernetesProvider;
use crate::provider::validate::sandbox_path;
use crate::provider::{
    BulkFiles, DirEntry, EntryKind, Files, ProviderError, ProviderResult, tarsafe,
};

/// Bound on one file operation.
const FILE_TIMEOUT: Duration = Duration::from_secs(120);
const ABSENT: i64 = 20;
const WRONG_KIND: i64 = 21;
const SYMLINK: i64 = 22;

const READ: &str = r#"[ -d "$1" ] && exit 21; [ -e "$1" ] || exit 20; exec cat -- "$1""#;
const WRITE: &str = r#"[ -d "$1" ] && exit 21
d=$(dirname -- "$1")
if ! mkdir -p -- "$d" 2>/dev/null; then
  while [ "$d" != / ]; do [ -e "$d" ] && [ ! -d "$d" ] && exit 21; d=$(dirname -- "$d"); done
  exit 1
fi
set -e; t="$1.sbx-write.$$"; cat > "$t"; chmod "$2" "$t"; mv -f -- "$t" "$1""#;
const LIST: &str = r#"[ -d "$1" ] || { [ -e "$1" ] && exit 21; exit 20; }; cd -- "$1" && find . -mindepth 1 -maxdepth 1 -printf '%y\0%s\0%P\0%l\0'"#;
const EXPORT: &str = r#"[ -L "$1" ] && exit 22; [ -e "$1" ] || exit 20; t=$(mktemp) || exit 1; trap 'rm -f "$t"' EXIT; tar -C "$(dirname -- "$1")" -cf "$t" -- "$(basename -- "$1")" && cat "$t""#;
const IMPORT: &str = r#"set -e; mkdir -p -- "$1"; tar -C "$1" -xf - --no-same-owner"#;
const DELETE: &str = r#"rm -rf -- "$1""#;

impl KubernetesProvider {
    /// Runs one of this module's scripts with `args`; returns its stdout on exit 0 and maps
    /// the agreed exit codes.
    async fn script(
        &self,
        id: &str,
        script: &str,
        args: &[&str],
        stdin: Option<&[u8]>,
    ) -> ProviderResult<Vec<u8>> {
        let mut argv = vec!["sh".to_string(), "-c".into(), script.into(), "sh".into()];
        argv.extend(args.iter().map(|a| a.to_string()));
        let out = self.exec_raw(id, &argv, stdin, FILE_TIMEOUT).await?;
        let path = args.first().copied().unwrap_or("");
        match out.exit_code {
            0 => Ok(out.stdout),
            ABSENT => Err(ProviderError::not_found(format!(
                "{path} does not exist in sandbox {id}"
            ))),
            WRONG_KIND => Err(ProviderError::invalid(format!(
                "{path} in sandbox {id} is not what the call expects (a directory where a file \
                 was expected, or the reverse)"
            ))),
            SYMLINK => Err(ProviderError::invalid(format!(
                "{path} in sandbox {id} is a symbolic link; name what it points to"
            ))),
            code => Err(ProviderError::transient(format!(
                "file operation on {path} in sandbox {id} failed with exit code {code}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ))),
        }
    }
}

fn refuse_root(id: &str, what: &str, path: &str) -> ProviderResult<()> {
    if path == "/" {
        return Err(ProviderError::invalid(format!(
            "refusing to {what} \"/\" in sandbox {id}; name a path below it"
        )));
    }
    Ok(())
}

/// `find -printf '%y\0%s\0%P\0%l\0'` output as entries.
fn entries(raw: &[u8]) -> Vec<DirEntry> {
    let fields: Vec<String> = raw
        .split(|b| *b == 0)
        .map(|f| String::from_utf8_lossy(f).into_owned())
        .collect();
    fields
        .chunks(4)
        .filter(|c| c.len() == 4 && !c[2].is_empty())
        .map(|c| {
            let kind = match c[0].as_str() {
                "f" => EntryKind::File,
                "d" => EntryKind::Directory,
                "l" => EntryKind::Symlink,
                _ => EntryKind::Other,
            };
            DirEntry {
                name: c[2].clone(),
                kind,
                size: (kind == EntryKind::File)
                    .then(|| c[1].parse().ok())
                    .flatten(),
                symlink_target: (kind == EntryKind::Symlink).then(|| c[3].clone()),
            }
        })
        .collect()
}

#[async_trait]
impl Files for KubernetesProvider {
    /// `cat` of the file. Absent = `NotFound` (rule 2).
    async fn read_file(&self, id: &str, path: &str) -> ProviderResult<Vec<u8>> {
        let path = sandbox_path("path to read", path)?;
        self.script(id, READ, &[&path], None).await
    }

    /// The bytes go in on stdin, into a temporary file that replaces the target (never
    /// appends); parents are created; setuid/setgid/sticky are masked off.
    async fn write_file(&self, id: &str, path: &str, data: &[u8], mode: u32) -> ProviderResult<()> {
        let path = sandbox_path("path to write", path)?;
        refuse_root(id, "write", &path)?;
        let mode = format!("{:o}", mode & 0o777);
        self.script(id, WRITE, &[&path, &mode], Some(data))
            .await
            .map(|_| ())
    }

    /// One level, NUL-separated. Absent = `NotFound`.
    async fn list_dir(&self, id: &str, path: &str) -> ProviderResult<Vec<DirEntry>> {
        let path = sandbox_path("directory to list", path)?;
        let raw = self.script(id, LIST, &[&path], None).await?;
        Ok(entries(&raw))
    }

    /// `rm -rf`; absent = success. `/` is refused.
    async fn delete_path(&self, id: &str, path: &str) -> ProviderResult<()> {
        let path = sandbox_path("path to delete", path)?;
        refuse_root(id, "delete", &path)?;
        self.script(id, DELETE, &[&path], None).await.map(|_| ())
    }
}

#[async_trait]
impl BulkFiles for KubernetesProvider {
    /// `tar` of the path rooted at its last segment, written to a temporary file in the
    /// sandbox first (so a failing `tar` is an error, not a short archive). Absent =
    /// `NotFound`; a symbolic link = `Invalid`; `/` = `Invalid`.
    async fn export(
        &self,
        id: &str,
        path: &str,
    ) -> ProviderResult<BoxStream<'static, ProviderResult<bytes::Bytes>>> {
        let path = sandbox_path("path to export", path)?;
        refuse_root(id, "export", &path)?;
        let archive = self.script(id, EXPORT, &[&path], None).await?;
        Ok(stream::once(async move { Ok(bytes::Bytes::from(archive)) }).boxed())
    }

    /// The archive is re-written by the one sanitiser (`provider::tarsafe`) first —
    /// traversal, absolute names and writes through its own symlinks refused, devices
    /// dropped, setuid/setgid/sticky cleared, ownership reset — then extracted at `path`
    /// from stdin.
    async fn import(&self, id: &str, path: &str, archive: Vec<u8>) -> ProviderResult<()> {
        let path = sandbox_path("path to import into", path)?;
        let sanitised = tokio::task::spawn_blocking(move || tarsafe::sanitise(&archive, ""))
            .await
            .map_err(|e| ProviderError::transient(format!("sanitising the archive failed: {e}")))?
            .map_err(|e| {
                ProviderError::invalid(format!(
                    "refusing to import into {path} in sandbox {id}: {e}"
                ))
            })?;
        self.script(id, IMPORT, &[&path], Some(&sanitised.archive))
            .await
            .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listing_output_becomes_entries() {
        let raw = b"f\x003\x00a.txt\x00\x00d\x004096\x00dir\x00\x00l\x004\x00ln\x00a.txt\x00";
        let e = entries(raw);
        assert_eq!(e.len(), 3);
        assert_eq!((e[0].kind, e[0].size), (EntryKind::File, Some(3)));
        assert_eq!((e[1].kind, e[1].size), (EntryKind::Directory, None));
        assert_eq!(e[2].symlink_target.as_deref(), Some("a.txt"));
    }
}
