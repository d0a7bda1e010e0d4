//! Decide (pure): the pool's members, its ledger and its spec → what to create, start and
//! remove. Free of I/O so the fill, scale and roll policy is table-tested below.
//!
//! The policy:
//! - Members in the ledger are not the pool's to count or touch: claimed ones belong to
//!   their Sandboxes, and entries without a claimant are removals in flight.
//! - `replicas` unclaimed members of the current template are wanted, running. Missing ones
//!   are created (and started); never-started ones are started; exited ones are replaced.
//! - A template change rolls without losing capacity: members of older templates are
//!   removed once `replicas` current ones run (all at once when `replicas` is 0); new ones
//!   are made first. Surplus current members (a scale-down) go too, idle ones first.
//! - A ledger entry whose claimant Sandbox is gone hands its member back for removal; one
//!   without a claimant is finished (member destroyed, entry dropped).

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};

use crate::api::LedgerEntry;
use crate::provider::SandboxState;

/// One member as the provider reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Provider id.
    pub id: String,
    /// Coarse state.
    pub state: SandboxState,
    /// Whether it ever started (a never-started member is still being made).
    pub has_run: bool,
    /// Its pool-template-hash label.
    pub template_hash: Option<String>,
    /// Creation time, when known.
    pub created_at: Option<DateTime<Utc>>,
    /// Its name (`sbxwp-<pool uid>-<k>`, which [`member_names`] hands out).
    pub name: String,
}

/// What the pool controller does in one pass.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// How many new members to create.
    pub create: usize,
    /// Unclaimed members to start.
    pub start: Vec<String>,
    /// Unclaimed members to remove (recorded in the ledger first, then destroyed).
    pub retire: Vec<String>,
    /// Ledger entries to finish: destroy the member, then drop the entry.
    pub finish: Vec<String>,
}

/// The counts status reports (see `SandboxWarmPoolStatus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counts {
    /// Unclaimed members.
    pub replicas: usize,
    /// Unclaimed current members that run.
    pub ready: usize,
    /// Unclaimed current members.
    pub updated: usize,
    /// Claimed members.
    pub claimed: usize,
}

/// Whether the member is unclaimed and built from `hash`.
fn current(m: &Member, hash: &str) -> bool {
    m.template_hash.as_deref() == Some(hash)
}

/// Exited by itself: stopped after a run. Such a member cannot be claimed; it is replaced.
fn exited(m: &Member) -> bool {
    m.state == SandboxState::Stopped && m.has_run
}

/// The unclaimed members: those the ledger does not name.
fn unclaimed<'a>(members: &'a [Member], ledger: &[LedgerEntry]) -> Vec<&'a Member> {
    let named: BTreeSet<&str> = ledger.iter().map(|e| e.member.as_str()).collect();
    members
        .iter()
        .filter(|m| !named.contains(m.id.as_str()))
        .collect()
}

/// The counts, for status.
pub fn counts(members: &[Member], ledger: &[LedgerEntry], hash: &str) -> Counts {
    let free = unclaimed(members, ledger);
    let updated: Vec<_> = free.iter().filter(|m| current(m, hash)).collect();
    Counts {
        replicas: free.len(),
        ready: updated
            .iter()
            .filter(|m| m.state == SandboxState::Running)
            .count(),
        updated: updated.len(),
        claimed: ledger.iter().filter(|e| e.claimed_by.is_some()).count(),
    }
}

/// The ids of the members a claim can take now: unclaimed, current, running.
pub fn claimable<'a>(members: &'a [Member], ledger: &[LedgerEntry], hash: &str) -> Vec<&'a str> {
    unclaimed(members, ledger)
        .into_iter()
        .filter(|m| current(m, hash) && m.state == SandboxState::Running)
        .map(|m| m.id.as_str())
        .collect()
}

/// Decides the pass. `claimant_gone` says, for a claimed entry, that its Sandbox no longer
/// exists (read directly, never guessed).
pub fn decide(
    members: &[Member],
    ledger: &[LedgerEntry],
    replicas: usize,
    hash: &str,
    claimant_gone: impl Fn(&LedgerEntry) -> bool,
) -> Plan {
    let free = unclaimed(members, ledger);
    let (fresh, old): (Vec<&Member>, Vec<&Member>) =
        free.into_iter().partition(|m| current(m, hash));
    let (broken, mut healthy): (Vec<&Member>, Vec<&Member>) =
        fresh.into_iter().partition(|m| exited(m));
    // Surplus goes idle ones first, newest first: the running and oldest stay.
    healthy.sort_by_key(|m| {
        (
            m.state == SandboxState::Running,
            std::cmp::Reverse(m.created_at),
        )
    });
    let surplus = healthy.len().saturating_sub(replicas);
    let mut retire: Vec<String> = healthy.drain(..surplus).map(|m| m.id.clone()).collect();
    retire.extend(broken.iter().map(|m| m.id.clone()));
    let running = healthy
        .iter()
        .filter(|m| m.state == SandboxState::Running)
        .count();
    let rolled = running >= replicas;
    retire.extend(
        old.iter()
            .filter(|m| rolled || m.state != SandboxState::Running)
            .map(|m| m.id.clone()),
    );
    retire.sort();
    Plan {
        create: replicas.saturating_sub(healthy.len()),
        start: healthy
            .iter()
            .filter(|m| !m.has_run && m.state != SandboxState::Running)
            .map(|m| m.id.clone())
            .collect(),
        retire,
        finish: ledger
            .iter()
            .filter(|e| e.claimed_by.is_none() || claimant_gone(e))
            .map(|e| e.member.clone())
            .collect(),
    }
}

