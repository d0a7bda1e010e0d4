//! Image pulls as a Sandbox reports them: while a provider pulls the image, the Sandbox is
//! `Reconciling` with reason `PullingImage` and a `Pulling` Event marks the start; the create
//! that follows the pull publishes a `Pulled` Event with the size and the duration.
//!
//! A pull in progress is not a failure: it is polled at a steady short interval instead of
//! the error backoff, and it does not complete the generation (the spec is not converged yet).

use std::time::Duration;

use kube::api::Api;
use kube::runtime::controller::Action;

use crate::api::{Sandbox, SandboxStatus, condition};
use crate::controller::events::normal;
use crate::controller::status::{self, Health, READY};
use crate::controller::{Context, Error, Result};
use crate::provider::image::PULLING_IMAGE;
use crate::provider::{ImagePull, ProviderError};

/// How often a Sandbox waiting for its image looks again.
pub const POLL: Duration = Duration::from_secs(2);

/// The provider's "still pulling" answer, when `err` is one.
pub fn in_progress(err: &Error) -> Option<&ProviderError> {
    match err {
        Error::Provider(p) if p.reason() == PULLING_IMAGE => Some(p),
        _ => None,
    }
}

/// Reports a pull in progress: Reconciling/`PullingImage` (with the generation left
/// unfinished), a `Pulling` Event when the pull starts, and a poll after [`POLL`].
pub async fn report(
    ctx: &Context,
    api: &Api<Sandbox>,
    sandbox: &Sandbox,
    current: &SandboxStatus,
    mut next: SandboxStatus,
    pulling: &ProviderError,
) -> Result<Action> {
    next.observed_generation = current.observed_generation;
    let mut conditions = next.conditions.clone();
    Health::progressing(PULLING_IMAGE, pulling.message()).apply(
        &mut conditions,
        current.observed_generation,
        &status::now(),
    );
    next.conditions = conditions;
    let before = condition(&current.conditions, READY).map(|c| c.reason.as_str());
    if before != Some(PULLING_IMAGE) {
        normal(ctx, sandbox, "Pulling", pulling.message().to_string()).await;
    }
    super::apply::save(ctx, api, sandbox, Some(current), &next).await?;
    Ok(Action::requeue(POLL))
}

/// Publishes the `Pulled` Event of a create that used a pull.
pub async fn pulled(ctx: &Context, sandbox: &Sandbox, pull: &ImagePull, digest: Option<&str>) {
    let size = pull
        .size_bytes
        .map_or("size unknown".to_string(), |b| format!("{b} bytes"));
    let digest = digest.map_or(String::new(), |d| format!(" as {d}"));
    normal(
        ctx,
        sandbox,
        "Pulled",
        format!(
            "pulled image {:?}{digest} in {:.1} s; image size {size}",
            pull.reference,
            pull.duration.as_secs_f64()
        ),
    )
    .await;
}
