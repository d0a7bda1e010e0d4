//! Act: run a pool pass's plan — finish ledger entries, retire members, start and create —
//! each removal recorded in the ledger before the member is touched.

use std::collections::BTreeSet;

use futures::future::try_join_all;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef};

use crate::api::{LedgerEntry, Sandbox, SandboxWarmPool};
use crate::controller::events::normal;
use crate::controller::outcome::{Outcome, Report};
use crate::controller::{Error, Result};
use crate::provider::labels::POOL_MEMBER;
use crate::registry::ProviderHandle;

use super::decide::{Member, Plan, member_names};
use super::{PoolContext, ledger, members};

/// What the steps act through.
pub struct On<'a> {
    /// The pool and where its status and Events go.
    pub r: &'a Report<'a, SandboxWarmPool>,
    /// The controller's state.
    pub pctx: &'a PoolContext,
    /// The pool's provider.
    pub handle: &'a ProviderHandle,
}

/// The UIDs of claimants whose Sandbox no longer exists. A member is only ever handed back
/// on proof, so the watch cache only spares reads: a claimant it shows alive (same UID) is
/// alive, and every other one is read directly before it counts as gone. A burst of claims
/// thus costs no read per claimant on every pool pass.
pub async fn gone_claimants(
    r: &Report<'_, SandboxWarmPool>,
    seen: &reflector::Store<Sandbox>,
    ledger: &[LedgerEntry],
) -> Result<BTreeSet<String>, Outcome> {
    let ns = r.object.namespace().unwrap_or_default();
    let api: Api<Sandbox> = Api::namespaced(r.ctx.client.clone(), &ns);
    let mut gone = BTreeSet::new();
    for c in ledger.iter().filter_map(|e| e.claimed_by.as_ref()) {
        let cached = seen.get(&ObjectRef::new(&c.name).within(&ns));
        if cached.and_then(|s| s.uid()).as_deref() == Some(c.uid.as_str()) {
            continue;
        }
        let live = api.get_opt(&c.name).await?;
        if live.and_then(|s| s.uid()).as_deref() != Some(c.uid.as_str()) {
            gone.insert(c.uid.clone());
        }
    }
    Ok(gone)
}

/// Runs the plan; `true` when anything was done (the report observes again).
pub async fn act(on: &On<'_>, plan: &Plan, all: &[Member], hash: &str) -> Result<bool, Outcome> {
    finish(on, &plan.finish).await?;
    retire(on, &plan.retire).await?;
    for id in &plan.start {
        let h = on.handle;
        h.upkeep("start", h.provider.start(id)).await?;
    }
    if plan.create > 0 {
        create(on, plan.create, all, hash).await?;
    }
    Ok(plan != &Plan::default())
}

/// Destroys the members of finished ledger entries, then drops the entries.
async fn finish(on: &On<'_>, ids: &[String]) -> Result<(), Outcome> {
    if ids.is_empty() {
        return Ok(());
    }
    destroy(on, ids).await?;
    ledger::change(&on.r.api, &on.r.object.name_any(), |_, l| {
        ledger::forget(l, ids).then_some(())
    })
    .await?;
    Ok(())
}

/// Records members as the pool's removals in the ledger, then destroys those it got (a claim
/// may have won one of them), then drops their entries.
pub async fn retire(on: &On<'_>, ids: &[String]) -> Result<(), Outcome> {
    if ids.is_empty() {
        return Ok(());
    }
    let taken = ledger::change(&on.r.api, &on.r.object.name_any(), |_, l| {
        let taken = ledger::retire(l, ids);
        (!taken.is_empty()).then_some(taken)
    })
    .await?;
    if let Some((taken, _)) = taken {
        on.r.ctx.failpoint("pool-after-retire-ledger");
        finish(on, &taken).await?;
        let msg = format!("removed unclaimed members {}", taken.join(", "));
        normal(on.r.ctx, on.r.object, "MembersRemoved", msg).await;
    }
    Ok(())
}

/// Destroys members (absent ones are a success).
async fn destroy(on: &On<'_>, ids: &[String]) -> Result<()> {
    let h = on.handle;
    try_join_all(
        ids.iter()
            .map(|id| h.upkeep("destroy", h.provider.destroy(id))),
    )
    .await?;
    Ok(())
}

/// Creates and starts `n` members of the current template, under the lowest free names.
async fn create(on: &On<'_>, n: usize, all: &[Member], hash: &str) -> Result<(), Outcome> {
    let pool = on.r.object;
    let desired = members::desired(&on.pctx.sctx, pool, on.handle, hash).await?;
    let existing: Vec<String> = all.iter().map(|m| m.name.clone()).collect();
    let names = member_names(&pool.uid().unwrap_or_default(), &existing, n);
    let h = on.handle;
    try_join_all(names.iter().map(|name| {
        let mut request = desired.request.clone();
        request.name = name.clone();
        request.labels.insert(POOL_MEMBER.into(), name.clone());
        async move {
            let made = h.upkeep("create", h.provider.create(&request)).await?;
            h.upkeep("start", h.provider.start(&made.id)).await?;
            Ok::<_, Error>(())
        }
    }))
    .await?;
    let msg = format!("created members {}", names.join(", "));
    normal(on.r.ctx, pool, "MembersCreated", msg).await;
    Ok(())
}
