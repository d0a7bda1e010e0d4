//! The egress capability: observing whether egress is restricted. That the verdict is an
//! observation (rule 9) is checked in `rules`.

use sandbox_operator::provider::{EgressState, ErrorKind};

use super::Fixture;
use super::support::{Check, OrFail, expect_kind, running, unique_hex};

/// A verdict says which mechanism was checked, and one that is not `Filtered` says what to
/// do about it; an absent sandbox is `NotFound`.
pub async fn capability_egress(fx: &Fixture) -> Check {
    let Some(egress) = fx.provider.egress() else {
        ensure!(
            !fx.expect.egress,
            "egress() is None but the provider declares it"
        );
        return Ok(());
    };
    ensure!(
        fx.expect.egress,
        "egress() is Some but the provider declares none"
    );
    let id = running(fx).await?;
    let v = egress.egress_verdict(&id).await.or_fail("egress_verdict")?;
    ensure!(
        !v.detail.trim().is_empty(),
        "the verdict names no mechanism: {v:?}"
    );
    ensure!(
        v.state == EgressState::Filtered || v.remediation.is_some(),
        "a verdict that is not Filtered carries a remediation: {v:?}"
    );
    expect_kind(
        egress
            .egress_verdict(&format!("sbx-{}", unique_hex()))
            .await,
        &[ErrorKind::NotFound],
        "egress verdict of an absent sandbox",
    )
}
