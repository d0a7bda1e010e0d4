//! What the pool controller last saw of each pool's members, for claims to pick from.
//!
//! A claim needs a member that runs, built to its spec, not in the ledger. Listing the
//! pool's members at the provider for every claim costs the heaviest call an engine serves
//! (a filtered listing of every container: ~5–15 ms on Docker, more under load). So the pool
//! controller records each listing it makes here, and a claim picks candidates from it and
//! describes only those it picked — each description is the proof that the member still
//! runs, belongs to the pool and carries the spec hash, so a stale sighting costs a listing
//! after all, never a wrong claim. The ledger (read with the pool) says who is taken; a
//! sighting never does.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::provider::SandboxDescriptor;

/// The last listing of each pool's members, by pool UID.
#[derive(Default)]
pub struct Sightings(Mutex<HashMap<String, Vec<SandboxDescriptor>>>);

impl Sightings {
    /// Records a listing of the members of the pool with UID `pool`.
    pub fn record(&self, pool: &str, members: &[SandboxDescriptor]) {
        self.lock().insert(pool.to_string(), members.to_vec());
    }

    /// The last listing of the pool with UID `pool`, if any was recorded.
    pub fn of(&self, pool: &str) -> Option<Vec<SandboxDescriptor>> {
        self.lock().get(pool).cloned()
    }

    /// Forgets the pool with UID `pool` (it is gone).
    pub fn forget(&self, pool: &str) {
        self.lock().remove(pool);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<SandboxDescriptor>>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::SandboxState;

    #[test]
    fn a_listing_is_kept_per_pool_until_forgotten() {
        let s = Sightings::default();
        assert!(s.of("p").is_none());
        s.record("p", &[SandboxDescriptor::bare("a", SandboxState::Running)]);
        assert_eq!(s.of("p").map(|m| m.len()), Some(1));
        assert!(s.of("q").is_none());
        s.forget("p");
        assert!(s.of("p").is_none());
    }
}
