//! Admission against the namespace's `SandboxBudget`s (pure: no I/O, so every rule is
//! unit-tested). The controller glue is `controller::budgets`.
//!
//! - **What counts.** A Sandbox *holds* its size while it may run: it was admitted (its
//!   external name is recorded, or this process admitted it a moment ago and the cache has not
//!   shown the record yet) and its `spec.state` is not `Stopped`. A Sandbox being deleted
//!   holds until it is gone: its sandbox exists until the cleanup confirms it is destroyed.
//!   Its size is `spec.resources` or, field by field, its provider's default.
//! - **Who waits.** A Sandbox that wants to run and has no admission (never created, or
//!   stopped and started again), whose Ready condition is absent (not reconciled yet) or says
//!   `OverBudget`. One stalled for another reason (an invalid spec) does not hold the queue.
//! - **Order.** Strict creation order (`creationTimestamp`, then name): a Sandbox never
//!   starts while an earlier one waits, even when it alone would fit. Without this, a stream of
//!   small Sandboxes would keep a large one waiting for ever.
//! - **Unknown sizes.** A budget on CPU or memory cannot admit a Sandbox whose size in that
//!   resource is not known before create (no `spec.resources` and no provider default, e.g.
//!   E2B, whose template decides): it is refused, naming the field to set, rather than counted
//!   as zero. A holding Sandbox of unknown size counts zero in that resource.

use crate::api::{Condition, DesiredState, Sandbox, condition};
use crate::provider::Resources;

/// The Ready reason of a Sandbox waiting for room.
pub const OVER_BUDGET: &str = "OverBudget";
/// The Ready reason of a Sandbox a budget cannot count (see the module docs).
pub const UNSIZED: &str = "UnsizedForBudget";

/// A Sandbox's size as a budget counts it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Size {
    /// CPU in millicores, when known.
    pub cpu_millis: Option<u64>,
    /// Memory in bytes, when known.
    pub memory_bytes: Option<u64>,
}

impl Size {
    /// The request's ceilings, each missing one taken from the provider's default.
    pub fn of(spec: &Resources, default: &Resources) -> Size {
        Size {
            cpu_millis: spec.cpu_millis.or(default.cpu_millis),
            memory_bytes: spec.memory_bytes.or(default.memory_bytes),
        }
    }
}

/// Where a Sandbox stands with respect to its namespace's budgets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// Counted against the budgets.
    Holding,
    /// Waiting for room, in creation order.
    Waiting,
    /// Neither (stopped, or held up by something else).
    Other,
}

/// A Sandbox of the namespace as admission sees it.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Its name (the tie-break after the creation time).
    pub name: String,
    /// Its `creationTimestamp`, in seconds.
    pub created: i64,
    /// Its size.
    pub size: Size,
    /// Where it stands.
    pub standing: Standing,
}

impl Entry {
    fn order(&self) -> (i64, &str) {
        (self.created, &self.name)
    }
}

/// One budget's ceilings, in the units admission compares.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Limit {
    /// The SandboxBudget's name.
    pub budget: String,
    /// CPU ceiling in millicores.
    pub cpu_millis: Option<u64>,
    /// Memory ceiling in bytes.
    pub memory_bytes: Option<u64>,
    /// Most holding Sandboxes.
    pub sandboxes: Option<u64>,
}

/// What the holding Sandboxes of a namespace add up to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Used {
    /// CPU in millicores.
    pub cpu_millis: u64,
    /// Memory in bytes.
    pub memory_bytes: u64,
    /// Number of Sandboxes.
    pub sandboxes: u64,
}

/// The decision on one Sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// It may create (or start) its sandbox.
    Admit,
    /// It waits for room ([`OVER_BUDGET`]); the message names the budget and the numbers.
    Wait(String),
    /// No budget can count it ([`UNSIZED`]); the message names the field to set.
    Unsized(String),
}

/// Where `s` stands; `admitted_here`: this process admitted it and the cache may not show it.
pub fn standing(s: &Sandbox, admitted_here: bool) -> Standing {
    if s.spec.state == Some(DesiredState::Stopped) {
        return Standing::Other;
    }
    let status = s.status.clone().unwrap_or_default();
    let recorded = status.external_name.is_some();
    if admitted_here || (s.metadata.deletion_timestamp.is_some() && recorded) {
        return Standing::Holding;
    }
    if s.metadata.deletion_timestamp.is_some() {
        return Standing::Other;
    }
    let ready = condition(&status.conditions, crate::controller::status::READY);
    let queued = ready.is_none_or(|c: &Condition| c.reason == OVER_BUDGET);
    match (needs_admission(s, admitted_here), queued, recorded) {
        (true, true, _) => Standing::Waiting,
        (_, _, true) => Standing::Holding,
        _ => Standing::Other,
    }
}

