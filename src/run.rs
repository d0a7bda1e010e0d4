//! `sandbox-operator run`: configuration → providers → HTTP endpoints → leader election →
//! controllers while leading → graceful shutdown on SIGTERM.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::channel::mpsc;
use futures::{SinkExt, StreamExt};
use kube::Client;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::watch;

use crate::api::{Sandbox, SandboxVolume};
use crate::config::OperatorConfig;
use crate::controller::{self, Context};
use crate::leader::{LeaderConfig, LeaderElector};
use crate::metrics::Metrics;
use crate::provider::docker::DockerProvider;
use crate::provider::{Provider, ProviderEvent, ProviderSettings};
use crate::registry::{ProviderHandle, ProviderRegistry};
use crate::server::{self, Liveness, Readiness, ServerState};
use crate::telemetry::{self, LogFormat};
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
    /// A provider could not be set up.
    #[error("provider {name:?}: {message}")]
    Provider {
        /// Provider name.
        name: String,
        /// What is wrong.
        message: String,
    },
    /// Leader election settings.
    #[error(transparent)]
    Leader(#[from] crate::leader::LeaderError),
    /// The HTTP server failed.
    #[error(transparent)]
    Server(#[from] server::ServerError),
    /// Leadership was lost while leading: the process exits so it restarts clean.
    #[error("lost leadership; exiting so a restarted process rejoins the election cleanly")]
    LostLeadership,
}

/// Runs the operator until SIGTERM/SIGINT.
pub async fn run(args: RunArgs) -> Result<(), RunError> {
    telemetry::init(args.log_format, &args.log_filter)?;
    install_crypto_provider();
    let config = OperatorConfig::load(args.config.as_deref())?;
    let client = Client::try_default().await?;
    let metrics = Metrics::new();
    let providers = build_providers(&config, &metrics).await?;
    let template_stores = template_stores_by_provider(&config)?;

    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutdown requested");
        let _ = stop_tx.send(true);
    });

    // HTTP endpoints, ready once the API server serves our CRDs.
    let readiness = Readiness::new();
    readiness.set_not_ready("waiting for the API server and the sandboxes.dev CRDs");
    let state = ServerState {
        metrics: metrics.clone(),
        readiness: readiness.clone(),
        liveness: Liveness::new(),
    };
    let listener = server::bind(args.metrics_addr).await?;
    let server_task = tokio::spawn(server::serve_on(listener, state, stopped()));
    {
        let client = client.clone();
        let readiness = readiness.clone();
        let mut stop = Box::pin(stopped());
        tokio::spawn(async move {
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
                    () = &mut stop => break,
                    () = tokio::time::sleep(Duration::from_secs(10)) => {}
                }
            }
        });
    }

    // Leader election: only the Lease holder reconciles.
    let mut leader_config = LeaderConfig::for_instance(&config.instance);
    let lease = args.lease_duration_secs.max(3);
    leader_config.lease_duration = Duration::from_secs(lease);
    leader_config.renew_deadline = Duration::from_millis(lease * 2000 / 3);
    leader_config.renew_interval = Duration::from_millis(lease * 1000 / 3);
    leader_config.retry_interval = Duration::from_millis((lease * 1000 / 7).max(500));
    let elector = LeaderElector::new(client.clone(), leader_config)?.with_metrics(metrics.clone());
    let mut leading = elector.subscribe();
    // The elector stops (and releases the Lease) only after the controllers have stopped.
    let (controllers_done_tx, controllers_done_rx) = watch::channel(false);
    let elector_task = tokio::spawn(elector.run(async move {
        let mut rx = controllers_done_rx;
        let _ = rx.wait_for(|d| *d).await;
    }));

    let mut stop = Box::pin(stopped());
    let became_leader = tokio::select! {
        () = &mut stop => false,
        r = leading.wait_for(|l| *l) => r.is_ok(),
    };
    let mut result = Ok(());
    if became_leader {
        tracing::info!(instance = %config.instance, "leading: starting controllers");
        let ctx = Context::new(
            client.clone(),
            providers.clone(),
            metrics.clone(),
            config.instance.clone(),
            config.resync(),
        );
        let (sandbox_triggers, volume_triggers) = provider_triggers(
            &providers,
            &config.instance,
            &client,
            args.namespace.as_deref(),
            stopped(),
        );
        let (ctl_stop_tx, ctl_stop_rx) = watch::channel(false);
        let ctl_stopped = move || {
            let mut rx = ctl_stop_rx.clone();
            async move {
                let _ = rx.wait_for(|s| *s).await;
            }
        };
        let ns = args.namespace.clone();
        let sandboxes = tokio::spawn(controller::sandbox::run(
            ctx.clone(),
            sandbox_triggers,
            ctl_stopped(),
            args.concurrency,
            ns.clone(),
        ));
        let volumes = tokio::spawn(controller::volume::run(
            ctx.clone(),
            volume_triggers,
            ctl_stopped(),
            ns.clone(),
        ));
        // SandboxTemplates, with each provider's template store (for fetch and unpublish).
        let templates = tokio::spawn(controller::template::run(
            ctx.clone(),
            template_stores.clone(),
            ctl_stopped(),
            ns,
        ));
        // The sweeper: leader only, stopped with the controllers (a no-op when disabled).
        let sweeper = tokio::spawn(controller::sweeper::run_periodic(
            controller::sweeper::Sweeper::new(
                client.clone(),
                metrics.clone(),
                &config.instance,
                &config.sweeper,
            ),
            providers.clone(),
            config.sweeper.clone(),
            ctl_stopped(),
        ));
        let lost = tokio::select! {
            () = &mut stop => false,
            _ = leading.wait_for(|l| !*l) => true,
        };
        let _ = ctl_stop_tx.send(true);
        let _ = sandboxes.await;
        let _ = volumes.await;
        let _ = templates.await;
        let _ = sweeper.await;
        if lost {
            result = Err(RunError::LostLeadership);
        }
    }
    let _ = controllers_done_tx.send(true);
    let _ = elector_task.await;
    let _ = server_task.await;
    tracing::info!("stopped");
    result
}

