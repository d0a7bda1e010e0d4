//! Proof that the conformance suite can fail: the Docker provider wrapped in a `dyn Provider`
//! that breaks exactly one rule, run through the check for that rule, which must return
//! `Err`. (The same checks pass on the unwrapped provider in `tests/conformance_docker.rs`.)

mod harness;
#[macro_use]
mod conformance;

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use sandbox_operator::provider::{
    BulkFiles, Capacity, CapacityProbe, CreateRequest, DirEntry, Egress, EgressState,
    EgressVerdict, ExecOutput, ExecRequest, Files, Hibernation, HibernationOutcome, Provider,
    ProviderError, ProviderEvents, ProviderResult, SandboxDescriptor, SandboxQuery, SetResources,
    StartedAt, Templates, VolumeInfo, VolumeQuery, Volumes,
};

use conformance::{Check, Fixture};

/// The one rule a [`Broken`] provider breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Breakage {
    /// `find` returns `Ok(vec![])` when it could not look (rule 1).
    FindHidesFailure,
    /// Reading an absent file returns empty bytes (rule 2).
    AbsentFileReadsEmpty,
    /// A volume held by a sandbox that is not running reads as unattached (rule 4).
    StoppedHolderIsUnattached,
    /// Destroying an absent sandbox is `NotFound` (rule 5).
    DestroyOfAbsentFails,
    /// A never-started sandbox reports its creation time as `started_at` (rule 6).
    StartedAtFromCreatedAt,
    /// Hibernation stops the sandbox but reports the processes preserved (rule 7).
    HibernationClaimsPreserved,
    /// Capacity answers zeros when it could not measure (rule 8).
    CapacityZerosOnFailure,
    /// The egress verdict is always `Filtered`, whatever is observed (rule 9).
    EgressVerdictIsFiltered,
    /// A memory ceiling is silently dropped at create (rule 10).
    MemoryCeilingIgnored,
    /// `events()` is `None` although the factory declares it (the capability set).
    EventsHidden,
}

/// A provider that delegates to `inner` except for its one [`Breakage`].
struct Broken {
    inner: Arc<dyn Provider>,
    breakage: Breakage,
}

impl Broken {
    fn is(&self, breakage: Breakage) -> bool {
        self.breakage == breakage
    }

    fn lie_about_start(&self, mut d: SandboxDescriptor) -> SandboxDescriptor {
        if self.is(Breakage::StartedAtFromCreatedAt)
            && let (StartedAt::Never, Some(created)) = (d.started_at, d.created_at)
        {
            d.started_at = StartedAt::At(created);
        }
        d
    }
}

#[async_trait]
impl Provider for Broken {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    async fn create(&self, request: &CreateRequest) -> ProviderResult<SandboxDescriptor> {
        let mut request = request.clone();
        if self.is(Breakage::MemoryCeilingIgnored) {
            request.resources.memory_bytes = None;
        }
        let d = self.inner.create(&request).await?;
        Ok(self.lie_about_start(d))
    }

    async fn describe(&self, id: &str) -> ProviderResult<Option<SandboxDescriptor>> {
        let d = self.inner.describe(id).await?;
        Ok(d.map(|d| self.lie_about_start(d)))
    }

    async fn find(&self, query: &SandboxQuery) -> ProviderResult<Vec<SandboxDescriptor>> {
        match self.inner.find(query).await {
            Err(_) if self.is(Breakage::FindHidesFailure) => Ok(vec![]),
            found => Ok(found?
                .into_iter()
                .map(|d| self.lie_about_start(d))
                .collect()),
        }
    }

    async fn start(&self, id: &str) -> ProviderResult<()> {
        self.inner.start(id).await
    }

    async fn stop(&self, id: &str) -> ProviderResult<()> {
        self.inner.stop(id).await
    }

    async fn sleep(&self, id: &str) -> ProviderResult<()> {
        self.inner.sleep(id).await
    }

    async fn wake(&self, id: &str) -> ProviderResult<()> {
        self.inner.wake(id).await
    }

    async fn destroy(&self, id: &str) -> ProviderResult<()> {
        if self.is(Breakage::DestroyOfAbsentFails) && self.inner.describe(id).await?.is_none() {
            return Err(ProviderError::not_found(format!(
                "sandbox {id} does not exist"
            )));
        }
        self.inner.destroy(id).await
    }

    async fn exec(&self, id: &str, request: &ExecRequest) -> ProviderResult<ExecOutput> {
        self.inner.exec(id, request).await
    }

    fn hibernation(&self) -> Option<&dyn Hibernation> {
        self.inner.hibernation().map(|_| self as &dyn Hibernation)
    }

