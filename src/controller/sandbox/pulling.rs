//! Image pulls as a Sandbox reports them: while a provider pulls the image, the Sandbox is
//! `Reconciling` with reason `PullingImage` and a `Pulling` Event marks the start; the create
//! that follows the pull publishes a `Pulled` Event with the size and the duration.
//!
//! A pull in progress is not a failure: it is polled at a steady short interval instead of
//! the error backoff, and it does not complete the generation (the spec is not converged yet).

use std::time::Duration;

use crate::api::Sandbox;
use crate::controller::events::normal;
use crate::controller::outcome::Outcome;
use crate::controller::{Context, Error};
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

/// A pull in progress: Reconciling/`PullingImage` with the generation left unfinished, a
/// `Pulling` Event when the pull starts, and a poll after [`POLL`].
pub fn outcome(pulling: &ProviderError) -> Outcome {
    Outcome::InProgress {
        reason: PULLING_IMAGE.into(),
        message: pulling.message().to_string(),
        recheck: POLL,
        announce: "Pulling",
    }
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
