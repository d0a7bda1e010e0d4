//! Cleanup: a deleted pool removes its unclaimed members (through the ledger, so a claim
//! racing the deletion keeps its member) and keeps its finalizer while Sandboxes hold
//! claimed members: its ledger is their proof of ownership.

use std::sync::Arc;

use kube::ResourceExt;
use kube::runtime::controller::Action;

use crate::api::{LedgerEntry, SandboxWarmPool};
use crate::controller::outcome::{MEMBERS_CLAIMED, Outcome, Report};
use crate::controller::{Error, Result};

use super::act::{self, On};
use super::{PoolContext, members};

/// The Cleanup half of the finalizer.
pub async fn cleanup(pool: Arc<SandboxWarmPool>, pctx: &PoolContext) -> Result<Action> {
    let r = Report::new(pctx.ctx.as_ref(), pool.as_ref(), None);
    let status = pool.status.clone().unwrap_or_default();
    match release(&r, pctx).await {
        Ok(()) => Ok(Action::await_change()),
        Err(Outcome::Failed { error, .. }) => Err(error),
        Err(held) => r.conclude(&status, status.clone(), held).await,
    }
}

/// Removes the unclaimed members and finishes the entries of gone claimants; `Err` is why
/// the finalizer stays.
async fn release(r: &Report<'_, SandboxWarmPool>, pctx: &PoolContext) -> Result<(), Outcome> {
    let pool = r.object;
    let Ok(handle) = super::provider(r.ctx, pool) else {
        // A pool whose provider was never configured made no members.
        return Ok(());
    };
    let on = On {
        r,
        pctx,
        handle: &handle,
    };
    let observed = members::observe(r.ctx, &handle, &pool.uid().unwrap_or_default())
        .await
        .map_err(|e| Outcome::cleanup_blocked("list the pool's members", e))?;
    let ledger = pool.status.clone().unwrap_or_default().ledger;
    let gone = act::gone_claimants(r, &pctx.sandboxes, &ledger).await?;
    let live = |e: &LedgerEntry| {
        e.claimed_by
            .as_ref()
            .is_some_and(|c| !gone.contains(&c.uid))
    };
    let unclaimed: Vec<String> = observed
        .iter()
        .map(|d| d.id.clone())
        .filter(|id| !ledger.iter().any(|e| &e.member == id && live(e)))
        .collect();
    act::retire(&on, &unclaimed).await?;
    let held: Vec<&LedgerEntry> = ledger.iter().filter(|e| live(e)).collect();
    if held.is_empty() {
        r.ctx.sightings.forget(&pool.uid().unwrap_or_default());
        return Ok(());
    }
    let names: Vec<String> = held
        .iter()
        .filter_map(|e| e.claimed_by.as_ref().map(|c| c.name.clone()))
        .collect();
    let message = format!(
        "unclaimed members removed; the deletion finishes when the Sandboxes holding claimed members are deleted: {}",
        names.join(", ")
    );
    Err(Outcome::Held {
        reason: MEMBERS_CLAIMED,
        error: Error::Dependency(message.clone()),
        message,
    })
}
