//! The provider conformance suite (`tests/conformance/`) against the real local Docker
//! engine: every contract rule and every capability, one test each.
//!
//! Needs a running engine and the base image (`tests/setup/docker.sh`,
//! `tests/setup/base-image.sh`; `SANDBOX_BASE_IMAGE` overrides the tag).

mod harness;
#[macro_use]
mod conformance;

conformance_suite!(conformance::docker::fixture);
