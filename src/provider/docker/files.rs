//! Exact file I/O through Docker's archive API.
//!
//! Reads and writes go through `GET`/`PUT /containers/{id}/archive`, never through exec
//! stdout: the archive endpoint moves bytes unchanged, works on stopped containers too, and
//! needs nothing inside the image. The path's type is learned first with the archive `HEAD`
//! (its `X-Docker-Container-Path-Stat` header), so an absent path is `NotFound` before any
//! transfer starts and a directory is refused instead of being read as a tarball.
//!
//! Docker has no list or delete endpoint. `list_dir` runs GNU `find` in the sandbox when it is
//! running (names NUL-separated, so every name is exact) and otherwise — stopped sandbox, or an
//! image without GNU `find` — streams the directory's archive and keeps only the top-level
//! entries (correct, but it reads the whole tree). `delete_path` runs `rm -rf` and therefore
//! needs a running sandbox.

use std::io::Read;

use bollard::container::PathStatResponse;
use bollard::query_parameters::{
    ContainerArchiveInfoOptionsBuilder, DownloadFromContainerOptionsBuilder,
    UploadToContainerOptionsBuilder,
};
use bytes::Bytes;
use futures::StreamExt;
use std::time::Duration;
use tar::{Archive, EntryType, Header};

use super::{DockerProvider, is_not_found, map_err};
use crate::provider::{
    DirEntry, EntryKind, ErrorKind, ExecRequest, Files, ProviderError, ProviderResult,
};
use crate::provider::{shellfs, validate};

/// Go's `os.FileMode` bits, as the archive stat header reports them (not Unix `st_mode`).
mod go_mode {
    pub const DIR: u32 = 1 << 31;
    pub const SYMLINK: u32 = 1 << 27;
    pub const DEVICE: u32 = 1 << 26;
    pub const NAMED_PIPE: u32 = 1 << 25;
    pub const SOCKET: u32 = 1 << 24;
    pub const CHAR_DEVICE: u32 = 1 << 21;
    pub const IRREGULAR: u32 = 1 << 19;
    pub const TYPE: u32 = DIR | SYMLINK | DEVICE | NAMED_PIPE | SOCKET | CHAR_DEVICE | IRREGULAR;
}

/// Symlink hops followed when resolving a path (the engine already resolves chains; this
/// only bounds a misbehaving one).
const MAX_SYMLINK_HOPS: usize = 16;
/// Bound on the helper commands (`find`, `rm`) this module runs inside the sandbox.
const HELPER_TIMEOUT: Duration = Duration::from_secs(60);
/// Chunks buffered between the download stream and the tar parser.
const ARCHIVE_CHANNEL_DEPTH: usize = 8;

pub(crate) fn is_dir(stat: &PathStatResponse) -> bool {
    stat.file_mode & go_mode::DIR != 0
}
pub(crate) fn is_symlink(stat: &PathStatResponse) -> bool {
    stat.file_mode & go_mode::SYMLINK != 0
}
pub(crate) fn is_regular(stat: &PathStatResponse) -> bool {
    stat.file_mode & go_mode::TYPE == 0
}

/// A blocking `Read` over chunks arriving from an async download, for the tar parser.
pub(crate) struct ChannelReader {
    rx: tokio::sync::mpsc::Receiver<Bytes>,
    current: Bytes,
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            match self.rx.blocking_recv() {
                Some(chunk) => self.current = chunk,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current[..n]);
        self.current = self.current.slice(n..);
        Ok(n)
    }
}

/// A container's running state, as far as file operations care.
fn exec_unavailable(err: &ProviderError) -> bool {
    err.is(ErrorKind::Conflict)
}

impl DockerProvider {
    /// Fails with `NotFound` when the sandbox itself does not exist.
    ///
    /// The archive endpoints answer 404 both for a missing path and for a missing container;
    /// this tells the two apart (only called after such a 404, so it costs nothing normally).
    pub(crate) async fn ensure_sandbox_exists(&self, id: &str) -> ProviderResult<()> {
        let docker = self.engine().await?;
        match docker.inspect_container(id, None).await {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => Err(ProviderError::not_found(format!(
                "sandbox {id} does not exist"
            ))),
            Err(e) => Err(map_err(&format!("inspecting sandbox {id}"), e)),
        }
    }

