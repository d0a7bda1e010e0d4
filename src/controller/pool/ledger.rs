//! The pool's ledger: the one place a member's ownership moves. Every change is a read of
//! the pool and a write of its `status.ledger` that is refused when the ledger is no longer
//! the one read: a JSON patch that first tests the pool's UID and `status.ledgerRevision` as
//! read, raises the revision by one, and then makes just its change — entries removed by
//! index, entries appended (422 when the test fails). Every ledger write goes through here,
//! so an unchanged revision is an unchanged ledger, and the indexes the patch names are the
//! ones read. A ledger written before the revision existed is tested whole instead, once;
//! a pool with neither is written with the resourceVersion read (409 on any change). A
//! refused change is decided again on the fresh pool. Two Sandboxes can therefore never
//! take one member, and the pool can never remove a member a Sandbox has just taken: every
//! removal is a ledger entry first ([`retire`]).
//!
//! Why a revision, not the ledger itself: the test and the write then carried the whole
//! ledger twice, and a pool with many claimed members made every claim's write (and the API
//! server's work on it) grow with them. Why not the resourceVersion: the pool controller
//! writes the rest of status too, and with a resourceVersion check every such write sent
//! the claims' ledger writes of that moment back for a fresh read — in a burst of claims,
//! round after round of them. The test conflicts only with what the decision read.
//!
//! The ledger and its revision are written under their own field manager; the pool
//! controller's server-side applies of the rest of status never carry them (see
//! `Reported::for_apply`), so they cannot put back a stale copy. One operator writes at a
//! time (leader election), so no writer of an older version, which kept no revision, writes
//! beside one that tests it.

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

/// The write of `ledger` over `pool`'s: its change, tested against the revision read when
/// the pool has one; else the whole ledger, tested against the ledger read, or — with none
/// read — checked against the resourceVersion read. Each write leaves a revision.
fn patch(pool: &SandboxWarmPool, ledger: &[LedgerEntry]) -> Result<Patch<serde_json::Value>> {
    let status = pool.status.as_ref();
    let read = status.map(|s| s.ledger.as_slice()).unwrap_or_default();
    let revision = status.and_then(|s| s.ledger_revision);
    if revision.is_none() && read.is_empty() {
        return Ok(Patch::Merge(serde_json::json!({
            "metadata": { "resourceVersion": pool.resource_version() },
            "status": {
                "ledger": if ledger.is_empty() { None } else { Some(ledger) },
                "ledgerRevision": 1,
            },
        })));
    }
    let uid = serde_json::json!({ "op": "test", "path": "/metadata/uid", "value": pool.uid() });
    let ops = match revision {
        Some(n) => {
            let mut ops = vec![
                uid,
                serde_json::json!({ "op": "test", "path": "/status/ledgerRevision", "value": n }),
                serde_json::json!({ "op": "replace", "path": "/status/ledgerRevision", "value": n + 1 }),
            ];
            ops.extend(edits(read, ledger));
            ops
        }
        None => vec![
            uid,
            serde_json::json!({ "op": "test", "path": "/status/ledger", "value": read }),
            whole(ledger),
            serde_json::json!({ "op": "add", "path": "/status/ledgerRevision", "value": 1 }),
        ],
    };
    let ops = serde_json::from_value(serde_json::Value::Array(ops))
        .map_err(|e| Error::Kube(kube::Error::SerdeError(e)))?;
    Ok(Patch::Json(ops))
}

/// The operation that makes the ledger `ledger` whatever it held.
fn whole(ledger: &[LedgerEntry]) -> serde_json::Value {
    if ledger.is_empty() {
        serde_json::json!({ "op": "remove", "path": "/status/ledger" })
    } else {
        serde_json::json!({ "op": "add", "path": "/status/ledger", "value": ledger })
    }
}