    fn volumes(&self) -> Option<&dyn Volumes> {
        self.inner.volumes().map(|_| self as &dyn Volumes)
    }

    fn templates(&self) -> Option<&dyn Templates> {
        self.inner.templates()
    }

    fn resources(&self) -> Option<&dyn SetResources> {
        self.inner.resources()
    }

    fn capacity(&self) -> Option<&dyn CapacityProbe> {
        self.inner.capacity().map(|_| self as &dyn CapacityProbe)
    }

    fn files(&self) -> Option<&dyn Files> {
        self.inner.files().map(|_| self as &dyn Files)
    }

    fn bulk_files(&self) -> Option<&dyn BulkFiles> {
        self.inner.bulk_files()
    }

    fn egress(&self) -> Option<&dyn Egress> {
        self.inner.egress().map(|_| self as &dyn Egress)
    }

    fn events(&self) -> Option<&dyn ProviderEvents> {
        if self.is(Breakage::EventsHidden) {
            return None;
        }
        self.inner.events()
    }
}

/// The inner provider's capability `cap`, which the accessors above only expose when it
/// exists.
fn inner<T: ?Sized>(cap: Option<&T>) -> &T {
    cap.expect("exposed only when the inner provider has it")
}

#[async_trait]
impl Hibernation for Broken {
    async fn hibernate(&self, id: &str) -> ProviderResult<HibernationOutcome> {
        if !self.is(Breakage::HibernationClaimsPreserved) {
            return inner(self.inner.hibernation()).hibernate(id).await;
        }
        self.inner.stop(id).await?;
        Ok(HibernationOutcome {
            processes_preserved: true,
            mechanism: "stop".into(),
            detail: None,
        })
    }

    async fn resume(&self, id: &str) -> ProviderResult<HibernationOutcome> {
        if !self.is(Breakage::HibernationClaimsPreserved) {
            return inner(self.inner.hibernation()).resume(id).await;
        }
        self.inner.start(id).await?;
        Ok(HibernationOutcome {
            processes_preserved: true,
            mechanism: "start".into(),
            detail: None,
        })
    }
}

impl Broken {
    fn unattach(&self, mut v: VolumeInfo) -> VolumeInfo {
        if self.is(Breakage::StoppedHolderIsUnattached) {
            v.attached = false;
            v.attached_to.clear();
        }
        v
    }
}

#[async_trait]
impl Volumes for Broken {
    async fn create_volume(
        &self,
        name: &str,
        labels: &BTreeMap<String, String>,
    ) -> ProviderResult<VolumeInfo> {
        inner(self.inner.volumes())
            .create_volume(name, labels)
            .await
    }

    async fn remove_volume(&self, name: &str) -> ProviderResult<()> {
        inner(self.inner.volumes()).remove_volume(name).await
    }

    async fn get_volume(&self, name: &str) -> ProviderResult<Option<VolumeInfo>> {
        let got = inner(self.inner.volumes()).get_volume(name).await?;
        Ok(got.map(|v| self.unattach(v)))
    }

    async fn list_volumes(&self, query: &VolumeQuery) -> ProviderResult<Vec<VolumeInfo>> {
        let listed = inner(self.inner.volumes()).list_volumes(query).await?;
        Ok(listed.into_iter().map(|v| self.unattach(v)).collect())
    }
}

#[async_trait]
impl CapacityProbe for Broken {
    async fn capacity(&self) -> ProviderResult<Capacity> {
        match inner(self.inner.capacity()).capacity().await {
            Err(_) if self.is(Breakage::CapacityZerosOnFailure) => Ok(Capacity {
                admits: None,
                detail: "could not measure".into(),
                disk_bytes: Some(0),
                inodes: Some(0),
                memory_bytes: Some(0),
            }),
            measured => measured,
        }
    }
}

#[async_trait]
impl Files for Broken {
    async fn read_file(&self, id: &str, path: &str) -> ProviderResult<Vec<u8>> {
        match inner(self.inner.files()).read_file(id, path).await {
            Err(e)
                if self.is(Breakage::AbsentFileReadsEmpty)
                    && e.is(sandbox_operator::provider::ErrorKind::NotFound) =>
            {
                Ok(vec![])
            }
            read => read,
        }
    }

    async fn write_file(&self, id: &str, path: &str, data: &[u8], mode: u32) -> ProviderResult<()> {
        inner(self.inner.files())
            .write_file(id, path, data, mode)
            .await
    }

    async fn list_dir(&self, id: &str, path: &str) -> ProviderResult<Vec<DirEntry>> {
        inner(self.inner.files()).list_dir(id, path).await
    }

    async fn delete_path(&self, id: &str, path: &str) -> ProviderResult<()> {
        inner(self.inner.files()).delete_path(id, path).await
    }
}

