//! Properties of the sweeper, over random pictures: inventories with owners present, gone,
//! replaced or unreadable; every sandbox state; start records that are known, unknown or
//! left out of the listing; ages around the grace period; other instances' and incomplete
//! labels; volumes and templates in every condition.
//!
//! - `decide` never puts in the delete set a sandbox that is running, sleeping, has run or
//!   may have run (`Unknown`) while its owner lives, nor anything not ours or not old enough,
//!   nor anything but proven wreckage whose owner could not be read; it respects the cap and
//!   ignores listing order.
//! - A whole pass over an in-memory provider, where the listing may leave out what a
//!   describe shows: a dry run lists exactly what a real pass then deletes, and the real
//!   pass never deletes a sandbox that has run while its owner lives, nor anything whose
//!   owner could not be read.
//!
//! No Docker, no API server: the provider is a map and the owners a table.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use proptest::prelude::*;
use sandbox_operator::config::SweeperConfig;
use sandbox_operator::controller::sweeper::decide::{
    self, Candidate, Category, Observation, OwnerFact, OwnerFacts, OwnerKey, OwnerKind, Policy,
    Verdict,
};
use sandbox_operator::controller::sweeper::owners::{OwnerRead, OwnerSource};
use sandbox_operator::controller::sweeper::{SweepError, Sweeper};
use sandbox_operator::metrics::Metrics;
use sandbox_operator::provider::labels::{KIND, MANAGED_BY, OWNER, OWNER_UID, RECLAIM_POLICY};
use sandbox_operator::provider::{
    CommitRequest, CreateRequest, ExecOutput, ExecRequest, Provider, ProviderError, ProviderResult,
    SandboxDescriptor, SandboxQuery, SandboxState, StartedAt, Template, Templates, VolumeInfo,
    VolumeQuery, Volumes,
};
use sandbox_operator::registry::ProviderHandle;

const INSTANCE: &str = "ops";
/// Cases per property: the decide step is cheap; a whole pass runs a small runtime each.
const DECIDE_CASES: u32 = 2048;
const PASS_CASES: u32 = 256;

fn now() -> DateTime<Utc> {
    DateTime::from_timestamp(1_750_000_000, 0).unwrap()
}

/// What the API server says about one owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// Exists with the labelled UID.
    Live,
    /// Exists, but is another object (another UID).
    Replaced,
    /// Does not exist.
    Gone,
    /// Could not be read.
    Unreadable,
}

/// One random provider resource, with what a listing says and what a describe says.
#[derive(Debug, Clone)]
struct Res {
    id: String,
    kind: OwnerKind,
    /// Index into the owner pool.
    owner: usize,
    /// `None`: no managed-by label; `Some(false)`: another instance's.
    ours: Option<bool>,
    /// Drop one owner label (not made by this operator).
    incomplete: bool,
    age_secs: Option<u64>,
    /// Sandbox: its state, the truth about its start, and what the listing says.
    state: SandboxState,
    truth: StartedAt,
    listed: StartedAt,
    /// Volume: attached, and its reclaim policy label.
    attached: bool,
    policy: Option<&'static str>,
    /// Template: in use.
    in_use: bool,
}

fn fate() -> impl Strategy<Value = Fate> {
    prop_oneof![
        Just(Fate::Live),
        Just(Fate::Replaced),
        Just(Fate::Gone),
        Just(Fate::Unreadable)
    ]
}

fn state() -> impl Strategy<Value = SandboxState> {
    prop_oneof![
        Just(SandboxState::Creating),
        Just(SandboxState::Running),
        Just(SandboxState::Sleeping),
        Just(SandboxState::Stopped)
    ]
}

fn started() -> impl Strategy<Value = StartedAt> {
    prop_oneof![
        Just(StartedAt::Never),
        Just(StartedAt::Unknown),
        (0i64..5000).prop_map(|s| StartedAt::At(now() - chrono::Duration::seconds(s))),
    ]
}