/// Installs aws-lc-rs as the process-wide rustls provider before any TLS client exists, so
/// kube (and later reqwest and the AWS SDK) never disagree about it — mixing providers panics.
fn install_crypto_provider() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}

/// Builds the provider registry from the configuration.
pub async fn build_providers(
    config: &OperatorConfig,
    metrics: &Metrics,
) -> Result<ProviderRegistry, RunError> {
    let mut registry = ProviderRegistry::new();
    let mut configured = config.providers.clone();
    if configured.is_empty() {
        configured.push(crate::config::ProviderConfig::docker_default("docker"));
    }
    for p in &configured {
        let settings = p.settings().ok_or_else(|| RunError::Provider {
            name: p.name.clone(),
            message: format!(
                "a provider of type {} needs its `{}:` block",
                p.type_, p.type_
            ),
        })?;
        let failed = |e: crate::provider::ProviderError| RunError::Provider {
            name: p.name.clone(),
            message: e.to_string(),
        };
        let provider: Arc<dyn Provider> = match (&settings, template_store_of(config, p)?) {
            // Docker carries its template store until publish/fetch move to the templates
            // service.
            (ProviderSettings::Docker(s), Some((store, limits))) => Arc::new(
                DockerProvider::connect_negotiated(p.name.clone(), s.clone())
                    .await
                    .map_err(failed)?
                    .with_template_store(store, limits),
            ),
            _ => crate::provider::build(&p.name, &settings)
                .await
                .map_err(failed)?,
        };
        registry.insert(ProviderHandle::new(
            provider,
            config.provider_concurrency,
            config.provider_timeout(),
            metrics.clone(),
        ));
    }
    if let Some(d) = config.default_provider_name() {
        registry.set_default(d);
    }
    Ok(registry)
}

