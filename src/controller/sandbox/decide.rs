//! Decide (pure): desired + observed → the provider steps to take, or a state to report.
//!
//! This is the whole convergence policy of the Sandbox controller, kept free of I/O so it is
//! table-tested below.

use crate::api::{DesiredState, HibernationStatus};
use crate::provider::labels::SPEC_HASH;
use crate::provider::{
    AppliedResources, Resources, RestartPolicy, SandboxDescriptor, SandboxState,
};

use super::build::Desired;

/// One provider action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Create the sandbox (not started).
    Create,
    /// Destroy the current sandbox (before a re-create).
    Destroy,
    /// Write the self-delivered env file into the sandbox.
    DeliverEnv,
    /// Start it.
    Start,
    /// Stop it (processes end).
    Stop,
    /// Suspend it, reporting whether processes survive.
    Hibernate,
    /// Resume it, reporting whether processes came back.
    Resume,
    /// Change resource ceilings in place.
    SetResources,
    /// Replace the outbound allow-list in place (providers with that capability).
    SetEgress,
    /// Restore the template's archive into the started sandbox (a provider without native
    /// templates; see [`super::restore`]).
    Restore,
}

impl Plan {
    /// Whether every step leaves the sandbox as observed (see [`Step::leaves_the_descriptor`]).
    pub fn leaves_the_descriptor(&self) -> bool {
        self.hold.is_none() && self.steps.iter().all(|s| s.leaves_the_descriptor())
    }
}

impl Step {
    /// Whether the step changes only what is inside the sandbox's filesystem, nothing the
    /// provider reports of it (state, ports, resources, network): an observation made before
    /// it still describes the sandbox after it.
    pub fn leaves_the_descriptor(self) -> bool {
        matches!(self, Step::DeliverEnv)
    }
}

/// A state the controller reports instead of acting on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hold {
    /// The provider lost the sandbox and the restart policy says not to recreate it.
    Gone,
    /// The main process exited by itself and the restart policy keeps it down.
    Exited(Option<i64>),
}

/// What to do.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// Steps, in order.
    pub steps: Vec<Step>,
    /// A state to report (no steps accompany it).
    pub hold: Option<Hold>,
    /// Why the sandbox is being recreated, when it is.
    pub recreate_reason: Option<String>,
}

/// What the controller observed, beyond the provider's descriptor.
#[derive(Debug, Clone, Copy)]
pub struct Observed<'a> {
    /// The provider's record, `None` when it holds nothing for this Sandbox.
    pub descriptor: Option<&'a SandboxDescriptor>,
    /// Whether a provider resource existed before (status recorded a sandbox id).
    pub existed_before: bool,
    /// Whether the spec changed since the last completed reconcile
    /// (`metadata.generation != status.observedGeneration`).
    pub spec_changed: bool,
    /// Whether the Sandbox asks for self-delivered env.
    pub wants_env: bool,
    /// Whether the current env content is already delivered into this sandbox.
    pub env_delivered: bool,
    /// Whether the template's archive was restored into this sandbox (only read when
    /// [`Desired::restore`] is set).
    pub restored: bool,
    /// Whether the provider replaces allow-lists in place, and whether the one it last
    /// applied is what the spec asks for now.
    pub egress: EgressConvergence,
    /// Whether the operator's own sleep stopped it: on a provider whose sleep is a stop
    /// (a Pod), a stopped sandbox after our sleep is asleep, not exited by itself
    /// ([`slept_since_start`]).
    pub asleep: bool,
    /// Whether env can be delivered only into a running sandbox (right after its start or
    /// resume) rather than into a created one before its main process starts.
    pub env_after_start: bool,
    /// Whether the Sandbox was served from a warm pool (a member it claimed, or one created
    /// cold from the pool's template). It keeps the build it got — a changed pool template
    /// rolls only unclaimed members — so its spec hash, resources and allow-list are not
    /// converged on the pool's template of today; its power state and env are its own.
    pub claimed: bool,
}

