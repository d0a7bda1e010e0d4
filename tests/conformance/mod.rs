//! The provider conformance suite: the eleven contract rules of the seam and every
//! capability, written against `dyn Provider` only, so the same checks run against Docker,
//! against every remote provider with its test double, and against a real service when its
//! credentials are in the environment (see `README.md` beside this file).
//!
//! A test binary supplies a factory, `async fn() -> Result<Fixture, Skipped>`, and expands
//! [`conformance_suite!`] with it: one `#[tokio::test]` per rule and per capability. Each
//! check is an ordinary `async fn(&Fixture) -> Check` in a module named for what it covers,
//! so a test can also call one directly (that is how `tests/conformance_broken.rs` proves
//! the checks fail on a provider that breaks a rule).
//!
//! Identity: after `create`, a check addresses a sandbox only by `SandboxDescriptor.id`, never
//! by the request's name, because remote providers choose their own ids.

#![allow(dead_code)]

#[macro_use]
pub mod support;

pub mod bulk;
pub mod capacity;
pub mod docker;
pub mod egress;
pub mod events;
pub mod files;
pub mod fixture;
pub mod hibernation;
pub mod interactive;
pub mod kubernetes;
pub mod lifecycle;
pub mod resources;
pub mod rules;
pub mod sweep;
pub mod templates;
pub mod volumes;

#[allow(unused_imports)]
pub use fixture::{Expect, Faults, Fixture, Planter, Skipped, live_env, skip};
pub use support::Check;

/// The fixture a factory produced, or `None` after printing `skipped: <reason>` when the
/// factory declined (an opt-in live run without credentials): the test then passes, and the
/// printed reason says why nothing was checked.
pub fn setup(made: Result<Fixture, Skipped>) -> Option<Fixture> {
    match made {
        Ok(fixture) => Some(fixture),
        Err(Skipped(reason)) => {
            println!("skipped: {reason}");
            None
        }
    }
}

/// Cleans up what a check left behind, then panics with the check's failure, if any.
pub async fn finish(fixture: Fixture, result: Check) {
    fixture.cleanup().await;
    if let Err(failure) = result {
        panic!("conformance check failed: {failure}");
    }
}

/// Expands to one `#[tokio::test]` per contract rule and per capability, each running the
/// check of that name against a fixture from `$factory` (an `async fn() -> Result<Fixture,
/// Skipped>`). Use it in a test binary that declares `mod harness;` and
/// `#[macro_use] mod conformance;` (the Docker factory cleans up through the harness).
#[macro_export]
macro_rules! conformance_suite {
    ($factory:path) => {
        $crate::conformance_suite!(@each $factory;
            rules::rule_01_enumerations_fail_when_they_cannot_look,
            rules::rule_02_absent_files_are_errors_and_bytes_cross_unchanged,
            rules::rule_03_get_template_is_none_only_when_absent,
            rules::rule_04_unknown_attachment_and_use_read_as_in_use,
            rules::rule_05_destroy_and_removal_are_idempotent,
            rules::rule_06_started_at_none_means_never_started,
            rules::rule_07_hibernation_reports_what_happened,
            rules::rule_08_unmeasured_capacity_is_absent_never_zero,
            rules::rule_09_egress_verdict_is_an_observation,
            rules::rule_10_unenforceable_fields_are_refused,
            lifecycle::capabilities_are_exactly_the_declared_set,
            lifecycle::identity_after_create_is_the_provider_id,
            lifecycle::create_stores_labels_env_and_restart_policy,
            lifecycle::create_of_a_taken_name_is_a_conflict,
            lifecycle::a_missing_template_or_image_creates_nothing,
            lifecycle::find_narrows_by_labels_states_and_owner,
            lifecycle::find_sees_planted_resources_and_keeps_foreign_ones_out,
            lifecycle::lifecycle_transitions_are_idempotent,
            lifecycle::operations_on_an_absent_sandbox_are_not_found,
            lifecycle::exec_returns_output_and_exit_code_as_data,
            lifecycle::exec_timeout_is_transient_and_bounded,
            lifecycle::published_ports_are_reachable,
            hibernation::capability_hibernation,
            volumes::capability_volumes,
            templates::capability_templates,
            resources::capability_set_resources,
            capacity::capability_capacity,
            files::capability_files,
            bulk::capability_bulk_files,
            egress::capability_egress,
            egress::capability_egress_policy,
            events::capability_events,
            sweep::sweep_never_deletes_a_started_sandbox_of_a_live_owner,
            interactive::stream_exec_delivers_stdin_and_its_end,
            interactive::stream_exec_passes_the_exit_code_through,
            interactive::stream_exec_keeps_stdout_and_stderr_apart,
            interactive::stream_exec_tty_has_its_size_and_resizes,
            interactive::stream_exec_delivers_signals,
            interactive::stream_exec_carries_a_large_stream,
            interactive::stream_exec_holds_a_fast_producer_for_a_slow_reader,
            interactive::stream_exec_keeps_the_tail_after_the_program_ended,
            interactive::logs_follow_new_lines,
            interactive::port_forward_reaches_an_http_server,
            interactive::port_forward_to_a_closed_port_is_transient_at_connect,
            interactive::stream_capabilities_refuse_absent_and_idle_sandboxes,
        );
    };
    (@each $factory:path; $($module:ident :: $check:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() {
                let Some(fixture) = $crate::conformance::setup($factory().await) else {
                    return;
                };
                let result = $crate::conformance::$module::$check(&fixture).await;
                $crate::conformance::finish(fixture, result).await;
            }
        )*
    };
}
