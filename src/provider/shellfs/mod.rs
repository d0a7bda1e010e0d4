//! File I/O through exec: the one implementation every provider uses when its own API has no
//! file endpoint it can trust (Docker under gVisor, Fly Machines, Kubernetes Pods, and the
//! bulk transfers of Fly Sprites).
//!
//! A provider says how to run one command ([`Shell`]) and how its exec streams carry bytes
//! ([`Transport`]); everything else — the scripts, their exit-code protocol (see
//! [`scripts`]), what each code means as an error, path checks, the tar sanitiser and the
//! listing format — lives here, so the providers cannot drift apart.
//!
//! The same contract holds on every provider: absent is `NotFound` (rule 2), a directory
//! where a file is expected (or the reverse) is `Invalid`, a write replaces the whole file
//! atomically, modes are masked to `0o777`, `/` is never written, deleted or exported, and an
//! import is sanitised before any byte reaches the sandbox. The sandbox must be running
//! (`Conflict` otherwise, like exec), and the image needs a POSIX shell, `cat`, `mkdir`, `mv`,
//! `chmod`, GNU `find` and `tar` (and `base64` for a text transport) — every Debian-based
//! image has them; a missing tool is `Unsupported`.

pub mod argv;
pub mod listing;
pub mod scripts;

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use futures::stream::{self, BoxStream, StreamExt};

use super::tarsafe::{self, Pieces};
use super::validate::sandbox_path;
use super::{ArchiveStream, DirEntry, ExecOutput, ProviderError, ProviderResult};

use scripts::{ABSENT, IS_DIR, NOT_DIR, NOT_REGULAR, SYMLINK, UNDER_A_FILE};

pub use argv::wrap;
pub use listing::entries;

/// Bound on one single-file operation (read, write, list, delete).
pub const FILE_TIMEOUT: Duration = Duration::from_secs(120);
/// Bound on one tree transfer (export, import), which moves whole directories.
pub const TRANSFER_TIMEOUT: Duration = Duration::from_secs(300);

/// How a provider's exec streams carry bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// Binary channels: every byte crosses unchanged.
    Binary,
    /// Text only (JSON strings): stdin and stdout cross as base64 (see
    /// [`scripts::BASE64_WRAPPER`]), so all 256 byte values still survive.
    Base64,
}

/// What the shell file protocol needs from a provider: one command, run to completion.
#[async_trait]
pub trait Shell: Send + Sync {
    /// How this provider's exec carries bytes.
    fn transport(&self) -> Transport;

    /// Runs `argv` as it is (no cwd or env wrapping) in sandbox `id` with optional stdin,
    /// bounded by `timeout`. A sandbox that is not running is `Conflict`.
    async fn shell_exec(
        &self,
        id: &str,
        argv: Vec<String>,
        stdin: Option<&[u8]>,
        timeout: Duration,
    ) -> ProviderResult<ExecOutput>;
}

/// Runs `script` with `args` over the provider's transport; returns stdout on exit 0 and maps
/// the protocol's exit codes to errors.
async fn run<S: Shell + ?Sized>(
    shell: &S,
    id: &str,
    script: &str,
    args: &[&str],
    stdin: Option<&[u8]>,
    timeout: Duration,
) -> ProviderResult<Vec<u8>> {
    let out = match shell.transport() {
        Transport::Binary => {
            let argv = script_argv(script, script_args(args));
            shell.shell_exec(id, argv, stdin, timeout).await?
        }
        Transport::Base64 => {
            let intake = match stdin {
                Some(_) => scripts::DECODE_STDIN,
                None => scripts::NO_STDIN,
            };
            // The script itself is the wrapper's `$0`, its arguments the wrapper's `$@`.
            let wrapper = scripts::BASE64_WRAPPER.replace("INTAKE", intake);
            let mut argv = vec!["sh".to_string(), "-c".into(), wrapper, script.into()];
            argv.extend(script_args(args));
            let encoded = stdin.map(|data| STANDARD.encode(data).into_bytes());
            let mut out = shell
                .shell_exec(id, argv, encoded.as_deref(), timeout)
                .await?;
            out.stdout = decode(id, &out.stdout)?;
            out
        }
    };
    let path = args.first().copied().unwrap_or("");
    verdict(id, path, out)
}