/// A listing's word on the start: the truth, left out (`Unknown`), or — a provider that
/// gets it wrong — `Never`.
fn listing_of(truth: StartedAt) -> impl Strategy<Value = StartedAt> {
    prop_oneof![
        3 => Just(truth),
        2 => Just(StartedAt::Unknown),
        1 => Just(StartedAt::Never),
    ]
}

fn resource(index: usize) -> impl Strategy<Value = Res> {
    let kind = prop_oneof![
        4 => Just(OwnerKind::Sandbox),
        1 => Just(OwnerKind::SandboxVolume),
        1 => Just(OwnerKind::SandboxTemplate),
        1 => Just(OwnerKind::SandboxWarmPool)
    ];
    let ours = prop_oneof![8 => Just(Some(true)), 1 => Just(Some(false)), 1 => Just(None)];
    let policy = prop_oneof![Just(Some("Delete")), Just(Some("Retain")), Just(None)];
    (
        (kind, 0usize..6, ours, prop::bool::weighted(0.1)),
        prop::option::weighted(0.9, 0u64..3000),
        (state(), started()),
        (any::<bool>(), policy, any::<bool>()),
    )
        .prop_flat_map(
            move |(who, age, (state, truth), (attached, policy, in_use))| {
                listing_of(truth).prop_map(move |listed| Res {
                    id: format!("r{index}"),
                    kind: who.0,
                    owner: who.1,
                    ours: who.2,
                    incomplete: who.3,
                    age_secs: age,
                    state,
                    truth,
                    listed,
                    attached,
                    policy,
                    in_use,
                })
            },
        )
}

fn picture() -> impl Strategy<Value = (Vec<Res>, Vec<Fate>, u64, usize)> {
    (0usize..14)
        .prop_flat_map(|n| (0..n).map(resource).collect::<Vec<_>>())
        .prop_flat_map(|res| {
            (
                Just(res),
                prop::collection::vec(fate(), 6),
                0u64..2000,
                0usize..12,
            )
        })
}

fn owner_name(index: usize) -> String {
    format!("o{index}")
}

fn uid(index: usize) -> String {
    format!("uid-{index}")
}

fn labels(r: &Res) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::from([
        (OWNER_UID.to_string(), uid(r.owner)),
        (OWNER.to_string(), format!("ns.{}", owner_name(r.owner))),
        (KIND.to_string(), r.kind.as_str().to_string()),
    ]);
    match r.ours {
        Some(true) => labels.insert(MANAGED_BY.into(), INSTANCE.into()),
        Some(false) => labels.insert(MANAGED_BY.into(), "someone-else".into()),
        None => None,
    };
    if r.incomplete {
        labels.remove(OWNER_UID);
    }
    if let Some(p) = r.policy {
        labels.insert(RECLAIM_POLICY.into(), p.into());
    }
    labels
}

fn created_at(r: &Res) -> Option<DateTime<Utc>> {
    r.age_secs
        .map(|s| now() - chrono::Duration::seconds(i64::try_from(s).unwrap()))
}

/// The candidate a listing gives (`listed`) or a describe (`!listed`).
fn candidate(r: &Res, listed: bool) -> Candidate {
    let observation = match r.kind {
        OwnerKind::Sandbox | OwnerKind::SandboxWarmPool => Observation::Sandbox {
            state: r.state,
            started: if listed { r.listed } else { r.truth },
        },
        OwnerKind::SandboxVolume => Observation::Volume {
            attached: r.attached,
            attached_to: Vec::new(),
        },
        OwnerKind::SandboxTemplate => Observation::Template { in_use: r.in_use },
    };
    Candidate {
        id: r.id.clone(),
        labels: labels(r),
        created_at: created_at(r),
        observation,
    }
}

fn key(kind: OwnerKind, owner: usize) -> OwnerKey {
    OwnerKey {
        kind,
        namespace: "ns".into(),
        name: owner_name(owner),
    }
}