/// The S3 template store a provider names (`providers[].templateStore`), built from its
/// settings with the environment as fallback; `None` when it names none. A store whose
/// settings are incomplete fails start-up with the missing settings named, rather than
/// surfacing later as a network failure.
fn template_store_of(
    config: &OperatorConfig,
    provider: &crate::config::ProviderConfig,
) -> Result<Option<(Arc<TemplateStore>, Limits)>, RunError> {
    let Some(name) = &provider.template_store else {
        return Ok(None);
    };
    let store_config = config
        .template_store(name)
        .ok_or_else(|| RunError::Provider {
            name: provider.name.clone(),
            message: format!("templateStore {name:?} is not defined under templateStores"),
        })?;
    let settings =
        StoreSettings::resolve(store_config, |k| std::env::var(k).ok()).map_err(|e| {
            RunError::Provider {
                name: provider.name.clone(),
                message: e.to_string(),
            }
        })?;
    Ok(Some((
        Arc::new(TemplateStore::new(settings)),
        Limits::default(),
    )))
}

/// The template store of every provider that names one, by provider name (one store client
/// per provider: building one makes no request).
pub fn template_stores_by_provider(
    config: &OperatorConfig,
) -> Result<controller::template::Stores, RunError> {
    let mut stores = controller::template::Stores::new();
    for p in &config.providers {
        if let Some(store) = template_store_of(config, p)? {
            stores.insert(p.name.clone(), store);
        }
    }
    Ok(stores)
}

/// Streams of objects to reconcile because their provider resources changed.
///
/// Each provider's event stream is resubscribed with backoff when it drops, so a restarted
/// engine is picked up again. Before resubscribing, the provider is probed; whenever its
/// reachability changes, every object on it is reconciled again: when it stops answering they
/// report it (`Ready=False`, `ProviderUnavailable`) instead of keeping a state nobody can see
/// any more — no event would ever arrive to tell them — and when it answers again they recover
/// at once rather than after their error backoff, and whatever changed while no events could
/// arrive is noticed. A connection that drops while the provider keeps answering is not such a
/// change: the periodic resync is the safety net for events missed then.
fn provider_triggers(
    providers: &ProviderRegistry,
    instance: &str,
    client: &Client,
    namespace: Option<&str>,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> (
    mpsc::UnboundedReceiver<ObjectRef<Sandbox>>,
    mpsc::UnboundedReceiver<ObjectRef<SandboxVolume>>,
) {
    let (sbx_tx, sbx_rx) = mpsc::unbounded();
    let (vol_tx, vol_rx) = mpsc::unbounded();
    let stop = futures::FutureExt::shared(Box::pin(stop));
    for handle in providers.iter() {
        let handle = handle.clone();
        let provider = handle.provider.clone();
        let registry = providers.clone();
        let client = client.clone();
        let namespace = namespace.map(str::to_string);
        let instance = instance.to_string();
        let mut sbx_tx = sbx_tx.clone();
        let mut vol_tx = vol_tx.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let Some(events) = provider.events() else {
                return;
            };
            let mut attempt = 0u32;
            // The controllers' initial listing reconciles everything once: start as reachable.
            let mut reachable = true;
            let pump = async {
                loop {
                    let mut stream = events.subscribe(&instance);
                    while let Some(item) = stream.next().await {
                        match item {
                            Ok(ProviderEvent { owner, action }) => {
                                attempt = 0;
                                tracing::debug!(kind = %owner.kind, namespace = %owner.namespace, name = %owner.name, %action, "provider event");
                                match owner.kind.as_str() {
                                    "Sandbox" => {
                                        let _ = sbx_tx
                                            .send(
                                                ObjectRef::new(&owner.name)
                                                    .within(&owner.namespace),
                                            )
                                            .await;
                                    }
                                    "SandboxVolume" => {
                                        let _ = vol_tx
                                            .send(
                                                ObjectRef::new(&owner.name)
                                                    .within(&owner.namespace),
                                            )
                                            .await;
                                    }
                                    _ => {}
                                }
                            }
                            Err(err) => {
                                tracing::warn!(%err, provider = provider.name(), "provider event stream failed");
                                break;
                            }
                        }
                    }
                    attempt = attempt.saturating_add(1);
                    tokio::time::sleep(
                        controller::backoff::delay_for(attempt).min(Duration::from_secs(30)),
                    )
                    .await;
                    // Any answer, even "no such sandbox", means the provider is reachable.
                    let up = handle
                        .call("probe", provider.describe(REACHABILITY_PROBE))
                        .await
                        .is_ok();
                    if up != reachable {
                        reachable = up;
                        if up {
                            attempt = 0;
                            tracing::info!(
                                provider = provider.name(),
                                "provider reachable again: reconciling its objects"
                            );
                        } else {
                            tracing::warn!(
                                provider = provider.name(),
                                "provider unreachable: reconciling its objects so they report it"
                            );
                        }
                        reconcile_objects_on(
                            &client,
                            namespace.as_deref(),
                            &registry,
                            provider.name(),
                            &mut sbx_tx,
                            &mut vol_tx,
                        )
                        .await;
                    }
                }
            };
            tokio::select! {
                () = stop => {}
                () = pump => {}
            }
        });
    }
    (sbx_rx, vol_rx)
}

