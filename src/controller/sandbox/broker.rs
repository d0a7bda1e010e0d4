//! The claim broker: claims of one pool that arrive together are served together, with one
//! listing of the pool's members and one ledger write for the whole batch (group commit).
//!
//! Why: every claim must move ownership through the pool's ledger by a
//! resourceVersion-checked write (see [`crate::controller::pool::ledger`]). Written claim by
//! claim, N claimants racing on one pool make N listings and N writes of which only one
//! wins each round: the others are refused (409), read the pool again and retry, so a burst
//! of 200 claims costs thousands of requests and most of them lose. Here the first claimant
//! of a pool to find no batch in flight becomes the batch's leader: it takes every claim
//! queued meanwhile, lists the members once, picks a distinct free member for each claimant,
//! and writes the ledger once. A single claim is a batch of one: no wait is added.
//!
//! The ledger stays the one authority: the batch's write carries the resourceVersion it
//! decided on, a 409 sends the whole batch to a fresh read, and a claimant whose UID the
//! ledger already names gets that member back rather than a second one. A leader whose pass
//! is cancelled drops its batch's replies; those claimants serve themselves next (their
//! reply channel is closed), so no claim waits forever.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kube::ResourceExt;
use kube::api::Api;
use tokio::sync::oneshot;

use crate::api::{Claimant, LedgerEntry, SandboxWarmPool};
use crate::controller::pool::{self, ledger, members};
use crate::controller::{Context, Error, Result};
use crate::provider::labels::{OWNER_UID, SPEC_HASH};
use crate::provider::{ProviderError, SandboxDescriptor, SandboxState};
use crate::registry::ProviderHandle;

/// One claimant's ask: a running member built to `spec_hash`.
#[derive(Debug, Clone)]
pub struct Ask {
    /// Who claims (the ledger entry names it).
    pub claimant: Claimant,
    /// The spec hash a member must carry to serve this claimant.
    pub spec_hash: String,
}

/// What a claim took: the member, and what the batch saw of it when it described it just
/// before the ledger write (the claim's pass then need not describe it again).
#[derive(Debug, Clone)]
pub struct Taken {
    /// The member's provider id.
    pub member: String,
    /// Its description, when the batch made one (a member picked from a sighting).
    pub seen: Option<SandboxDescriptor>,
}

/// The member a claim got (`None`: no free member; the claim is served cold).
type Answer = Result<Option<Taken>>;

/// A queued claim, where its answer goes, and where the member its batch means to give it
/// is told before the answer (see [`Broker::claim`]).
struct Queued {
    ask: Ask,
    reply: oneshot::Sender<Answer>,
    early: Mutex<Option<oneshot::Sender<String>>>,
}

/// The claims of one pool: those waiting, and the lock the batch leader holds.
#[derive(Default)]
struct Lane {
    waiting: Mutex<Vec<Queued>>,
    serving: tokio::sync::Mutex<()>,
}

/// The claim broker (one per Sandbox controller).
#[derive(Default)]
pub struct Broker {
    lanes: Mutex<HashMap<String, Arc<Lane>>>,
}

/// What a batch acts on: the pool (as its leader read it) and its provider.
pub struct PoolAt<'a> {
    /// The shared controller context (the pools' sightings).
    pub ctx: &'a Context,
    /// The pool's API (its namespace).
    pub api: &'a Api<SandboxWarmPool>,
    /// The pool as the claimant read it this pass: the batch decides its first attempt on it.
    pub read: &'a SandboxWarmPool,
    /// The pool's provider.
    pub handle: &'a ProviderHandle,
}

impl Broker {
    /// Claims a member for `ask`: the one the ledger already gives its claimant, else a free
    /// running member built to its spec hash, entered in the ledger; `None` when none is free.
    ///
    /// `early` is told the member the batch means to give the claimant as the ledger write
    /// that would make it so starts (when the batch picks from the pool's sighting), so the
    /// claimant can prepare it meanwhile. Only a preparation that is undone unless the
    /// answer names the same member: the write can still lose, and the answer decides.
    pub async fn claim(
        &self,
        at: &PoolAt<'_>,
        ask: Ask,
        early: Option<oneshot::Sender<String>>,
    ) -> Answer {
        let key = pool::identity(at.read);
        let lane = self.lane(&key);
        let answered = claim_in(&lane, at, ask, early).await;
        drop(lane);
        self.forget_if_idle(&key);
        answered
    }

