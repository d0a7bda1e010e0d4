//! Files on E2B, through envd: exact bytes over its HTTP `/files` endpoints, directories
//! through its `filesystem.Filesystem` service, and tar trees through `tar` run by its
//! process service.
//!
//! `/files` moves bytes unchanged and answers 404 for an absent file, so a read is never
//! empty bytes standing in for a missing file (rule 2). envd has no mode on upload (a new
//! file gets 0644, a replaced one keeps its mode), so `write_file` sets the requested mode
//! with `chmod` afterwards, masked to the permission bits: setuid/setgid are never written.

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use serde_json::{Value, json};

use super::E2bProvider;
use super::envd::{self, Event};
use super::process;
use crate::provider::shellfs;
use crate::provider::validate;
use crate::provider::{
    ArchiveStream, BulkFiles, DirEntry, EntryKind, ErrorKind, ExecRequest, Files, ProviderError,
    ProviderResult,
};

/// Bound on the helper commands this module runs (`chmod`, `tar -x`).
const HELPER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

/// envd's `EntryInfo` as a directory entry.
fn dir_entry(entry: &Value) -> Option<DirEntry> {
    let name = entry.get("name")?.as_str()?.to_string();
    let kind = match entry.get("type").and_then(Value::as_str) {
        Some("FILE_TYPE_FILE") => EntryKind::File,
        Some("FILE_TYPE_DIRECTORY") => EntryKind::Directory,
        Some("FILE_TYPE_SYMLINK") => EntryKind::Symlink,
        _ => EntryKind::Other,
    };
    // proto3 JSON writes int64 as a string; accept a number too.
    let size = entry.get("size").and_then(|s| {
        s.as_u64()
            .or_else(|| s.as_str().and_then(|s| s.parse().ok()))
    });
    Some(DirEntry {
        name,
        kind,
        size: (kind == EntryKind::File).then(|| size.unwrap_or(0)),
        symlink_target: entry
            .get("symlinkTarget")
            .and_then(Value::as_str)
            .map(str::to_string),
    })
}

impl E2bProvider {
    async fn filesystem(
        &self,
        id: &str,
        method: &str,
        path: &str,
        context: &str,
    ) -> ProviderResult<Value> {
        let body = json!({ "path": path, "depth": 1 });
        let method = format!("filesystem.Filesystem/{method}");
        self.inner
            .envd_call(id, |access| {
                let (method, body) = (&method, &body);
                async move {
                    self.inner
                        .envd
                        .unary(id, &access, method, body, context)
                        .await
                }
            })
            .await
    }

