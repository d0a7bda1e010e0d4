//! The configured providers, by name, each behind its own concurrency bound and timeout.
//!
//! Every external call goes through [`ProviderHandle::call`] (or, for the operator's own
//! upkeep, [`ProviderHandle::upkeep`], which yields its slots to Sandboxes: [`limit`]), so
//! one slow provider fills only its own slots and times out on its own clock: it never
//! stalls reconciles for the others. Interactive processes and whole-file writes go through
//! the handle too ([`exec`]), which keeps a process waiting in a sandbox in use where the
//! provider says starting one is costly ([`warm`]).

pub mod exec;
pub mod limit;
pub mod warm;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::{OperatorConfig, ProviderConfig};
use crate::metrics::Metrics;
use crate::provider::{Provider, ProviderError, ProviderResult};
use limit::{Lane, Limiter};

/// A configured provider could not be built.
#[derive(Debug, thiserror::Error)]
#[error("provider {name:?}: {message}")]
pub struct BuildError {
    /// The provider's configured name.
    pub name: String,
    /// What is wrong, naming the setting to fix.
    pub message: String,
}

/// One configured provider with its bound and timeout.
#[derive(Clone)]
pub struct ProviderHandle {
    /// The provider itself.
    pub provider: Arc<dyn Provider>,
    limit: Arc<Limiter>,
    timeout: Duration,
    metrics: Metrics,
    /// The processes waiting in this provider's sandboxes; `None` where it keeps none.
    warm: Option<Arc<warm::WarmExec>>,
}

impl ProviderHandle {
    /// Wraps a provider with at most `concurrency` calls in flight, each bounded by `timeout`.
    pub fn new(
        provider: Arc<dyn Provider>,
        concurrency: usize,
        timeout: Duration,
        metrics: Metrics,
    ) -> Self {
        let warm = warm::wanted(provider.as_ref()).then(Arc::default);
        ProviderHandle {
            provider,
            limit: Limiter::new(concurrency),
            timeout,
            metrics,
            warm,
        }
    }

    /// The provider's configured name.
    pub fn name(&self) -> &str {
        self.provider.name()
    }

    /// Runs one provider operation for a Sandbox under this provider's bound and timeout,
    /// recording it.
    ///
    /// A timeout is `Transient`: the operation may still complete at the provider, which is
    /// why every operation the controllers issue is idempotent or observed before retried.
    /// Not an `async fn` of its own: [`Self::call_in`]'s future is returned as it is, so
    /// the operation's future is not wrapped (and, in a debug build, copied) once more —
    /// a template fetch's is large enough to overflow a worker's stack that way.
    pub fn call<T, F>(
        &self,
        operation: &'static str,
        fut: F,
    ) -> impl Future<Output = ProviderResult<T>>
    where
        F: Future<Output = ProviderResult<T>>,
    {
        self.call_in(Lane::Sandbox, operation, fut)
    }

    /// [`Self::call`] for the operator's own upkeep (a warm pool's members, the sweeper),
    /// which yields the provider's slots to Sandbox calls (see [`limit`]).
    pub fn upkeep<T, F>(
        &self,
        operation: &'static str,
        fut: F,
    ) -> impl Future<Output = ProviderResult<T>>
    where
        F: Future<Output = ProviderResult<T>>,
    {
        self.call_in(Lane::Upkeep, operation, fut)
    }

    async fn call_in<T, F>(&self, lane: Lane, operation: &'static str, fut: F) -> ProviderResult<T>
    where
        F: Future<Output = ProviderResult<T>>,
    {
        let _permit = self.limit.acquire(lane).await;
        let started = Instant::now();
        let result = match tokio::time::timeout(self.timeout, fut).await {
            Ok(result) => result,
            Err(_) => Err(ProviderError::transient(format!(
                "provider {} did not answer {operation} within {}s",
                self.name(),
                self.timeout.as_secs()
            ))),
        };
        let outcome = match &result {
            Ok(_) => "ok",
            Err(e) => e.category(),
        };
        let elapsed = started.elapsed();
        self.metrics
            .provider_call(self.name(), operation, outcome, elapsed.as_secs_f64());
        tracing::debug!(
            provider = self.name(),
            operation,
            outcome,
            ?elapsed,
            "provider call"
        );
        result
    }
}

/// The endpoint of the template store provider `p` names, as the store's client resolves it
/// (see `run::template_service`), so the provider can let its sandboxes reach it.
fn store_endpoint(config: &OperatorConfig, p: &ProviderConfig) -> Option<String> {
    let store = config.template_store(p.template_store.as_deref()?)?;
    crate::templates::store::endpoint_of(store, |k| std::env::var(k).ok())
}

/// All configured providers and which one a Sandbox without `spec.provider` uses.
#[derive(Clone, Default)]
pub struct ProviderRegistry {
    providers: BTreeMap<String, ProviderHandle>,
    default: Option<String>,
}

impl ProviderRegistry {
    /// Builds every configured provider (one Docker provider named `docker` when none is
    /// configured), each behind the configured concurrency bound and timeout. Used by `run`
    /// and by the on-demand `sweep`, so both see the same providers.
    pub async fn from_config(
        config: &OperatorConfig,
        metrics: &Metrics,
    ) -> Result<ProviderRegistry, BuildError> {
        let mut registry = ProviderRegistry::new();
        let mut configured = config.providers.clone();
        if configured.is_empty() {
            configured.push(ProviderConfig::docker_default("docker"));
        }
        for p in &configured {
            let failed = |message: String| BuildError {
                name: p.name.clone(),
                message,
            };
            let mut settings = p.settings().map_err(|needs| failed(needs.to_string()))?;
            if let Some(endpoint) = store_endpoint(config, p) {
                settings.kind_mut().open_template_store(&endpoint);
            }
            let provider = crate::provider::build(&p.name, &settings)
                .await
                .map_err(|e| failed(e.to_string()))?;
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

    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a provider; the first one added is the default unless [`Self::set_default`].
    pub fn insert(&mut self, handle: ProviderHandle) {
        if self.default.is_none() {
            self.default = Some(handle.name().to_string());
        }
        self.providers.insert(handle.name().to_string(), handle);
    }

    /// Sets the default provider's name.
    pub fn set_default(&mut self, name: impl Into<String>) {
        self.default = Some(name.into());
    }

    /// The provider an object names, or the default when it names none. The error names
    /// the configured providers so the user can fix `spec.provider`.
    pub fn resolve(&self, name: Option<&str>) -> Result<&ProviderHandle, String> {
        let wanted = name.or(self.default.as_deref());
        wanted.and_then(|n| self.providers.get(n)).ok_or_else(|| {
            let known: Vec<&str> = self.providers.keys().map(String::as_str).collect();
            match name {
                Some(n) => format!(
                    "spec.provider {n:?} is not configured in this operator; configured providers: {known:?}"
                ),
                None => format!(
                    "no default provider is configured; set spec.provider to one of {known:?}"
                ),
            }
        })
    }

    /// Every configured provider.
    pub fn iter(&self) -> impl Iterator<Item = &ProviderHandle> {
        self.providers.values()
    }
}
