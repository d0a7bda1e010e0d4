//! The egress capability: observing whether egress is restricted. That the verdict is an
//! observation (rule 9) is checked in `rules`.

use sandbox_operator::provider::{EgressState, ErrorKind};

use super::Fixture;
use super::support::{Check, OrFail, expect_kind, running, running_from, unique_hex};

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

/// An allow-list is replaced in place: the sandbox keeps its id and keeps running, every form
/// (a list, none at all, unrestricted) is accepted, and an absent sandbox is `NotFound`.
pub async fn capability_egress_policy(fx: &Fixture) -> Check {
    let Some(policy) = fx.provider.egress_policy() else {
        ensure!(
            !fx.expect.egress_policy,
            "egress_policy() is None but the provider declares it"
        );
        return Ok(());
    };
    ensure!(
        fx.expect.egress_policy,
        "egress_policy() is Some but the provider declares none"
    );
    let mut request = fx.request();
    request.allowed_domains = Some(vec!["one.example.com".into()]);
    let id = running_from(fx, &request).await?;
    let lists: [Option<Vec<String>>; 3] = [
        Some(vec!["two.example.com".into(), "*.example.org".into()]),
        Some(vec![]),
        None,
    ];
    // A provider that fixes a placement at create (`placement`) replaces lists in place only
    // within it, and refuses a move across placements with `Conflict` (the controller
    // recreates then); every other provider takes every form.
    let created = policy.placement(request.allowed_domains.as_deref());
    for allowed in &lists {
        let result = policy.set_allowed_domains(&id, allowed.as_deref()).await;
        if policy.placement(allowed.as_deref()) == created {
            result.or_fail(&format!("set_allowed_domains({allowed:?})"))?;
        } else {
            expect_kind(
                result,
                &[ErrorKind::Conflict],
                &format!("set_allowed_domains({allowed:?}) across placements"),
            )?;
        }
        let d = fx
            .provider
            .describe(&id)
            .await
            .or_fail("describe after replacing the allow-list")?
            .ok_or_else(|| format!("sandbox {id} is gone after replacing its allow-list"))?;
        ensure!(d.id == id, "the sandbox changed id: {} -> {}", id, d.id);
    }
    expect_kind(
        policy
            .set_allowed_domains(&format!("sbx-{}", unique_hex()), None)
            .await,
        &[ErrorKind::NotFound],
        "replacing the allow-list of an absent sandbox",
    )
}