/// Whether `s` must pass admission before its provider call: it wants to run and holds no
/// admission (never recorded, or recorded but stopped).
pub fn needs_admission(s: &Sandbox, admitted_here: bool) -> bool {
    let status = s.status.as_ref();
    let recorded = status.is_some_and(|st| st.external_name.is_some());
    let stopped = status.and_then(|st| st.phase.as_deref()) == Some("Stopped");
    s.spec.state != Some(DesiredState::Stopped) && !admitted_here && (!recorded || stopped)
}

/// The sum over the holding entries.
pub fn used(entries: &[Entry]) -> Used {
    entries
        .iter()
        .filter(|e| e.standing == Standing::Holding)
        .fold(Used::default(), |u, e| Used {
            cpu_millis: u.cpu_millis + e.size.cpu_millis.unwrap_or(0),
            memory_bytes: u.memory_bytes + e.size.memory_bytes.unwrap_or(0),
            sandboxes: u.sandboxes + 1,
        })
}

/// Decides on `candidate` against `others` (the namespace's other Sandboxes) and `limits`.
pub fn admit(candidate: &Entry, others: &[Entry], limits: &[Limit]) -> Verdict {
    if let Some(why) = unknown_size(candidate, limits) {
        return Verdict::Unsized(why);
    }
    let earlier = others
        .iter()
        .filter(|e| e.standing == Standing::Waiting && e.order() < candidate.order())
        .min_by(|a, b| a.order().cmp(&b.order()));
    if let (Some(first), Some(limit)) = (earlier, limits.first()) {
        return Verdict::Wait(format!(
            "waiting for room in SandboxBudget {}: Sandbox {} came first and waits too; \
             Sandboxes start in creation order",
            limit.budget, first.name
        ));
    }
    let used = used(others);
    for limit in limits {
        if let Some(why) = over(limit, &used, &candidate.size) {
            return Verdict::Wait(why);
        }
    }
    Verdict::Admit
}

/// Why `limit` has no room for `size` on top of `used`, if it has none.
fn over(limit: &Limit, used: &Used, size: &Size) -> Option<String> {
    let checks = [
        ("sandboxes", limit.sandboxes, used.sandboxes, 1, ""),
        (
            "cpu",
            limit.cpu_millis,
            used.cpu_millis,
            size.cpu_millis.unwrap_or(0),
            "m",
        ),
        (
            "memory",
            limit.memory_bytes,
            used.memory_bytes,
            size.memory_bytes.unwrap_or(0),
            " bytes",
        ),
    ];
    let (what, hard, in_use, needs, unit) = checks
        .into_iter()
        .find(|(_, hard, in_use, needs, _)| hard.is_some_and(|h| in_use + needs > h))?;
    Some(format!(
        "waiting for room in SandboxBudget {}: {what} {in_use}{unit} of {}{unit} in use, this \
         Sandbox needs {needs}{unit}; it starts when room frees up, in creation order",
        limit.budget,
        hard.unwrap_or(0)
    ))
}

