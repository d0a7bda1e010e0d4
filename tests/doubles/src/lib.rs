//! Test doubles of the remote sandbox APIs the operator talks to. Each is written from the
//! vendor's published API and backs every sandbox with a real local Docker container, so exec,
//! files, ports and pause are real. Test code only: the operator binary never links this crate.

use std::sync::Mutex;
use std::time::Duration;

pub mod e2b;
pub mod fly;
pub mod pid_label;
pub mod ports;
pub mod removal;
pub mod sprites;

/// How much of a sandbox's history a double's answers carry. Real APIs keep only recent
/// history, and a listing is not obliged to carry optional fields at all: a client must
/// never read "no start recorded" as "never started". Each double applies it to its own
/// fields (see `README.md`): Fly to `events`, E2B to `startedAt`/`endAt`, Sprites to
/// `created_at`/`last_running_at`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum History {
    /// Everything, in every answer.
    #[default]
    Complete,
    /// Listings leave the optional history fields out; a read of one sandbox still has them.
    OmittedFromListings,
    /// History is cut to its recent part: Fly keeps only the newest event in every answer;
    /// E2B and Sprites listings leave out timestamps older than [`RECENT`].
    Truncated,
}

/// How far back [`History::Truncated`] keeps a timestamp in E2B and Sprites listings.
pub const RECENT: Duration = Duration::from_secs(1);

/// A double's current [`History`] mode, switched by a test at any time.
#[derive(Debug, Default)]
pub struct HistoryMode(Mutex<History>);

impl HistoryMode {
    /// Switches to `history` from the next answer on.
    pub fn set(&self, history: History) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = history;
    }

    /// The mode now.
    pub fn get(&self) -> History {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a listing entry may carry a timestamp `age` old (E2B, Sprites).
    pub fn listing_keeps(&self, age: chrono::TimeDelta) -> bool {
        match self.get() {
            History::Complete => true,
            History::OmittedFromListings => false,
            History::Truncated => age.to_std().is_ok_and(|age| age <= RECENT),
        }
    }
}