    /// Stats `path` without following a final symlink. `Ok(None)`: the sandbox exists and
    /// the path does not.
    pub(crate) async fn stat_path(
        &self,
        id: &str,
        path: &str,
    ) -> ProviderResult<Option<PathStatResponse>> {
        let docker = self.engine().await?;
        let options = ContainerArchiveInfoOptionsBuilder::default()
            .path(path)
            .build();
        match docker.get_container_archive_info(id, Some(options)).await {
            Ok(stat) => Ok(Some(stat)),
            Err(e) if is_not_found(&e) => {
                self.ensure_sandbox_exists(id).await?;
                Ok(None)
            }
            Err(e) => Err(map_err(&format!("looking up {path} in sandbox {id}"), e)),
        }
    }

    /// Stats `path`, following symlinks; returns the resolved path with its stat. `Ok(None)`
    /// when the path (or a symlink's target) does not exist.
    pub(crate) async fn resolve_path(
        &self,
        id: &str,
        path: &str,
    ) -> ProviderResult<Option<(String, PathStatResponse)>> {
        let mut current = path.to_string();
        for _ in 0..MAX_SYMLINK_HOPS {
            let Some(stat) = self.stat_path(id, &current).await? else {
                return Ok(None);
            };
            if !is_symlink(&stat) {
                return Ok(Some((current, stat)));
            }
            // The engine reports the target resolved inside the container's root.
            if stat.link_target.is_empty() {
                return Ok(None);
            }
            current = stat.link_target.clone();
        }
        Err(ProviderError::invalid(format!(
            "{path} in sandbox {id}: more than {MAX_SYMLINK_HOPS} levels of symbolic links"
        )))
    }

    /// Downloads `path`'s archive and hands it, as a blocking reader, to `parse` on a
    /// blocking thread — memory stays bounded by the channel, not by the tree's size.
    ///
    /// A transfer error takes precedence over whatever the parser made of the truncated
    /// stream, so a 404 mid-way is still `NotFound`.
    pub(crate) async fn with_archive<T, F>(
        &self,
        id: &str,
        path: &str,
        parse: F,
    ) -> ProviderResult<T>
    where
        T: Send + 'static,
        F: FnOnce(ChannelReader) -> ProviderResult<T> + Send + 'static,
    {
        let docker = self.engine().await?;
        let options = DownloadFromContainerOptionsBuilder::default()
            .path(path)
            .build();
        let mut stream = Box::pin(docker.download_from_container(id, Some(options)));
        let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(ARCHIVE_CHANNEL_DEPTH);
        let reader = ChannelReader {
            rx,
            current: Bytes::new(),
        };
        let parser = tokio::task::spawn_blocking(move || parse(reader));
        let forward = async move {
            while let Some(chunk) = stream.next().await {
                match chunk {
                    Ok(bytes) => {
                        if tx.send(bytes).await.is_err() {
                            // The parser has what it needs and hung up.
                            return None;
                        }
                    }
                    Err(e) => return Some(e),
                }
            }
            None
        };
        let (transfer_error, parsed) = tokio::join!(forward, parser);
        if let Some(e) = transfer_error {
            if is_not_found(&e) {
                self.ensure_sandbox_exists(id).await?;
                return Err(ProviderError::not_found(format!(
                    "{path} does not exist in sandbox {id}"
                )));
            }
            return Err(map_err(&format!("downloading {path} from sandbox {id}"), e));
        }
        parsed.map_err(|e| {
            ProviderError::transient(format!(
                "reading the archive of {path} from sandbox {id}: {e}"
            ))
        })?
    }

    /// Finds the deepest existing directory at or above `dir` (following symlinks) and the
    /// directory names missing below it, outermost first.
    ///
    /// Uploads go to that anchor with the missing directories inside the archive: uploading
    /// at "/" instead would be refused on a read-only root filesystem even when the target
    /// is on a writable volume. `target` names the operation's path for messages.
    pub(crate) async fn existing_anchor(
        &self,
        id: &str,
        dir: &str,
        target: &str,
    ) -> ProviderResult<(String, Vec<String>)> {
        let mut anchor = dir.to_string();
        let mut missing: Vec<String> = Vec::new();
        loop {
            match self.resolve_path(id, &anchor).await? {
                Some((_, stat)) if is_dir(&stat) => break,
                Some(_) => {
                    return Err(ProviderError::invalid(format!(
                        "cannot write {target} in sandbox {id}: {anchor} exists and is not a directory"
                    )));
                }
                None if anchor == "/" => {
                    return Err(ProviderError::transient(format!(
                        "sandbox {id} reports no root directory; is its filesystem mounted?"
                    )));
                }
                None => {
                    let (up, segment) = validate::split_parent(&anchor);
                    missing.push(segment.to_string());
                    anchor = up.to_string();
                }
            }
        }
        missing.reverse();
        Ok((anchor, missing))
    }

