//! envd, the in-sandbox daemon the SDKs talk to for commands and files, served by the
//! operator for every provider with the capabilities it needs. A request names its sandbox by
//! the `E2b-Sandbox-Id` header (the SDKs' `E2B_SANDBOX_URL` mode) or by its host,
//! `{port}-{sandboxID}.{domain}`, and carries the sandbox's envd access token; envd's paths
//! never collide with the REST API's, so both share one listener.
//!
//! - [`target`]: the sandbox a request reaches (token checked, provider found);
//! - [`error`]: the Connect error codes and their HTTP statuses;
//! - [`process`]: the process service (`process.Process`).

pub mod error;
pub mod process;
pub mod target;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;

use super::routes::E2bState;

/// The port envd listens on inside an E2B sandbox: the SDKs put it in the host name and
/// the `E2b-Sandbox-Port` header.
pub const ENVD_PORT: u16 = 49983;

/// envd's routes.
pub fn router() -> Router<E2bState> {
    Router::new()
        .route("/health", get(health))
        .merge(process::router())
}

/// envd's liveness answer, for the sandbox the request names.
async fn health(_t: target::EnvdTarget) -> StatusCode {
    StatusCode::NO_CONTENT
}