    /// The lane under `key`, made when there is none.
    fn lane(&self, key: &str) -> Arc<Lane> {
        let mut lanes = lock(&self.lanes);
        lanes.entry(key.to_string()).or_default().clone()
    }

    /// Drops the lane under `key` once no claim holds it, so the map holds only the pools
    /// with claims in flight (pools come and go for as long as the operator runs). Checked
    /// under the map's lock, under which claims also take their lane: a claim holding it
    /// keeps it. A claim cancelled mid-way leaves its lane to the pool's next claim.
    fn forget_if_idle(&self, key: &str) {
        let mut lanes = lock(&self.lanes);
        if lanes.get(key).is_some_and(|l| Arc::strong_count(l) == 1) {
            lanes.remove(key);
        }
    }
}

/// One claim through `lane`: queued, then answered by the batch that took it, or leading
/// the next batch itself.
async fn claim_in(
    lane: &Lane,
    at: &PoolAt<'_>,
    ask: Ask,
    early: Option<oneshot::Sender<String>>,
) -> Answer {
    let (reply, mut answer) = oneshot::channel();
    lock(&lane.waiting).push(Queued {
        ask: ask.clone(),
        reply,
        early: Mutex::new(early),
    });
    let _serving = lane.serving.lock().await;
    match answer.try_recv() {
        Ok(answered) => return answered,
        // Our batch's leader was cancelled after taking it: serve ourselves.
        Err(oneshot::error::TryRecvError::Closed) => {
            let (reply, _) = oneshot::channel();
            let alone = [Queued {
                ask,
                reply,
                early: Mutex::default(),
            }];
            return serve(at, &alone).await?.pop().unwrap_or_else(unanswered);
        }
        Err(oneshot::error::TryRecvError::Empty) => {}
    }
    let batch: Vec<Queued> = std::mem::take(&mut *lock(&lane.waiting));
    let answers = match serve(at, &batch).await {
        Ok(answers) => answers,
        Err(e) => batch.iter().map(|_| Err(copy(&e))).collect(),
    };
    for (queued, answered) in batch.into_iter().zip(answers) {
        let _ = queued.reply.send(answered);
    }
    answer.try_recv().unwrap_or_else(|_| unanswered())
}

/// Serves a batch: candidates from the pool's last sighting, or — when the sighting cannot
/// serve every claimant — one listing of the members; then one ledger write of every
/// assignment (decided again on a fresh read whenever the write loses a race). One answer
/// per claim.
///
/// Sighted candidates are described while the ledger write is under way, not before it (a
/// describe is an engine round trip on every claim's path): a candidate that no longer runs
/// as sighted has its entry taken back before the batch is served from a listing, which
/// gives the claimants the ledger still names their members back. A batch that got members
/// from the sighting for only some claimants is served from a listing the same way.
async fn serve(at: &PoolAt<'_>, batch: &[Queued]) -> Result<Vec<Answer>> {
    if let Some(candidates) = sighted(at, batch) {
        foretell(at, batch, &candidates);
        let (described, picked) = tokio::join!(
            describe(at, batch, &candidates),
            commit(at, batch, &candidates)
        );
        let picked = picked?;
        let gone: Vec<String> = candidates
            .iter()
            .filter(|c| described.iter().all(|d| d.id != c.id))
            .map(|c| c.id.clone())
            .collect();
        if gone.is_empty() && picked.iter().all(Option::is_some) {
            return Ok(answers(picked, Some(&described)));
        }
        take_back(at, batch, &gone).await?;
    }
    let pool_uid = at.read.uid().unwrap_or_default();
    let found = members::observe(at.ctx, at.handle, &pool_uid).await?;
    let picked = commit(at, batch, &found).await?;
    Ok(answers(picked, None))
}