#[async_trait]
impl Egress for Broken {
    async fn egress_verdict(&self, id: &str) -> ProviderResult<EgressVerdict> {
        let observed = inner(self.inner.egress()).egress_verdict(id).await?;
        if !self.is(Breakage::EgressVerdictIsFiltered) {
            return Ok(observed);
        }
        Ok(EgressVerdict {
            state: EgressState::Filtered,
            detail: "as configured".into(),
            remediation: None,
        })
    }
}

/// A Docker fixture whose provider and unreachable twin both carry `breakage`.
async fn broken(breakage: Breakage) -> Fixture {
    let mut fixture = conformance::docker::fixture()
        .await
        .expect("the Docker factory never skips");
    fixture.provider = Arc::new(Broken {
        inner: fixture.provider.clone(),
        breakage,
    });
    fixture.unreachable = Arc::new(Broken {
        inner: fixture.unreachable.clone(),
        breakage,
    });
    fixture
}

/// Runs `check` against a provider with `breakage`; passes only when the check fails and
/// its message contains `names` (so it failed for the rule that was broken).
async fn must_fail<F>(breakage: Breakage, names: &str, check: F)
where
    F: AsyncFnOnce(&Fixture) -> Check,
{
    let fixture = broken(breakage).await;
    let result = check(&fixture).await;
    fixture.cleanup().await;
    match result {
        Ok(()) => panic!("the check passed a provider with {breakage:?}"),
        Err(failure) => {
            println!("{breakage:?} is caught: {failure}");
            assert!(
                failure.contains(names),
                "{breakage:?} failed the check, but not for {names:?}: {failure}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn find_that_hides_a_failed_call_fails_rule_1() {
    must_fail(Breakage::FindHidesFailure, "rule 1: find", async |fx| {
        conformance::rules::rule_01_enumerations_fail_when_they_cannot_look(fx).await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_bytes_for_an_absent_file_fail_rule_2() {
    must_fail(Breakage::AbsentFileReadsEmpty, "rule 2", async |fx| {
        conformance::rules::rule_02_absent_files_are_errors_and_bytes_cross_unchanged(fx).await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_holder_read_as_unattached_fails_rule_4() {
    must_fail(Breakage::StoppedHolderIsUnattached, "rule 4", async |fx| {
        conformance::rules::rule_04_unknown_attachment_and_use_read_as_in_use(fx).await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destroy_of_an_absent_id_as_not_found_fails_rule_5() {
    must_fail(Breakage::DestroyOfAbsentFails, "rule 5", async |fx| {
        conformance::rules::rule_05_destroy_and_removal_are_idempotent(fx).await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_time_for_wreckage_fails_rule_6() {
    must_fail(Breakage::StartedAtFromCreatedAt, "rule 6", async |fx| {
        conformance::rules::rule_06_started_at_none_means_never_started(fx).await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claiming_preserved_processes_after_a_stop_fails_rule_7() {
    must_fail(Breakage::HibernationClaimsPreserved, "rule 7", async |fx| {
        conformance::rules::rule_07_hibernation_reports_what_happened(fx).await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zeros_for_unmeasured_capacity_fail_rule_8() {
    must_fail(Breakage::CapacityZerosOnFailure, "rule 8", async |fx| {
        conformance::rules::rule_08_unmeasured_capacity_is_absent_never_zero(fx).await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configured_egress_verdict_fails_rule_9() {
    must_fail(Breakage::EgressVerdictIsFiltered, "rule 9", async |fx| {
        conformance::rules::rule_09_egress_verdict_is_an_observation(fx).await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silently_ignored_memory_ceiling_fails_rule_10() {
    must_fail(
        Breakage::MemoryCeilingIgnored,
        "rule 10: memory",
        async |fx| conformance::rules::rule_10_unenforceable_fields_are_refused(fx).await,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capability_missing_from_the_declared_set_fails() {
    must_fail(Breakage::EventsHidden, "events()", async |fx| {
        conformance::lifecycle::capabilities_are_exactly_the_declared_set(fx).await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capability_missing_from_the_declared_set_fails_its_own_check() {
    must_fail(Breakage::EventsHidden, "events()", async |fx| {
        conformance::events::capability_events(fx).await
    })
    .await;
}

/// The opt-in mechanism itself: a live factory without its credentials declines, and the
/// suite turns that into a printed reason instead of a run.
#[test]
fn a_live_run_without_credentials_is_skipped_with_its_reason() {
    let var = "SANDBOX_LIVE_CONFORMANCE_NEVER_SET";
    let declined = conformance::live_env(var).expect_err("the variable is not set");
    assert!(declined.0.contains(var), "{declined:?}");
    assert!(conformance::setup(Err(declined)).is_none());
}
