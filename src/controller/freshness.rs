//! Whether the watch cache has caught up with our own last status write of an object.
//!
//! A reconcile works from the cached object, except when the cache may not have seen the
//! status this operator last wrote — a reconcile queued by a provider event or a quick retry
//! can run before the watch delivers our write, and a status rebuilt from the older copy
//! would drop what the write recorded (the provider id, lastHibernation, the delivered env
//! version). The resourceVersion each write returned is kept until the cache shows it; only
//! while it differs is the object read fresh (one GET). A converged object has no entry, so
//! a resync reads nothing from the API server.

use std::collections::HashMap;
use std::sync::Mutex;

/// The resourceVersion of our last status write, by object UID, until the cache shows it.
#[derive(Default)]
pub struct Written {
    versions: Mutex<HashMap<String, String>>,
}

impl Written {
    /// Records the resourceVersion a write of `uid` returned.
    pub fn wrote(&self, uid: &str, version: Option<String>) {
        let mut map = self.lock();
        match version {
            Some(v) => {
                map.insert(uid.to_string(), v);
            }
            None => {
                map.remove(uid);
            }
        }
    }

    /// Whether the cached copy at `cached_version` may predate our last write of `uid`.
    /// A cache that shows our write clears the entry.
    pub fn stale(&self, uid: &str, cached_version: Option<&str>) -> bool {
        let mut map = self.lock();
        match map.get(uid) {
            None => false,
            Some(v) if Some(v.as_str()) == cached_version => {
                map.remove(uid);
                false
            }
            Some(_) => true,
        }
    }

    /// Forgets `uid`: a fresh read (a quorum read, at least as new as any write we made)
    /// replaced the cached copy, or the object is gone.
    pub fn forget(&self, uid: &str) {
        self.lock().remove(uid);
    }

    /// How many objects the cache has not caught up with.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether the cache has caught up with every write.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.versions.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_only_until_the_cache_shows_our_write() {
        let w = Written::default();
        assert!(!w.stale("u", Some("1")), "nothing written: trust the cache");
        w.wrote("u", Some("5".into()));
        assert!(w.stale("u", Some("4")));
        assert!(!w.stale("u", Some("5")));
        assert!(w.is_empty(), "caught up: the entry is gone");
        w.wrote("u", Some("7".into()));
        w.forget("u");
        assert!(!w.stale("u", Some("6")));
    }
}
