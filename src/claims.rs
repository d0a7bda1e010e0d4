//! The ledger half of the identity rule for Sandboxes that claimed a warm pool member: the
//! member carries its pool's owner labels (provider labels cannot change), so the proof that
//! it now belongs to a Sandbox is the pool's ledger entry naming that Sandbox's UID. Read
//! here, by the controllers and the access layer alike, and judged by the one rule,
//! [`crate::provider::labels::ensure_owned_or_claimed`].

use kube::api::Api;
use kube::{Client, ResourceExt};

use crate::api::{Sandbox, SandboxWarmPool};
use crate::provider::labels::Claim;

/// The member the ledger of the Sandbox's `spec.warmPoolRef` pool (in the Sandbox's own
/// namespace) gives to this Sandbox; `None` when it names no pool, the pool is gone, or its
/// ledger gives this Sandbox nothing.
pub async fn proof(client: &Client, sandbox: &Sandbox) -> Result<Option<Claim>, kube::Error> {
    let Some(pool_ref) = &sandbox.spec.warm_pool_ref else {
        return Ok(None);
    };
    let uid = sandbox.uid().unwrap_or_default();
    let api: Api<SandboxWarmPool> =
        Api::namespaced(client.clone(), &sandbox.namespace().unwrap_or_default());
    let Some(pool) = api.get_opt(&pool_ref.name).await? else {
        return Ok(None);
    };
    Ok(of(&pool, &uid))
}

/// [`proof`] from a pool already read.
pub fn of(pool: &SandboxWarmPool, sandbox_uid: &str) -> Option<Claim> {
    let entry = pool.status.as_ref()?.claimed_by(sandbox_uid)?;
    Some(Claim {
        pool_uid: pool.uid()?,
        member: entry.member.clone(),
    })
}
