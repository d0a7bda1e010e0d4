//! Headroom of a Docker engine: free disk and inodes where new sandboxes' layers and volumes
//! live, and memory available without swapping.
//!
//! Only a LOCAL engine can be measured: the engine API reports where its data lives
//! (`DockerRootDir`) and how much memory the host has in total, but not what is free. So when
//! the engine is reached over a unix socket and its root directory is visible here, the root
//! directory is `statvfs`ed and `/proc/meminfo`'s `MemAvailable` is read. Anything that could
//! not be measured — a remote engine, a root directory this process cannot see (an operator
//! in a pod without the host's `/var/lib/docker`), a filesystem without a fixed inode table —
//! is left ABSENT, never zero (rule 8), and `detail` says which and why. The engine being
//! unreachable is an `Err`: that is "could not look", not "nothing free".
//!
//! The provider has no verdict of its own (`admits: None`): Docker has no quota to exhaust,
//! the floors are the caller's policy.

use std::path::Path;

use super::{DockerProvider, map_err};
use crate::provider::{Capacity, CapacityProbe, ProviderResult};

/// What a `statvfs` of the engine's root directory yielded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FsHeadroom {
    /// Free bytes available to unprivileged writers (`f_bavail * f_frsize`); `None` when the
    /// filesystem reports no block count at all.
    pub disk_bytes: Option<u64>,
    /// Free inodes (`f_favail`); `None` when the filesystem has no fixed inode table
    /// (`f_files == 0`, e.g. btrfs), where zero would be a lie.
    pub inodes: Option<u64>,
}

/// Interprets raw `statvfs` numbers (pure, so the zero-means-unknown cases are testable).
pub(crate) fn fs_headroom(
    blocks: u64,
    bavail: u64,
    frsize: u64,
    files: u64,
    favail: u64,
) -> FsHeadroom {
    FsHeadroom {
        disk_bytes: (blocks > 0 && frsize > 0).then(|| bavail.saturating_mul(frsize)),
        inodes: (files > 0).then_some(favail),
    }
}

/// `MemAvailable` from a `/proc/meminfo` text, in bytes.
pub(crate) fn mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let mut parts = line.split_whitespace().skip(1);
    let value: u64 = parts.next()?.parse().ok()?;
    match parts.next() {
        Some("kB") => value.checked_mul(1024),
        None => Some(value),
        Some(_) => None,
    }
}

impl DockerProvider {
    /// Whether the engine is reached over a local unix socket (the only case in which this
    /// host's filesystem and memory are the engine's).
    pub(crate) fn engine_is_local(&self) -> bool {
        let endpoint = match self.settings.endpoint.clone() {
            Some(ep) => ep,
            None => std::env::var("DOCKER_HOST").unwrap_or_else(|_| "unix://".into()),
        };
        endpoint.starts_with("unix://") || endpoint.starts_with('/')
    }
}

/// Whether `root` looks like the engine's data directory as seen from here (not an empty
/// directory of the same name inside the operator's own container).
fn looks_like_engine_root(root: &Path) -> bool {
    ["containers", "volumes", "image"]
        .iter()
        .any(|sub| root.join(sub).is_dir())
}

#[async_trait::async_trait]
impl CapacityProbe for DockerProvider {
    async fn capacity(&self) -> ProviderResult<Capacity> {
        let docker = self.engine().await?;
        let info = docker
            .info()
            .await
            .map_err(|e| map_err("reading the Docker engine's info for capacity", e))?;
        let mut capacity = Capacity::default();
        let mut found = Findings::default();
        if !self.engine_is_local() {
            found.missing.push(
                "disk, inodes and memory: the engine is remote, and its API reports no free space \
                 or available memory"
                    .into(),
            );
        } else {
            match info.docker_root_dir.as_deref().filter(|r| !r.is_empty()) {
                None => found
                    .missing
                    .push("disk and inodes: the engine did not report its root directory".into()),
                Some(root) => measure_disk(root, &mut capacity, &mut found).await,
            }
            measure_memory(&mut capacity, &mut found).await;
        }
        capacity.detail = found.detail();
        capacity.admits = None;
        Ok(capacity)
    }
}