/// `sh -c SCRIPT sh ARGS…`: the arguments become `$1…`, never script text.
fn script_argv(script: &str, args: Vec<String>) -> Vec<String> {
    let mut argv = vec!["sh".to_string(), "-c".into(), script.into(), "sh".into()];
    argv.extend(args);
    argv
}

fn script_args(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| a.to_string()).collect()
}

/// Base64 from a text transport, back to bytes.
fn decode(id: &str, text: &[u8]) -> ProviderResult<Vec<u8>> {
    let compact: Vec<u8> = text
        .iter()
        .copied()
        .filter(|c| !c.is_ascii_whitespace())
        .collect();
    STANDARD.decode(compact).map_err(|e| {
        ProviderError::transient(format!(
            "sandbox {id}: the file data came back damaged (not base64: {e})"
        ))
    })
}

/// The protocol's exit codes (see [`scripts`]) as results.
fn verdict(id: &str, path: &str, out: ExecOutput) -> ProviderResult<Vec<u8>> {
    let invalid = |what: &str| ProviderError::invalid(format!("{path} in sandbox {id} {what}"));
    match out.exit_code {
        0 => Ok(out.stdout),
        ABSENT => Err(ProviderError::not_found(format!(
            "{path} does not exist in sandbox {id}"
        ))),
        IS_DIR => Err(invalid("is a directory, not a file; list it instead")),
        NOT_REGULAR => Err(invalid("is not a regular file (device, fifo or socket)")),
        NOT_DIR => Err(invalid("is not a directory; read it as a file instead")),
        SYMLINK => Err(invalid(&format!(
            "is a symbolic link to {}; name what it points to",
            String::from_utf8_lossy(&out.stdout).trim()
        ))),
        UNDER_A_FILE => Err(invalid(
            "cannot be created: a parent of it is a file, not a directory; write elsewhere or \
             delete that file first",
        )),
        code @ (126 | 127) => Err(ProviderError::unsupported(format!(
            "a file operation on {path} in sandbox {id} needs a tool the image lacks (exit \
             {code}): {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))),
        code => Err(ProviderError::transient(format!(
            "a file operation on {path} in sandbox {id} failed (exit {code}): {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))),
    }
}

/// A normalised sandbox path other than `/`, which is never written, deleted or exported.
fn below_root(id: &str, what: &str, path: &str) -> ProviderResult<String> {
    let path = sandbox_path(&format!("path to {what}"), path)?;
    if path == "/" {
        return Err(ProviderError::invalid(format!(
            "refusing to {what} \"/\" in sandbox {id}; name a path below it"
        )));
    }
    Ok(path)
}

/// The exact bytes of a regular file (following symlinks).
pub async fn read_file<S: Shell + ?Sized>(
    shell: &S,
    id: &str,
    path: &str,
) -> ProviderResult<Vec<u8>> {
    let path = sandbox_path("path to read", path)?;
    run(shell, id, scripts::READ, &[&path], None, FILE_TIMEOUT).await
}

/// Creates or replaces the whole file (parents created), mode masked to `0o777`.
pub async fn write_file<S: Shell + ?Sized>(
    shell: &S,
    id: &str,
    path: &str,
    data: &[u8],
    mode: u32,
) -> ProviderResult<()> {
    let args = write_args(id, path, mode)?;
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    run(shell, id, scripts::WRITE, &args, Some(data), FILE_TIMEOUT)
        .await
        .map(|_| ())
}

/// The arguments of [`scripts::WRITE`] for a whole-file write of `path` with `mode`:
/// the checked path, the mode masked to `0o777`, the umask that creates the file with that
/// mode, and whether a `chmod` must add execute bits.
fn write_args(id: &str, path: &str, mode: u32) -> ProviderResult<[String; 4]> {
    let path = below_root(id, "write", path)?;
    let mode = mode & 0o777;
    let chmod = if mode & 0o111 != 0 { "x" } else { "" };
    Ok([
        path,
        format!("{mode:o}"),
        format!("{:o}", !mode & 0o777),
        chmod.to_string(),
    ])
}

/// A whole-file write as one command for a shell that reports its status in band (see
/// [`scripts::REPORTED`]): its argv (stdin is the data), and the path it writes.
pub fn reported_write(id: &str, path: &str, mode: u32) -> ProviderResult<(Vec<String>, String)> {
    let args = write_args(id, path, mode)?;
    let script = format!("{}{}", scripts::REPORTED, scripts::WRITE);
    let path = args[0].clone();
    Ok((script_argv(&script, args.to_vec()), path))
}

/// The largest data [`reported_write_from_env`] carries: a warm reader reads its header a
/// byte at a time, so past a few KiB stdin is cheaper.
pub const ENV_DATA_MAX: usize = 8 * 1024;

/// An argv and the environment it runs with.
pub type WithEnv = (Vec<String>, BTreeMap<String, String>);

/// [`reported_write`] with `data` in the environment instead of on stdin (see
/// [`scripts::WRITE`]): its argv and environment. `None` unless `data` is small text — at
/// most [`ENV_DATA_MAX`] bytes of UTF-8 without NUL, which no environment can hold.
pub fn reported_write_from_env(
    id: &str,
    path: &str,
    mode: u32,
    data: &[u8],
) -> ProviderResult<Option<WithEnv>> {
    let (mut argv, _) = reported_write(id, path, mode)?;
    let text = (data.len() <= ENV_DATA_MAX && !data.contains(&0))
        .then(|| std::str::from_utf8(data).ok())
        .flatten();
    Ok(text.map(|text| {
        argv.push("env".into());
        let env = BTreeMap::from([(scripts::DATA_VAR.to_string(), text.to_string())]);
        (argv, env)
    }))
}

/// [`reported_write_from_env`], staged (see [`scripts::WRITE`]): the data is written beside
/// the file and put in place only when [`scripts::COMMIT`] follows on stdin. `None` as there.
pub fn staged_write_from_env(
    id: &str,
    path: &str,
    mode: u32,
    data: &[u8],
) -> ProviderResult<Option<WithEnv>> {
    let staged = reported_write_from_env(id, path, mode, data)?;
    Ok(staged.map(|(mut argv, env)| {
        argv.push("staged".into());
        (argv, env)
    }))
}

/// The outcome of a write made with [`reported_write`]: its status, and stderr when it
/// failed.
pub fn reported_outcome(id: &str, path: &str, code: i64, stderr: Vec<u8>) -> ProviderResult<()> {
    let out = ExecOutput {
        stdout: Vec::new(),
        stderr,
        exit_code: code,
    };
    verdict(id, path, out).map(|_| ())
}

/// The exit code a [`scripts::REPORTED`] script wrote, once `out` (all of its stdout so
/// far) is exactly that status; `None` while it is incomplete or is anything else.
pub fn reported_status(out: &[u8]) -> Option<i64> {
    let inner = out
        .strip_prefix(&[scripts::STATUS_START])?
        .strip_suffix(&[scripts::STATUS_END])?;
    std::str::from_utf8(inner).ok()?.parse().ok()
}

/// One level of a directory, sorted by name. Absent = `NotFound`; `[]` only when empty.
pub async fn list_dir<S: Shell + ?Sized>(
    shell: &S,
    id: &str,
    path: &str,
) -> ProviderResult<Vec<DirEntry>> {
    let path = sandbox_path("directory to list", path)?;
    let raw = run(shell, id, scripts::LIST, &[&path], None, FILE_TIMEOUT).await?;
    let mut listed = entries(&raw).ok_or_else(|| {
        ProviderError::transient(format!(
            "listing {path} in sandbox {id}: the listing came back cut short"
        ))
    })?;
    listed.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(listed)
}

/// `rm -rf` of a path other than `/`; absent = success.
pub async fn delete_path<S: Shell + ?Sized>(shell: &S, id: &str, path: &str) -> ProviderResult<()> {
    let path = below_root(id, "delete", path)?;
    run(shell, id, scripts::DELETE, &[&path], None, FILE_TIMEOUT)
        .await
        .map(|_| ())
}

/// A tar of `path` rooted at its last segment, as one chunk (bounded by the exec's output
/// ceiling). Absent = `NotFound`; a symbolic link = `Invalid` naming its target.
pub async fn export<S: Shell + ?Sized>(
    shell: &S,
    id: &str,
    path: &str,
) -> ProviderResult<BoxStream<'static, ProviderResult<bytes::Bytes>>> {
    let path = below_root(id, "export", path)?;
    let archive = run(shell, id, scripts::EXPORT, &[&path], None, TRANSFER_TIMEOUT).await?;
    Ok(stream::once(async move { Ok(bytes::Bytes::from(archive)) }).boxed())
}

/// Extracts `archive` at `path` after [`sanitise`] (the tenant's archive never reaches the
/// sandbox as it came).
pub async fn import<S: Shell + ?Sized>(
    shell: &S,
    id: &str,
    path: &str,
    archive: ArchiveStream,
) -> ProviderResult<()> {
    let path = sandbox_path("path to import into", path)?;
    let sanitised = sanitise(archive, String::new(), id, &path).await?.to_vec();
    let stdin = Some(&sanitised[..]);
    run(
        shell,
        id,
        scripts::IMPORT,
        &[&path],
        stdin,
        TRANSFER_TIMEOUT,
    )
    .await
    .map(|_| ())
}

/// The one sanitiser ([`tarsafe::sanitise_pieces`]) off the async runtime, reading `archive`
/// as it arrives (an upload is checked while it is still being received): traversal,
/// absolute names and writes through the archive's own symlinks refused, devices dropped,
/// setuid/setgid/sticky cleared, ownership reset, members placed under `prefix`. A hostile or
/// broken archive is `Invalid` naming `path` in sandbox `id`, and nothing of it is returned.
pub async fn sanitise(
    archive: ArchiveStream,
    prefix: String,
    id: &str,
    path: &str,
) -> ProviderResult<Pieces> {
    let mut batches = batched(archive);
    tokio::task::spawn_blocking(move || {
        let input = std::iter::from_fn(move || batches.blocking_recv()).flatten();
        tarsafe::sanitise_pieces(input, &prefix)
    })
    .await
    .map_err(|e| ProviderError::transient(format!("sanitising the archive failed: {e}")))?
    .map_err(|e| {
        ProviderError::invalid(format!(
            "refusing to import into {path} in sandbox {id}: {e}"
        ))
    })
}

/// The least an arriving archive is handed to the sanitiser's thread in.
const BATCH: usize = 1 << 20;

/// Hands an arriving archive to the sanitiser's thread in batches of at least [`BATCH`]
/// bytes. The network delivers an upload in thousands of small reads; waking that thread for
/// each of them cost more than sanitising them, so a task on the runtime gathers them first
/// (without copying). It stops when the sanitiser stops reading.
fn batched(mut archive: ArchiveStream) -> tokio::sync::mpsc::Receiver<Vec<std::io::Result<Bytes>>> {
    let (tx, rx) = tokio::sync::mpsc::channel(2);
    tokio::spawn(async move {
        let mut batch = Vec::new();
        let mut size = 0;
        while let Some(piece) = archive.next().await {
            let broken = piece.is_err();
            size += piece.as_ref().map_or(0, Bytes::len);
            batch.push(piece);
            if size >= BATCH || broken {
                if tx.send(std::mem::take(&mut batch)).await.is_err() || broken {
                    return;
                }
                size = 0;
            }
        }
        let _ = tx.send(batch).await;
    });
    rx
}

#[cfg(test)]
mod tests;
