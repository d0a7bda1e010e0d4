//! envd's filesystem service (`/filesystem.Filesystem/…`), done through the seam's exec: one
//! `find -printf` run per call, parsed by [`entry`]; watching polls snapshots and diffs them
//! ([`diff`], [`watch`]) because sandbox images carry no inotify tool.
//!
//! - [`entry`]: `EntryInfo` from `find` records;
//! - [`shell`]: the scripts and the one runner over the seam's exec;
//! - [`diff`]: the events between two snapshots (pure);
//! - [`watch`]: watchers (`CreateWatcher`, `GetWatcherEvents`, `RemoveWatcher`) and the
//!   `WatchDir` stream.

pub mod diff;
pub mod entry;
pub mod shell;
pub mod watch;

use axum::http::HeaderMap;
use axum::response::Response;
use bytes::Bytes;
use serde::Deserialize;
use serde_json::json;

use super::error::EnvdError;
use super::rpc;
use super::target::EnvdTarget;

/// `StatRequest`, `MakeDirRequest`, `RemoveRequest`, `ListDirRequest`.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct PathRequest {
    /// The path.
    pub path: String,
    /// `ListDir`'s depth (0 reads as 1).
    pub depth: u32,
}

/// `MoveRequest`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct MoveRequest {
    /// What to move.
    pub source: String,
    /// Where to.
    pub destination: String,
}

/// `Stat`: the entry at a path (a link itself, not its target); `not_found` when absent.
pub async fn stat(t: EnvdTarget, h: HeaderMap, body: Bytes) -> Result<Response, EnvdError> {
    rpc::refuse_other_user(&h, None)?;
    let req: PathRequest = rpc::unary(&body)?;
    let path = shell::path("path to stat", &req.path)?;
    let entry = shell::stat(&t.target, &path).await?;
    Ok(rpc::ok(json!({"entry": entry.wire()})))
}

/// `MakeDir`: creates a directory and its parents; `already_exists` when it is there.
pub async fn make_dir(t: EnvdTarget, h: HeaderMap, body: Bytes) -> Result<Response, EnvdError> {
    rpc::refuse_other_user(&h, None)?;
    let req: PathRequest = rpc::unary(&body)?;
    let path = shell::path("directory to make", &req.path)?;
    let args = [path.as_str(), entry::FORMAT];
    let raw = shell::run(&t.target, shell::MAKE_DIR, &args, &path).await?;
    Ok(rpc::ok(json!({"entry": shell::one(&raw, &path)?.wire()})))
}

/// `Move`: renames, creating the destination's parents; answers the moved entry.
pub async fn move_(t: EnvdTarget, h: HeaderMap, body: Bytes) -> Result<Response, EnvdError> {
    rpc::refuse_other_user(&h, None)?;
    let req: MoveRequest = rpc::unary(&body)?;
    let source = shell::below_root("move", &req.source)?;
    let destination = shell::below_root("move onto", &req.destination)?;
    let args = [source.as_str(), entry::FORMAT, destination.as_str()];
    let raw = shell::run(&t.target, shell::MOVE, &args, &source).await?;
    Ok(rpc::ok(
        json!({"entry": shell::one(&raw, &destination)?.wire()}),
    ))
}

/// `ListDir`: the entries below a directory, `depth` levels deep.
pub async fn list_dir(t: EnvdTarget, h: HeaderMap, body: Bytes) -> Result<Response, EnvdError> {
    rpc::refuse_other_user(&h, None)?;
    let req: PathRequest = rpc::unary(&body)?;
    let path = shell::path("directory to list", &req.path)?;
    let found = shell::list(&t.target, &path, req.depth).await?;
    let entries: Vec<_> = found.iter().map(entry::Entry::wire).collect();
    Ok(rpc::ok(json!({ "entries": entries })))
}

/// `Remove`: a file or a whole tree; absent is success.
pub async fn remove(t: EnvdTarget, h: HeaderMap, body: Bytes) -> Result<Response, EnvdError> {
    rpc::refuse_other_user(&h, None)?;
    let req: PathRequest = rpc::unary(&body)?;
    let path = shell::below_root("remove", &req.path)?;
    shell::remove(&t.target, &path).await?;
    Ok(rpc::ok(json!({})))
}
