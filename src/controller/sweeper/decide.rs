//! Decide (pure): candidates + owner facts + now + policy → what to delete, defer or keep.
//!
//! Every rule that protects a user's data lives here, free of I/O, so each one is pinned by
//! a table test below. The impure half of the sweeper only enumerates, looks owners up,
//! confirms right before a deletion and deletes what this function says.
//!
//! The rules, in the order they are applied to one candidate:
//!
//! 1. Only resources labelled `sandboxes.dev/managed-by=<this instance>` are candidates;
//!    anything else is never touched (the enumeration already filters by the label; this
//!    re-checks so a provider that ignored the filter can never widen a deletion).
//! 2. A resource without all four owner labels was not made by this operator and is kept.
//! 3. A sandbox *proven* never started (`started_at = Never`, rule 6, and not running or
//!    sleeping: `Unknown` and any sign of a run read as "has run") is **wreckage** once it
//!    is at least the grace period old — whether or not its owner is alive: a live owner's
//!    controller always starts what it creates right away (even a `Stopped` one is started
//!    once), so an old never-started sandbox is a create that was interrupted, and the
//!    controller recreates it — unless that owner's status names it as its current sandbox,
//!    which the act step checks by a direct read of the owner right before deleting.
//!    Younger than the grace period it may be a create in flight.
//! 4. Everything else depends on the owner, read from the API server by namespace/name and
//!    compared by UID: a live owner with the labelled UID keeps the resource; an owner that
//!    could not be read keeps it too (never delete on a partial picture).
//! 5. Volumes labelled with any reclaim policy other than `Delete` are kept: `Retain` means
//!    the user keeps the data after its SandboxVolume is gone, and a volume without the
//!    label is treated like the controller treats a SandboxVolume without `reclaimPolicy`
//!    — as `Retain`.
//! 6. Attached volumes (stopped sandboxes count; unknown reads as attached, rule 4) and
//!    templates in use (unknown reads as in use) are kept.
//! 7. An ownerless resource is reclaimed once it is at least the grace period old; one whose
//!    age the provider does not report is kept (it cannot be proven old enough).
//! 8. The per-pass cap: deletions run oldest first, and those beyond the cap are deferred
//!    to a later pass and reported, so a wrong picture cannot wipe a provider in one pass.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::provider::labels::{MANAGED_BY, Owner, RECLAIM_POLICY};
use crate::provider::{SandboxState, StartedAt};

/// The only reclaim-policy label value that lets the sweeper remove a volume.
pub const RECLAIM_DELETE: &str = "Delete";

/// What kind of provider resource a candidate is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ResourceKind {
    /// A sandbox (a Docker container, a Machine).
    Sandbox,
    /// A named volume.
    Volume,
    /// A template (a committed image, an archive).
    Template,
}

impl ResourceKind {
    /// Lower-case word for tables and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            ResourceKind::Sandbox => "sandbox",
            ResourceKind::Volume => "volume",
            ResourceKind::Template => "template",
        }
    }
}

impl fmt::Display for ResourceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the provider observed about a candidate, by kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observation {
    /// A sandbox: its state, and whether it was ever started.
    Sandbox {
        /// Its coarse state.
        state: SandboxState,
        /// Rule 6, as the provider reported it.
        started: StartedAt,
    },
    /// A volume and its attachment (rule 4: unknown is reported as attached).
    Volume {
        /// Whether any sandbox, stopped ones included, has it attached.
        attached: bool,
        /// Which sandboxes hold it, when known.
        attached_to: Vec<String>,
    },
    /// A template and its use (rule 4: unknown is reported as in use).
    Template {
        /// Whether any sandbox is backed by it.
        in_use: bool,
    },
}

/// One provider resource as enumerated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// The provider's id for it (container name, volume name, template id).
    pub id: String,
    /// Every label the provider holds for it.
    pub labels: BTreeMap<String, String>,
    /// Creation time, when the provider reports it.
    pub created_at: Option<DateTime<Utc>>,
    /// Kind-specific observation.
    pub observation: Observation,
}

impl Candidate {
    /// The kind of resource.
    pub fn kind(&self) -> ResourceKind {
        match self.observation {
            Observation::Sandbox { .. } => ResourceKind::Sandbox,
            Observation::Volume { .. } => ResourceKind::Volume,
            Observation::Template { .. } => ResourceKind::Template,
        }
    }