/// Why a budget cannot count `candidate` (a limited resource of unknown size), if so.
fn unknown_size(candidate: &Entry, limits: &[Limit]) -> Option<String> {
    limits.iter().find_map(|l| {
        let field = if l.cpu_millis.is_some() && candidate.size.cpu_millis.is_none() {
            "cpu"
        } else if l.memory_bytes.is_some() && candidate.size.memory_bytes.is_none() {
            "memory"
        } else {
            return None;
        };
        Some(format!(
            "SandboxBudget {} limits {field}, and this Sandbox's {field} is not known before \
             create (its provider sets no default); set spec.resources.{field}",
            l.budget
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{SandboxSpec, SandboxStatus};

    fn entry(name: &str, created: i64, standing: Standing, cpu: u64) -> Entry {
        Entry {
            name: name.into(),
            created,
            size: Size {
                cpu_millis: Some(cpu),
                memory_bytes: Some(1 << 30),
            },
            standing,
        }
    }

    fn limit(sandboxes: Option<u64>, cpu: Option<u64>) -> Limit {
        Limit {
            budget: "team".into(),
            sandboxes,
            cpu_millis: cpu,
            memory_bytes: None,
        }
    }

    #[test]
    fn no_budget_admits_everything_and_a_full_one_names_itself_and_the_numbers() {
        let holding = vec![entry("a", 1, Standing::Holding, 1000); 2];
        let c = entry("c", 3, Standing::Waiting, 1000);
        assert_eq!(admit(&c, &holding, &[]), Verdict::Admit);
        assert_eq!(admit(&c, &holding, &[limit(Some(3), None)]), Verdict::Admit);
        let Verdict::Wait(why) = admit(&c, &holding, &[limit(Some(2), None)]) else {
            panic!("a full budget admits nothing");
        };
        assert!(why.contains("SandboxBudget team") && why.contains("sandboxes 2 of 2"));
        let Verdict::Wait(why) = admit(&c, &holding, &[limit(None, Some(2500))]) else {
            panic!("2000m + 1000m is over 2500m");
        };
        assert!(why.contains("cpu 2000m of 2500m"), "{why}");
    }

    #[test]
    fn an_earlier_waiting_sandbox_goes_first_even_when_a_later_one_would_fit() {
        let others = vec![
            entry("big", 5, Standing::Waiting, 4000),
            entry("run", 1, Standing::Holding, 1000),
        ];
        let small = entry("small", 6, Standing::Waiting, 500);
        let Verdict::Wait(why) = admit(&small, &others, &[limit(None, Some(2000))]) else {
            panic!("strict creation order");
        };
        assert!(why.contains("Sandbox big came first"), "{why}");
        // Same second: the name breaks the tie.
        let twin = entry("a-twin", 5, Standing::Waiting, 500);
        assert_eq!(
            admit(&twin, &others, &[limit(None, Some(2000))]),
            Verdict::Admit
        );
    }

    #[test]
    fn an_unknown_size_under_a_cpu_budget_is_refused_naming_the_field() {
        let mut c = entry("c", 1, Standing::Waiting, 0);
        c.size.cpu_millis = None;
        assert!(matches!(
            admit(&c, &[], &[limit(None, Some(1000))]),
            Verdict::Unsized(why) if why.contains("spec.resources.cpu")
        ));
        assert_eq!(admit(&c, &[], &[limit(Some(1), None)]), Verdict::Admit);
    }

    fn sandbox(recorded: bool, reason: Option<&str>) -> Sandbox {
        let mut s = Sandbox::new("s", SandboxSpec::default());
        let mut status = SandboxStatus {
            external_name: recorded.then(|| "sbx-1".into()),
            ..SandboxStatus::default()
        };
        if let Some(reason) = reason {
            status.conditions.push(Condition {
                type_: "Ready".into(),
                status: "False".into(),
                reason: reason.into(),
                message: String::new(),
                last_transition_time: None,
                observed_generation: None,
            });
        }
        s.status = Some(status);
        s
    }

    #[test]
    fn standing_follows_the_record_the_state_and_the_reason() {
        assert_eq!(standing(&sandbox(false, None), false), Standing::Waiting);
        assert_eq!(
            standing(&sandbox(false, Some(OVER_BUDGET)), false),
            Standing::Waiting
        );
        assert_eq!(
            standing(&sandbox(false, Some("InvalidSpec")), false),
            Standing::Other
        );
        assert_eq!(standing(&sandbox(false, None), true), Standing::Holding);
        assert_eq!(
            standing(&sandbox(true, Some("Running")), false),
            Standing::Holding
        );
        let mut stopped = sandbox(true, Some("Running"));
        stopped.spec.state = Some(DesiredState::Stopped);
        assert_eq!(standing(&stopped, false), Standing::Other);
        let mut restarting = sandbox(true, Some(OVER_BUDGET));
        restarting.status.as_mut().unwrap().phase = Some("Stopped".into());
        assert_eq!(standing(&restarting, false), Standing::Waiting);
        assert!(needs_admission(&restarting, false));
        assert!(!needs_admission(&sandbox(true, None), false));
    }

    #[test]
    fn usage_sums_what_holds_and_a_spec_wins_over_the_default() {
        let entries = vec![
            entry("a", 1, Standing::Holding, 500),
            entry("b", 2, Standing::Waiting, 700),
            entry("c", 3, Standing::Holding, 250),
        ];
        assert_eq!(
            used(&entries),
            Used {
                cpu_millis: 750,
                memory_bytes: 2 << 30,
                sandboxes: 2
            }
        );
        let spec = Resources {
            cpu_millis: Some(250),
            ..Resources::default()
        };
        let default = Resources {
            cpu_millis: Some(1000),
            memory_bytes: Some(1 << 30),
            ..Resources::default()
        };
        assert_eq!(
            Size::of(&spec, &default),
            Size {
                cpu_millis: Some(250),
                memory_bytes: Some(1 << 30)
            }
        );
    }
}
