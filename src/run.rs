//! `sandbox-operator run`: configuration → providers → HTTP endpoints → leader election →
//! controllers while leading → a bounded stop.
//!
//! The process ends in one of three ways, each within a bound:
//! - SIGTERM/SIGINT: the controllers get `--graceful-shutdown-secs` to finish, then the Lease
//!   is released so a standby takes over at once; exit 0.
//! - Leadership lost (no renewal within the renew deadline, or another replica took the
//!   Lease): `/healthz` fails, the controllers are stopped before the Lease can expire for the
//!   others (within half of lease duration − renew deadline), and the process exits non-zero, as
//!   controller-runtime does. Why exit rather than stop the controllers and re-enter the
//!   election in-process: a fresh process is the only state that provably holds no
//!   half-stopped controller, no detached transfer task and no stale cache from the old term,
//!   and a stop that did not finish cannot be hidden behind green probes. The kubelet
//!   restarts the pod; the other replica, a hot standby, takes over meanwhile.
//! - A supervised task (controller, sweeper, HTTP server, readiness probe, the election)
//!   ends or panics: `/healthz` fails with the reason, the others get the graceful deadline,
//!   the Lease is released, and the process exits non-zero (see [`crate::supervisor`]).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use tokio::sync::watch;

use crate::config::OperatorConfig;
use crate::controller::{self, Context};
use crate::leader::{LeaderConfig, LeaderElector};
use crate::metrics::Metrics;
use crate::registry::ProviderRegistry;
use crate::server::{self, Liveness, Readiness, ServerState};
use crate::supervisor::{Ending, TaskExit, TaskSet, Trigger};
use crate::telemetry::{self, LogFormat};
use crate::templates::service::TemplateService;
use crate::templates::store::{StoreSettings, TemplateStore};
use crate::templates::transfer::Limits;

/// Flags of `sandbox-operator run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Operator configuration file (YAML). Without it: one Docker provider named `docker`.
    #[arg(long, env = "SANDBOX_OPERATOR_CONFIG")]
    pub config: Option<PathBuf>,
    /// Address of the /metrics, /healthz and /readyz server.
    #[arg(
        long,
        env = "SANDBOX_OPERATOR_METRICS_ADDR",
        default_value = "0.0.0.0:8080"
    )]
    pub metrics_addr: SocketAddr,
    /// Log format.
    #[arg(long, env = "SANDBOX_OPERATOR_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Log filter when RUST_LOG is unset.
    #[arg(long, default_value = "info,kube_runtime=warn")]
    pub log_filter: String,
    /// Watch only this namespace (default: all namespaces).
    #[arg(long, env = "SANDBOX_OPERATOR_NAMESPACE")]
    pub namespace: Option<String>,
    /// Leader-election lease duration in seconds (renewal timings scale with it).
    #[arg(long, default_value_t = 15)]
    pub lease_duration_secs: u64,
    /// Concurrent Sandbox reconciles.
    #[arg(long, default_value_t = 32)]
    pub concurrency: u16,
    /// On SIGTERM, or when a task failed, how long the controllers may take to finish their
    /// in-flight reconciles before they are aborted. With the Lease release after it, keep it
    /// well inside the pod's terminationGracePeriodSeconds (30 s by default).
    #[arg(
        long,
        env = "SANDBOX_OPERATOR_GRACEFUL_SHUTDOWN_SECS",
        default_value_t = 10
    )]
    pub graceful_shutdown_secs: u64,
}

