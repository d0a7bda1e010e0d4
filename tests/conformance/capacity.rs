//! The capacity capability: headroom measurement. Zeros-for-unknown (rule 8) is in `rules`.

use super::Fixture;
use super::support::{Check, OrFail};

/// The probe answers, says what it measured, and measures something: a probe that can
/// never measure anything is not a capability.
pub async fn capability_capacity(fx: &Fixture) -> Check {
    let Some(probe) = fx.provider.capacity() else {
        ensure!(
            !fx.expect.capacity,
            "capacity() is None but the provider declares it"
        );
        return Ok(());
    };
    ensure!(
        fx.expect.capacity,
        "capacity() is Some but the provider declares none"
    );
    let c = probe.capacity().await.or_fail("capacity")?;
    ensure!(
        c.disk_bytes.is_some()
            || c.inodes.is_some()
            || c.memory_bytes.is_some()
            || c.admits.is_some(),
        "capacity measured nothing and has no verdict: {c:?}"
    );
    ensure!(
        !c.detail.trim().is_empty(),
        "capacity detail is empty: {c:?}"
    );
    let again = probe.capacity().await.or_fail("capacity, again")?;
    ensure!(
        again.disk_bytes.is_some() == c.disk_bytes.is_some()
            && again.memory_bytes.is_some() == c.memory_bytes.is_some(),
        "what is measurable changed between two calls: {c:?} then {again:?}"
    );
    Ok(())
}