    /// Uploads an archive (already safe: built or sanitised by us) for extraction at
    /// `anchor`, which must be an existing directory. A file never replaces a directory.
    pub(crate) async fn upload_archive(
        &self,
        id: &str,
        anchor: &str,
        archive: Vec<Bytes>,
        target: &str,
    ) -> ProviderResult<()> {
        let docker = self.engine().await?;
        let body = match <[Bytes; 1]>::try_from(archive) {
            Ok([whole]) => bollard::body_full(whole),
            Err(pieces) => bollard::body_stream(futures::stream::iter(pieces)),
        };
        let options = UploadToContainerOptionsBuilder::default()
            .path(anchor)
            // Never let a file replace a directory (the default would delete the tree).
            .no_overwrite_dir_non_dir("true")
            .build();
        match docker.upload_to_container(id, Some(options), body).await {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => {
                self.ensure_sandbox_exists(id).await?;
                Err(ProviderError::conflict(format!(
                    "{anchor} disappeared from sandbox {id} while {target} was being written; retry"
                )))
            }
            Err(e) => {
                // The engine reports extraction refusals as 500s; tell the user which.
                let err = map_err(&format!("writing {target} in sandbox {id}"), e);
                let msg = err.message().to_string();
                if msg.contains("cannot overwrite") {
                    Err(ProviderError::invalid(format!(
                        "writing {target} in sandbox {id} would replace a directory with a file or \
                         a file with a directory; delete it first ({msg})"
                    )))
                } else if msg.contains("read-only") {
                    Err(ProviderError::invalid(format!(
                        "{target} in sandbox {id} is on a read-only filesystem ({msg})"
                    )))
                } else {
                    Err(err)
                }
            }
        }
    }

    /// Lists one level with GNU `find` in the running sandbox. `Ok(None)`: the sandbox is
    /// not running or its image cannot do it, use the archive instead.
    pub(crate) async fn list_dir_exec(
        &self,
        id: &str,
        path: &str,
    ) -> ProviderResult<Option<Vec<DirEntry>>> {
        let request = ExecRequest {
            argv: [
                "find",
                "-H",
                path,
                "-mindepth",
                "1",
                "-maxdepth",
                "1",
                "-printf",
                shellfs::scripts::LISTING_FORMAT,
            ]
            .map(String::from)
            .to_vec(),
            cwd: None,
            env: Default::default(),
            timeout: HELPER_TIMEOUT,
        };
        let output = match self.run_exec(id, &request).await {
            Ok(output) => output,
            Err(e) if exec_unavailable(&e) => return Ok(None),
            Err(e) => return Err(e),
        };
        if output.exit_code != 0 {
            // No GNU find (busybox, distroless), or the directory vanished: the archive
            // answers authoritatively either way.
            return Ok(None);
        }
        // A malformed listing also falls back to the archive.
        Ok(shellfs::entries(&output.stdout))
    }

    /// Lists one level by streaming the directory's archive and keeping the top-level
    /// entries. Works on stopped sandboxes and any image, at the cost of reading the tree.
    async fn list_dir_archive(&self, id: &str, path: &str) -> ProviderResult<Vec<DirEntry>> {
        let shown = path.to_string();
        self.with_archive(id, path, move |reader| {
            let bad = |e: std::io::Error| {
                ProviderError::transient(format!("reading the archive of {shown}: {e}"))
            };
            let mut archive = Archive::new(reader);
            let mut root: Option<Vec<Vec<u8>>> = None;
            let mut entries = Vec::new();
            for entry in archive.entries().map_err(bad)? {
                let entry = entry.map_err(bad)?;
                let comps: Vec<Vec<u8>> = entry
                    .path_bytes()
                    .split(|b| *b == b'/')
                    .filter(|c| !c.is_empty() && *c != b".")
                    .map(<[u8]>::to_vec)
                    .collect();
                let Some(root) = root.as_ref() else {
                    // The first entry is the directory itself, named after its last segment.
                    root = Some(comps);
                    continue;
                };
                if comps.len() != root.len() + 1 || !comps.starts_with(root) {
                    continue;
                }
                let header = entry.header();
                let kind = match header.entry_type() {
                    EntryType::Regular | EntryType::Continuous | EntryType::Link => EntryKind::File,
                    EntryType::Directory => EntryKind::Directory,
                    EntryType::Symlink => EntryKind::Symlink,
                    _ => EntryKind::Other,
                };
                entries.push(DirEntry {
                    name: String::from_utf8_lossy(&comps[root.len()]).into_owned(),
                    kind,
                    size: (kind == EntryKind::File && header.entry_type() != EntryType::Link)
                        .then(|| entry.size()),
                    symlink_target: (kind == EntryKind::Symlink).then(|| {
                        entry
                            .link_name_bytes()
                            .map(|t| String::from_utf8_lossy(&t).into_owned())
                            .unwrap_or_default()
                    }),
                });
            }
            Ok(entries)
        })
        .await
    }
}