/// Every owner of every kind in the pool, as the API server would answer.
fn facts(fates: &[Fate]) -> OwnerFacts {
    let kinds = [
        OwnerKind::Sandbox,
        OwnerKind::SandboxVolume,
        OwnerKind::SandboxTemplate,
        OwnerKind::SandboxWarmPool,
    ];
    kinds
        .iter()
        .flat_map(|kind| {
            fates.iter().enumerate().map(|(i, fate)| {
                let fact = match fate {
                    Fate::Live => OwnerFact::Live { uid: uid(i) },
                    Fate::Replaced => OwnerFact::Live {
                        uid: format!("other-{i}"),
                    },
                    Fate::Gone => OwnerFact::Absent,
                    Fate::Unreadable => OwnerFact::Unknown("timed out".into()),
                };
                (key(*kind, i), fact)
            })
        })
        .collect()
}

/// Whether `r` is a sandbox (a Sandbox's or a warm pool member) that has (or may have) run,
/// or runs, while its owner lives.
fn protected(r: &Res, fates: &[Fate]) -> bool {
    matches!(r.kind, OwnerKind::Sandbox | OwnerKind::SandboxWarmPool)
        && fates[r.owner] == Fate::Live
        && !r.incomplete
        && (r.truth.has_run() || matches!(r.state, SandboxState::Running | SandboxState::Sleeping))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(DECIDE_CASES))]

    #[test]
    fn decide_never_deletes_what_ran_under_a_live_owner(
        (res, fates, grace, max) in picture()
    ) {
        let candidates: Vec<Candidate> = res.iter().map(|r| candidate(r, false)).collect();
        let policy = Policy {
            instance: INSTANCE.into(),
            grace: Duration::from_secs(grace),
            max_deletions: max,
        };
        let owners = facts(&fates);
        let plan = decide::decide(&candidates, &owners, now(), &policy);
        prop_assert_eq!(plan.decisions.len(), res.len());
        prop_assert!(plan.deletions().count() <= max);
        for d in &plan.decisions {
            let (Verdict::Delete(category) | Verdict::Deferred(category)) = d.verdict else {
                continue;
            };
            let r = res.iter().find(|r| r.id == d.candidate.id).unwrap();
            prop_assert!(!protected(r, &fates), "deleted a sandbox that ran: {:?}", d);
            prop_assert_eq!(r.ours, Some(true), "not ours: {:?}", d);
            prop_assert!(!r.incomplete, "incomplete owner labels: {:?}", d);
            prop_assert!(d.age.is_some_and(|a| a >= policy.grace), "too young: {:?}", d);
            if category == Category::Wreckage {
                // Wreckage is decided whatever its owner's state (the act step reads the
                // owner before deleting it: see the pass property).
                prop_assert_eq!(r.truth, StartedAt::Never);
                prop_assert!(matches!(r.state, SandboxState::Creating | SandboxState::Stopped));
            } else {
                prop_assert!(fates[r.owner] != Fate::Live, "owner lives: {:?}", d);
                prop_assert!(fates[r.owner] != Fate::Unreadable, "owner unreadable: {:?}", d);
            }
        }
        let mut reversed = candidates.clone();
        reversed.reverse();
        prop_assert_eq!(decide::decide(&reversed, &owners, now(), &policy), plan);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(PASS_CASES))]

    #[test]
    fn a_dry_run_lists_exactly_what_a_real_pass_deletes(
        (res, fates, grace, max) in picture()
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let store = Arc::new(Store::of(&res));
        let config = SweeperConfig {
            grace_secs: grace,
            max_deletions_per_pass: max,
            ..SweeperConfig::default()
        };
        let pass = |dry_run: bool| {
            let metrics = Metrics::new();
            let owners = Arc::new(Owners(facts(&fates)));
            let sweeper = Sweeper::with_owner_source(owners, metrics.clone(), INSTANCE, &config)
                .with_dry_run(dry_run);
            let handle = ProviderHandle::new(store.clone(), 4, Duration::from_secs(10), metrics);
            runtime.block_on(async move { sweeper.pass_at(&handle, now()).await })
        };
        let dry = pass(true);
        prop_assert!(store.deleted().is_empty(), "a dry run deleted {:?}", store.deleted());
        let real = pass(false);
        prop_assert_eq!(dry.reclaimed(), real.reclaimed(), "\n{}\n{}", dry.render_table(), real.render_table());
        let deleted = store.deleted();
        let reclaimed: BTreeSet<String> = real
            .reclaimed()
            .iter()
            .map(|k| k.split_once('/').unwrap().1.to_string())
            .collect();
        prop_assert_eq!(&deleted, &reclaimed);
        for r in deleted.iter().filter_map(|id| res.iter().find(|r| r.id == *id)) {
            prop_assert!(!protected(r, &fates), "deleted {:?} whose owner lives:\n{}", r, real.render_table());
            prop_assert!(
                fates[r.owner] != Fate::Unreadable,
                "deleted {:?} whose owner could not be read:\n{}", r, real.render_table()
            );
        }
    }
}

