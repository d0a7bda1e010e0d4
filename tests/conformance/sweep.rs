//! The sweeper against the provider: a sandbox the suite started and owns is never deleted,
//! whatever the provider's listings leave out (rule 6: only a provider that *knows* a
//! sandbox never ran may say so, and unknown means "has run").
//!
//! The check runs `find`, `inventory` and a whole sweep pass — real deletions, no grace
//! period — in every history mode the fixture's double offers ([`Fixture::history`]: listings
//! without history, history cut short) and once plainly for providers without a double. An
//! orphan beside the owned sandbox, which the pass with complete history must reclaim,
//! proves the pass really deletes.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use sandbox_doubles::History;
use sandbox_operator::config::SweeperConfig;
use sandbox_operator::controller::sweeper::decide::{
    Candidate, OwnerFact, OwnerFacts, OwnerKey, OwnerKind,
};
use sandbox_operator::controller::sweeper::owners::{OwnerRead, OwnerSource};
use sandbox_operator::controller::sweeper::report::{Action, PassReport};
use sandbox_operator::controller::sweeper::{SweepError, Sweeper};
use sandbox_operator::metrics::Metrics;
use sandbox_operator::provider::labels::Owner;
use sandbox_operator::registry::ProviderHandle;

use super::Fixture;
use super::support::{Check, OrFail, create, ids, running_from, stop_or_refused};

/// Owners as the suite declares them: those listed exist with their UID, whose status names
/// no sandbox (the worst case: only rule 6 protects what they own); every other is gone.
pub struct FixedOwners(pub BTreeMap<OwnerKey, String>);

impl FixedOwners {
    /// The owners in `live` exist; every other is gone.
    pub fn live(live: &[&Owner]) -> FixedOwners {
        FixedOwners(
            live.iter()
                .filter_map(|o| Some((key(o)?, o.uid.clone())))
                .collect(),
        )
    }
}

fn key(owner: &Owner) -> Option<OwnerKey> {
    Some(OwnerKey {
        kind: OwnerKind::parse(&owner.kind)?,
        namespace: owner.namespace.clone(),
        name: owner.name.clone(),
    })
}

#[async_trait]
impl OwnerSource for FixedOwners {
    async fn facts(
        &self,
        candidates: &[Candidate],
        _instance: &str,
    ) -> Result<OwnerFacts, SweepError> {
        Ok(candidates
            .iter()
            .filter_map(|c| key(&c.owner()?))
            .map(|k| {
                let fact = match self.0.get(&k) {
                    Some(uid) => OwnerFact::Live { uid: uid.clone() },
                    None => OwnerFact::Absent,
                };
                (k, fact)
            })
            .collect())
    }

    async fn read(&self, key: &OwnerKey) -> Result<Option<OwnerRead>, String> {
        Ok(self.0.get(key).map(|uid| OwnerRead {
            uid: uid.clone(),
            current_sandbox: None,
        }))
    }
}

/// One real pass (grace 0, no cap) over the fixture's provider with `owners`.
pub async fn sweep(fx: &Fixture, owners: FixedOwners) -> PassReport {
    let metrics = Metrics::new();
    let config = SweeperConfig {
        grace_secs: 0,
        max_deletions_per_pass: 100,
        dry_run: false,
        ..SweeperConfig::default()
    };
    let sweeper =
        Sweeper::with_owner_source(Arc::new(owners), metrics.clone(), &fx.instance, &config);
    let handle = ProviderHandle::new(
        fx.provider.clone(),
        8,
        std::time::Duration::from_secs(120),
        metrics,
    );
    sweeper.pass(&handle).await
}

/// The modes to run in: every history mode of the fixture's double, else one plain run.
fn modes(fx: &Fixture) -> Vec<History> {
    match fx.history {
        Some(_) => vec![
            History::OmittedFromListings,
            History::Truncated,
            History::Complete,
        ],
        None => vec![History::Complete],
    }
}

/// Puts the double (if any) in `mode`.
fn set_mode(fx: &Fixture, mode: History) {
    if let Some(set) = &fx.history {
        set(mode);
    }
}

/// A sandbox the suite owns that has run, stopped and run again (stop where the provider
/// has it): what a live, Ready Sandbox whose user changed `spec.state` looks like.
async fn owned_and_cycled(fx: &Fixture, owner: &Owner) -> Result<String, String> {
    let mut request = fx.request();
    request.owner = owner.clone();
    request.name = format!("sbx-{}", owner.uid);
    let id = running_from(fx, &request).await?;
    if stop_or_refused(fx, &id).await? {
        fx.provider.start(&id).await.or_fail("start again")?;
    }
    Ok(id)
}

/// Rule 6 under the sweeper: in every history mode, `find` and `inventory` never call the
/// owned, started sandbox never-started, and a whole real pass keeps it — while it deletes
/// the orphan beside it.
pub async fn sweep_never_deletes_a_started_sandbox_of_a_live_owner(fx: &Fixture) -> Check {
    let owner = fx.owner("Sandbox");
    let owned = owned_and_cycled(fx, &owner).await?;
    for mode in modes(fx) {
        let orphan = create(fx, &fx.request()).await?.id;
        set_mode(fx, mode);
        let result = check_mode(fx, &owner, &owned, &orphan, mode).await;
        set_mode(fx, History::Complete);
        result?;
    }
    Ok(())
}

async fn check_mode(
    fx: &Fixture,
    owner: &Owner,
    owned: &str,
    orphan: &str,
    mode: History,
) -> Check {
    let found = fx
        .provider
        .find(&fx.owner_query(owner))
        .await
        .or_fail("find")?;
    ensure!(
        ids(&found) == vec![owned.to_string()] && found[0].started_at.has_run(),
        "{mode:?}: find must list the started sandbox as one that has run: {found:?}"
    );
    let inventory = fx
        .provider
        .inventory(&fx.instance_labels())
        .await
        .or_fail("inventory")?;
    let listed = inventory.sandboxes.iter().find(|d| d.id == owned);
    ensure!(
        listed.is_some_and(|d| d.started_at.has_run()),
        "{mode:?}: inventory must list the started sandbox as one that has run: {listed:?}"
    );
    let report = sweep(fx, FixedOwners::live(&[owner])).await;
    let table = report.render_table();
    println!("sweep in history mode {mode:?}:\n{table}");
    ensure!(
        report
            .rows
            .iter()
            .all(|r| r.id != owned || !matches!(r.action, Action::Deleted | Action::WouldDelete)),
        "{mode:?}: the sweep deleted a started sandbox of a live owner:\n{table}"
    );
    let still = fx.provider.describe(owned).await.or_fail("describe")?;
    ensure!(
        still.is_some(),
        "{mode:?}: the owned sandbox is gone after the sweep:\n{table}"
    );
    // With history cut, an orphan may be kept too (an E2B listing without `startedAt` gives
    // no age to prove it old enough); with it complete, the pass must reclaim it.
    let orphan_left = fx.provider.describe(orphan).await.or_fail("describe")?;
    ensure!(
        mode != History::Complete || orphan_left.is_none(),
        "{mode:?}: the sweep kept the orphan, so it proved nothing:\n{table}"
    );
    Ok(())
}