    /// The owner its labels name, when all four owner labels are present.
    pub fn owner(&self) -> Option<Owner> {
        Owner::from_labels(&self.labels)
    }

    /// Whether this is a sandbox the provider *proves* never ran (rule 6): `Never`, in a
    /// state a sandbox that never ran can be in. Running or sleeping means it has run,
    /// whatever the provider said about its history; `Unknown` means it may have.
    pub fn proven_never_started(&self) -> bool {
        matches!(
            self.observation,
            Observation::Sandbox {
                state: SandboxState::Creating | SandboxState::Stopped,
                started: StartedAt::Never,
            }
        )
    }
}

/// The kinds an owner label may name, i.e. the kinds whose objects the sweeper can read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum OwnerKind {
    /// `Sandbox` (owns sandboxes).
    Sandbox,
    /// `SandboxVolume` (owns volumes).
    SandboxVolume,
    /// `SandboxTemplate` (owns templates and their capture helpers).
    SandboxTemplate,
    /// `SandboxWarmPool` (owns its members; a claimed member stays the pool's in the labels
    /// and the pool keeps its finalizer while it is claimed, so a live pool keeps them all
    /// and a gone pool's members are reclaimed like any ownerless sandbox).
    SandboxWarmPool,
}

impl OwnerKind {
    /// Parses the `sandboxes.dev/kind` label value.
    pub fn parse(kind: &str) -> Option<OwnerKind> {
        match kind {
            "Sandbox" => Some(OwnerKind::Sandbox),
            "SandboxVolume" => Some(OwnerKind::SandboxVolume),
            "SandboxTemplate" => Some(OwnerKind::SandboxTemplate),
            "SandboxWarmPool" => Some(OwnerKind::SandboxWarmPool),
            _ => None,
        }
    }

    /// The Kubernetes kind.
    pub fn as_str(self) -> &'static str {
        match self {
            OwnerKind::Sandbox => "Sandbox",
            OwnerKind::SandboxVolume => "SandboxVolume",
            OwnerKind::SandboxTemplate => "SandboxTemplate",
            OwnerKind::SandboxWarmPool => "SandboxWarmPool",
        }
    }
}

impl fmt::Display for OwnerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which object an owner label points at (by name; the UID is compared separately).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OwnerKey {
    /// Kind of the owning object.
    pub kind: OwnerKind,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

impl OwnerKey {
    /// The key for an owner read from labels; `None` for a kind the sweeper cannot read.
    pub fn of(owner: &Owner) -> Option<OwnerKey> {
        Some(OwnerKey {
            kind: OwnerKind::parse(&owner.kind)?,
            namespace: owner.namespace.clone(),
            name: owner.name.clone(),
        })
    }
}

impl fmt::Display for OwnerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
    }
}

/// What the API server said about an owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnerFact {
    /// An object of that kind and name exists, with this UID.
    Live {
        /// Its UID (compared with the `owner-uid` label).
        uid: String,
    },
    /// No object of that kind and name exists.
    Absent,
    /// It could not be read; nothing that depends on it is deleted.
    Unknown(String),
}

/// Facts about every owner the candidates name.
pub type OwnerFacts = BTreeMap<OwnerKey, OwnerFact>;

/// The policy a pass decides with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// This operator instance (`sandboxes.dev/managed-by`).
    pub instance: String,
    /// Minimum age before anything is reclaimed.
    pub grace: Duration,
    /// Maximum deletions in one pass.
    pub max_deletions: usize,
}

/// Why a resource is reclaimed (also the metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Category {
    /// A sandbox whose owner no longer exists.
    Orphan,
    /// A sandbox that was created and never started.
    Wreckage,
    /// An unattached volume whose SandboxVolume no longer exists.
    Volume,
    /// An unused template whose SandboxTemplate no longer exists.
    Template,
}

impl Category {
    /// Every category, for per-category metrics.
    pub const ALL: [Category; 4] = [
        Category::Orphan,
        Category::Wreckage,
        Category::Volume,
        Category::Template,
    ];

    /// The metric label and table word.
    pub fn as_str(self) -> &'static str {
        match self {
            Category::Orphan => "orphan",
            Category::Wreckage => "wreckage",
            Category::Volume => "volume",
            Category::Template => "template",
        }
    }

    /// Whether the deletion depends on the owner being gone, and so must be confirmed by a
    /// direct read of the owner right before it happens. Wreckage is reclaimed whatever the
    /// owner's state (rule 3).
    pub fn needs_owner_gone(self) -> bool {
        !matches!(self, Category::Wreckage)
    }
}