/// The owners as a fixed table: reads agree with the listing's facts.
struct Owners(OwnerFacts);

#[async_trait]
impl OwnerSource for Owners {
    async fn facts(&self, _: &[Candidate], _: &str) -> Result<OwnerFacts, SweepError> {
        Ok(self.0.clone())
    }

    async fn read(&self, key: &OwnerKey) -> Result<Option<OwnerRead>, String> {
        match self.0.get(key) {
            Some(OwnerFact::Live { uid }) => Ok(Some(OwnerRead {
                uid: uid.clone(),
                current_sandbox: None,
            })),
            Some(OwnerFact::Unknown(why)) => Err(why.clone()),
            Some(OwnerFact::Absent) | None => Ok(None),
        }
    }
}

/// An in-memory provider: listings show what `Res::listed` says, a describe the truth.
struct Store {
    resources: Vec<Res>,
    deleted: Mutex<BTreeSet<String>>,
}

impl Store {
    fn of(res: &[Res]) -> Store {
        Store {
            resources: res.to_vec(),
            deleted: Mutex::new(BTreeSet::new()),
        }
    }

    fn deleted(&self) -> BTreeSet<String> {
        self.deleted.lock().unwrap().clone()
    }

    fn present(&self, kind: OwnerKind) -> impl Iterator<Item = &Res> {
        let deleted = self.deleted();
        self.resources
            .iter()
            .filter(move |r| r.kind == kind && !deleted.contains(&r.id))
    }

    fn one(&self, kind: OwnerKind, id: &str) -> Option<&Res> {
        self.present(kind).find(|r| r.id == id)
    }

    fn delete(&self, id: &str) -> ProviderResult<()> {
        self.deleted.lock().unwrap().insert(id.to_string());
        Ok(())
    }

    fn matches(r: &Res, want: &BTreeMap<String, String>) -> bool {
        let have = labels(r);
        want.iter().all(|(k, v)| have.get(k) == Some(v))
    }
}

fn sandbox(r: &Res, listed: bool) -> SandboxDescriptor {
    SandboxDescriptor {
        id: r.id.clone(),
        state: r.state,
        labels: labels(r),
        created_at: created_at(r),
        started_at: if listed { r.listed } else { r.truth },
        exit_code: None,
        template_ref: None,
        image: None,
        volumes: Vec::new(),
        ports: Vec::new(),
        resources: Default::default(),
        command: None,
        restart_policy: Default::default(),
        env: BTreeMap::new(),
        image_digest: None,
        image_pull: None,
        isolation: None,
    }
}