/// Whether our own suspend is what the sandbox last went through: the last suspend or
/// resume (`status.lastHibernation`) was a suspend, and nothing started the sandbox after
/// it (`status.startedAt`). Then, if it is stopped, our suspend stopped it.
///
/// Both times have whole seconds, so a suspend in the very second the sandbox started
/// looks simultaneous with the start. A suspend record counts then: it is the last thing
/// we did (seen in CI: an E2B pause right after a Pod started was taken for the process
/// exiting, and the pause answered 400). A resume record never counts. A record of an older
/// version, which does not say which it was, counts only when strictly after the start (a
/// resume starts the sandbox again, so its start is never before it).
pub fn slept_since_start(last: Option<&HibernationStatus>, started_at: Option<&str>) -> bool {
    let parse = |t: &str| chrono::DateTime::parse_from_rfc3339(t).ok();
    let Some(last) = last else {
        return false;
    };
    match (
        parse(&last.time),
        started_at.and_then(parse),
        last.suspended,
    ) {
        (Some(slept), Some(started), Some(true)) => slept >= started,
        (Some(slept), Some(started), None) => slept > started,
        _ => false,
    }
}

/// Where a provider that replaces allow-lists in place stands with this sandbox's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EgressConvergence {
    /// The provider cannot: `spec.egress` is part of the spec hash (a change recreates).
    #[default]
    NotInPlace,
    /// The applied allow-list is the desired one.
    Applied,
    /// The applied allow-list differs, or is not known.
    Differs,
}

/// Decides the plan.
pub fn decide(desired: &Desired, observed: &Observed<'_>) -> Plan {
    let restart = desired.request.restart_policy;
    let Some(current) = observed.descriptor else {
        if observed.existed_before && restart == RestartPolicy::Never && !observed.spec_changed {
            return Plan {
                hold: Some(Hold::Gone),
                ..Plan::default()
            };
        }
        return Plan {
            steps: restore_after_start(desired, fresh(desired.state, env_when(observed))),
            ..Plan::default()
        };
    };
    if let Some(plan) = unrestored(desired, observed) {
        return plan;
    }

    let hash = current.labels.get(SPEC_HASH);
    if hash != Some(&desired.spec_hash) && !observed.claimed {
        let mut steps = vec![Step::Destroy];
        steps.extend(fresh(desired.state, env_when(observed)));
        return Plan {
            steps: restore_after_start(desired, steps),
            hold: None,
            recreate_reason: Some(match hash {
                Some(_) => "the spec changed in a field that cannot be applied in place".into(),
                None => "the sandbox carries no spec hash (created by an older operator)".into(),
            }),
        };
    }

    let mut steps = Vec::new();
    if resources_differ(&desired.request.resources, &current.resources) && !observed.claimed {
        steps.push(Step::SetResources);
    }
    let exited_by_itself = exited_by_itself(current, observed, restart);

    use DesiredState as D;
    use SandboxState as S;
    let power: &[Step] = match (&desired.state, current.state) {
        (D::Running, S::Running) | (D::Sleeping, S::Sleeping) | (D::Stopped, S::Stopped) => &[],
        (D::Running | D::Sleeping, S::Stopped) if exited_by_itself => {
            return Plan {
                hold: Some(Hold::Exited(current.exit_code)),
                ..Plan::default()
            };
        }
        (D::Sleeping, S::Stopped) if observed.asleep => &[],
        (D::Running, S::Stopped) if observed.asleep => &[Step::Resume],
        (D::Running, S::Creating | S::Stopped) => &[Step::Start],
        (D::Running, S::Sleeping) => &[Step::Resume],
        (D::Sleeping, S::Creating | S::Stopped) => &[Step::Start, Step::Hibernate],
        (D::Sleeping, S::Running) => &[Step::Hibernate],
        // A never-started sandbox is started once before it is stopped, so it never looks
        // like the wreckage of an interrupted create to the sweeper.
        (D::Stopped, S::Creating) => &[Step::Start, Step::Stop],
        (D::Stopped, S::Running) => &[Step::Stop],
        (D::Stopped, S::Sleeping) => &[Step::Resume, Step::Stop],
    };
    steps.extend_from_slice(power);
    with_env(&mut steps, observed, current.state == S::Running);
    if !observed.claimed {
        with_egress(&mut steps, observed.egress, current.state == S::Running);
    }
    Plan {
        steps,
        ..Plan::default()
    }
}