impl fmt::Display for Category {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a resource is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Keep {
    /// Labelled for another operator instance: never ours to touch.
    OtherInstance,
    /// Not all four owner labels are present: not made by this operator.
    IncompleteOwnerLabels,
    /// The owner label names a kind the sweeper cannot look up.
    UnsupportedOwnerKind(String),
    /// Its owner exists with the labelled UID.
    OwnerLive,
    /// Its owner could not be read.
    OwnerUnknown(String),
    /// The provider does not report its creation time, so it cannot be proven old enough.
    AgeUnknown,
    /// Younger than the grace period: possibly a create in flight.
    YoungerThanGrace,
    /// A volume some sandbox (running or stopped) holds.
    Attached(Vec<String>),
    /// A volume whose reclaim policy is not `Delete` (the label's value, `None` if absent).
    Retained(Option<String>),
    /// A template some sandbox is backed by.
    InUse,
}

impl Keep {
    /// Whether this is the normal state of a managed resource (owner alive) or not ours at
    /// all: such keeps are only counted in a report, never listed one by one, or a pass over
    /// thousands of healthy sandboxes would print thousands of rows.
    pub fn is_quiet(&self) -> bool {
        matches!(self, Keep::OwnerLive | Keep::OtherInstance)
    }
}

impl fmt::Display for Keep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Keep::OtherInstance => f.write_str("managed by another operator instance"),
            Keep::IncompleteOwnerLabels => {
                f.write_str("owner labels incomplete: not made by this operator")
            }
            Keep::UnsupportedOwnerKind(kind) => {
                write!(f, "owner kind {kind:?} cannot be looked up")
            }
            Keep::OwnerLive => f.write_str("owner exists"),
            Keep::OwnerUnknown(why) => write!(f, "owner could not be read: {why}"),
            Keep::AgeUnknown => {
                f.write_str("age unknown, cannot be proven older than the grace period")
            }
            Keep::YoungerThanGrace => f.write_str("younger than the grace period"),
            Keep::Attached(to) if to.is_empty() => f.write_str("attached (or attachment unknown)"),
            Keep::Attached(to) => write!(f, "attached to {}", to.join(", ")),
            Keep::Retained(Some(policy)) => write!(f, "reclaim policy {policy}"),
            Keep::Retained(None) => f.write_str("no reclaim-policy label (Retain is the default)"),
            Keep::InUse => f.write_str("in use (or use unknown)"),
        }
    }
}

/// The verdict on one candidate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Reclaim it in this pass.
    Delete(Category),
    /// Eligible, but the per-pass cap was reached: left for a later pass.
    Deferred(Category),
    /// Keep it.
    Keep(Keep),
}

/// One candidate with its verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// The resource.
    pub candidate: Candidate,
    /// The owner its labels name, when complete.
    pub owner: Option<Owner>,
    /// Its age at `now`, when its creation time is known.
    pub age: Option<Duration>,
    /// What to do.
    pub verdict: Verdict,
    /// Why, in words (shown in the table and in Events).
    pub why: String,
}

/// The whole decision of a pass: deletions first, in the order they run (oldest first),
/// then deferred ones in the same order, then kept ones by kind and id.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// Every candidate, decided.
    pub decisions: Vec<Decision>,
}

impl Plan {
    /// Decisions to act on now.
    pub fn deletions(&self) -> impl Iterator<Item = &Decision> {
        self.decisions
            .iter()
            .filter(|d| matches!(d.verdict, Verdict::Delete(_)))
    }

    /// How many eligible resources were left to a later pass by the cap.
    pub fn deferred(&self) -> usize {
        self.decisions
            .iter()
            .filter(|d| matches!(d.verdict, Verdict::Deferred(_)))
            .count()
    }

    /// How many resources of `category` are eligible (deleted now or deferred).
    pub fn eligible(&self, category: Category) -> usize {
        self.decisions
            .iter()
            .filter(
                |d| matches!(d.verdict, Verdict::Delete(c) | Verdict::Deferred(c) if c == category),
            )
            .count()
    }
}