/// Why the operator stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Logging could not be set up.
    #[error(transparent)]
    Telemetry(#[from] telemetry::TelemetryError),
    /// The configuration file is wrong.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// No Kubernetes client (no kubeconfig, no in-cluster environment).
    #[error("cannot build a Kubernetes client (set KUBECONFIG or run in a cluster): {0}")]
    Kube(#[from] kube::Error),
    /// A configured provider could not be built.
    #[error(transparent)]
    Providers(#[from] crate::registry::BuildError),
    /// A provider's template store could not be set up.
    #[error("provider {name:?}: {message}")]
    Provider {
        /// Provider name.
        name: String,
        /// What is wrong.
        message: String,
    },
    /// The aggregated API could not start.
    #[error(transparent)]
    Access(#[from] crate::access::AccessStartError),
    /// The E2B-compatible API could not start.
    #[error(transparent)]
    E2bApi(#[from] crate::e2bapi::E2bApiStartError),
    /// Leader election settings.
    #[error(transparent)]
    Leader(#[from] crate::leader::LeaderError),
    /// The HTTP server failed.
    #[error(transparent)]
    Server(#[from] server::ServerError),
    /// Leadership was lost while leading: the process exits so it restarts clean.
    #[error("{reason}; exiting so a restarted process rejoins the election cleanly")]
    LostLeadership {
        /// What happened.
        reason: String,
    },
    /// A supervised task ended or panicked: the process exits so another replica takes over.
    #[error("{reason}; exiting so another replica takes over")]
    TaskFailed {
        /// Which task, and how it ended.
        reason: String,
    },
}

/// Why the operator stops.
#[derive(Debug, Clone, PartialEq, Eq)]
enum End {
    /// SIGTERM/SIGINT.
    Signal,
    /// Leadership lost while leading (or the election stopped while leading).
    Lost(String),
    /// A supervised task ended or panicked.
    Failed(String),
}

impl End {
    /// The `/healthz` reason while stopping; `None` for a requested stop.
    fn unhealthy(&self) -> Option<String> {
        match self {
            End::Signal => None,
            End::Lost(why) => Some(format!("{why}; stopping the controllers and exiting")),
            End::Failed(why) => Some(format!("{why}; stopping and exiting")),
        }
    }

    fn into_result(self) -> Result<(), RunError> {
        match self {
            End::Signal => Ok(()),
            End::Lost(reason) => Err(RunError::LostLeadership { reason }),
            End::Failed(reason) => Err(RunError::TaskFailed { reason }),
        }
    }
}

/// What `run` builds once and the leader's tasks share.
struct Parts {
    client: Client,
    metrics: Metrics,
    providers: ProviderRegistry,
    templates: Arc<TemplateService>,
    config: OperatorConfig,
    namespace: Option<String>,
    concurrency: u16,
}

/// The probes' state, and what flips it when the process starts to stop.
#[derive(Clone)]
struct Health {
    liveness: Liveness,
    readiness: Readiness,
}

impl Health {
    /// Fail `/healthz` (and `/readyz`) with the reason the process is stopping, before the
    /// bounded stop begins, so the probes tell the truth while it runs.
    fn declare(&self, end: &End) {
        match end.unhealthy() {
            Some(reason) => {
                tracing::error!(%reason, "unhealthy");
                self.readiness.set_not_ready(reason.clone());
                self.liveness.set_failed(reason);
            }
            None => self.readiness.set_not_ready("shutting down"),
        }
    }
}

/// Runs the operator until SIGTERM/SIGINT, or until it must exit so a clean process (or
/// another replica) takes over: see the module docs.
pub async fn run(args: RunArgs) -> Result<(), RunError> {
    telemetry::init(args.log_format, &args.log_filter)?;
    install_crypto_provider();
    let config = OperatorConfig::load(args.config.as_deref())?;
    let metrics = initialised_metrics();
    let client = crate::kube_client::counted(&metrics).await?;
    let providers = ProviderRegistry::from_config(&config, &metrics).await?;
    let templates = Arc::new(template_service(&config)?);
    let apis = Apis::bind(&config, &client, &providers).await?;
    let leader_config = LeaderConfig::for_instance(&config.instance, args.lease_duration_secs);
    let elector =
        LeaderElector::new(client.clone(), leader_config.clone())?.with_metrics(metrics.clone());
    let parts = Parts {
        client,
        metrics,
        providers,
        templates,
        config,
        namespace: args.namespace.clone(),
        concurrency: args.concurrency,
    };

    let signal = signal_trigger();

    // HTTP endpoints and the readiness probe run until the very end, so the probes answer
    // (truthfully) while the process stops.
    let health = Health {
        liveness: Liveness::new(),
        readiness: Readiness::new(),
    };
    health
        .readiness
        .set_not_ready("waiting for the API server and the sandboxes.dev CRDs");
    let listener = server::bind(args.metrics_addr).await?;
    let process_stop = Trigger::new();
    let mut process = TaskSet::new();
    spawn_process_tasks(&mut process, &parts, &health, listener, &process_stop);
    apis.spawn(&mut process, &process_stop);

    // Leader election: only the Lease holder reconciles. The elector stops (and releases the
    // Lease) only after the controllers have stopped.
    let mut leading = elector.subscribe();
    let election = Election::start(elector, &leader_config);

    let followed = tokio::select! {
        () = signal.fired() => Err(End::Signal),
        r = leading.wait_for(|l| *l) => r
            .map(drop)
            .map_err(|_| End::Failed("the leader election stopped".into())),
        exit = process.first_exit() => Err(End::Failed(exit.to_string())),
    };
    let end = match followed {
        Ok(()) => {
            let how = Leading {
                graceful: Duration::from_secs(args.graceful_shutdown_secs),
                lost: leader_config
                    .lease_duration
                    .saturating_sub(leader_config.renew_deadline)
                    / 2,
            };
            lead(&parts, &mut leading, &signal, &mut process, &health, how).await
        }
        Err(end) => {
            health.declare(&end);
            end
        }
    };

    election.stop().await;
    process_stop.fire();
    log_stops(process.stop_within(Duration::from_secs(5)).await);
    tracing::info!(?end, "stopped");
    end.into_result()
}

/// The listeners every replica serves, leader or not: the aggregated API and the
/// E2B-compatible API (each when enabled; the E2B API only reads and writes objects).
struct Apis {
    access: Option<crate::access::AccessServer>,
    e2b_api: Option<crate::e2bapi::E2bApiServer>,
}

impl Apis {
    /// Binds them before anything runs, so a taken port or a bad setting stops the start.
    async fn bind(
        config: &OperatorConfig,
        client: &Client,
        providers: &ProviderRegistry,
    ) -> Result<Apis, RunError> {
        let access =
            crate::access::AccessServer::bind(&config.access, client.clone(), providers.clone())
                .await?;
        let e2b_api = crate::e2bapi::E2bApiServer::bind(
            &config.e2b_api,
            client.clone(),
            providers.clone(),
            &config.instance,
        )
        .await?;
        Ok(Apis { access, e2b_api })
    }

    /// Serves them until `stop`.
    fn spawn(self, process: &mut TaskSet, stop: &Trigger) {
        if let Some(access) = self.access {
            process.spawn("aggregated API server", access.run(stop.fired()));
        }
        if let Some(e2b_api) = self.e2b_api {
            process.spawn("E2B API server", e2b_api.run(stop.fired()));
        }
    }
}

/// The metrics, every known label combination present from the start (at zero), so a
/// dashboard shows a series before its first event.
fn initialised_metrics() -> Metrics {
    let metrics = Metrics::new();
    let sweep_categories = controller::sweeper::decide::Category::ALL.map(|c| c.as_str());
    metrics.initialise(&crate::metrics::KnownLabels {
        kinds: &["Sandbox", "SandboxVolume", "SandboxTemplate"],
        error_categories: controller::error::CATEGORIES,
        sweep_categories: &sweep_categories,
        sweep_outcomes: controller::sweeper::DELETION_OUTCOMES,
        sweep_abort_reasons: controller::sweeper::ABORT_REASONS,
    });
    metrics
}

/// A trigger fired on SIGTERM or SIGINT.
fn signal_trigger() -> Trigger {
    let signal = Trigger::new();
    let fire = signal.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutdown requested");
        fire.fire();
    });
    signal
}

/// The running leader election.
struct Election {
    stop: Trigger,
    task: tokio::task::JoinHandle<()>,
    /// How long it may take to stop: its release is bounded by the renew deadline.
    bound: Duration,
}

impl Election {
    fn start(elector: LeaderElector, config: &LeaderConfig) -> Election {
        let stop = Trigger::new();
        let task = tokio::spawn(elector.run(stop.fired()));
        Election {
            stop,
            task,
            bound: config.renew_deadline + Duration::from_secs(1),
        }
    }

    /// Stop electing and release the Lease if held. Call it only once the leader's work has
    /// stopped: a standby starts as soon as the Lease is released.
    async fn stop(self) {
        self.stop.fire();
        match tokio::time::timeout(self.bound, self.task).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!(error = %e, "the leader election task failed"),
            Err(_) => {
                tracing::warn!(bound = ?self.bound, "the leader election did not stop in time; exiting without it")
            }
        }
    }
}

/// The tasks every replica runs, leader or not: the HTTP server and the readiness probe of
/// the API (ready once the API server serves our CRDs).
fn spawn_process_tasks(
    tasks: &mut TaskSet,
    parts: &Parts,
    health: &Health,
    listener: tokio::net::TcpListener,
    stop: &Trigger,
) {
    let state = ServerState {
        metrics: parts.metrics.clone(),
        readiness: health.readiness.clone(),
        liveness: health.liveness.clone(),
    };
    let stopped = stop.fired();
    tasks.spawn("metrics and probe server", async move {
        if let Err(e) = server::serve_on(listener, state, stopped).await {
            tracing::error!(error = %e, "metrics and probe server failed");
        }
    });
    let client = parts.client.clone();
    let readiness = health.readiness.clone();
    let mut stopped = Box::pin(stop.fired());
    tasks.spawn("readiness probe", async move {
        loop {
            match server::probe_api(
                &client,
                "sandboxes.dev/v1alpha1",
                &["Sandbox", "SandboxVolume", "SandboxTemplate"],
            )
            .await
            {
                Ok(()) => readiness.set_ready(),
                Err(reason) => readiness.set_not_ready(reason),
            }
            tokio::select! {
                () = &mut stopped => break,
                () = tokio::time::sleep(Duration::from_secs(10)) => {}
            }
        }
    });
}

/// The stop deadlines of the leader's tasks.
#[derive(Debug, Clone, Copy)]
struct Leading {
    /// On a signal or a failed task: we still hold the Lease (the elector keeps renewing),
    /// so in-flight reconciles may finish calmly.
    graceful: Duration,
    /// On lost leadership: another replica may take the Lease once it expires, a lease
    /// duration after our last renewal; we noticed at the renew deadline. Half the margin
    /// between the two, so the other half still covers clock skew and request latency and
    /// our work has stopped before anyone else's can start.
    lost: Duration,
}

/// While leading: run the controllers and the sweeper until a signal, the loss of
/// leadership, or a supervised task's end; then fail the probes if that is a failure, stop
/// the tasks within the deadline, and say why.
async fn lead(
    parts: &Parts,
    leading: &mut watch::Receiver<bool>,
    signal: &Trigger,
    process: &mut TaskSet,
    health: &Health,
    deadlines: Leading,
) -> End {
    tracing::info!(instance = %parts.config.instance, "leading: starting controllers");
    let stop = Trigger::new();
    let mut tasks = TaskSet::new();
    spawn_leader_tasks(&mut tasks, parts, &stop);
    let end = tokio::select! {
        () = signal.fired() => End::Signal,
        r = leading.wait_for(|l| !*l) => End::Lost(match r {
            Ok(_) => "lost leadership (the Lease could not be renewed in time, or was taken)".into(),
            Err(_) => "the leader election stopped while leading".into(),
        }),
        exit = tasks.first_exit() => End::Failed(exit.to_string()),
        exit = process.first_exit() => End::Failed(exit.to_string()),
    };
    health.declare(&end);
    let deadline = match end {
        End::Lost(_) => deadlines.lost,
        End::Signal | End::Failed(_) => deadlines.graceful,
    };
    tracing::info!(?deadline, "stopping the controllers");
    stop.fire();
    log_stops(tasks.stop_within(deadline).await);
    end
}

/// The leader-only tasks: the three controllers, and the sweeper when enabled.
fn spawn_leader_tasks(tasks: &mut TaskSet, parts: &Parts, stop: &Trigger) {
    let ctx = Context::with_images(
        parts.client.clone(),
        parts.providers.clone(),
        parts.templates.clone(),
        parts.metrics.clone(),
        parts.config.instance.clone(),
        parts.config.resync(),
        controller::sandbox::images::ImageRules::new(&parts.config.open_images),
    );
    let (sandbox_triggers, volume_triggers) = controller::triggers::provider_triggers(
        tasks,
        &parts.providers,
        &parts.config.instance,
        &parts.client,
        parts.namespace.as_deref(),
        ctx.echoes.clone(),
        stop.fired(),
    );
    let ns = parts.namespace.clone();
    tasks.spawn(
        "Sandbox controller",
        controller::sandbox::run(
            ctx.clone(),
            sandbox_triggers,
            stop.fired(),
            parts.concurrency,
            ns.clone(),
        ),
    );
    tasks.spawn(
        "SandboxVolume controller",
        controller::volume::run(ctx.clone(), volume_triggers, stop.fired(), ns.clone()),
    );
    tasks.spawn(
        "SandboxWarmPool controller",
        controller::pool::run(ctx.clone(), stop.fired(), ns.clone()),
    );
    // SandboxTemplates (the template stores are in the context's templates service).
    tasks.spawn(
        "SandboxTemplate controller",
        controller::template::run(ctx, stop.fired(), ns),
    );
    let sweeper = &parts.config.sweeper;
    if sweeper.enabled {
        tasks.spawn(
            "sweeper",
            controller::sweeper::run_periodic(
                controller::sweeper::Sweeper::new(
                    parts.client.clone(),
                    parts.metrics.clone(),
                    &parts.config.instance,
                    sweeper,
                ),
                parts.providers.clone(),
                sweeper.clone(),
                stop.fired(),
            ),
        );
    } else {
        tracing::info!("sweeper disabled (sweeper.enabled: false)");
    }
}

/// Logs how each task ended during a stop.
fn log_stops(exits: Vec<TaskExit>) {
    for exit in exits {
        match &exit.ending {
            Ending::Returned => tracing::debug!(task = exit.task, "stopped"),
            Ending::Panicked(_) => tracing::error!(task = exit.task, "{exit}"),
            Ending::Aborted => {
                tracing::warn!(
                    task = exit.task,
                    "did not stop within its deadline: aborted"
                )
            }
        }
    }
}

/// Installs aws-lc-rs as the process-wide rustls provider before any TLS client exists, so
/// kube (and later reqwest and the AWS SDK) never disagree about it — mixing providers panics.
fn install_crypto_provider() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}

/// The templates service: one store client per template store a provider names
/// (`providers[].templateStore`), built from its settings with the environment as fallback,
/// shared by every provider that names it. A store whose settings are incomplete fails
/// start-up with the missing settings named, rather than surfacing later as a network
/// failure. Building a client makes no request.
pub fn template_service(config: &OperatorConfig) -> Result<TemplateService, RunError> {
    let mut service = TemplateService::new(Limits::default());
    let mut built = std::collections::BTreeSet::new();
    for provider in &config.providers {
        let Some(name) = &provider.template_store else {
            continue;
        };
        let fail = |message: String| RunError::Provider {
            name: provider.name.clone(),
            message,
        };
        if built.insert(name.clone()) {
            let store_config = config.template_store(name).ok_or_else(|| {
                fail(format!(
                    "templateStore {name:?} is not defined under templateStores"
                ))
            })?;
            let settings = StoreSettings::resolve(store_config, |k| std::env::var(k).ok())
                .map_err(|e| fail(e.to_string()))?;
            service.add_store(Arc::new(TemplateStore::new(settings)));
        }
        service.assign(&provider.name, name);
    }
    Ok(service)
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn health() -> Health {
        let health = Health {
            liveness: Liveness::new(),
            readiness: Readiness::new(),
        };
        health.readiness.set_ready();
        health
    }

    #[test]
    fn a_requested_stop_keeps_healthz_green_and_exits_zero() {
        let h = health();
        h.declare(&End::Signal);
        assert_eq!(h.liveness.status(), Ok(()));
        assert_eq!(h.readiness.status(), Err("shutting down".into()));
        assert!(End::Signal.into_result().is_ok());
    }

    #[test]
    fn lost_leadership_and_failed_tasks_fail_healthz_with_the_reason_and_exit_non_zero() {
        for (end, says) in [
            (End::Lost("lost leadership".into()), "lost leadership"),
            (
                End::Failed("the sweeper panicked: boom".into()),
                "the sweeper panicked: boom",
            ),
        ] {
            let h = health();
            h.declare(&end);
            let reason = h.liveness.status().unwrap_err();
            assert!(reason.starts_with(says), "{reason}");
            assert!(h.readiness.status().is_err());
            let err = end.into_result().unwrap_err().to_string();
            assert!(err.starts_with(says) && err.contains("exiting"), "{err}");
        }
    }
}
