//! envd's process service (`process.Process`, Connect protocol, JSON codec): processes run
//! through the sandbox's provider's streaming exec, under pids this replica assigns.
//!
//! - [`wire`]: the messages (pure);
//! - [`ring`]: a process's recent output, bounded (pure);
//! - [`table`]: this replica's processes, their input and their readers;
//! - [`peers`]: the replicas serving envd, each registered by a Lease under a tag its pids
//!   carry; [`forward`]: a request for another replica's process, sent there;
//! - [`respond`]: a process's event stream;
//! - [`start`]: `Start` and `Connect` (server streams); [`control`]: the other methods.
//!
//! A process's state lives in the replica that started it; another replica forwards a
//! request for its pid there, and answers `not_found` once that replica has stopped.

pub mod control;
pub mod forward;
pub mod peers;
pub mod respond;
pub mod ring;
pub mod start;
pub mod table;
pub mod wire;

use axum::Router;
use axum::routing::post;

use crate::e2bapi::routes::E2bState;

pub use forward::Replica;

/// The process service's routes. Their state, this replica's [`Replica`], is an extension
/// the E2B API's router is layered with.
pub fn router() -> Router<E2bState> {
    Router::new()
        .route("/process.Process/Start", post(start::start))
        .route("/process.Process/Connect", post(start::connect))
        .route("/process.Process/List", post(control::list))
        .route("/process.Process/SendInput", post(control::send_input))
        .route("/process.Process/StreamInput", post(control::stream_input))
        .route("/process.Process/SendSignal", post(control::send_signal))
        .route("/process.Process/Update", post(control::update))
        .route("/process.Process/CloseStdin", post(control::close_stdin))
}
