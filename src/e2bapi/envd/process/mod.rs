//! envd's process service (`process.Process`, Connect protocol, JSON codec): processes run
//! through the sandbox's provider's streaming exec, under pids this replica assigns.
//!
//! - [`wire`]: the messages (pure);
//! - [`ring`]: a process's recent output, bounded (pure);
//! - [`table`]: this replica's processes, their input and their readers;
//! - [`respond`]: a process's event stream;
//! - [`start`]: `Start` and `Connect` (server streams); [`control`]: the other methods.
//!
//! A process's state lives in the replica that started it; another replica answers
//! `not_found` for its pid, saying so.

pub mod control;
pub mod respond;
pub mod ring;
pub mod start;
pub mod table;
pub mod wire;

use axum::routing::post;
use axum::{Extension, Router};

use crate::e2bapi::routes::E2bState;

/// The process service's routes, with this replica's process table.
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
        .layer(Extension(table::ProcessTable::default()))
}