/// Tells the claimant of a batch of one, when it asked to know early (see
/// [`Broker::claim`]), the member the batch's first decision — [`commit`]'s, on the same
/// read ledger and candidates — gives it. Not the claimants of a larger batch: there they
/// would prepare their members all at once, competing for the engine with each other and
/// with the refill, while their one ledger write would not wait for them anyway. Measured on
/// Docker, 200 claims at once: 3.4 s to all Ready without, 14.7–16.6 s with.
fn foretell(at: &PoolAt<'_>, batch: &[Queued], found: &[SandboxDescriptor]) {
    if batch.len() != 1 {
        return;
    }
    let mut entries = at
        .read
        .status
        .as_ref()
        .map(|s| s.ledger.clone())
        .unwrap_or_default();
    for q in batch {
        let member = assign(found, &q.ask, &mut entries);
        if let (Some(member), Some(early)) = (member, lock(&q.early).take()) {
            let _ = early.send(member);
        }
    }
}

/// Removes the ledger entries that give the batch's claimants one of `members` (candidates
/// that no longer run as sighted); nothing when `members` is empty.
async fn take_back(at: &PoolAt<'_>, batch: &[Queued], members: &[String]) -> Result<()> {
    if members.is_empty() {
        return Ok(());
    }
    let claimants: Vec<&str> = batch.iter().map(|q| q.ask.claimant.uid.as_str()).collect();
    ledger::change(at.api, &at.read.name_any(), |_, entries| {
        unassign(entries, members, &claimants);
        Some(())
    })
    .await?;
    Ok(())
}

/// Drops the entries that give one of `claimants` one of `members`; others stay.
fn unassign(entries: &mut Vec<LedgerEntry>, members: &[String], claimants: &[&str]) {
    entries.retain(|e| {
        let ours = e
            .claimed_by
            .as_ref()
            .is_some_and(|c| claimants.contains(&c.uid.as_str()));
        !(ours && members.contains(&e.member))
    });
}

/// Writes the batch's assignments from `found` into the ledger: the member each claimant
/// got, `None` for those that got none (or all, when the pool is gone).
async fn commit(
    at: &PoolAt<'_>,
    batch: &[Queued],
    found: &[SandboxDescriptor],
) -> Result<Vec<Option<String>>> {
    let name = at.read.name_any();
    let changed = ledger::change_from(at.api, &name, Some(at.read.clone()), |_, entries| {
        let picked: Vec<Option<String>> = batch
            .iter()
            .map(|q| assign(found, &q.ask, entries))
            .collect();
        Some(picked)
    })
    .await?;
    Ok(match changed {
        Some((picked, _)) => picked,
        // The pool is gone: nothing to claim from.
        None => vec![None; batch.len()],
    })
}

/// One answer per pick, carrying the member's description when `seen` holds one.
fn answers(picked: Vec<Option<String>>, seen: Option<&[SandboxDescriptor]>) -> Vec<Answer> {
    let described = |id: &str| seen.and_then(|s| s.iter().find(|d| d.id == id)).cloned();
    picked
        .into_iter()
        .map(|p| {
            Ok(p.map(|member| Taken {
                seen: described(&member),
                member,
            }))
        })
        .collect()
}

/// Candidates for the batch from the pool's last sighting (see
/// [`crate::controller::pool::sightings`]): as many free claimable members as the batch
/// has claimants, as sighted. `None` when the sighting cannot serve the batch — none
/// recorded, or too few free members in it — so the batch lists the members instead.
fn sighted(at: &PoolAt<'_>, batch: &[Queued]) -> Option<Vec<SandboxDescriptor>> {
    let pool_uid = at.read.uid()?;
    let sighting = at.ctx.sightings.of(&pool_uid)?;
    let ledger = at
        .read
        .status
        .as_ref()
        .map(|s| s.ledger.as_slice())
        .unwrap_or_default();
    let free: Vec<&SandboxDescriptor> = sighting
        .iter()
        .filter(|d| claimable_by_any(d, batch) && ledger.iter().all(|e| e.member != d.id))
        .collect();
    let ids: Vec<&str> = free.iter().map(|d| d.id.as_str()).collect();
    let first = batch.first()?;
    let mut picks: Vec<SandboxDescriptor> = Vec::with_capacity(batch.len());
    for _ in batch {
        let p = pick(&ids, &first.ask.claimant.uid, |id| {
            picks.iter().any(|t| t.id == id)
        })?;
        let sighted = free.iter().find(|d| d.id == p)?;
        picks.push((*sighted).clone());
    }
    Some(picks)
}