/// What a probe measured and what it could not, each with its reason (rule 8: a headroom that
/// could not be measured is absent, and the detail says why).
#[derive(Default)]
struct Findings {
    measured: Vec<String>,
    missing: Vec<String>,
}

impl Findings {
    fn detail(&self) -> String {
        let mut detail = String::new();
        if !self.measured.is_empty() {
            detail.push_str(&format!(
                "measured on the engine host: {}",
                self.measured.join(", ")
            ));
        }
        if !self.missing.is_empty() {
            if !detail.is_empty() {
                detail.push_str("; ");
            }
            detail.push_str(&format!("not measured: {}", self.missing.join("; ")));
        }
        detail
    }
}

/// `statvfs` of the engine's root directory, when this process can see it.
async fn statvfs_of(root: &str) -> Result<nix::sys::statvfs::Statvfs, String> {
    let probe = Path::new(root).to_path_buf();
    tokio::task::spawn_blocking(move || {
        if !looks_like_engine_root(&probe) {
            return Err(format!(
                "{} is not visible here (mount the engine's data directory into the operator to \
                 measure it)",
                probe.display()
            ));
        }
        nix::sys::statvfs::statvfs(probe.as_path())
            .map_err(|e| format!("statvfs({}) failed: {e}", probe.display()))
    })
    .await
    .map_err(|e| format!("statvfs task failed: {e}"))
    .and_then(|r| r)
}

/// Free disk bytes and inodes on the filesystem of the engine's root directory.
async fn measure_disk(root: &str, capacity: &mut Capacity, found: &mut Findings) {
    let s = match statvfs_of(root).await {
        Ok(s) => s,
        Err(why) => return found.missing.push(format!("disk and inodes: {why}")),
    };
    #[allow(clippy::useless_conversion)]
    let fs = fs_headroom(
        u64::from(s.blocks()),
        u64::from(s.blocks_available()),
        u64::from(s.fragment_size()),
        u64::from(s.files()),
        u64::from(s.files_available()),
    );
    capacity.disk_bytes = fs.disk_bytes;
    capacity.inodes = fs.inodes;
    match fs.disk_bytes {
        Some(b) => found.measured.push(format!("{b} bytes free on {root}")),
        None => found.missing.push(format!(
            "disk: the filesystem of {root} reports no block count"
        )),
    }
    match fs.inodes {
        Some(i) => found.measured.push(format!("{i} inodes free on {root}")),
        None => found.missing.push(format!(
            "inodes: the filesystem of {root} has no fixed inode table"
        )),
    }
}

/// Available memory of the engine host (`MemAvailable`).
async fn measure_memory(capacity: &mut Capacity, found: &mut Findings) {
    match tokio::fs::read_to_string("/proc/meminfo").await {
        Ok(text) => match mem_available(&text) {
            Some(bytes) => {
                capacity.memory_bytes = Some(bytes);
                found
                    .measured
                    .push(format!("{bytes} bytes of memory available (MemAvailable)"));
            }
            None => found
                .missing
                .push("memory: /proc/meminfo has no MemAvailable line".into()),
        },
        Err(e) => found
            .missing
            .push(format!("memory: cannot read /proc/meminfo: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_counts_that_mean_unknown_stay_absent() {
        assert_eq!(
            fs_headroom(100, 10, 4096, 50, 7),
            FsHeadroom {
                disk_bytes: Some(40960),
                inodes: Some(7)
            }
        );
        // btrfs-style: no inode table → inodes absent, not 0.
        assert_eq!(fs_headroom(100, 10, 4096, 0, 0).inodes, None);
        // A genuinely full filesystem IS zero.
        assert_eq!(fs_headroom(100, 0, 4096, 50, 0).disk_bytes, Some(0));
        assert_eq!(fs_headroom(100, 0, 4096, 50, 0).inodes, Some(0));
        assert_eq!(fs_headroom(0, 0, 4096, 50, 0).disk_bytes, None);
    }

    #[test]
    fn mem_available_is_read_in_bytes() {
        let text = "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   1000 kB\n";
        assert_eq!(mem_available(text), Some(1_024_000));
        assert_eq!(mem_available("MemTotal: 5 kB\n"), None);
    }
}
