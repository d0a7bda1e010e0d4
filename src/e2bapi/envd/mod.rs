//! envd, the in-sandbox daemon the SDKs talk to for commands and files, served by the
//! operator for every provider with the capabilities it needs. A request names its sandbox by
//! the `E2b-Sandbox-Id` header (the SDKs' `E2B_SANDBOX_URL` mode) or by its host,
//! `{port}-{sandboxID}.{domain}`, and carries the sandbox's envd access token; envd's paths
//! never collide with the REST API's, so both share one listener.
//!
//! - [`target`]: the sandbox a request reaches (token checked, provider found);
//! - [`error`]: the Connect error codes and their HTTP statuses;
//! - [`rpc`]: the Connect JSON codec both services speak, and the user check;
//! - [`filesystem`]: the filesystem service; [`files`]: `/files` up- and download;
//! - [`process`]: the process service (`process.Process`).

pub mod error;
pub mod files;
pub mod files_multipart;
pub mod filesystem;
pub mod process;
pub mod rpc;
pub mod target;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::{get, post};

use super::routes::E2bState;

/// The port envd listens on inside an E2B sandbox: the SDKs put it in the host name and
/// the `E2b-Sandbox-Port` header.
pub const ENVD_PORT: u16 = 49983;

/// envd's routes.
pub fn router() -> Router<E2bState> {
    use filesystem as fs;
    const FS: &str = "/filesystem.Filesystem";
    Router::new()
        .route("/health", get(health))
        .route(
            "/files",
            get(files::download)
                .post(files::upload)
                .layer(files::limit()),
        )
        .route(&format!("{FS}/Stat"), post(fs::stat))
        .route(&format!("{FS}/MakeDir"), post(fs::make_dir))
        .route(&format!("{FS}/Move"), post(fs::move_))
        .route(&format!("{FS}/ListDir"), post(fs::list_dir))
        .route(&format!("{FS}/Remove"), post(fs::remove))
        .route(&format!("{FS}/WatchDir"), post(fs::watch::watch_dir))
        .route(&format!("{FS}/CreateWatcher"), post(fs::watch::create))
        .route(&format!("{FS}/GetWatcherEvents"), post(fs::watch::events))
        .route(&format!("{FS}/RemoveWatcher"), post(fs::watch::remove))
        .merge(process::router())
}

/// envd's liveness answer, for the sandbox the request names.
async fn health(_t: target::EnvdTarget) -> StatusCode {
    StatusCode::NO_CONTENT
}