/// The candidates that still run as sighted, each described now: claimable by the batch
/// and carrying the pool's owner-uid label. One that cannot be described is left out.
async fn describe(
    at: &PoolAt<'_>,
    batch: &[Queued],
    candidates: &[SandboxDescriptor],
) -> Vec<SandboxDescriptor> {
    let h = at.handle;
    let pool_uid = at.read.uid().unwrap_or_default();
    let described = futures::future::join_all(
        candidates
            .iter()
            .map(|c| h.call("describe", h.provider.describe(&c.id))),
    )
    .await;
    described
        .into_iter()
        .filter_map(|d| d.ok().flatten())
        .filter(|d| claimable_by_any(d, batch) && owned_by_pool(d, &pool_uid))
        .collect()
}

/// Whether some claimant of the batch could take `d`.
fn claimable_by_any(d: &SandboxDescriptor, batch: &[Queued]) -> bool {
    batch.iter().any(|q| claimable(d, &q.ask.spec_hash))
}

/// Whether a described member carries the pool's owner-uid label.
fn owned_by_pool(d: &SandboxDescriptor, pool_uid: &str) -> bool {
    d.labels.get(OWNER_UID).map(String::as_str) == Some(pool_uid)
}

/// The member for one claimant: the ledger's entry for it, else a free claimable member
/// (entered into `entries`), else none.
fn assign(
    found: &[SandboxDescriptor],
    ask: &Ask,
    entries: &mut Vec<LedgerEntry>,
) -> Option<String> {
    let uid = &ask.claimant.uid;
    if let Some(e) = entries
        .iter()
        .find(|e| e.claimed_by.as_ref().is_some_and(|c| &c.uid == uid))
    {
        return Some(e.member.clone());
    }
    let ready: Vec<&str> = found
        .iter()
        .filter(|d| claimable(d, &ask.spec_hash))
        .map(|d| d.id.as_str())
        .collect();
    let member = pick(&ready, uid, |id| entries.iter().any(|e| e.member == id))?;
    entries.push(LedgerEntry {
        member: member.clone(),
        claimed_by: Some(ask.claimant.clone()),
    });
    Some(member)
}

/// A member a claim can take: running, built to `spec_hash`.
fn claimable(d: &SandboxDescriptor, spec_hash: &str) -> bool {
    d.state == SandboxState::Running
        && d.labels.get(SPEC_HASH).map(String::as_str) == Some(spec_hash)
}

/// The free member a claimant tries first: claimants start at different places in the list
/// (by their UID), so claims decided apart (by two passes) rarely want the same one.
fn pick(ready: &[&str], uid: &str, in_ledger: impl Fn(&str) -> bool) -> Option<String> {
    let start = uid
        .bytes()
        .fold(0usize, |h, b| h.wrapping_mul(31).wrapping_add(b.into()));
    let n = ready.len();
    (0..n)
        .map(|i| ready[(start + i) % n])
        .find(|id| !in_ledger(id))
        .map(str::to_string)
}

/// A claim that got no answer (cannot happen: a batch answers every claim it took). An
/// error rather than "none free", which would create a sandbox cold beside a member the
/// ledger may give it: the next pass finds that entry.
fn unanswered() -> Answer {
    Err(Error::Provider(ProviderError::transient(
        "a claim got no answer from its batch; retrying",
    )))
}

/// The same error for every claimant of a failed batch (each reports it on its own object).
fn copy(e: &Error) -> Error {
    Error::Provider(ProviderError::transient(format!("claiming a member: {e}")))
}

