//! Execs and pauses of one container never overlap (within this provider).
//!
//! An exec is two engine calls: create, then start. On this engine (20.10, and the runc it
//! drives) a start that reaches a container paused after the create joins the frozen cgroup
//! and never returns: the exec's `runc init` is frozen with the rest, and the engine holds the
//! container's exec store while it waits, so every later inspect of that container hangs
//! too — the engine is wedged until someone thaws the cgroup by hand. Creates on a paused
//! container are refused by the engine itself, so only that window matters — and it is
//! wider than the two calls: the engine answers an attached start as soon as it has taken
//! the connection and runs the process after that. Here every exec holds a shared gate of
//! its container from its create until the engine reports the process's pid, and a pause
//! holds it alone: a pause waits for execs being started, and an exec started after a pause
//! is refused at its create (`Conflict`, "not running").
//!
//! The gate lives in the provider, so it covers every exec and pause this process makes
//! (the operator's own hibernation and idle suspend, the processes kept waiting in
//! sandboxes, the access layer). A pause made elsewhere — another operator replica's access
//! layer, a user's `docker pause` — is outside it.

use tokio::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Gates, shared by containers whose ids hash alike: a few stripes keep memory flat however
/// many sandboxes there are, and two containers sharing one only queue a pause behind an
/// exec start of the other.
const STRIPES: usize = 64;

/// The gates of every container.
pub struct FreezeGate {
    stripes: Vec<RwLock<()>>,
}

impl Default for FreezeGate {
    fn default() -> Self {
        FreezeGate {
            stripes: (0..STRIPES).map(|_| RwLock::new(())).collect(),
        }
    }
}

impl FreezeGate {
    fn stripe(&self, id: &str) -> &RwLock<()> {
        let h = id
            .bytes()
            .fold(0usize, |h, b| h.wrapping_mul(31).wrapping_add(b.into()));
        &self.stripes[h % STRIPES]
    }

    /// Held while an exec of container `id` is created and started.
    pub async fn exec(&self, id: &str) -> RwLockReadGuard<'_, ()> {
        self.stripe(id).read().await
    }

    /// Held while container `id` is paused.
    pub async fn pause(&self, id: &str) -> RwLockWriteGuard<'_, ()> {
        self.stripe(id).write().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_pause_waits_for_an_exec_being_started_and_execs_share() {
        let gate = FreezeGate::default();
        let starting = gate.exec("c").await;
        let other = gate.exec("c").await;
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(20), gate.pause("c"))
                .await
                .is_err(),
            "a pause waits while an exec of its container starts"
        );
        drop((starting, other));
        let _paused = gate.pause("c").await;
    }
}