/// The operations that turn `read` into `wanted`: the entries of `read` that `wanted` does
/// not keep (in order) removed by index, last first, then `wanted`'s new ones appended.
/// Any `wanted` can be reached that way — what is kept is a prefix of it — and the ledger's
/// edits only ever remove entries and append new ones, so that is also the smallest.
fn edits(read: &[LedgerEntry], wanted: &[LedgerEntry]) -> Vec<serde_json::Value> {
    if read.is_empty() || wanted.is_empty() {
        return if read.is_empty() && wanted.is_empty() {
            Vec::new()
        } else {
            vec![whole(wanted)]
        };
    }
    let mut kept = 0;
    let mut removed = Vec::new();
    for (i, entry) in read.iter().enumerate() {
        if wanted.get(kept) == Some(entry) {
            kept += 1;
        } else {
            removed.push(i);
        }
    }
    let removals = removed
        .iter()
        .rev()
        .map(|i| serde_json::json!({ "op": "remove", "path": format!("/status/ledger/{i}") }));
    let appends = wanted[kept..].iter().map(
        |entry| serde_json::json!({ "op": "add", "path": "/status/ledger/-", "value": entry }),
    );
    removals.chain(appends).collect()
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

    fn revised(ledger: Vec<LedgerEntry>, revision: i64) -> SandboxWarmPool {
        let mut pool = pool(ledger);
        if let Some(s) = pool.status.as_mut() {
            s.ledger_revision = Some(revision);
        }
        pool
    }

    /// The pool as the API server stores it after `patch` (a JSON patch applied to it).
    fn applied(pool: &SandboxWarmPool, patch: &Patch<serde_json::Value>) -> SandboxWarmPool {
        let Patch::Json(ops) = patch else {
            panic!("not a JSON patch")
        };
        let mut doc = serde_json::to_value(pool).unwrap();
        json_patch::patch(&mut doc, ops).unwrap();
        serde_json::from_value(doc).unwrap()
    }

    #[test]
    fn a_ledger_write_tests_the_revision_it_decided_on_and_carries_only_its_change() {
        let read: Vec<_> = ["a", "b", "c"].into_iter().map(entry).collect();
        let ops = json(
            &patch(
                &revised(read.clone(), 4),
                &[entry("a"), entry("c"), entry("d")],
            )
            .unwrap(),
        );
        assert_eq!(
            ops,
            serde_json::json!([
                { "op": "test", "path": "/metadata/uid", "value": "pool-uid" },
                { "op": "test", "path": "/status/ledgerRevision", "value": 4 },
                { "op": "replace", "path": "/status/ledgerRevision", "value": 5 },
                { "op": "remove", "path": "/status/ledger/1" },
                { "op": "add", "path": "/status/ledger/-", "value": { "member": "d" } },
            ])
        );
    }

    #[test]
    fn every_edit_of_a_revised_ledger_leaves_exactly_the_ledger_wanted() {
        let all: Vec<_> = ["a", "b", "c", "d"].into_iter().map(entry).collect();
        let claimed = LedgerEntry {
            claimed_by: Some(Claimant {
                name: "s".into(),
                uid: "u".into(),
            }),
            ..entry("b")
        };
        let wanted_ones: Vec<Vec<LedgerEntry>> = vec![
            vec![],
            all.clone(),
            vec![all[3].clone(), all[0].clone()],
            vec![all[1].clone(), all[2].clone(), entry("e")],
            vec![all[0].clone(), claimed, all[2].clone()],
            vec![entry("e"), entry("f")],
        ];
        for read in [Vec::new(), all.clone(), all[1..3].to_vec()] {
            for wanted in &wanted_ones {
                let before = revised(read.clone(), 9);
                let after = applied(&before, &patch(&before, wanted).unwrap());
                let status = after.status.unwrap();
                assert_eq!(&status.ledger, wanted, "from {read:?}");
                assert_eq!(status.ledger_revision, Some(10));
            }
        }
    }

    #[test]
    fn a_ledger_from_before_revisions_is_tested_whole_once_and_revised() {
        let read = vec![entry("a")];
        let before = pool(read.clone());
        let write = patch(&before, &[entry("a"), entry("b")]).unwrap();
        let ops = json(&write);
        assert_eq!(
            ops[1],
            serde_json::json!({ "op": "test", "path": "/status/ledger", "value": [{ "member": "a" }] })
        );
        let after = applied(&before, &write).status.unwrap();
        assert_eq!(after.ledger, vec![entry("a"), entry("b")]);
        assert_eq!(after.ledger_revision, Some(1));
        // Emptied: the field goes, still tested first.
        let ops = json(&patch(&before, &[]).unwrap());
        assert_eq!(
            ops[2],
            serde_json::json!({ "op": "remove", "path": "/status/ledger" })
        );
        assert_eq!(ops[1]["op"], "test");
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
