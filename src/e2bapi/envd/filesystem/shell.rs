//! The filesystem service's work, done by one command in the sandbox through the seam's
//! exec: a short `sh` script per method whose paths are positional arguments (never script
//! text), answering [`FORMAT`] records. The exit codes follow the shell file protocol's
//! ([`scripts`]) and add [`EXISTS`], so the same code means the same thing everywhere.

use std::time::Duration;

use super::entry::{self, Entry, FORMAT};
use crate::access::lookup::Target;
use crate::access::status::AccessError;
use crate::e2bapi::envd::error::{Code, EnvdError};
use crate::provider::ExecRequest;
use crate::provider::shellfs::scripts::{self, ABSENT, NOT_DIR};
use crate::provider::validate::sandbox_path;

/// The path exists already (a directory `MakeDir` would create).
pub const EXISTS: i64 = 26;

/// Bound on one method's command.
pub const TIMEOUT: Duration = Duration::from_secs(60);

/// `$1` itself (not what a link points to).
pub const STAT: &str =
    r#"[ -e "$1" ] || [ -L "$1" ] || exit 20; exec find "$1" -maxdepth 0 -printf "$2""#;

/// What lies below directory `$1` (or the directory a link `$1` names), `$3` levels deep.
pub const LIST: &str = r#"[ -d "$1" ] || { [ -e "$1" ] && exit 23; exit 20; };
exec find -H "$1" -mindepth 1 -maxdepth "$3" -printf "$2""#;

/// Creates directory `$1` and its parents; an existing directory is [`EXISTS`].
pub const MAKE_DIR: &str = r#"if [ -e "$1" ] || [ -L "$1" ]; then [ -d "$1" ] && exit 26; exit 23; fi;
mkdir -p -- "$1" || exit 1; exec find "$1" -maxdepth 0 -printf "$2""#;

/// Renames `$1` to `$3` (its parents created); answers `$3`.
pub const MOVE: &str = r#"[ -e "$1" ] || [ -L "$1" ] || exit 20;
mkdir -p -- "$(dirname -- "$3")" && mv -T -- "$1" "$3" || exit 1;
exec find "$3" -maxdepth 0 -printf "$2""#;

/// A normalised absolute path, `InvalidArgument` otherwise.
pub fn path(what: &str, raw: &str) -> Result<String, EnvdError> {
    sandbox_path(what, raw).map_err(|e| EnvdError::new(Code::InvalidArgument, e.to_string()))
}

/// As [`path`], refusing `/`, which is never moved or removed.
pub fn below_root(what: &str, raw: &str) -> Result<String, EnvdError> {
    let p = path(what, raw)?;
    if p == "/" {
        return Err(EnvdError::new(
            Code::InvalidArgument,
            format!("refusing to {what} \"/\"; name a path below it"),
        ));
    }
    Ok(p)
}

/// Runs `script` with `args` in the sandbox; its stdout on exit 0, the exit code's meaning
/// for `path` otherwise.
pub async fn run(
    t: &Target,
    script: &str,
    args: &[&str],
    path: &str,
) -> Result<Vec<u8>, EnvdError> {
    let mut argv = vec!["sh".to_string(), "-c".into(), script.into(), "sh".into()];
    argv.extend(args.iter().map(|a| a.to_string()));
    let request = ExecRequest {
        argv,
        cwd: None,
        env: Default::default(),
        timeout: TIMEOUT,
    };
    let out = t
        .handle
        .call("exec", t.handle.provider.exec(&t.id, &request))
        .await
        .map_err(|e| EnvdError::from(AccessError::from_provider(path, &e)))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let fail = |code, what: &str| Err(EnvdError::new(code, format!("{path}: {what}")));
    match out.exit_code {
        0 => Ok(out.stdout),
        ABSENT => fail(Code::NotFound, "no such file or directory"),
        NOT_DIR => fail(Code::InvalidArgument, "not a directory"),
        EXISTS => fail(Code::AlreadyExists, "already exists"),
        126 | 127 => fail(
            Code::Unimplemented,
            &format!("the image lacks a tool this needs (sh, find, mkdir, mv): {stderr}"),
        ),
        code => fail(
            Code::Internal,
            &format!("failed (exit {code}): {}", stderr.trim()),
        ),
    }
}

/// The records of `raw`, or `Internal` when they came back cut short.
pub fn entries(raw: &[u8], path: &str) -> Result<Vec<Entry>, EnvdError> {
    entry::parse(raw).ok_or_else(|| {
        EnvdError::new(
            Code::Internal,
            format!("{path}: the listing came back cut short or not in GNU find's format"),
        )
    })
}

/// The one record a stat-like script answers.
pub fn one(raw: &[u8], path: &str) -> Result<Entry, EnvdError> {
    entries(raw, path)?
        .pop()
        .ok_or_else(|| EnvdError::new(Code::Internal, format!("{path}: find answered no record")))
}

/// `path` itself.
pub async fn stat(t: &Target, path: &str) -> Result<Entry, EnvdError> {
    one(&run(t, STAT, &[path, FORMAT], path).await?, path)
}

/// What lies below `path`, `depth` levels deep, sorted by path ([`visible`]).
pub async fn list(t: &Target, path: &str, depth: u32) -> Result<Vec<Entry>, EnvdError> {
    let depth = depth.max(1).to_string();
    let found = entries(&run(t, LIST, &[path, FORMAT, &depth], path).await?, path)?;
    Ok(visible(found))
}

/// `found` sorted by path, without the files writes stage beside their targets
/// (`scripts::is_staging_name`): a listing or a watch's poll that caught one would show a
/// name the caller never used, and — to a watch — the write to the target as that name's
/// removal.
pub fn visible(mut found: Vec<Entry>) -> Vec<Entry> {
    found.retain(|e| !scripts::is_staging_name(e.path.rsplit('/').next().unwrap_or_default()));
    found.sort_by(|a, b| a.path.cmp(&b.path));
    found
}

/// `rm -rf` of `path` (absent is success, as the seam's delete).
pub async fn remove(t: &Target, path: &str) -> Result<(), EnvdError> {
    run(t, scripts::DELETE, &[path], path).await.map(drop)
}
