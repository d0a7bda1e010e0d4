//! The hibernation capability: suspend and resume, with the state they leave behind. Rule 7
//! (the outcome is what happened) is checked in `rules`.

use sandbox_operator::provider::{ErrorKind, SandboxState};

use super::Fixture;
use super::rules::{process_identity, start_ticker};
use super::support::{Check, OrFail, describe, expect_kind, running, sh, unique_hex, wait_until};

/// A hibernated sandbox whose processes were preserved reads as `Sleeping` (otherwise as
/// `Stopped`); hibernating it again keeps that; resume makes it `Running` and the workload
/// carries on when preservation was reported; absent ids are `NotFound`.
pub async fn capability_hibernation(fx: &Fixture) -> Check {
    let Some(hib) = fx.provider.hibernation() else {
        ensure!(
            !fx.expect.hibernation,
            "hibernation() is None but the provider declares it"
        );
        return Ok(());
    };
    ensure!(
        fx.expect.hibernation,
        "hibernation() is Some but the provider declares none"
    );
    let id = running(fx).await?;
    let pid = start_ticker(fx, &id).await?;
    let slept = hib.hibernate(&id).await.or_fail("hibernate")?;
    ensure!(
        !slept.mechanism.is_empty(),
        "the outcome names no mechanism: {slept:?}"
    );
    let want = if slept.processes_preserved {
        SandboxState::Sleeping
    } else {
        SandboxState::Stopped
    };
    let state = describe(fx, &id).await?.state;
    ensure!(
        state == want,
        "after hibernate ({slept:?}) the sandbox is {state:?}, want {want:?}"
    );
    let again = hib
        .hibernate(&id)
        .await
        .or_fail("hibernating a hibernated sandbox")?;
    ensure!(
        again.processes_preserved == slept.processes_preserved,
        "hibernating twice changed the answer: {slept:?} then {again:?}"
    );
    let woke = hib.resume(&id).await.or_fail("resume")?;
    let state = describe(fx, &id).await?.state;
    ensure!(
        state == SandboxState::Running,
        "after resume the sandbox is {state:?}"
    );
    if woke.processes_preserved {
        let first = sh(fx, &id, "cat /tmp/conf-tick").await?;
        wait_until(
            "the preserved workload to carry on",
            fx.patience,
            || async {
                let now = sh(fx, &id, "cat /tmp/conf-tick").await?;
                (now != first)
                    .then_some(())
                    .ok_or_else(|| format!("tick still {now:?}"))
            },
        )
        .await?;
        ensure!(
            process_identity(fx, &id, &pid).await?.is_some(),
            "resume reported preserved processes but the workload is gone"
        );
    }
    let resumed = hib
        .resume(&id)
        .await
        .or_fail("resuming a running sandbox")?;
    ensure!(
        resumed.processes_preserved,
        "resuming a running sandbox loses nothing, yet reports {resumed:?}"
    );
    let absent = format!("sbx-{}", unique_hex());
    let nf = [ErrorKind::NotFound];
    expect_kind(
        hib.hibernate(&absent).await,
        &nf,
        "hibernate of an absent sandbox",
    )?;
    expect_kind(
        hib.resume(&absent).await,
        &nf,
        "resume of an absent sandbox",
    )
}