/// Decides every candidate. Pure and deterministic: the same input gives the same plan, so
/// a dry run lists exactly what a real pass on the same picture deletes.
pub fn decide(
    candidates: &[Candidate],
    owners: &OwnerFacts,
    now: DateTime<Utc>,
    policy: &Policy,
) -> Plan {
    let (mut eligible, mut kept): (Vec<Decision>, Vec<Decision>) = candidates
        .iter()
        .map(|candidate| decision_of(candidate, owners, now, policy))
        .partition(|d| matches!(d.verdict, Verdict::Delete(_)));
    // Oldest first: under the cap, what has been lying around longest goes first. Ties by
    // kind and id so the order never depends on the provider's listing order.
    eligible.sort_by(|a, b| {
        (a.candidate.created_at, a.candidate.kind(), &a.candidate.id).cmp(&(
            b.candidate.created_at,
            b.candidate.kind(),
            &b.candidate.id,
        ))
    });
    for (n, decision) in eligible.iter_mut().enumerate() {
        if n >= policy.max_deletions
            && let Verdict::Delete(category) = decision.verdict
        {
            decision.verdict = Verdict::Deferred(category);
        }
    }
    kept.sort_by(|a, b| {
        (a.candidate.kind(), &a.candidate.id).cmp(&(b.candidate.kind(), &b.candidate.id))
    });
    eligible.extend(kept);
    Plan {
        decisions: eligible,
    }
}

/// One candidate decided on its own, before the cap: what [`decide`] does for each, and what
/// the act step repeats on a candidate's fresh description right before deleting it.
pub fn decision_of(
    candidate: &Candidate,
    owners: &OwnerFacts,
    now: DateTime<Utc>,
    policy: &Policy,
) -> Decision {
    let owner = candidate.owner();
    let age = candidate.created_at.map(|t| age_at(t, now));
    let (verdict, why) = match judge(candidate, owner.as_ref(), age, owners, policy) {
        Ok((category, why)) => (Verdict::Delete(category), why),
        Err(keep) => {
            let why = keep.to_string();
            (Verdict::Keep(keep), why)
        }
    };
    Decision {
        candidate: candidate.clone(),
        owner,
        age,
        verdict,
        why,
    }
}

/// The rules of the module docs for one candidate, as stages: whose it is, whether it is
/// wreckage, whether its owner is gone, what it is, and whether it is old enough.
fn judge(
    candidate: &Candidate,
    owner: Option<&Owner>,
    age: Option<Duration>,
    owners: &OwnerFacts,
    policy: &Policy,
) -> Result<(Category, String), Keep> {
    if candidate.labels.get(MANAGED_BY) != Some(&policy.instance) {
        return Err(Keep::OtherInstance);
    }
    let owner = owner.ok_or(Keep::IncompleteOwnerLabels)?;
    if candidate.proven_never_started() {
        old_enough(age, policy)?;
        return Ok((Category::Wreckage, wreckage_why(owner, owners)));
    }
    let key = OwnerKey::of(owner).ok_or_else(|| Keep::UnsupportedOwnerKind(owner.kind.clone()))?;
    let gone = owner_gone(&key, owner, owners)?;
    let category = category_of(candidate)?;
    old_enough(age, policy)?;
    Ok((category, format!("owner {gone}")))
}

/// Rule 7's age check: a known age of at least the grace period.
fn old_enough(age: Option<Duration>, policy: &Policy) -> Result<(), Keep> {
    match age {
        None => Err(Keep::AgeUnknown),
        Some(age) if age < policy.grace => Err(Keep::YoungerThanGrace),
        Some(_) => Ok(()),
    }
}

/// Why never-started wreckage goes, naming what became of its owner.
fn wreckage_why(owner: &Owner, owners: &OwnerFacts) -> String {
    format!(
        "never started, older than the grace period ({} {}/{} {})",
        owner.kind,
        owner.namespace,
        owner.name,
        match OwnerKey::of(owner).and_then(|k| owners.get(&k)) {
            Some(OwnerFact::Live { uid }) if *uid == owner.uid =>
                "exists: its controller recreates the sandbox",
            Some(OwnerFact::Live { .. }) | Some(OwnerFact::Absent) => "is gone",
            _ => "not checked",
        }
    )
}

/// Rule 4: the owner is gone (in words) or the resource is kept.
fn owner_gone(key: &OwnerKey, owner: &Owner, owners: &OwnerFacts) -> Result<String, Keep> {
    match owners.get(key) {
        Some(OwnerFact::Live { uid }) if *uid == owner.uid => Err(Keep::OwnerLive),
        Some(OwnerFact::Live { uid }) => Ok(format!(
            "{key} is another object now (UID {uid}, labelled UID {})",
            owner.uid
        )),
        Some(OwnerFact::Absent) => Ok(format!("{key} does not exist")),
        Some(OwnerFact::Unknown(why)) => Err(Keep::OwnerUnknown(why.clone())),
        None => Err(Keep::OwnerUnknown("it was not looked up".into())),
    }
}

