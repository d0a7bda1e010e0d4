//! What a provider factory hands the suite: the provider, what it is expected to offer, a
//! create request it can run, and the means to clean up.

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sandbox_operator::provider::labels::{MANAGED_BY, OWNER_UID, Owner};
use sandbox_operator::provider::{CreateRequest, Provider, SandboxQuery, VolumeQuery};

use super::support::unique_hex;

/// A factory's "not this time": an opt-in live run whose credentials are not in the
/// environment. The suite prints `skipped: <reason>` and the test passes.
#[derive(Debug)]
pub struct Skipped(pub String);

/// Declines a run, with the reason printed as `skipped: <reason>`.
pub fn skip(reason: impl Into<String>) -> Skipped {
    Skipped(reason.into())
}

/// The value of `var` for an opt-in live run, or [`Skipped`] naming the variable to set.
pub fn live_env(var: &str) -> Result<String, Skipped> {
    match std::env::var(var) {
        Ok(value) if !value.trim().is_empty() => Ok(value),
        _ => Err(skip(format!(
            "{var} is not set; export it to run the conformance suite against the real service"
        ))),
    }
}

/// What the provider under test is expected to offer. Every capability is asserted either
/// way: `false` means the accessor must return `None`, never that its checks are skipped.
#[derive(Debug, Clone, Default)]
pub struct Expect {
    /// `hibernation()` is `Some`.
    pub hibernation: bool,
    /// `volumes()` is `Some`.
    pub volumes: bool,
    /// `templates()` is `Some`.
    pub templates: bool,
    /// `resources()` (set_resources) is `Some`.
    pub set_resources: bool,
    /// `capacity()` is `Some`.
    pub capacity: bool,
    /// `files()` is `Some`.
    pub files: bool,
    /// `bulk_files()` is `Some`.
    pub bulk_files: bool,
    /// `egress()` is `Some`.
    pub egress: bool,
    /// `events()` is `Some`.
    pub events: bool,
    /// `egress_policy()` is `Some` (an allow-list replaced in place).
    pub egress_policy: bool,
    /// The provider's memory granule in MiB (Fly: 256), 0 or 1 for any whole MiB: the
    /// set_resources check asks only for sizes the provider can apply exactly, since rule 10
    /// forbids rounding.
    pub memory_step_mib: u64,
    /// The provider's volumes cannot carry labels (Fly): ownership is not recorded on them,
    /// so the checks of owner idempotency and of label filters do not apply, and the sweeper
    /// never reclaims such volumes (each SandboxVolume's finalizer removes its own).
    pub unlabelled_volumes: bool,
    /// `CreateRequest.command` is honoured as the main process (otherwise create refuses it).
    pub command: bool,
    /// A CPU ceiling is enforced (otherwise create refuses it).
    pub cpu: bool,
    /// A memory ceiling is enforced (otherwise create refuses it).
    pub memory: bool,
    /// A process-count ceiling is enforced (otherwise create refuses it).
    pub pids: bool,
    /// A domain allow-list (`allowed_domains: Some([..])`) is enforced (otherwise refused).
    pub domain_egress: bool,
    /// `allowed_domains: Some([])` (no egress at all) is enforced (otherwise refused).
    pub no_egress: bool,
    /// The service parks idle sandboxes by itself and has no call to stop or suspend one
    /// (Fly Sprites): `stop` and `sleep` must be `Unsupported` (still `NotFound` for an
    /// absent sandbox), and the checks that need a stopped or sleeping sandbox assert that
    /// refusal instead.
    pub parks_itself: bool,
    /// `streaming_exec()` is `Some` (stdin, TTY, signals, separate streams, exit code).
    pub streaming_exec: bool,
    /// `logs()` is `Some` (the main process's log, with follow).
    pub logs: bool,
    /// `port_forward()` is `Some` (TCP connections to a port inside a sandbox).
    pub port_forward: bool,
}

impl Expect {
    /// Every capability, with the given create-time enforcement left to the caller.
    pub fn all_capabilities() -> Expect {
        Expect {
            hibernation: true,
            volumes: true,
            templates: true,
            set_resources: true,
            capacity: true,
            files: true,
            bulk_files: true,
            egress: true,
            events: true,
            streaming_exec: true,
            logs: true,
            port_forward: true,
            ..Expect::default()
        }
    }
}

/// Creates sandboxes behind the provider's back (straight at the service), so the suite can
/// check that `find` sees what it did not create itself (crash adoption) and never returns
/// what carries someone else's labels.
#[async_trait]
pub trait Planter: Send + Sync {
    /// Creates a sandbox carrying exactly `labels` (plus whatever the planter needs to clean
    /// it up later, outside the `sandboxes.dev/` prefix) and returns its provider id.
    async fn plant(&self, labels: &BTreeMap<String, String>) -> Result<String, String>;
}

