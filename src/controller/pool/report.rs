//! Report: the pool's counts (observed again after acting) and whether it is Ready, still
//! filling or rolling, or past its progress deadline.

use chrono::{DateTime, Utc};
use kube::ResourceExt;

use crate::api::{Condition, SandboxWarmPoolStatus, condition};
use crate::controller::outcome::Outcome;
use crate::controller::status::{RECONCILING, STALLED};
use crate::provider::SandboxDescriptor;

use super::act::On;
use super::decide::{Counts, claimable, counts};
use super::{WAIT, members};

/// The reason a pool stalls with when a fill or roll outlives its deadline.
pub const DEADLINE_EXCEEDED: &str = "ProgressDeadlineExceeded";

/// Deadline when `spec.progressDeadlineSeconds` is omitted.
const DEFAULT_DEADLINE_SECONDS: i64 = 600;

/// Counts the members into status — as observed before acting (`seen`), or observed again
/// when the pass acted; Ready when `replicas` current members run and no older ones are
/// left. Each member a claim can take gets processes waiting in it (see `registry::warm`),
/// so a claim's environment delivery and first command do not wait for a runtime exec; a
/// member counts as ready once they are started (or could not be), so claims that follow
/// the pool's readiness do not compete with those starts.
pub async fn report(
    on: &On<'_>,
    acted: bool,
    seen: Vec<SandboxDescriptor>,
    hash: &str,
    next: &mut SandboxWarmPoolStatus,
) -> Result<Outcome, Outcome> {
    let pool = on.r.object;
    let observed = match acted {
        false => seen,
        true => {
            if let Some(fresh) = on.r.api.get_opt(&pool.name_any()).await? {
                next.ledger = fresh.status.unwrap_or_default().ledger;
            }
            members::observe(on.r.ctx, on.handle, &pool.uid().unwrap_or_default()).await?
        }
    };
    let all: Vec<_> = observed.iter().map(members::member).collect();
    let mut c = counts(&all, &next.ledger, hash);
    for id in claimable(&all, &next.ledger, hash) {
        on.handle.prime(id, None);
        if !on.handle.is_settled(id) {
            c.ready = c.ready.saturating_sub(1);
        }
    }
    let int = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
    next.replicas = int(c.replicas);
    next.ready_replicas = int(c.ready);
    next.updated_replicas = int(c.updated);
    next.claimed_replicas = int(c.claimed);
    let want = usize::try_from(pool.spec.replicas).unwrap_or(0);
    let deadline = pool
        .spec
        .progress_deadline_seconds
        .unwrap_or(DEFAULT_DEADLINE_SECONDS);
    Ok(health(
        &c,
        want,
        &next.conditions,
        pool.metadata.generation,
        deadline,
        Utc::now(),
    ))
}

/// Ready, progressing, or stalled past the deadline (pure).
pub fn health(
    c: &Counts,
    want: usize,
    conditions: &[Condition],
    generation: Option<i64>,
    deadline_seconds: i64,
    now: DateTime<Utc>,
) -> Outcome {
    if c.ready >= want && c.updated == c.replicas && c.replicas == want {
        let msg = format!("{} members ready, {} claimed", c.ready, c.claimed);
        return Outcome::ready("PoolReady", msg);
    }
    let msg = format!(
        "{} of {want} members ready ({} of the current template, {} unclaimed in all)",
        c.ready, c.updated, c.replicas
    );
    if past_deadline(conditions, generation, deadline_seconds, now) {
        return Outcome::Stalled {
            reason: DEADLINE_EXCEEDED.into(),
            message: format!(
                "not done within spec.progressDeadlineSeconds ({deadline_seconds}s): {msg}; the operator keeps trying — see the pool's Events for the failing step"
            ),
            recheck: Some(WAIT),
        };
    }
    Outcome::waiting("Progressing", msg, Some(WAIT))
}

/// Whether the work of this generation has gone on longer than the deadline: already
/// stalled for it at this generation, or reconciling since longer than it.
fn past_deadline(
    conditions: &[Condition],
    generation: Option<i64>,
    deadline_seconds: i64,
    now: DateTime<Utc>,
) -> bool {
    if let Some(s) = condition(conditions, STALLED)
        && s.reason == DEADLINE_EXCEEDED
        && s.observed_generation == generation
    {
        return true;
    }
    let Some(since) = condition(conditions, RECONCILING)
        .filter(|c| c.status == "True")
        .and_then(|c| c.last_transition_time.as_deref())
        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
    else {
        return false;
    };
    (now - since.with_timezone(&Utc)).num_seconds() > deadline_seconds
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::status::Health;

    fn counts(ready: usize, updated: usize, replicas: usize) -> Counts {
        Counts {
            replicas,
            ready,
            updated,
            claimed: 0,
        }
    }

    #[test]
    fn ready_only_when_all_wanted_current_members_run_and_no_old_ones_are_left() {
        let now = Utc::now();
        assert!(matches!(
            health(&counts(2, 2, 2), 2, &[], Some(1), 60, now),
            Outcome::Ready { .. }
        ));
        assert!(matches!(
            health(&counts(2, 2, 3), 2, &[], Some(1), 60, now),
            Outcome::Waiting { .. }
        ));
        assert!(matches!(
            health(&counts(1, 2, 2), 2, &[], Some(1), 60, now),
            Outcome::Waiting { .. }
        ));
    }

    #[test]
    fn a_roll_past_its_deadline_stalls_until_the_generation_changes() {
        let mut c = Vec::new();
        let then = now_minus(120);
        Health::progressing("Progressing", "x").apply(&mut c, Some(1), &crate::api::rfc3339(then));
        let late = health(&counts(0, 0, 0), 1, &c, Some(1), 60, Utc::now());
        assert!(matches!(&late, Outcome::Stalled { reason, .. } if reason == DEADLINE_EXCEEDED));
        let mut stalled = Vec::new();
        Health::stalled(DEADLINE_EXCEEDED, "x").apply(&mut stalled, Some(1), "t");
        assert!(past_deadline(&stalled, Some(1), 60, Utc::now()));
        assert!(!past_deadline(&stalled, Some(2), 60, Utc::now()));
        let early = health(&counts(0, 0, 0), 1, &c, Some(1), 600, Utc::now());
        assert!(matches!(early, Outcome::Waiting { .. }));
    }

    fn now_minus(seconds: i64) -> DateTime<Utc> {
        Utc::now() - chrono::Duration::seconds(seconds)
    }
}