/// Adds the in-place allow-list step where the sandbox runs: providers apply allow-lists to a
/// live sandbox. It goes right after a start or resume in the plan — resume replaces the
/// egress policy, since a sandbox resumed from a snapshot may come back with the allow-list it
/// was suspended with — else first when the sandbox already runs (before a hibernate or
/// stop). A sandbox that stays down gets it at its next resume.
fn with_egress(steps: &mut Vec<Step>, egress: EgressConvergence, running: bool) {
    let brought_up = steps
        .iter()
        .rposition(|s| matches!(s, Step::Start | Step::Resume));
    let wanted = match egress {
        EgressConvergence::NotInPlace => false,
        EgressConvergence::Differs => true,
        EgressConvergence::Applied => steps.contains(&Step::Resume),
    };
    match (wanted, brought_up) {
        (false, _) => {}
        (true, Some(i)) => steps.insert(i + 1, Step::SetEgress),
        (true, None) if running => steps.insert(0, Step::SetEgress),
        (true, None) => {}
    }
}

/// When a new sandbox gets its env, if it wants one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EnvAt {
    None,
    BeforeStart,
    AfterStart,
}

fn env_when(observed: &Observed<'_>) -> EnvAt {
    match (observed.wants_env, observed.env_after_start) {
        (false, _) => EnvAt::None,
        (true, false) => EnvAt::BeforeStart,
        (true, true) => EnvAt::AfterStart,
    }
}

/// Whether the main process exited by itself and `restartPolicy` keeps it down (not our
/// own sleep, not a spec change).
fn exited_by_itself(
    current: &SandboxDescriptor,
    observed: &Observed<'_>,
    restart: RestartPolicy,
) -> bool {
    current.state == SandboxState::Stopped
        && !observed.asleep
        && current.started_at.has_run()
        && !observed.spec_changed
        && match restart {
            RestartPolicy::Never => true,
            RestartPolicy::OnFailure => current.exit_code == Some(0),
            RestartPolicy::Always => false,
        }
}

/// Adds the env delivery an existing sandbox still needs: before the power steps (after a
/// resource change), or — where files need a running sandbox and it does not run yet —
/// right after its start or resume.
fn with_env(steps: &mut Vec<Step>, observed: &Observed<'_>, running: bool) {
    if !observed.wants_env || observed.env_delivered {
        return;
    }
    if observed.env_after_start && !running {
        return after_start(steps, Step::DeliverEnv);
    }
    let at = steps
        .iter()
        .take_while(|s| **s == Step::SetResources)
        .count();
    steps.insert(at, Step::DeliverEnv);
}

/// Puts `step` right after the last start or resume of `steps`; nowhere when the sandbox is
/// not brought up (it gets it when it next runs).
fn after_start(steps: &mut Vec<Step>, step: Step) {
    if let Some(i) = steps
        .iter()
        .rposition(|s| matches!(s, Step::Start | Step::Resume))
    {
        steps.insert(i + 1, step);
    }
}

/// Steps for a sandbox that does not exist yet: create, deliver env before the main process
/// starts (or right after, where files need a running sandbox), then bring it to the
/// desired power state.
fn fresh(state: DesiredState, env: EnvAt) -> Vec<Step> {
    let mut steps = vec![Step::Create];
    if env == EnvAt::BeforeStart {
        steps.push(Step::DeliverEnv);
    }
    steps.push(Step::Start);
    if env == EnvAt::AfterStart {
        steps.push(Step::DeliverEnv);
    }
    match state {
        DesiredState::Running => {}
        DesiredState::Sleeping => steps.push(Step::Hibernate),
        DesiredState::Stopped => steps.push(Step::Stop),
    }
    steps
}

