//! The provider conformance suite (`tests/conformance/`) against the local Docker engine
//! with every sandbox under gVisor (`runtime: runsc`).
//!
//! Needs the engine with the `runsc` runtime registered (`tests/setup/gvisor.sh`, part of
//! `make test-setup`) and the base image. What gVisor changes is declared in [`fixture`]'s
//! `Expect`, so the suite asserts the refusal instead of skipping the check.

mod harness;
#[macro_use]
mod conformance;

use std::sync::Arc;

use conformance::fixture::{Fixture, Skipped};
use sandbox_operator::provider::docker::{DockerProvider, DockerSettings};

/// The Docker fixture with a runsc-backed provider. Under gVisor, `docker update` is
/// unsupported, so the provider offers no in-place resource changes; everything else
/// (pause-based hibernation, files through exec, templates by commit, networking) is
/// offered and checked like on runc. No egress gateway is configured, so domain
/// allow-lists are refused.
async fn fixture() -> Result<Fixture, Skipped> {
    let mut fixture = conformance::docker::fixture().await?;
    let provider = DockerProvider::connect_negotiated(
        "docker-runsc-conformance",
        DockerSettings {
            default_image: Some(harness::docker::base_image()),
            runtime: Some("runsc".into()),
            ..Default::default()
        },
    )
    .await
    .expect("the Docker engine answers (run tests/setup/docker.sh)");
    fixture.provider = Arc::new(provider);
    fixture.unreachable = Arc::new(
        DockerProvider::connect(
            "docker-runsc-unreachable",
            DockerSettings {
                runtime: Some("runsc".into()),
                egress: None,
                ..conformance::docker::unreachable().settings().clone()
            },
        )
        .expect("a client for a closed port is built without contacting it"),
    );
    fixture.expect.set_resources = false;
    // This provider has no egress gateway configured (gVisor behind the gateway's internal
    // network is not tried here): a domain allow-list must be refused, not left open.
    fixture.expect.domain_egress = false;
    fixture.expect.egress_policy = false;
    Ok(fixture)
}

conformance_suite!(fixture);
