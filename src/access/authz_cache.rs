//! Recent authorization decisions, kept for a few seconds.
//!
//! Every request of the aggregated API needs a decision, and a SubjectAccessReview is a round
//! trip to the API server on the path of every `kubectl sandbox exec`. An agent that runs
//! many short commands asks the same question again and again, so the answer is kept for
//! [`TTL`]: the same window the API server's own delegated authorizer (the one aggregated
//! API servers built on its libraries use) keeps its answers, allowed and denied alike. A
//! revoked RoleBinding therefore takes effect within that window, as it does there.
//!
//! The key is the whole question: the user's name, UID, every group and extra attribute, and
//! the verb, subresource, namespace and name. Only decisions are kept; an API server that
//! could not answer is asked again next time. The cache is bounded: when it is full,
//! expired entries go first, and if none has expired it is emptied (a burst of distinct
//! questions costs reviews, never memory).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::authn::UserInfo;
use super::authz::{Attributes, Authorizer};
use super::status::AccessError;

/// How long a decision is kept.
pub const TTL: Duration = Duration::from_secs(10);

/// Most decisions kept at once.
const CAPACITY: usize = 4096;

/// The question, in full.
type Key = (UserInfo, Attributes);

/// A kept decision: allowed, or the 403 to give again.
#[derive(Clone)]
struct Decision {
    at: Instant,
    denied: Option<String>,
}

/// An [`Authorizer`] in front of another, keeping its decisions for [`TTL`].
pub struct CachedAuthorizer {
    inner: Arc<dyn Authorizer>,
    kept: Mutex<HashMap<Key, Decision>>,
    ttl: Duration,
}

impl CachedAuthorizer {
    /// Keeps `inner`'s decisions for [`TTL`].
    pub fn new(inner: Arc<dyn Authorizer>) -> Self {
        Self::with_ttl(inner, TTL)
    }

    fn with_ttl(inner: Arc<dyn Authorizer>, ttl: Duration) -> Self {
        CachedAuthorizer {
            inner,
            kept: Mutex::new(HashMap::new()),
            ttl,
        }
    }

    fn recall(&self, key: &Key) -> Option<Decision> {
        let kept = self.kept.lock().ok()?;
        kept.get(key).filter(|d| d.at.elapsed() < self.ttl).cloned()
    }

    fn remember(&self, key: Key, denied: Option<String>) {
        let Ok(mut kept) = self.kept.lock() else {
            return;
        };
        if kept.len() >= CAPACITY {
            kept.retain(|_, d| d.at.elapsed() < self.ttl);
            if kept.len() >= CAPACITY {
                kept.clear();
            }
        }
        let at = Instant::now();
        kept.insert(key, Decision { at, denied });
    }
}

#[async_trait]
impl Authorizer for CachedAuthorizer {
    async fn authorize(&self, user: &UserInfo, attrs: &Attributes) -> Result<(), AccessError> {
        let key = (user.clone(), attrs.clone());
        if let Some(decision) = self.recall(&key) {
            return match decision.denied {
                None => Ok(()),
                Some(message) => Err(AccessError::Forbidden(message)),
            };
        }
        match self.inner.authorize(user, attrs).await {
            Ok(()) => {
                self.remember(key, None);
                Ok(())
            }
            Err(AccessError::Forbidden(message)) => {
                self.remember(key, Some(message.clone()));
                Err(AccessError::Forbidden(message))
            }
            Err(other) => Err(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Allows `alice` only; counts the questions; fails while `down` is set.
    #[derive(Default)]
    struct Counting {
        asked: AtomicUsize,
        down: std::sync::atomic::AtomicBool,
    }

    #[async_trait]
    impl Authorizer for Counting {
        async fn authorize(&self, user: &UserInfo, attrs: &Attributes) -> Result<(), AccessError> {
            self.asked.fetch_add(1, Ordering::SeqCst);
            if self.down.load(Ordering::SeqCst) {
                return Err(AccessError::Unavailable("no API server".into()));
            }
            if user.name == "alice" {
                Ok(())
            } else {
                Err(attrs.denied(&user.name, ""))
            }
        }
    }

    fn user(name: &str, groups: &[&str]) -> UserInfo {
        UserInfo {
            name: name.into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            ..UserInfo::default()
        }
    }

    fn exec_on(name: &str) -> Attributes {
        Attributes {
            verb: "create",
            subresource: "exec",
            namespace: "team-a".into(),
            name: name.into(),
        }
    }

    fn cached(ttl: Duration) -> (Arc<Counting>, CachedAuthorizer) {
        let inner = Arc::new(Counting::default());
        let cache = CachedAuthorizer::with_ttl(inner.clone(), ttl);
        (inner, cache)
    }

    #[tokio::test]
    async fn the_same_question_is_asked_once_and_answered_alike() {
        let (inner, cache) = cached(TTL);
        for _ in 0..3 {
            assert!(
                cache
                    .authorize(&user("alice", &[]), &exec_on("box"))
                    .await
                    .is_ok()
            );
            let denied = cache.authorize(&user("bob", &[]), &exec_on("box")).await;
            assert!(
                matches!(&denied, Err(AccessError::Forbidden(m)) if m.contains("\"bob\"")),
                "{denied:?}"
            );
        }
        assert_eq!(inner.asked.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn any_difference_in_the_question_asks_again() {
        let (inner, cache) = cached(TTL);
        cache
            .authorize(&user("alice", &[]), &exec_on("box"))
            .await
            .ok();
        cache
            .authorize(&user("alice", &["dev"]), &exec_on("box"))
            .await
            .ok();
        cache
            .authorize(&user("alice", &[]), &exec_on("other"))
            .await
            .ok();
        let mut with_uid = user("alice", &[]);
        with_uid.uid = Some("u-1".into());
        cache.authorize(&with_uid, &exec_on("box")).await.ok();
        assert_eq!(inner.asked.load(Ordering::SeqCst), 4);
    }

    #[tokio::test]
    async fn an_expired_decision_and_an_unanswered_question_are_asked_again() {
        let (inner, cache) = cached(Duration::ZERO);
        cache
            .authorize(&user("alice", &[]), &exec_on("box"))
            .await
            .ok();
        cache
            .authorize(&user("alice", &[]), &exec_on("box"))
            .await
            .ok();
        assert_eq!(inner.asked.load(Ordering::SeqCst), 2);

        let (inner, cache) = cached(TTL);
        inner.down.store(true, Ordering::SeqCst);
        let first = cache.authorize(&user("alice", &[]), &exec_on("box")).await;
        assert!(
            matches!(first, Err(AccessError::Unavailable(_))),
            "{first:?}"
        );
        inner.down.store(false, Ordering::SeqCst);
        assert!(
            cache
                .authorize(&user("alice", &[]), &exec_on("box"))
                .await
                .is_ok()
        );
        assert_eq!(inner.asked.load(Ordering::SeqCst), 2);
    }
}
