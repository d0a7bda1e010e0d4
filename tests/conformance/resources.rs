//! The set_resources capability: changing a running sandbox's ceilings in place.

use sandbox_operator::provider::{ErrorKind, Resources};

use super::Fixture;
use super::support::{Check, OrFail, describe, expect_kind, running_from, sh, unique_hex};

/// When the sandbox's PID 1 started (field 22 of `/proc/1/stat`, in clock ticks since boot):
/// it changes exactly when the main process was started again.
async fn pid1_start(fx: &Fixture, id: &str) -> Result<String, String> {
    let out = sh(fx, id, "sed 's/.*) //' /proc/1/stat | cut -d' ' -f20").await?;
    Ok(out.trim().to_string())
}

/// The ceilings this provider enforces, at `scale` (1 = the create-time values).
fn ceilings(fx: &Fixture, cpu: u64, memory_mib: u64, pids: i64) -> Resources {
    Resources {
        cpu_millis: fx.expect.cpu.then_some(cpu),
        memory_bytes: fx.expect.memory.then_some(memory_mib << 20),
        disk_bytes: None,
        pids: fx.expect.pids.then_some(pids),
    }
}

/// New ceilings are applied and reported (by the call and by `describe`), and the call says
/// truthfully whether it restarted the sandbox (PID 1's start time is compared); fields left out
/// keep their values; a ceiling the provider cannot change in place is `Unsupported` and
/// changes nothing; an absent sandbox is `NotFound`.
pub async fn capability_set_resources(fx: &Fixture) -> Check {
    let Some(res) = fx.provider.resources() else {
        ensure!(
            !fx.expect.set_resources,
            "resources() is None but the provider declares it"
        );
        return Ok(());
    };
    ensure!(
        fx.expect.set_resources,
        "resources() is Some but the provider declares none"
    );
    // Four distinct memory sizes the provider can apply exactly.
    let step = fx.expect.memory_step_mib.max(1);
    let [first, second, third, fourth] = if step > 1 {
        [step, 2 * step, 3 * step, 4 * step]
    } else {
        [256, 320, 288, 384]
    };
    let mut request = fx.request();
    request.resources = ceilings(fx, 500, first, 128);
    let id = running_from(fx, &request).await?;

    let wanted = ceilings(fx, 250, second, 100);
    let before = pid1_start(fx, &id).await?;
    let change = res
        .set_resources(&id, &wanted)
        .await
        .or_fail("set_resources")?;
    // The result says whether the sandbox was restarted, as it happened.
    let after = pid1_start(fx, &id).await?;
    ensure!(
        change.restarted == (before != after),
        "set_resources reported restarted = {}, but PID 1 started at tick {before} before and \
         {after} after",
        change.restarted
    );
    let applied = change.applied;
    let reported = describe(fx, &id).await?.resources;
    for (what, got) in [("returned", &applied), ("described", &reported)] {
        // Only what was asked is compared: a provider may report a ceiling it always has
        // (Fly's CPU count) where the spec sets none.
        ensure!(
            wanted.cpu_millis.is_none_or(|c| got.cpu_millis == Some(c))
                && got.memory_bytes == wanted.memory_bytes
                && wanted.pids.is_none_or(|p| got.pids == Some(p)),
            "{what} ceilings {got:?}, asked {wanted:?}"
        );
    }
    // Only the fields present change.
    let memory_only = Resources {
        memory_bytes: fx.expect.memory.then_some(third << 20),
        ..Default::default()
    };
    let applied = res
        .set_resources(&id, &memory_only)
        .await
        .or_fail("set_resources")?
        .applied;
    ensure!(
        wanted
            .cpu_millis
            .is_none_or(|c| applied.cpu_millis == Some(c))
            && wanted.pids.is_none_or(|p| applied.pids == Some(p))
            && applied.memory_bytes == memory_only.memory_bytes.or(wanted.memory_bytes),
        "changing one field changed others: {applied:?}"
    );
    // Disk: applied as asked, or refused without touching anything else.
    let with_disk = Resources {
        memory_bytes: fx.expect.memory.then_some(fourth << 20),
        disk_bytes: Some(1 << 30),
        ..Default::default()
    };
    match res.set_resources(&id, &with_disk).await {
        Ok(change) => ensure!(
            change.applied.disk_bytes == Some(1 << 30),
            "an accepted disk ceiling is not reported: {change:?}"
        ),
        Err(e) => {
            ensure!(e.is(ErrorKind::Unsupported), "a refused disk ceiling: {e}");
            let now = describe(fx, &id).await?.resources;
            ensure!(
                now.memory_bytes == applied.memory_bytes,
                "a refused change changed memory: {now:?}"
            );
        }
    }
    let absent = format!("sbx-{}", unique_hex());
    expect_kind(
        res.set_resources(&absent, &wanted).await,
        &[ErrorKind::NotFound],
        "set_resources of an absent sandbox",
    )
}
