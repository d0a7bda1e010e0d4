//! The pool's ledger: the one place a member's ownership moves. Every change is a read of
//! the pool and a write of its `status.ledger` that carries the resourceVersion read, so the
//! API server refuses it (409) when anyone changed the pool meanwhile; the change is then
//! decided again on the fresh pool. Two Sandboxes can therefore never take one member, and
//! the pool can never remove a member a Sandbox has just taken.
//!
//! The ledger is written by merge patch under its own field manager; the pool controller's
//! server-side applies of the rest of status never carry it (see `Reported::for_apply`), so
//! they cannot put back a stale copy.

use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};

use crate::api::{LedgerEntry, SandboxWarmPool};
use crate::controller::{Error, Result};

/// The field manager of ledger writes.
pub const LEDGER_MANAGER: &str = "sandbox-operator-ledger";

/// How often a change is decided again after losing a race, before the pass gives up (and
/// is retried with backoff).
const ATTEMPTS: usize = 16;

/// Writes `ledger` into the pool read as `pool`; `None` when the pool changed since it was
/// read (409), else the pool as written.
pub async fn write(
    api: &Api<SandboxWarmPool>,
    pool: &SandboxWarmPool,
    ledger: &[LedgerEntry],
) -> Result<Option<SandboxWarmPool>> {
    let patch = serde_json::json!({
        "metadata": { "resourceVersion": pool.resource_version() },
        "status": { "ledger": if ledger.is_empty() { None } else { Some(ledger) } },
    });
    let params = PatchParams {
        field_manager: Some(LEDGER_MANAGER.into()),
        ..PatchParams::default()
    };
    match api
        .patch_status(&pool.name_any(), &params, &Patch::Merge(&patch))
        .await
    {
        Ok(written) => Ok(Some(written)),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(None),
        Err(e) => Err(Error::Kube(e)),
    }
}

/// Reads the pool `name` and applies `edit` to its ledger, again on a fresh read whenever
/// the write loses a race. `edit` returns `None` when there is nothing to change (nothing is
/// written), else what the change achieved; an edit that leaves the ledger as it was is not
/// written either. `Ok(None)` also when the pool does not exist.
pub async fn change<T>(
    api: &Api<SandboxWarmPool>,
    name: &str,
    edit: impl FnMut(&SandboxWarmPool, &mut Vec<LedgerEntry>) -> Option<T>,
) -> Result<Option<(T, SandboxWarmPool)>> {
    change_from(api, name, None, edit).await
}

/// [`change`], deciding the first attempt on `read` — the pool as the caller has just read
/// it — instead of reading it again: a claim saves a round trip, and a stale copy costs
/// nothing but the 409 that sends it to a fresh read.
pub async fn change_from<T>(
    api: &Api<SandboxWarmPool>,
    name: &str,
    mut read: Option<SandboxWarmPool>,
    mut edit: impl FnMut(&SandboxWarmPool, &mut Vec<LedgerEntry>) -> Option<T>,
) -> Result<Option<(T, SandboxWarmPool)>> {
    for _ in 0..ATTEMPTS {
        let pool = match read.take() {
            Some(pool) => pool,
            None => match api.get_opt(name).await? {
                Some(pool) => pool,
                None => return Ok(None),
            },
        };
        let before = pool.status.clone().unwrap_or_default().ledger;
        let mut ledger = before.clone();
        let Some(done) = edit(&pool, &mut ledger) else {
            return Ok(None);
        };
        if ledger == before {
            return Ok(Some((done, pool)));
        }
        if let Some(written) = write(api, &pool, &ledger).await? {
            return Ok(Some((done, written)));
        }
    }
    Err(Error::Provider(crate::provider::ProviderError::transient(
        format!(
            "the ledger of SandboxWarmPool {name:?} kept changing under {ATTEMPTS} attempts; retrying"
        ),
    )))
}

/// Records `members` as being removed by the pool (no claimant): after this no Sandbox can
/// take them. Those already in the ledger are left as they are (a claim won the race).
pub fn retire(ledger: &mut Vec<LedgerEntry>, members: &[String]) -> Vec<String> {
    let mut taken = Vec::new();
    for id in members {
        if ledger.iter().all(|e| &e.member != id) {
            ledger.push(LedgerEntry {
                member: id.clone(),
                claimed_by: None,
            });
            taken.push(id.clone());
        }
    }
    taken
}

/// Drops the entries of `members` (their members are destroyed).
pub fn forget(ledger: &mut Vec<LedgerEntry>, members: &[String]) -> bool {
    let before = ledger.len();
    ledger.retain(|e| !members.contains(&e.member));
    ledger.len() != before
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Claimant;

    #[test]
    fn retiring_never_takes_a_claimed_member() {
        let mut ledger = vec![LedgerEntry {
            member: "a".into(),
            claimed_by: Some(Claimant {
                name: "s".into(),
                uid: "u".into(),
            }),
        }];
        let taken = retire(&mut ledger, &["a".into(), "b".into()]);
        assert_eq!(taken, vec!["b".to_string()]);
        assert!(ledger[0].claimed_by.is_some());
        assert!(forget(&mut ledger, &["b".into()]));
        assert_eq!(ledger.len(), 1);
        assert!(!forget(&mut ledger, &["zz".into()]));
    }
}