/// A sandbox that needs a template restore gets it right after its first start, before
/// anything else (hibernate, stop) and before it is ever reported Ready.
fn restore_after_start(desired: &Desired, mut steps: Vec<Step>) -> Vec<Step> {
    if desired.restore.is_some()
        && let Some(start) = steps.iter().position(|s| *s == Step::Start)
    {
        steps.insert(start + 1, Step::Restore);
    }
    steps
}

/// A sandbox whose template restore never completed (a crash between its start and the
/// restore, or during it) is never handed out: it is destroyed and made again.
fn unrestored(desired: &Desired, observed: &Observed<'_>) -> Option<Plan> {
    if desired.restore.is_none() || observed.restored {
        return None;
    }
    let steps = vec![Step::Destroy];
    Some(Plan {
        steps: restore_after_start(
            desired,
            [steps, fresh(desired.state, env_when(observed))].concat(),
        ),
        hold: None,
        recreate_reason: Some("its template restore did not complete".into()),
    })
}

/// Whether a ceiling the spec sets differs from what the provider applied. Ceilings the spec
/// leaves out are not compared: removing a limit in place is not something every provider
/// can do, and "unset" means "provider default", not "unlimited".
pub fn resources_differ(want: &Resources, have: &AppliedResources) -> bool {
    (want.cpu_millis.is_some() && want.cpu_millis != have.cpu_millis)
        || (want.memory_bytes.is_some() && want.memory_bytes != have.memory_bytes)
        || (want.pids.is_some() && want.pids != have.pids)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn only_the_env_file_leaves_the_observation_standing() {
        let all = [
            Step::Create,
            Step::Destroy,
            Step::DeliverEnv,
            Step::Start,
            Step::Stop,
            Step::Hibernate,
            Step::Resume,
            Step::SetResources,
            Step::SetEgress,
            Step::Restore,
        ];
        let leaving: Vec<_> = all
            .into_iter()
            .filter(|s| s.leaves_the_descriptor())
            .collect();
        assert_eq!(leaving, [Step::DeliverEnv]);
    }
    use crate::provider::labels::Owner;
    use crate::provider::{CreateRequest, RestartPolicy};

    fn desired(state: DesiredState, restart: RestartPolicy) -> Desired {
        Desired {
            request: CreateRequest {
                name: "sbx-1".into(),
                owner: Owner {
                    instance: "i".into(),
                    kind: "Sandbox".into(),
                    namespace: "n".into(),
                    name: "s".into(),
                    uid: "1".into(),
                },
                image: Some("img".into()),
                template: None,
                command: None,
                restart_policy: restart,
                env: BTreeMap::new(),
                labels: BTreeMap::new(),
                resources: Resources {
                    memory_bytes: Some(100),
                    ..Resources::default()
                },
                ports: vec![],
                volumes: vec![],
                allowed_domains: None,
                idle_action: None,
                image_pull_policy: Default::default(),
                registry_credentials: Vec::new(),
                secret_env_keys: Default::default(),
            },
            state,
            spec_hash: "h1".into(),
            restore: None,
        }
    }

    fn descriptor(
        state: SandboxState,
        hash: &str,
        started: bool,
        exit: Option<i64>,
    ) -> SandboxDescriptor {
        SandboxDescriptor {
            labels: BTreeMap::from([(SPEC_HASH.to_string(), hash.to_string())]),
            started_at: if started {
                crate::provider::StartedAt::At(chrono::Utc::now())
            } else {
                crate::provider::StartedAt::Never
            },
            exit_code: exit,
            resources: AppliedResources {
                memory_bytes: Some(100),
                ..AppliedResources::default()
            },
            ..SandboxDescriptor::bare("sbx-1", state)
        }
    }

    fn obs(d: Option<&SandboxDescriptor>) -> Observed<'_> {
        Observed {
            descriptor: d,
            existed_before: false,
            spec_changed: false,
            wants_env: false,
            env_delivered: true,
            restored: false,
            egress: EgressConvergence::NotInPlace,
            asleep: false,
            env_after_start: false,
            claimed: false,
        }
    }

    #[test]
    fn a_claimed_member_keeps_its_build_when_its_pool_template_changes() {
        let d = desired(D::Running, RestartPolicy::Never);
        let old_build = SandboxDescriptor {
            resources: AppliedResources::default(),
            ..descriptor(S::Running, "old", true, None)
        };
        let claimed = Observed {
            claimed: true,
            egress: EgressConvergence::Differs,
            ..obs(Some(&old_build))
        };
        assert_eq!(decide(&d, &claimed), Plan::default());
        let stopped = Desired {
            state: D::Stopped,
            ..d.clone()
        };
        assert_eq!(decide(&stopped, &claimed).steps, vec![Stop]);
        let unclaimed = Observed {
            claimed: false,
            ..claimed
        };
        assert!(decide(&d, &unclaimed).steps.contains(&Destroy));
    }

    #[test]
    fn env_goes_in_after_the_start_where_files_need_a_running_sandbox() {
        let d = desired(D::Running, RestartPolicy::Never);
        let wants = |after: bool, cur| Observed {
            wants_env: true,
            env_delivered: false,
            env_after_start: after,
            ..obs(cur)
        };
        assert_eq!(
            decide(&d, &wants(false, None)).steps,
            vec![Create, DeliverEnv, Start]
        );
        assert_eq!(
            decide(&d, &wants(true, None)).steps,
            vec![Create, Start, DeliverEnv]
        );
        // A created, never-started sandbox (a gated Pod) of an earlier pass.
        let created = descriptor(S::Creating, "h1", false, None);
        let later = decide(&d, &wants(true, Some(&created))).steps;
        assert_eq!(later, vec![Start, DeliverEnv]);
        let before = decide(&d, &wants(false, Some(&created))).steps;
        assert_eq!(before, vec![DeliverEnv, Start]);
        let running = descriptor(S::Running, "h1", true, None);
        assert_eq!(
            decide(&d, &wants(true, Some(&running))).steps,
            vec![DeliverEnv]
        );
    }

    #[test]
    fn a_sandbox_our_sleep_stopped_is_asleep_and_wakes_by_a_resume() {
        for restart in [RestartPolicy::Never, RestartPolicy::OnFailure] {
            let stopped = descriptor(S::Stopped, "h1", true, Some(0));
            let asleep = Observed {
                asleep: true,
                ..obs(Some(&stopped))
            };
            let sleeping = decide(&desired(D::Sleeping, restart), &asleep);
            assert_eq!((sleeping.steps, sleeping.hold), (vec![], None));
            let woken = decide(&desired(D::Running, restart), &asleep);
            assert_eq!((woken.steps, woken.hold), (vec![Resume], None));
            let exited = decide(&desired(D::Running, restart), &obs(Some(&stopped)));
            assert_eq!(exited.hold, Some(Hold::Exited(Some(0))));
        }
    }

    #[test]
    fn our_suspend_is_the_last_thing_unless_a_start_came_after_it() {
        let (t1, t2) = ("2026-01-01T00:00:00Z", "2026-01-01T00:00:05Z");
        let record = |time: &str, suspended| HibernationStatus {
            processes_preserved: false,
            mechanism: "sleep".into(),
            detail: None,
            time: time.into(),
            suspended,
        };
        for (last, started, asleep, case) in [
            (
                record(t2, Some(true)),
                Some(t1),
                true,
                "suspended after the start",
            ),
            (
                record(t1, Some(true)),
                Some(t1),
                true,
                "suspended in the second it started",
            ),
            (
                record(t1, Some(true)),
                Some(t2),
                false,
                "started after the suspend",
            ),
            (record(t2, Some(false)), Some(t1), false, "resumed"),
            (
                record(t1, Some(false)),
                Some(t1),
                false,
                "resumed in the second it started",
            ),
            (
                record(t2, None),
                Some(t1),
                true,
                "older record, after the start",
            ),
            (
                record(t1, None),
                Some(t1),
                false,
                "older record, same second",
            ),
            (record(t1, Some(true)), None, false, "never started"),
        ] {
            assert_eq!(slept_since_start(Some(&last), started), asleep, "{case}");
        }
        assert!(!slept_since_start(None, Some(t1)), "no record");
    }

    #[test]
    fn an_allow_list_converges_in_place_and_every_resume_replaces_it() {
        use EgressConvergence as E;
        let cases: Vec<(D, S, E, Vec<Step>)> = vec![
            (D::Running, S::Running, E::Differs, vec![SetEgress]),
            (D::Running, S::Running, E::Applied, vec![]),
            (D::Running, S::Sleeping, E::Applied, vec![Resume, SetEgress]),
            (D::Running, S::Sleeping, E::Differs, vec![Resume, SetEgress]),
            (
                D::Stopped,
                S::Sleeping,
                E::Applied,
                vec![Resume, SetEgress, Stop],
            ),
            (
                D::Sleeping,
                S::Running,
                E::Differs,
                vec![SetEgress, Hibernate],
            ),
            (D::Stopped, S::Running, E::Differs, vec![SetEgress, Stop]),
            (D::Running, S::Creating, E::Differs, vec![Start, SetEgress]),
            // Stays down: applied at its next resume.
            (D::Sleeping, S::Sleeping, E::Differs, vec![]),
            (D::Running, S::Sleeping, E::NotInPlace, vec![Resume]),
        ];
        for (want, have, egress, steps) in cases {
            let d = desired(want, RestartPolicy::Never);
            let cur = descriptor(have, "h1", true, None);
            let observed = Observed {
                egress,
                ..obs(Some(&cur))
            };
            assert_eq!(
                decide(&d, &observed).steps,
                steps,
                "{want:?} from {have:?} with {egress:?}"
            );
        }
    }

    use DesiredState as D;
    use SandboxState as S;
    use Step::*;

    #[test]
    fn power_state_table() {
        let cases: Vec<(D, S, bool, Vec<Step>)> = vec![
            (D::Running, S::Running, true, vec![]),
            (D::Running, S::Creating, false, vec![Start]),
            (D::Running, S::Sleeping, true, vec![Resume]),
            (D::Sleeping, S::Running, true, vec![Hibernate]),
            (D::Sleeping, S::Creating, false, vec![Start, Hibernate]),
            (D::Sleeping, S::Sleeping, true, vec![]),
            (D::Stopped, S::Running, true, vec![Stop]),
            (D::Stopped, S::Sleeping, true, vec![Resume, Stop]),
            (D::Stopped, S::Creating, false, vec![Start, Stop]),
            (D::Stopped, S::Stopped, true, vec![]),
        ];
        for (want, have, started, steps) in cases {
            let d = desired(want, RestartPolicy::Never);
            let cur = descriptor(have, "h1", started, None);
            assert_eq!(
                decide(&d, &obs(Some(&cur))).steps,
                steps,
                "{want:?} from {have:?}"
            );
        }
    }

    #[test]
    fn absent_sandbox_is_created_then_brought_to_state() {
        let d = desired(D::Sleeping, RestartPolicy::Never);
        let mut o = obs(None);
        o.wants_env = true;
        assert_eq!(
            decide(&d, &o).steps,
            vec![Create, DeliverEnv, Start, Hibernate]
        );
        let d = desired(D::Stopped, RestartPolicy::Never);
        assert_eq!(decide(&d, &obs(None)).steps, vec![Create, Start, Stop]);
    }

    #[test]
    fn vanished_sandbox_follows_restart_policy() {
        let mut o = obs(None);
        o.existed_before = true;
        let never = decide(&desired(D::Running, RestartPolicy::Never), &o);
        assert_eq!((never.steps.len(), never.hold), (0, Some(Hold::Gone)));
        let always = decide(&desired(D::Running, RestartPolicy::Always), &o);
        assert_eq!(always.steps, vec![Create, Start]);
        // A spec change is the user asking again: recreate even under Never.
        o.spec_changed = true;
        assert_eq!(
            decide(&desired(D::Running, RestartPolicy::Never), &o).steps,
            vec![Create, Start]
        );
    }

    #[test]
    fn exited_process_is_reported_not_restarted_unless_asked() {
        let cur = descriptor(S::Stopped, "h1", true, Some(3));
        let p = decide(&desired(D::Running, RestartPolicy::Never), &obs(Some(&cur)));
        assert_eq!(p.hold, Some(Hold::Exited(Some(3))));
        let p = decide(
            &desired(D::Running, RestartPolicy::OnFailure),
            &obs(Some(&cur)),
        );
        assert_eq!(p.steps, vec![Start]);
        let clean = descriptor(S::Stopped, "h1", true, Some(0));
        let p = decide(
            &desired(D::Running, RestartPolicy::OnFailure),
            &obs(Some(&clean)),
        );
        assert_eq!(p.hold, Some(Hold::Exited(Some(0))));
        let mut o = obs(Some(&cur));
        o.spec_changed = true;
        assert_eq!(
            decide(&desired(D::Running, RestartPolicy::Never), &o).steps,
            vec![Start]
        );
    }

    #[test]
    fn changed_hash_recreates_and_resources_update_in_place() {
        let cur = descriptor(S::Running, "old", true, None);
        let p = decide(&desired(D::Running, RestartPolicy::Never), &obs(Some(&cur)));
        assert_eq!(p.steps, vec![Destroy, Create, Start]);
        assert!(p.recreate_reason.is_some());
        let mut cur = descriptor(S::Running, "h1", true, None);
        cur.resources.memory_bytes = Some(50);
        let mut o = obs(Some(&cur));
        o.wants_env = true;
        o.env_delivered = false;
        assert_eq!(
            decide(&desired(D::Running, RestartPolicy::Never), &o).steps,
            vec![SetResources, DeliverEnv]
        );
    }

    #[test]
    fn unset_ceilings_are_not_compared() {
        let want = Resources::default();
        let have = AppliedResources {
            cpu_millis: Some(1000),
            ..AppliedResources::default()
        };
        assert!(!resources_differ(&want, &have));
    }

    #[test]
    fn a_store_template_is_restored_right_after_the_first_start() {
        let mut d = desired(D::Stopped, RestartPolicy::Never);
        d.restore = Some("tpl".into());
        let mut o = obs(None);
        o.wants_env = true;
        assert_eq!(
            decide(&d, &o).steps,
            vec![Create, DeliverEnv, Start, Restore, Stop]
        );
        // Restored already: nothing to do.
        let cur = descriptor(S::Stopped, "h1", true, None);
        let mut o = obs(Some(&cur));
        o.restored = true;
        assert_eq!(decide(&d, &o).steps, vec![]);
        // A recreate restores again.
        let old = descriptor(S::Running, "old", true, None);
        let mut o = obs(Some(&old));
        o.restored = true;
        let d = {
            let mut d = desired(D::Running, RestartPolicy::Never);
            d.restore = Some("tpl".into());
            d
        };
        assert_eq!(decide(&d, &o).steps, vec![Destroy, Create, Start, Restore]);
    }

    #[test]
    fn a_sandbox_whose_restore_never_completed_is_made_again() {
        let mut d = desired(D::Running, RestartPolicy::Never);
        d.restore = Some("tpl".into());
        let cur = descriptor(S::Running, "h1", true, None);
        let p = decide(&d, &obs(Some(&cur)));
        assert_eq!(p.steps, vec![Destroy, Create, Start, Restore]);
        assert!(p.recreate_reason.is_some_and(|r| r.contains("restore")));
        // Without a template to restore, the same sandbox is left alone.
        let d = desired(D::Running, RestartPolicy::Never);
        assert_eq!(decide(&d, &obs(Some(&cur))).steps, vec![]);
    }
}
