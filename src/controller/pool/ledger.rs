//! The pool's ledger: the one place a member's ownership moves. Every change is a read of
//! the pool and a write of its `status.ledger` that is refused when the ledger is no longer
//! the one read: a JSON patch that first tests the pool's UID and the whole ledger as read
//! (422 when either changed), or — for a pool with no ledger yet, where there is nothing to
//! test — a merge patch carrying the resourceVersion read (409 on any change). A refused
//! change is decided again on the fresh pool. Two Sandboxes can therefore never take one
//! member, and the pool can never remove a member a Sandbox has just taken: every removal
//! is a ledger entry first ([`retire`]).
//!
//! Why not the resourceVersion always: the pool controller writes the rest of status too,
//! and with a resourceVersion check every such write sent the claims' ledger writes of that
//! moment back for a fresh read — in a burst of claims, round after round of them. The test
//! conflicts only with what the decision read: the ledger.
//!
//! The ledger is written under its own field manager; the pool controller's server-side
//! applies of the rest of status never carry it (see `Reported::for_apply`), so they cannot
//! put back a stale copy.

use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};

use crate::api::{LedgerEntry, SandboxWarmPool};
use crate::controller::{Error, Result};

/// The field manager of ledger writes.
pub const LEDGER_MANAGER: &str = "sandbox-operator-ledger";

/// How often a change is decided again after losing a race, before the pass gives up (and
/// is retried with backoff).
const ATTEMPTS: usize = 16;

/// Writes `ledger` into the pool read as `pool`; `None` when the pool's ledger (or, with
/// none, the pool) changed since it was read, else the pool as written.
pub async fn write(
    api: &Api<SandboxWarmPool>,
    pool: &SandboxWarmPool,
    ledger: &[LedgerEntry],
) -> Result<Option<SandboxWarmPool>> {
    let params = PatchParams {
        field_manager: Some(LEDGER_MANAGER.into()),
        ..PatchParams::default()
    };
    let patch = patch(pool, ledger)?;
    match api.patch_status(&pool.name_any(), &params, &patch).await {
        Ok(written) => Ok(Some(written)),
        Err(kube::Error::Api(s)) if lost_race(&s) => Ok(None),
        Err(e) => Err(Error::Kube(e)),
    }
}

/// The write of `ledger` over `pool`'s: tested against the ledger read when it has one,
/// else checked against the resourceVersion read.
fn patch(pool: &SandboxWarmPool, ledger: &[LedgerEntry]) -> Result<Patch<serde_json::Value>> {
    let read = pool.status.as_ref().map(|s| &s.ledger);
    let Some(read) = read.filter(|l| !l.is_empty()) else {
        return Ok(Patch::Merge(serde_json::json!({
            "metadata": { "resourceVersion": pool.resource_version() },
            "status": { "ledger": if ledger.is_empty() { None } else { Some(ledger) } },
        })));
    };
    let write = if ledger.is_empty() {
        serde_json::json!({ "op": "remove", "path": "/status/ledger" })
    } else {
        serde_json::json!({ "op": "replace", "path": "/status/ledger", "value": ledger })
    };
    let ops = serde_json::json!([
        { "op": "test", "path": "/metadata/uid", "value": pool.uid() },
        { "op": "test", "path": "/status/ledger", "value": read },
        write,
    ]);
    let ops = serde_json::from_value(ops).map_err(|e| Error::Kube(kube::Error::SerdeError(e)))?;
    Ok(Patch::Json(ops))
}

/// Whether a refused write lost a race: 409 for a stale resourceVersion; 422 without causes
/// for a failed test (the API server names no field then — a schema refusal does).
fn lost_race(s: &kube::core::Status) -> bool {
    let causes = s.details.as_ref().map_or(0, |d| d.causes.len());
    s.code == 409 || (s.code == 422 && causes == 0)
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
    use crate::api::{Claimant, SandboxWarmPoolStatus};

    fn entry(member: &str) -> LedgerEntry {
        LedgerEntry {
            member: member.into(),
            claimed_by: None,
        }
    }

    fn pool(ledger: Vec<LedgerEntry>) -> SandboxWarmPool {
        let mut pool = SandboxWarmPool::new("p", Default::default());
        pool.metadata.uid = Some("pool-uid".into());
        pool.metadata.resource_version = Some("7".into());
        pool.status = Some(SandboxWarmPoolStatus {
            ledger,
            ..Default::default()
        });
        pool
    }

    fn json(patch: &Patch<serde_json::Value>) -> serde_json::Value {
        match patch {
            Patch::Json(ops) => serde_json::to_value(ops).unwrap(),
            Patch::Merge(v) => serde_json::json!({ "merge": v }),
            _ => panic!("unexpected patch kind"),
        }
    }

    #[test]
    fn a_ledger_write_tests_the_pool_and_the_ledger_it_decided_on() {
        let read = vec![entry("a")];
        let ops = json(&patch(&pool(read.clone()), &[entry("a"), entry("b")]).unwrap());
        assert_eq!(
            ops,
            serde_json::json!([
                { "op": "test", "path": "/metadata/uid", "value": "pool-uid" },
                { "op": "test", "path": "/status/ledger", "value": [{ "member": "a" }] },
                { "op": "replace", "path": "/status/ledger",
                  "value": [{ "member": "a" }, { "member": "b" }] },
            ])
        );
        // Emptied: the field goes, still tested first.
        let ops = json(&patch(&pool(read), &[]).unwrap());
        assert_eq!(
            ops[2],
            serde_json::json!({ "op": "remove", "path": "/status/ledger" })
        );
        assert_eq!(ops[1]["op"], "test");
    }

    #[test]
    fn a_first_entry_is_checked_against_the_resource_version() {
        let merge = json(&patch(&pool(Vec::new()), &[entry("a")]).unwrap());
        assert_eq!(merge["merge"]["metadata"]["resourceVersion"], "7");
        assert_eq!(merge["merge"]["status"]["ledger"][0]["member"], "a");
    }

    #[test]
    fn only_a_stale_read_counts_as_a_lost_race() {
        // As the API server words them: a failed test has no details; a schema refusal
        // names the field.
        let status = |code: u16, causes: usize| -> kube::core::Status {
            let causes: Vec<_> = (0..causes)
                .map(|_| serde_json::json!({ "field": "status.ledger", "reason": "FieldValueInvalid" }))
                .collect();
            serde_json::from_value(serde_json::json!({
                "status": "Failure", "code": code, "reason": "Invalid",
                "message": "the server rejected our request due to an error in our request",
                "details": { "causes": causes },
            }))
            .unwrap()
        };
        assert!(lost_race(&status(409, 0)));
        assert!(lost_race(&status(422, 0)), "a failed test");
        assert!(
            !lost_race(&status(422, 1)),
            "a schema refusal names its field"
        );
        assert!(!lost_race(&status(500, 0)));
    }

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