/// Rules 5 and 6: the category an ownerless resource is reclaimed as, or why it is kept.
fn category_of(candidate: &Candidate) -> Result<Category, Keep> {
    match &candidate.observation {
        Observation::Sandbox { .. } => Ok(Category::Orphan),
        Observation::Volume {
            attached,
            attached_to,
        } => {
            match candidate.labels.get(RECLAIM_POLICY) {
                Some(p) if p == RECLAIM_DELETE => {}
                other => return Err(Keep::Retained(other.cloned())),
            }
            if *attached {
                return Err(Keep::Attached(attached_to.clone()));
            }
            Ok(Category::Volume)
        }
        Observation::Template { in_use: true } => Err(Keep::InUse),
        Observation::Template { in_use: false } => Ok(Category::Template),
    }
}

/// How old something created at `created` is at `now`, rounded DOWN to whole seconds and
/// one second less: providers' listings report creation times in whole seconds (Docker's
/// list truncates them), so the real creation may lie up to a second after the reported one.
/// An age is never overstated, so nothing younger than the grace period is ever reclaimed.
pub fn age_at(created: DateTime<Utc>, now: DateTime<Utc>) -> Duration {
    let secs = (now - created).num_seconds().saturating_sub(1).max(0);
    Duration::from_secs(u64::try_from(secs).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::labels::{KIND, OWNER, OWNER_UID};

    const INSTANCE: &str = "ops";
    const GRACE: Duration = Duration::from_secs(600);

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2025-01-01T12:00:00Z")
            .map(|t| t.with_timezone(&Utc))
            .expect("time")
    }

    #[test]
    fn warm_pool_members_name_an_owner_the_sweeper_can_read() {
        use crate::provider::labels::POOL_KIND;
        let kind = OwnerKind::parse(POOL_KIND);
        assert_eq!(kind, Some(OwnerKind::SandboxWarmPool));
        assert_eq!(kind.map(OwnerKind::as_str), Some(POOL_KIND));
    }

    #[test]
    fn ages_are_rounded_down_and_never_overstated() {
        let at = |secs: i64, millis: i64| {
            now() - chrono::Duration::seconds(secs) - chrono::Duration::milliseconds(millis)
        };
        assert_eq!(age_at(at(600, 0), now()), Duration::from_secs(599));
        assert_eq!(age_at(at(600, 999), now()), Duration::from_secs(599));
        assert_eq!(age_at(at(601, 0), now()), Duration::from_secs(600));
        assert_eq!(age_at(now(), now()), Duration::ZERO);
        assert_eq!(
            age_at(now() + chrono::Duration::seconds(5), now()),
            Duration::ZERO
        );
    }

    fn policy(max: usize) -> Policy {
        Policy {
            instance: INSTANCE.into(),
            grace: GRACE,
            max_deletions: max,
        }
    }

    fn labels(kind: &str, name: &str, uid: &str) -> BTreeMap<String, String> {
        BTreeMap::from([
            (MANAGED_BY.to_string(), INSTANCE.to_string()),
            (OWNER_UID.to_string(), uid.to_string()),
            (OWNER.to_string(), format!("ns.{name}")),
            (KIND.to_string(), kind.to_string()),
        ])
    }

    fn sandbox(id: &str, owner: &str, uid: &str, started: bool, age_secs: i64) -> Candidate {
        Candidate {
            id: id.into(),
            labels: labels("Sandbox", owner, uid),
            created_at: Some(now() - chrono::Duration::seconds(age_secs)),
            observation: if started {
                Observation::Sandbox {
                    state: SandboxState::Stopped,
                    started: StartedAt::At(now()),
                }
            } else {
                Observation::Sandbox {
                    state: SandboxState::Creating,
                    started: StartedAt::Never,
                }
            },
        }
    }

    fn volume(
        id: &str,
        owner: &str,
        uid: &str,
        policy: Option<&str>,
        attached: bool,
        age_secs: i64,
    ) -> Candidate {
        let mut labels = labels("SandboxVolume", owner, uid);
        if let Some(p) = policy {
            labels.insert(RECLAIM_POLICY.into(), p.into());
        }
        Candidate {
            id: id.into(),
            labels,
            created_at: Some(now() - chrono::Duration::seconds(age_secs)),
            observation: Observation::Volume {
                attached,
                attached_to: if attached { vec!["c1".into()] } else { vec![] },
            },
        }
    }

    fn template(id: &str, owner: &str, uid: &str, in_use: bool, age_secs: i64) -> Candidate {
        Candidate {
            id: id.into(),
            labels: labels("SandboxTemplate", owner, uid),
            created_at: Some(now() - chrono::Duration::seconds(age_secs)),
            observation: Observation::Template { in_use },
        }
    }

    fn key(kind: OwnerKind, name: &str) -> OwnerKey {
        OwnerKey {
            kind,
            namespace: "ns".into(),
            name: name.into(),
        }
    }

    /// Owners: Sandbox `live` (uid u-live), `renamed` exists with uid u-new, `ghost` absent,
    /// `flaky` unreadable; SandboxVolume `vol` live (u-vol), `gone-vol` absent;
    /// SandboxTemplate `tpl` live (u-tpl), `gone-tpl` absent.
    fn owners() -> OwnerFacts {
        let live = |uid: &str| OwnerFact::Live { uid: uid.into() };
        BTreeMap::from([
            (key(OwnerKind::Sandbox, "live"), live("u-live")),
            (key(OwnerKind::Sandbox, "renamed"), live("u-new")),
            (key(OwnerKind::Sandbox, "ghost"), OwnerFact::Absent),
            (
                key(OwnerKind::Sandbox, "flaky"),
                OwnerFact::Unknown("timeout".into()),
            ),
            (key(OwnerKind::SandboxVolume, "vol"), live("u-vol")),
            (key(OwnerKind::SandboxVolume, "gone-vol"), OwnerFact::Absent),
            (key(OwnerKind::SandboxTemplate, "tpl"), live("u-tpl")),
            (
                key(OwnerKind::SandboxTemplate, "gone-tpl"),
                OwnerFact::Absent,
            ),
        ])
    }

    fn verdict_of(c: Candidate) -> Verdict {
        let plan = decide(&[c], &owners(), now(), &policy(100));
        plan.decisions[0].verdict.clone()
    }

    #[test]
    fn each_rule_in_a_table() {
        use Category as C;
        let old = 3600;
        let young = 60;
        let cases: Vec<(&str, Candidate, Verdict)> = vec![
            // Sandboxes.
            (
                "live owner, started",
                sandbox("a", "live", "u-live", true, old),
                Verdict::Keep(Keep::OwnerLive),
            ),
            (
                "owner absent, old",
                sandbox("b", "ghost", "u-g", true, old),
                Verdict::Delete(C::Orphan),
            ),
            (
                "owner absent, young",
                sandbox("c", "ghost", "u-g", true, young),
                Verdict::Keep(Keep::YoungerThanGrace),
            ),
            (
                "owner recreated under the same name",
                sandbox("d", "renamed", "u-old", true, old),
                Verdict::Delete(C::Orphan),
            ),
            (
                "owner unreadable",
                sandbox("e", "flaky", "u-f", true, old),
                Verdict::Keep(Keep::OwnerUnknown("timeout".into())),
            ),
            (
                "owner never looked up",
                sandbox("f", "unlisted", "u-x", true, old),
                Verdict::Keep(Keep::OwnerUnknown("it was not looked up".into())),
            ),
            (
                "never started, old, owner gone",
                sandbox("g", "ghost", "u-g", false, old),
                Verdict::Delete(C::Wreckage),
            ),
            (
                "never started, old, owner alive",
                sandbox("h", "live", "u-live", false, old),
                Verdict::Delete(C::Wreckage),
            ),
            (
                "never started, owner unreadable",
                sandbox("i", "flaky", "u-f", false, old),
                Verdict::Delete(C::Wreckage),
            ),
            (
                "never started, young (create in flight)",
                sandbox("j", "live", "u-live", false, young),
                Verdict::Keep(Keep::YoungerThanGrace),
            ),
            (
                "never started, listed exactly the grace period old (may be a second younger)",
                sandbox("k", "ghost", "u-g", false, 600),
                Verdict::Keep(Keep::YoungerThanGrace),
            ),
            (
                "never started, listed a second more than the grace period old",
                sandbox("k2", "ghost", "u-g", false, 601),
                Verdict::Delete(C::Wreckage),
            ),
            // Volumes.
            (
                "volume, owner gone, Delete, unattached",
                volume("v1", "gone-vol", "u", Some("Delete"), false, old),
                Verdict::Delete(C::Volume),
            ),
            (
                "volume, owner gone, Retain",
                volume("v2", "gone-vol", "u", Some("Retain"), false, old),
                Verdict::Keep(Keep::Retained(Some("Retain".into()))),
            ),
            (
                "volume, owner gone, no policy label",
                volume("v3", "gone-vol", "u", None, false, old),
                Verdict::Keep(Keep::Retained(None)),
            ),
            (
                "volume, owner gone, attached (stopped sandbox counts)",
                volume("v4", "gone-vol", "u", Some("Delete"), true, old),
                Verdict::Keep(Keep::Attached(vec!["c1".into()])),
            ),
            (
                "volume, owner alive",
                volume("v5", "vol", "u-vol", Some("Delete"), false, old),
                Verdict::Keep(Keep::OwnerLive),
            ),
            (
                "volume, owner gone, young",
                volume("v6", "gone-vol", "u", Some("Delete"), false, young),
                Verdict::Keep(Keep::YoungerThanGrace),
            ),
            // Templates.
            (
                "template, owner gone, unused",
                template("t1", "gone-tpl", "u", false, old),
                Verdict::Delete(C::Template),
            ),
            (
                "template, owner gone, in use",
                template("t2", "gone-tpl", "u", true, old),
                Verdict::Keep(Keep::InUse),
            ),
            (
                "template, owner alive",
                template("t3", "tpl", "u-tpl", false, old),
                Verdict::Keep(Keep::OwnerLive),
            ),
            (
                "template, owner gone, young",
                template("t4", "gone-tpl", "u", false, young),
                Verdict::Keep(Keep::YoungerThanGrace),
            ),
        ];
        for (what, candidate, expected) in cases {
            assert_eq!(verdict_of(candidate), expected, "{what}");
        }
    }

    #[test]
    fn resources_of_other_instances_or_without_owner_labels_are_never_touched() {
        let mut foreign = sandbox("x", "ghost", "u-g", false, 99_999);
        foreign.labels.insert(MANAGED_BY.into(), "other".into());
        assert_eq!(
            verdict_of(foreign.clone()),
            Verdict::Keep(Keep::OtherInstance)
        );
        foreign.labels.remove(MANAGED_BY);
        assert_eq!(verdict_of(foreign), Verdict::Keep(Keep::OtherInstance));

        let mut partial = sandbox("y", "ghost", "u-g", false, 99_999);
        partial.labels.remove(OWNER_UID);
        assert_eq!(
            verdict_of(partial),
            Verdict::Keep(Keep::IncompleteOwnerLabels)
        );

        let mut odd = sandbox("z", "ghost", "u-g", true, 99_999);
        odd.labels.insert(KIND.into(), "Pod".into());
        assert_eq!(
            verdict_of(odd),
            Verdict::Keep(Keep::UnsupportedOwnerKind("Pod".into()))
        );
    }

    #[test]
    fn unknown_age_is_never_old_enough() {
        let mut c = sandbox("a", "ghost", "u-g", true, 0);
        c.created_at = None;
        assert_eq!(verdict_of(c.clone()), Verdict::Keep(Keep::AgeUnknown));
        c.observation = Observation::Sandbox {
            state: SandboxState::Creating,
            started: StartedAt::Never,
        };
        assert_eq!(verdict_of(c), Verdict::Keep(Keep::AgeUnknown));
        // A creation time in the future (clock skew) is age zero, not a huge age.
        let mut future = sandbox("b", "ghost", "u-g", true, -3600);
        future.created_at = Some(now() + chrono::Duration::hours(1));
        assert_eq!(verdict_of(future), Verdict::Keep(Keep::YoungerThanGrace));
    }

    #[test]
    fn only_a_proven_never_started_sandbox_is_wreckage() {
        use SandboxState as S;
        let with = |state: S, started: StartedAt| {
            let mut c = sandbox("a", "live", "u-live", true, 3600);
            c.observation = Observation::Sandbox { state, started };
            verdict_of(c)
        };
        for state in [S::Creating, S::Stopped] {
            assert_eq!(
                with(state, StartedAt::Never),
                Verdict::Delete(Category::Wreckage)
            );
            assert_eq!(
                with(state, StartedAt::Unknown),
                Verdict::Keep(Keep::OwnerLive),
                "{state:?}: unknown means it may have run"
            );
        }
        for state in [S::Running, S::Sleeping] {
            assert_eq!(
                with(state, StartedAt::Never),
                Verdict::Keep(Keep::OwnerLive),
                "{state:?} has run, whatever its history says"
            );
        }
    }

    #[test]
    fn zero_grace_reclaims_immediately() {
        let p = Policy {
            grace: Duration::ZERO,
            ..policy(10)
        };
        let plan = decide(
            &[sandbox("a", "ghost", "u", false, 0)],
            &owners(),
            now(),
            &p,
        );
        assert_eq!(
            plan.decisions[0].verdict,
            Verdict::Delete(Category::Wreckage)
        );
    }

    #[test]
    fn the_cap_defers_the_youngest_and_the_order_is_oldest_first() {
        let candidates = vec![
            sandbox("c3", "ghost", "u", true, 3000),
            template("t1", "gone-tpl", "u", false, 5000),
            sandbox("c1", "ghost", "u", false, 9000),
            volume("v2", "gone-vol", "u", Some("Delete"), false, 4000),
            sandbox("keep", "live", "u-live", true, 99_999),
        ];
        let plan = decide(&candidates, &owners(), now(), &policy(2));
        let order: Vec<(&str, &Verdict)> = plan
            .decisions
            .iter()
            .map(|d| (d.candidate.id.as_str(), &d.verdict))
            .collect();
        assert_eq!(
            order,
            vec![
                ("c1", &Verdict::Delete(Category::Wreckage)),
                ("t1", &Verdict::Delete(Category::Template)),
                ("v2", &Verdict::Deferred(Category::Volume)),
                ("c3", &Verdict::Deferred(Category::Orphan)),
                ("keep", &Verdict::Keep(Keep::OwnerLive)),
            ]
        );
        assert_eq!(plan.deletions().count(), 2);
        assert_eq!(plan.deferred(), 2);
        assert_eq!(plan.eligible(Category::Orphan), 1);
        assert_eq!(plan.eligible(Category::Volume), 1);
        assert_eq!(plan.eligible(Category::Wreckage), 1);
    }

    #[test]
    fn same_picture_same_plan_whatever_the_listing_order() {
        let mut candidates = vec![
            sandbox("b", "ghost", "u", true, 3600),
            sandbox("a", "ghost", "u", true, 3600),
            volume("v", "gone-vol", "u", Some("Delete"), false, 3600),
            sandbox("l", "live", "u-live", true, 3600),
        ];
        let first = decide(&candidates, &owners(), now(), &policy(2));
        candidates.reverse();
        let second = decide(&candidates, &owners(), now(), &policy(2));
        assert_eq!(first, second);
        let deleted: Vec<&str> = first.deletions().map(|d| d.candidate.id.as_str()).collect();
        assert_eq!(deleted, vec!["a", "b"]);
    }

    #[test]
    fn reasons_name_the_owner_and_what_was_seen() {
        let plan = decide(
            &[
                sandbox("a", "renamed", "u-old", true, 3600),
                sandbox("b", "live", "u-live", false, 3600),
                volume("v", "gone-vol", "u", Some("Delete"), false, 3600),
            ],
            &owners(),
            now(),
            &policy(10),
        );
        let why: BTreeMap<&str, &str> = plan
            .decisions
            .iter()
            .map(|d| (d.candidate.id.as_str(), d.why.as_str()))
            .collect();
        assert_eq!(
            why["a"],
            "owner Sandbox ns/renamed is another object now (UID u-new, labelled UID u-old)"
        );
        assert!(
            why["b"].contains("never started") && why["b"].contains("recreates"),
            "{}",
            why["b"]
        );
        assert_eq!(why["v"], "owner SandboxVolume ns/gone-vol does not exist");
        // Listed 3600 s old: reported as 3599 s, the age never overstated.
        assert_eq!(plan.decisions[0].age, Some(Duration::from_secs(3599)));
    }

    #[test]
    fn quiet_keeps_are_the_normal_ones() {
        assert!(Keep::OwnerLive.is_quiet());
        assert!(Keep::OtherInstance.is_quiet());
        assert!(!Keep::YoungerThanGrace.is_quiet());
        assert!(!Keep::Retained(None).is_quiet());
    }
}