/// Fault injection at the service, for providers tested against a double: while failing,
/// every request the provider makes is answered with a server error (5xx), so rule 1 is
/// checked on a provider that reached its service and was refused, not only on one that
/// reached nothing.
#[async_trait]
pub trait Faults: Send + Sync {
    /// Makes every following request fail until [`Faults::heal`].
    async fn fail_all(&self);
    /// Ends [`Faults::fail_all`].
    async fn heal(&self);
}

/// One test's world.
pub struct Fixture {
    /// The provider under test.
    pub provider: Arc<dyn Provider>,
    /// The same kind of provider pointed at a service that does not answer (a closed port):
    /// every enumeration and lookup on it must fail (rules 1, 3, 8).
    pub unreachable: Arc<dyn Provider>,
    /// The operator-instance name every resource of this test carries (`managed-by`).
    pub instance: String,
    /// A create request the provider can run, idling until stopped; the suite fills in the
    /// name and owner. `command` is `None` for providers that cannot set the main process.
    pub base: CreateRequest,
    /// What the provider offers.
    pub expect: Expect,
    /// Plants resources behind the provider's back, when the service allows it.
    pub planter: Option<Arc<dyn Planter>>,
    /// Fails the service on demand (a double's fault injection), when there is one.
    pub faults: Option<Arc<dyn Faults>>,
    /// How long an asynchronous effect may take to show (a start, an event).
    pub patience: Duration,
    /// Switches the double's history mode (listings without history, history cut short),
    /// when the provider is tested against a double that has one; the sweep check runs in
    /// every mode, and plainly without.
    pub history: Option<Arc<dyn Fn(sandbox_doubles::History) + Send + Sync>>,
    /// Kept alive for the fixture's lifetime, dropped after [`Fixture::cleanup`]: a double's
    /// server, a guard that removes what a panicking check left behind.
    pub guard: Option<Box<dyn Any + Send + Sync>>,
}

impl Fixture {
    /// An owner of `kind` in this fixture's instance, with a fresh UID.
    pub fn owner(&self, kind: &str) -> Owner {
        let uid = unique_hex();
        Owner {
            instance: self.instance.clone(),
            kind: kind.into(),
            namespace: "conformance".into(),
            name: format!("obj-{uid}"),
            uid,
        }
    }

    /// A fresh request: the base request under a new deterministic name (`sbx-<uid>`)
    /// owned by a new `Sandbox` owner.
    pub fn request(&self) -> CreateRequest {
        let owner = self.owner("Sandbox");
        CreateRequest {
            name: format!("sbx-{}", owner.uid),
            owner,
            ..self.base.clone()
        }
    }

    /// Labels selecting exactly this fixture's resources.
    pub fn instance_labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([(MANAGED_BY.to_string(), self.instance.clone())])
    }

    /// A query for this fixture's sandboxes.
    pub fn query(&self) -> SandboxQuery {
        SandboxQuery {
            labels: self.instance_labels(),
            ..Default::default()
        }
    }

    /// A query for the one sandbox of `owner` (instance and owner-uid labels).
    pub fn owner_query(&self, owner: &Owner) -> SandboxQuery {
        let mut labels = self.instance_labels();
        labels.insert(OWNER_UID.to_string(), owner.uid.clone());
        SandboxQuery {
            labels,
            ..Default::default()
        }
    }

    /// Removes, through the seam, every sandbox, template and volume carrying this
    /// fixture's instance label (in that order: sandboxes hold the others). Best effort: a
    /// factory's guard is the safety net for what this cannot reach.
    pub async fn cleanup(&self) {
        let p = &self.provider;
        if let Ok(found) = p.find(&self.query()).await {
            for d in found {
                let _ = p.destroy(&d.id).await;
            }
        }
        if let Some(templates) = p.templates()
            && let Ok(listed) = templates.list_templates(None).await
        {
            for t in listed {
                if t.labels.get(MANAGED_BY) == Some(&self.instance) {
                    let _ = templates.remove_template(&t.id).await;
                }
            }
        }
        if let Some(volumes) = p.volumes() {
            let query = VolumeQuery {
                labels: self.instance_labels(),
                ..Default::default()
            };
            if let Ok(listed) = volumes.list_volumes(&query).await {
                for v in listed {
                    let _ = volumes.remove_volume(&v.name).await;
                }
            }
        }
    }
}