    /// Runs a helper command and fails unless it exits 0.
    async fn helper(&self, id: &str, argv: Vec<String>, what: &str) -> ProviderResult<()> {
        let request = ExecRequest {
            argv,
            cwd: None,
            env: Default::default(),
            timeout: HELPER_TIMEOUT,
        };
        let out = self.inner.exec_request(id, &request).await?;
        if out.exit_code == 0 {
            return Ok(());
        }
        Err(ProviderError::invalid(format!(
            "{what} in E2B sandbox {id} failed (exit {}): {}",
            out.exit_code,
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }

    /// The nearest existing ancestor of `path` when it is not a directory; `None` when it is
    /// one, or when that could not be found out.
    async fn non_directory_ancestor(&self, id: &str, path: &str) -> Option<String> {
        let script = "p=$(dirname -- \"$1\"); \
                      while [ \"$p\" != / ] && [ ! -e \"$p\" ]; do p=$(dirname -- \"$p\"); done; \
                      [ -d \"$p\" ] || printf %s \"$p\"";
        let request = ExecRequest {
            argv: vec![
                "sh".into(),
                "-c".into(),
                script.into(),
                "sh".into(),
                path.into(),
            ],
            cwd: None,
            env: Default::default(),
            timeout: std::time::Duration::from_secs(20),
        };
        let out = self.inner.exec_request(id, &request).await.ok()?;
        let blocker = String::from_utf8_lossy(&out.stdout).into_owned();
        (out.exit_code == 0 && !blocker.is_empty()).then_some(blocker)
    }

    async fn upload(&self, id: &str, path: &str, data: &[u8]) -> ProviderResult<()> {
        self.inner
            .envd_call(id, |access| async move {
                self.inner
                    .envd
                    .write_file(id, &access, path, data.to_vec())
                    .await
            })
            .await
    }
}

#[async_trait]
impl Files for E2bProvider {
    async fn read_file(&self, id: &str, path: &str) -> ProviderResult<Vec<u8>> {
        let path = validate::sandbox_path("file path", path)?;
        self.inner
            .envd_call(id, |access| {
                let path = &path;
                async move { self.inner.envd.read_file(id, &access, path).await }
            })
            .await
    }

    async fn write_file(&self, id: &str, path: &str, data: &[u8], mode: u32) -> ProviderResult<()> {
        let path = validate::sandbox_path("file path", path)?;
        if path == "/" {
            return Err(ProviderError::invalid(
                "file path \"/\" is a directory; name a file",
            ));
        }
        match self.upload(id, &path, data).await {
            Ok(()) => {}
            // envd answers 500 when it cannot create the parents: say why, when it is a file
            // standing where a directory must be (bad input, not something to retry).
            Err(e) if e.is(ErrorKind::Transient) => {
                return Err(match self.non_directory_ancestor(id, &path).await {
                    Some(blocker) => ProviderError::invalid(format!(
                        "cannot write {path} in E2B sandbox {id}: {blocker} is not a directory"
                    )),
                    None => e,
                });
            }
            Err(e) => return Err(e),
        }
        let mode = format!("{:o}", mode & 0o777);
        self.helper(
            id,
            vec!["chmod".into(), mode, "--".into(), path.clone()],
            &format!("chmod {path}"),
        )
        .await
    }

    async fn list_dir(&self, id: &str, path: &str) -> ProviderResult<Vec<DirEntry>> {
        let path = validate::sandbox_path("directory path", path)?;
        let context = format!("listing {path} in E2B sandbox {id}");
        let answer = self.filesystem(id, "ListDir", &path, &context).await?;
        let entries = answer
            .get("entries")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let mut listed: Vec<DirEntry> = entries.iter().filter_map(dir_entry).collect();
        if listed.len() != entries.len() {
            return Err(ProviderError::transient(format!(
                "{context}: envd returned entries without a name; not trusting a partial listing"
            )));
        }
        listed.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(listed)
    }

    async fn delete_path(&self, id: &str, path: &str) -> ProviderResult<()> {
        let path = validate::sandbox_path("path", path)?;
        if path == "/" {
            return Err(ProviderError::invalid(
                "refusing to delete \"/\" of a sandbox",
            ));
        }
        let context = format!("deleting {path} in E2B sandbox {id}");
        match self.filesystem(id, "Remove", &path, &context).await {
            Ok(_) => Ok(()),
            Err(e) if e.is(ErrorKind::NotFound) => {
                // Absent is success — but only if the sandbox itself is still there.
                self.inner.access(id).await.map(drop)
            }
            Err(e) => Err(e),
        }
    }
}

#[async_trait]
impl BulkFiles for E2bProvider {
    /// `tar -C <parent> -cf - <name>` through envd's process service, streamed. `/` →
    /// `Invalid`; absent → `NotFound` before any byte; a symlink → `Invalid`.
    async fn export(
        &self,
        id: &str,
        path: &str,
    ) -> ProviderResult<BoxStream<'static, ProviderResult<Bytes>>> {
        let path = validate::sandbox_path("export path", path)?;
        if path == "/" {
            return Err(ProviderError::invalid(format!(
                "refusing to export \"/\" of E2B sandbox {id}: archives are rooted at the path's \
                 last segment, so name a directory below \"/\""
            )));
        }
        let context = format!("exporting {path} from E2B sandbox {id}");
        let stat = self.filesystem(id, "Stat", &path, &context).await?;
        if stat["entry"]["type"] == "FILE_TYPE_SYMLINK" {
            return Err(ProviderError::invalid(format!(
                "{path} in E2B sandbox {id} is a symbolic link; export what it points to instead"
            )));
        }
        let (parent, name) = validate::split_parent(&path);
        let process = json!({ "cmd": "tar", "args": ["-C", parent, "-cf", "-", "--", name] });
        let start = process::start_request(process, false, None);
        let timeout = Some(HELPER_TIMEOUT);
        let events = self
            .inner
            .envd_call(id, |access| {
                let (start, context) = (&start, context.clone());
                async move {
                    self.inner
                        .envd
                        .start(id, &access, start, timeout, context)
                        .await
                }
            })
            .await?;
        Ok(tar_stream(events, context))
    }

    /// Sanitises the archive (see `tarsafe`), uploads it to a temporary file, extracts it at
    /// `path` (created if missing) without restoring ownership, and removes the file.
    async fn import(&self, id: &str, path: &str, archive: ArchiveStream) -> ProviderResult<()> {
        let path = validate::sandbox_path("import path", path)?;
        let sanitised = shellfs::sanitise(archive, String::new(), id, &path).await?;
        let staged = format!(
            "/tmp/.sandbox-operator-import-{:016x}.tar",
            fastrand::u64(..)
        );
        self.upload(id, &staged, &sanitised.to_vec()).await?;
        let script = "mkdir -p -- \"$1\" && tar -xf \"$2\" -C \"$1\" --no-same-owner; \
                      rc=$?; rm -f -- \"$2\"; exit $rc";
        self.helper(
            id,
            vec![
                "sh".into(),
                "-c".into(),
                script.into(),
                "sh".into(),
                path.clone(),
                staged,
            ],
            &format!("extracting an archive into {path}"),
        )
        .await
    }
}

/// The archive bytes of a `tar` process: stdout, with a failure exit turned into a final
/// error naming what `tar` printed.
fn tar_stream(
    events: BoxStream<'static, Result<Event, envd::EnvdError>>,
    context: String,
) -> BoxStream<'static, ProviderResult<Bytes>> {
    let mut stderr = Vec::new();
    events
        .filter_map(move |event| {
            let item = match event {
                Ok(Event::Stdout(bytes)) => Some(Ok(Bytes::from(bytes))),
                Ok(Event::Stderr(bytes)) => {
                    stderr.extend_from_slice(&bytes);
                    None
                }
                Ok(Event::Start(_) | Event::Pty(_) | Event::End(0)) => None,
                Ok(Event::End(code)) => Some(Err(ProviderError::transient(format!(
                    "{context}: tar exited {code}: {}",
                    String::from_utf8_lossy(&stderr).trim()
                )))),
                Err(e) => Some(Err(envd::call_error(e))),
            };
            futures::future::ready(item)
        })
        .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_normalised_or_refused() {
        assert_eq!(validate::sandbox_path("p", "/a//b/").unwrap(), "/a/b");
        assert_eq!(validate::sandbox_path("p", "/").unwrap(), "/");
        for bad in ["a/b", "/a/../b", "/a/./b", "/a\0b"] {
            assert!(validate::sandbox_path("p", bad).is_err(), "{bad:?}");
        }
        assert_eq!(validate::split_parent("/a/b"), ("/a", "b"));
        assert_eq!(validate::split_parent("/a"), ("/", "a"));
    }

    #[test]
    fn entries_map_with_sizes_for_files_only() {
        let file = json!({"name": "a", "type": "FILE_TYPE_FILE", "size": "12"});
        let dir = json!({"name": "d", "type": "FILE_TYPE_DIRECTORY", "size": 4096});
        let link = json!({"name": "l", "type": "FILE_TYPE_SYMLINK", "symlinkTarget": "/etc"});
        assert_eq!(dir_entry(&file).unwrap().size, Some(12));
        assert_eq!(dir_entry(&dir).unwrap().size, None);
        assert_eq!(dir_entry(&dir).unwrap().kind, EntryKind::Directory);
        let link = dir_entry(&link).unwrap();
        assert_eq!(
            (link.kind, link.symlink_target.as_deref()),
            (EntryKind::Symlink, Some("/etc"))
        );
        assert!(dir_entry(&json!({"type": "FILE_TYPE_FILE"})).is_none());
    }
}
