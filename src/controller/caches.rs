//! Watch caches of the objects a Sandbox names (SandboxTemplates, SandboxVolumes,
//! SandboxWarmPools), shared by the Sandbox controller's watches and its dereference and
//! claim steps.
//!
//! A Sandbox waiting for its template or volume is woken by that object's watch event (see
//! [`super::sandbox::run`]) instead of polling, and a resync of a converged Sandbox reads its
//! template and volumes from here instead of GETting them: at idle nothing is read from the
//! API server.

use std::sync::Arc;
use std::time::Duration;

use kube::Resource;
use kube::api::Api;
use kube::runtime::reflector::{ObjectRef, Store};

use crate::api::{SandboxTemplate, SandboxVolume, SandboxWarmPool};

/// How long a lookup waits for a cache's first listing before reading the API server
/// instead.
const SYNC_WAIT: Duration = Duration::from_secs(10);

/// The caches (set once by the Sandbox controller when it starts its watches).
#[derive(Clone)]
pub struct Caches {
    /// Every SandboxTemplate the operator watches.
    pub templates: Store<SandboxTemplate>,
    /// Every SandboxVolume the operator watches.
    pub volumes: Store<SandboxVolume>,
    /// Every SandboxWarmPool the operator watches: a claim decides on the cached pool, and
    /// its ledger write, which carries the cached resourceVersion, is refused when the cache
    /// was behind (then it reads the pool afresh).
    pub pools: Store<SandboxWarmPool>,
}

/// Reads `name` in `namespace` from `cache` once it has synced, else (no cache, or not
/// synced within [`SYNC_WAIT`]) from the API server: a cache that has not listed yet would
/// read a present object as absent.
pub async fn lookup<K>(
    cache: Option<&Store<K>>,
    api: &Api<K>,
    namespace: &str,
    name: &str,
) -> kube::Result<Option<Arc<K>>>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug + 'static,
{
    if let Some(store) = cache
        && tokio::time::timeout(SYNC_WAIT, store.wait_until_ready())
            .await
            .is_ok_and(|r| r.is_ok())
    {
        return Ok(store.get(&ObjectRef::new(name).within(namespace)));
    }
    Ok(api.get_opt(name).await?.map(Arc::new))
}