/// Builds the archive `write_file` uploads: the missing directories (mode `0o755`), then the
/// file. Everything root-owned; the file's mode masked to `0o777`.
fn write_archive(
    missing_dirs: &[&str],
    name: &str,
    data: &[u8],
    mode: u32,
) -> ProviderResult<Vec<u8>> {
    let io = |e: std::io::Error| {
        ProviderError::invalid(format!("building the archive for {name:?}: {e}"))
    };
    let mtime = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let mut builder = tar::Builder::new(Vec::with_capacity(data.len() + 2048));
    let mut prefix = String::new();
    for dir in missing_dirs {
        prefix.push_str(dir);
        prefix.push('/');
        let mut h = Header::new_gnu();
        h.set_entry_type(EntryType::Directory);
        h.set_mode(0o755);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(mtime);
        h.set_size(0);
        builder
            .append_data(&mut h, &prefix, std::io::empty())
            .map_err(io)?;
    }
    let mut h = Header::new_gnu();
    h.set_entry_type(EntryType::Regular);
    h.set_mode(mode & 0o777);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(mtime);
    h.set_size(data.len() as u64);
    builder
        .append_data(&mut h, format!("{prefix}{name}"), data)
        .map_err(io)?;
    builder.into_inner().map_err(io)
}

#[async_trait::async_trait]
impl Files for DockerProvider {
    /// Reads the exact bytes of a regular file (following symlinks). Absent → `NotFound`;
    /// a directory or special file → `Invalid`.
    async fn read_file(&self, id: &str, path: &str) -> ProviderResult<Vec<u8>> {
        let path = validate::sandbox_path("file path", path)?;
        if self.is_gvisor() {
            return shellfs::read_file(self, id, &path).await;
        }
        let Some((resolved, stat)) = self.resolve_path(id, &path).await? else {
            return Err(ProviderError::not_found(format!(
                "file {path} does not exist in sandbox {id}"
            )));
        };
        if is_dir(&stat) {
            return Err(ProviderError::invalid(format!(
                "{path} in sandbox {id} is a directory, not a file; list it instead"
            )));
        }
        if !is_regular(&stat) {
            return Err(ProviderError::invalid(format!(
                "{path} in sandbox {id} is not a regular file (device, fifo or socket)"
            )));
        }
        let shown = path.clone();
        self.with_archive(id, &resolved, move |reader| {
            let bad = |e: std::io::Error| {
                ProviderError::transient(format!("reading the archive of {shown}: {e}"))
            };
            let mut archive = Archive::new(reader);
            let mut entries = archive.entries().map_err(bad)?;
            let Some(entry) = entries.next() else {
                return Err(ProviderError::transient(format!(
                    "the engine sent an empty archive for {shown}"
                )));
            };
            let mut entry = entry.map_err(bad)?;
            if entry.header().entry_type() != EntryType::Regular {
                return Err(ProviderError::invalid(format!(
                    "{shown} changed while being read: it is no longer a regular file"
                )));
            }
            let expected = entry.size();
            let mut data = Vec::with_capacity(usize::try_from(expected).unwrap_or(0));
            entry.read_to_end(&mut data).map_err(bad)?;
            if data.len() as u64 != expected {
                return Err(ProviderError::transient(format!(
                    "{shown}: read {} bytes of {expected}; the transfer was cut short",
                    data.len()
                )));
            }
            Ok(data)
        })
        .await
    }