/// A std mutex's guard; a poisoned one (a panic while held) is still consistent here: its
/// data is a queue of claims or a map of lanes, each change of which is one push or take.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::StartedAt;

    fn member(id: &str, state: SandboxState, hash: &str) -> SandboxDescriptor {
        SandboxDescriptor {
            labels: [(SPEC_HASH.to_string(), hash.to_string())].into(),
            started_at: StartedAt::Unknown,
            ..SandboxDescriptor::bare(id, state)
        }
    }

    fn ask(uid: &str) -> Ask {
        Ask {
            claimant: Claimant {
                name: format!("s-{uid}"),
                uid: uid.into(),
            },
            spec_hash: "h".into(),
        }
    }

    #[test]
    fn a_lane_is_kept_while_a_claim_holds_it_and_forgotten_after() {
        let broker = Broker::default();
        let held = broker.lane("ns/p/u");
        broker.forget_if_idle("ns/p/u");
        assert!(
            Arc::ptr_eq(&held, &broker.lane("ns/p/u")),
            "a held lane stays"
        );
        drop(held);
        broker.forget_if_idle("ns/p/u");
        assert!(lock(&broker.lanes).is_empty(), "an idle lane is dropped");
    }

    #[test]
    fn a_batch_gives_each_claimant_a_distinct_member_and_no_more_than_there_are() {
        let found = vec![
            member("a", SandboxState::Running, "h"),
            member("b", SandboxState::Running, "h"),
            member("c", SandboxState::Stopped, "h"),
            member("d", SandboxState::Running, "other"),
        ];
        let mut entries = Vec::new();
        let picked: Vec<_> = ["u1", "u2", "u3"]
            .iter()
            .map(|u| assign(&found, &ask(u), &mut entries))
            .collect();
        let given: Vec<_> = picked.iter().flatten().cloned().collect();
        assert_eq!(given.len(), 2, "{picked:?}");
        assert_ne!(given[0], given[1]);
        assert!(given.iter().all(|m| m == "a" || m == "b"), "{given:?}");
        assert_eq!(entries.len(), 2);
    }

    #[test]
    fn a_claimant_the_ledger_names_gets_its_member_back_not_a_second_one() {
        let found = vec![
            member("a", SandboxState::Running, "h"),
            member("b", SandboxState::Running, "h"),
        ];
        let mut entries = vec![LedgerEntry {
            member: "b".into(),
            claimed_by: Some(ask("u1").claimant),
        }];
        assert_eq!(assign(&found, &ask("u1"), &mut entries), Some("b".into()));
        assert_eq!(entries.len(), 1);
    }

    #[test]
    fn a_candidate_that_no_longer_runs_is_taken_back_from_its_claimant_only() {
        let entry = |member: &str, uid: Option<&str>| LedgerEntry {
            member: member.into(),
            claimed_by: uid.map(|u| ask(u).claimant),
        };
        let mut entries = vec![
            entry("a", Some("u1")),
            entry("b", Some("u2")),
            entry("c", Some("other")),
            entry("d", None),
        ];
        let gone = ["a".to_string(), "c".to_string(), "d".to_string()];
        unassign(&mut entries, &gone, &["u1", "u2"]);
        let left: Vec<&str> = entries.iter().map(|e| e.member.as_str()).collect();
        assert_eq!(
            left,
            ["b", "c", "d"],
            "only u1's entry for a gone member goes"
        );
    }

    #[test]
    fn a_claim_never_picks_a_member_in_the_ledger_and_spreads_claimants() {
        let ready = ["a", "b", "c"];
        let taken = |id: &str| id == "a" || id == "b";
        assert_eq!(pick(&ready, "u1", taken), Some("c".to_string()));
        assert_eq!(pick(&ready, "u1", |_| true), None);
        let firsts: std::collections::BTreeSet<_> = (0..20)
            .filter_map(|i| pick(&ready, &format!("uid-{i}"), |_| false))
            .collect();
        assert!(firsts.len() > 1, "{firsts:?}");
    }
}