/// Names for `n` new members of the pool with `pool_uid`: `sbxwp-<uid>-<k>` with the lowest
/// `k` no existing member uses. Deterministic from what the provider holds, so a pass that
/// crashed after a create finds the member instead of making a second one under another
/// name (a create of a taken name fails as a conflict).
pub fn member_names(pool_uid: &str, existing: &[String], n: usize) -> Vec<String> {
    let taken: BTreeSet<&str> = existing.iter().map(String::as_str).collect();
    (0..)
        .map(|k| format!("sbxwp-{pool_uid}-{k}"))
        .filter(|name| !taken.contains(name.as_str()))
        .take(n)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Claimant;

    fn m(id: &str, state: SandboxState, hash: &str) -> Member {
        Member {
            id: id.into(),
            state,
            has_run: state != SandboxState::Creating,
            template_hash: Some(hash.into()),
            created_at: None,
            name: id.into(),
        }
    }

    fn claimed(id: &str, uid: &str) -> LedgerEntry {
        LedgerEntry {
            member: id.into(),
            claimed_by: Some(Claimant {
                name: "s".into(),
                uid: uid.into(),
            }),
        }
    }

    const R: SandboxState = SandboxState::Running;

    #[test]
    fn an_empty_pool_is_filled() {
        let plan = decide(&[], &[], 3, "h", |_| false);
        assert_eq!(plan.create, 3);
        assert!(plan.retire.is_empty());
    }

    #[test]
    fn a_claim_is_refilled_and_the_claimed_member_is_left_alone() {
        let members = [m("a", R, "h"), m("b", R, "h")];
        let ledger = [claimed("a", "u1")];
        let plan = decide(&members, &ledger, 2, "h", |_| false);
        assert_eq!(plan.create, 1);
        assert!(plan.retire.is_empty() && plan.finish.is_empty());
        let c = counts(&members, &ledger, "h");
        assert_eq!((c.replicas, c.ready, c.claimed), (1, 1, 1));
    }

    #[test]
    fn scale_down_removes_surplus_idle_members_first() {
        let mut idle = m("c", SandboxState::Creating, "h");
        idle.has_run = false;
        let plan = decide(&[m("a", R, "h"), m("b", R, "h"), idle], &[], 2, "h", |_| {
            false
        });
        assert_eq!(plan.retire, vec!["c".to_string()]);
        assert_eq!(plan.create, 0);
    }

    #[test]
    fn a_roll_keeps_old_members_until_the_new_ones_run() {
        let old = [m("a", R, "old"), m("b", R, "old")];
        let plan = decide(&old, &[], 2, "new", |_| false);
        assert_eq!((plan.create, plan.retire.len()), (2, 0));
        let mut starting = m("c", SandboxState::Creating, "new");
        starting.has_run = false;
        let half = [
            m("a", R, "old"),
            m("b", R, "old"),
            starting,
            m("d", R, "new"),
        ];
        let plan = decide(&half, &[], 2, "new", |_| false);
        assert_eq!((plan.create, plan.retire.len()), (0, 0));
        assert_eq!(plan.start, vec!["c".to_string()]);
        let done = [
            m("a", R, "old"),
            m("b", R, "old"),
            m("c", R, "new"),
            m("d", R, "new"),
        ];
        let plan = decide(&done, &[], 2, "new", |_| false);
        assert_eq!(plan.retire, vec!["a".to_string(), "b".to_string()]);
    }

    #[test]
    fn claimed_members_of_an_old_template_are_never_rolled() {
        let members = [m("a", R, "old"), m("b", R, "new")];
        let plan = decide(&members, &[claimed("a", "u1")], 1, "new", |_| false);
        assert!(plan.retire.is_empty(), "{plan:?}");
    }

    #[test]
    fn exited_members_are_replaced() {
        let plan = decide(&[m("a", SandboxState::Stopped, "h")], &[], 1, "h", |_| {
            false
        });
        assert_eq!(
            (plan.create, plan.retire.clone()),
            (1, vec!["a".to_string()])
        );
    }

    #[test]
    fn entries_of_gone_claimants_and_removals_in_flight_are_finished() {
        let ledger = [
            claimed("a", "live"),
            claimed("b", "gone"),
            LedgerEntry {
                member: "c".into(),
                claimed_by: None,
            },
        ];
        let gone = |e: &LedgerEntry| e.claimed_by.as_ref().is_some_and(|c| c.uid == "gone");
        let plan = decide(&[], &ledger, 0, "h", gone);
        assert_eq!(plan.finish, vec!["b".to_string(), "c".to_string()]);
    }

    #[test]
    fn member_names_are_the_lowest_free_indexes() {
        let existing = vec!["sbxwp-u-0".to_string(), "sbxwp-u-2".to_string()];
        assert_eq!(
            member_names("u", &existing, 2),
            vec!["sbxwp-u-1".to_string(), "sbxwp-u-3".to_string()]
        );
    }
}