    /// Creates or replaces the whole file through the archive `PUT`, creating missing parent
    /// directories (`0o755`, root-owned). The mode is masked to `0o777`; the file is owned by
    /// root. An existing directory at `path` is refused, never replaced.
    async fn write_file(&self, id: &str, path: &str, data: &[u8], mode: u32) -> ProviderResult<()> {
        let path = validate::sandbox_path("file path", path)?;
        if path == "/" {
            return Err(ProviderError::invalid("cannot write a file at \"/\""));
        }
        if self.is_gvisor() {
            return shellfs::write_file(self, id, &path, data, mode).await;
        }
        let (parent, name) = validate::split_parent(&path);

        let (anchor, missing) = self.existing_anchor(id, parent, &path).await?;
        let missing: Vec<&str> = missing.iter().map(String::as_str).collect();
        let archive = write_archive(&missing, name, data, mode)?;
        self.upload_archive(id, &anchor, vec![Bytes::from(archive)], &path)
            .await
    }

    /// Lists one level of a directory (following a symlink to one). Absent → `NotFound`,
    /// `[]` only for an empty directory, a non-directory → `Invalid`. `/` always lists.
    async fn list_dir(&self, id: &str, path: &str) -> ProviderResult<Vec<DirEntry>> {
        let path = validate::sandbox_path("directory path", path)?;
        if self.is_gvisor() {
            return shellfs::list_dir(self, id, &path).await;
        }
        let Some((resolved, stat)) = self.resolve_path(id, &path).await? else {
            return Err(ProviderError::not_found(format!(
                "directory {path} does not exist in sandbox {id}"
            )));
        };
        if !is_dir(&stat) {
            return Err(ProviderError::invalid(format!(
                "{path} in sandbox {id} is not a directory; read it as a file instead"
            )));
        }
        let mut entries = match self.list_dir_exec(id, &resolved).await? {
            Some(entries) => entries,
            None => self.list_dir_archive(id, &resolved).await?,
        };
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(entries)
    }

    /// Deletes a file or a whole tree with `rm -rf` in the running sandbox. Absent = success;
    /// `/` is refused; a stopped sandbox is `Conflict` (start it first).
    async fn delete_path(&self, id: &str, path: &str) -> ProviderResult<()> {
        let path = validate::sandbox_path("path to delete", path)?;
        if path == "/" {
            return Err(ProviderError::invalid(format!(
                "refusing to delete \"/\" in sandbox {id}; name the directory to delete"
            )));
        }
        let request = ExecRequest {
            argv: ["rm", "-rf", "--", &path].map(String::from).to_vec(),
            cwd: None,
            env: Default::default(),
            timeout: HELPER_TIMEOUT,
        };
        let output = self.run_exec(id, &request).await?;
        match output.exit_code {
            0 => Ok(()),
            126 | 127 => Err(ProviderError::unsupported(format!(
                "deleting {path} in sandbox {id} needs `rm` in the image, which cannot run it: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            ))),
            code => Err(ProviderError::conflict(format!(
                "deleting {path} in sandbox {id} failed (rm exited {code}): {}",
                String::from_utf8_lossy(&output.stderr).trim()
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_normalised_or_refused() {
        assert_eq!(validate::sandbox_path("p", "/").unwrap(), "/");
        assert_eq!(validate::sandbox_path("p", "//a//b/").unwrap(), "/a/b");
        for bad in ["a/b", "", "/a/../b", "/a/./b", "/..", "/a\0b"] {
            assert!(
                matches!(validate::sandbox_path("p", bad), Err(e) if e.is(ErrorKind::Invalid)),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn parents_split_at_the_last_segment() {
        assert_eq!(validate::split_parent("/a"), ("/", "a"));
        assert_eq!(validate::split_parent("/a/b/c"), ("/a/b", "c"));
    }

    #[test]
    fn write_archive_masks_mode_and_orders_parents_first() {
        let bytes = write_archive(&["x", "y"], "f.bin", b"\x00\xff", 0o6755).unwrap();
        let mut ar = Archive::new(bytes.as_slice());
        let seen: Vec<(String, EntryType, u32, u64)> = ar
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let h = e.header();
                (
                    String::from_utf8(e.path_bytes().into_owned()).unwrap(),
                    h.entry_type(),
                    h.mode().unwrap(),
                    h.uid().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            seen,
            vec![
                ("x/".into(), EntryType::Directory, 0o755, 0),
                ("x/y/".into(), EntryType::Directory, 0o755, 0),
                ("x/y/f.bin".into(), EntryType::Regular, 0o755, 0),
            ]
        );
    }
}