fn volume(r: &Res) -> VolumeInfo {
    VolumeInfo {
        name: r.id.clone(),
        attached: r.attached,
        attached_to: Vec::new(),
        labels: labels(r),
        created_at: created_at(r),
        size_bytes: None,
    }
}

fn template(r: &Res) -> Template {
    Template {
        id: r.id.clone(),
        reference: r.id.clone(),
        created_at: created_at(r),
        size_bytes: None,
        label: None,
        labels: labels(r),
        capture_paths: Vec::new(),
        base_image: None,
        in_use: r.in_use,
    }
}

fn refused<T>(what: &str) -> ProviderResult<T> {
    Err(ProviderError::unsupported(format!(
        "{what}: not in this test"
    )))
}

#[async_trait]
impl Provider for Store {
    fn name(&self) -> &str {
        "memory"
    }
    fn kind(&self) -> &'static str {
        "memory"
    }
    async fn create(&self, _: &CreateRequest) -> ProviderResult<SandboxDescriptor> {
        refused("create")
    }
    async fn describe(&self, id: &str) -> ProviderResult<Option<SandboxDescriptor>> {
        let one = |kind| self.one(kind, id);
        let found = one(OwnerKind::Sandbox).or_else(|| one(OwnerKind::SandboxWarmPool));
        Ok(found.map(|r| sandbox(r, false)))
    }
    async fn find(&self, q: &SandboxQuery) -> ProviderResult<Vec<SandboxDescriptor>> {
        Ok(self
            .present(OwnerKind::Sandbox)
            .chain(self.present(OwnerKind::SandboxWarmPool))
            .filter(|r| Store::matches(r, &q.labels))
            .map(|r| sandbox(r, true))
            .collect())
    }
    async fn start(&self, _: &str) -> ProviderResult<()> {
        refused("start")
    }
    async fn stop(&self, _: &str) -> ProviderResult<()> {
        refused("stop")
    }
    async fn sleep(&self, _: &str) -> ProviderResult<()> {
        refused("sleep")
    }
    async fn wake(&self, _: &str) -> ProviderResult<()> {
        refused("wake")
    }
    async fn destroy(&self, id: &str) -> ProviderResult<()> {
        self.delete(id)
    }
    async fn exec(&self, _: &str, _: &ExecRequest) -> ProviderResult<ExecOutput> {
        refused("exec")
    }
    fn volumes(&self) -> Option<&dyn Volumes> {
        Some(self)
    }
    fn templates(&self) -> Option<&dyn Templates> {
        Some(self)
    }
}

#[async_trait]
impl Volumes for Store {
    async fn create_volume(
        &self,
        _: &str,
        _: &BTreeMap<String, String>,
    ) -> ProviderResult<VolumeInfo> {
        refused("create_volume")
    }
    async fn remove_volume(&self, name: &str) -> ProviderResult<()> {
        self.delete(name)
    }
    async fn get_volume(&self, name: &str) -> ProviderResult<Option<VolumeInfo>> {
        Ok(self.one(OwnerKind::SandboxVolume, name).map(volume))
    }
    async fn list_volumes(&self, q: &VolumeQuery) -> ProviderResult<Vec<VolumeInfo>> {
        Ok(self
            .present(OwnerKind::SandboxVolume)
            .filter(|r| Store::matches(r, &q.labels))
            .map(volume)
            .collect())
    }
}

#[async_trait]
impl Templates for Store {
    async fn commit(&self, _: &CommitRequest) -> ProviderResult<Template> {
        refused("commit")
    }
    async fn get_template(&self, id: &str) -> ProviderResult<Option<Template>> {
        Ok(self.one(OwnerKind::SandboxTemplate, id).map(template))
    }
    async fn list_templates(&self, _: Option<&str>) -> ProviderResult<Vec<Template>> {
        Ok(self
            .present(OwnerKind::SandboxTemplate)
            .map(template)
            .collect())
    }
    async fn remove_template(&self, id: &str) -> ProviderResult<()> {
        self.delete(id)
    }
}