/// A sandbox id no provider holds: describing it only tells whether the provider answers.
const REACHABILITY_PROBE: &str = "sandbox-operator-reachability-probe";

/// Queues a reconcile of every Sandbox and SandboxVolume (in `namespace`, or everywhere) that
/// lives on `provider`. A failed listing is logged: the periodic resync still covers them.
async fn reconcile_objects_on(
    client: &Client,
    namespace: Option<&str>,
    providers: &ProviderRegistry,
    provider: &str,
    sbx_tx: &mut mpsc::UnboundedSender<ObjectRef<Sandbox>>,
    vol_tx: &mut mpsc::UnboundedSender<ObjectRef<SandboxVolume>>,
) {
    use kube::ResourceExt;
    fn api<K>(client: &Client, namespace: Option<&str>) -> kube::Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        match namespace {
            Some(ns) => kube::Api::namespaced(client.clone(), ns),
            None => kube::Api::all(client.clone()),
        }
    }
    let on = |named: Option<&str>| providers.resolve(named).is_ok_and(|h| h.name() == provider);
    match api::<Sandbox>(client, namespace)
        .list(&Default::default())
        .await
    {
        Ok(list) => {
            for s in list.items.iter().filter(|s| {
                on(s.status
                    .as_ref()
                    .and_then(|st| st.provider.as_deref())
                    .or(s.spec.provider.as_deref()))
            }) {
                let _ = sbx_tx
                    .send(ObjectRef::new(&s.name_any()).within(&s.namespace().unwrap_or_default()))
                    .await;
            }
        }
        Err(err) => {
            tracing::warn!(%err, provider, "cannot list Sandboxes to reconcile them; the periodic resync will")
        }
    }
    match api::<SandboxVolume>(client, namespace)
        .list(&Default::default())
        .await
    {
        Ok(list) => {
            for v in list.items.iter().filter(|v| {
                on(v.status
                    .as_ref()
                    .and_then(|st| st.provider.as_deref())
                    .or(v.spec.provider.as_deref()))
            }) {
                let _ = vol_tx
                    .send(ObjectRef::new(&v.name_any()).within(&v.namespace().unwrap_or_default()))
                    .await;
            }
        }
        Err(err) => {
            tracing::warn!(%err, provider, "cannot list SandboxVolumes to reconcile them; the periodic resync will")
        }
    }
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
