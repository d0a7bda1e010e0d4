//! Prometheus metrics.
//!
//! One [`Metrics`] value is created at startup and cloned into every controller, the sweeper,
//! the provider wrappers and the HTTP server (clones share the same registry). Label values are
//! bounded by construction: kinds are the three CRD kinds, providers are configured names,
//! categories/outcomes/reasons are short fixed words chosen by the callers — never object
//! names or error messages, which would make cardinality unbounded.
//!
//! Names follow Prometheus conventions: `sandbox_operator_` prefix, `_total` on counters,
//! `_seconds` on durations. Exposition is the Prometheus text format 0.0.4, which every
//! scraper understands.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// `Content-Type` of [`Metrics::render`]'s output.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Duration buckets (seconds): 5 ms doubling up to ~164 s, which covers a cached reconcile as
/// well as a provider create that pulls an image.
fn duration_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 16))
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindCategoryLabels {
    kind: String,
    category: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProviderCallLabels {
    provider: String,
    operation: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProviderOpLabels {
    provider: String,
    operation: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CategoryOutcomeLabels {
    category: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CategoryLabels {
    category: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModeLabels {
    mode: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerbResourceLabels {
    verb: String,
    resource: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VersionLabels {
    version: String,
}

struct Inner {
    registry: Registry,
    reconcile: ReconcileFamilies,
    provider: ProviderFamilies,
    sweep: SweepFamilies,
    leader: Gauge,
    kube_requests: Family<VerbResourceLabels, Counter>,
    claims: Family<ModeLabels, Counter>,
}

/// How reconciles end and how long they take, by object kind.
struct ReconcileFamilies {
    total: Family<KindLabels, Counter>,
    errors: Family<KindCategoryLabels, Counter>,
    duration: HistogramFamily<KindLabels>,
}

impl ReconcileFamilies {
    fn register(registry: &mut Registry) -> Self {
        let total = Family::<KindLabels, Counter>::default();
        registry.register(
            "reconciles",
            "Reconciles finished, by object kind",
            total.clone(),
        );
        let errors = Family::<KindCategoryLabels, Counter>::default();
        registry.register(
            "reconcile_errors",
            "Reconciles that failed, by object kind and error category",
            errors.clone(),
        );
        let duration: HistogramFamily<KindLabels> = Family::new_with_constructor(duration_buckets);
        registry.register(
            "reconcile_duration_seconds",
            "Wall time of one reconcile, by object kind",
            duration.clone(),
        );
        ReconcileFamilies {
            total,
            errors,
            duration,
        }
    }
}

/// Calls into the providers and how long they take.
struct ProviderFamilies {
    calls: Family<ProviderCallLabels, Counter>,
    duration: HistogramFamily<ProviderOpLabels>,
}

impl ProviderFamilies {
    fn register(registry: &mut Registry) -> Self {
        let calls = Family::<ProviderCallLabels, Counter>::default();
        registry.register(
            "provider_calls",
            "Calls into a provider, by provider name, operation and outcome",
            calls.clone(),
        );
        let duration: HistogramFamily<ProviderOpLabels> =
            Family::new_with_constructor(duration_buckets);
        registry.register(
            "provider_call_duration_seconds",
            "Wall time of one provider call, by provider name and operation",
            duration.clone(),
        );
        ProviderFamilies { calls, duration }
    }
}

/// What the sweeper found, deleted and gave up on, and when it last finished a pass.
struct SweepFamilies {
    deletions: Family<CategoryOutcomeLabels, Counter>,
    candidates: Family<CategoryLabels, Gauge>,
    aborted: Family<ReasonLabels, Counter>,
    passes: Counter,
    last_success: Gauge<f64, AtomicU64>,
}

impl SweepFamilies {
    fn register(registry: &mut Registry) -> Self {
        let deletions = Family::<CategoryOutcomeLabels, Counter>::default();
        registry.register(
            "sweep_deletions",
            "Sweeper deletions, by resource category and outcome",
            deletions.clone(),
        );
        let candidates = Family::<CategoryLabels, Gauge>::default();
        registry.register(
            "sweep_candidates",
            "Resources the last completed sweep pass found eligible for deletion, by category",
            candidates.clone(),
        );
        let aborted = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "sweep_aborted",
            "Sweep passes aborted before deleting anything further, by reason",
            aborted.clone(),
        );
        let passes = Counter::default();
        registry.register(
            "sweep_passes",
            "Sweep passes that completed",
            passes.clone(),
        );
        let last_success = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "sweep_last_success_timestamp_seconds",
            "Unix time of the last completed sweep pass",
            last_success.clone(),
        );
        SweepFamilies {
            deletions,
            candidates,
            aborted,
            passes,
            last_success,
        }
    }
}

/// Registers `build_info`: a constant 1 whose label names the running version.
fn register_build_info(registry: &mut Registry) {
    let build_info = Family::<VersionLabels, Gauge>::default();
    build_info
        .get_or_create(&VersionLabels {
            version: env!("CARGO_PKG_VERSION").into(),
        })
        .set(1);
    registry.register(
        "build_info",
        "Always 1; the version label says which build is running",
        build_info,
    );
}

/// The label values known in advance (see [`Metrics::initialise`]).
pub struct KnownLabels<'a> {
    /// Object kinds reconciled.
    pub kinds: &'a [&'a str],
    /// Reconcile error categories.
    pub error_categories: &'a [&'a str],
    /// Sweeper deletion categories.
    pub sweep_categories: &'a [&'a str],
    /// Sweeper deletion outcomes.
    pub sweep_outcomes: &'a [&'a str],
    /// Why a sweep pass aborts.
    pub sweep_abort_reasons: &'a [&'a str],
}

/// The operator's metrics. Cheap to clone; all clones record into one registry.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// Create and register every metric (all start at zero / absent series), in the order
    /// they are exposed: build, reconciles, provider calls, sweeps, leadership, API requests.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("sandbox_operator");
        register_build_info(&mut registry);
        let reconcile = ReconcileFamilies::register(&mut registry);
        let provider = ProviderFamilies::register(&mut registry);
        let sweep = SweepFamilies::register(&mut registry);
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 while this replica holds the leader Lease, else 0",
            leader.clone(),
        );
        let kube_requests = Family::<VerbResourceLabels, Counter>::default();
        registry.register(
            "kube_requests",
            "Requests sent to the Kubernetes API server, by verb and resource[/subresource]",
            kube_requests.clone(),
        );
        let claims = Family::<ModeLabels, Counter>::default();
        registry.register(
            "warm_pool_claims",
            "Sandboxes with spec.warmPoolRef served, by mode: warm (a running member) or cold (created)",
            claims.clone(),
        );
        for mode in ["warm", "cold"] {
            drop(claims.get_or_create(&ModeLabels { mode: mode.into() }));
        }
        Metrics {
            inner: Arc::new(Inner {
                registry,
                reconcile,
                provider,
                sweep,
                leader,
                kube_requests,
                claims,
            }),
        }
    }

    /// Creates, at zero, the series whose labels are known in advance, so dashboards and
    /// alerts (`rate`, `increase`) see them from the start instead of only after the first
    /// failure. Open-ended labels (providers, operations, a provider's finer error reasons)
    /// appear when first recorded.
    pub fn initialise(&self, known: &KnownLabels<'_>) {
        let i = &self.inner;
        for kind in known.kinds {
            let labels = KindLabels {
                kind: (*kind).into(),
            };
            drop(i.reconcile.total.get_or_create(&labels));
            drop(i.reconcile.duration.get_or_create(&labels));
            for category in known.error_categories {
                drop(i.reconcile.errors.get_or_create(&KindCategoryLabels {
                    kind: (*kind).into(),
                    category: (*category).into(),
                }));
            }
        }
        for category in known.sweep_categories {
            drop(i.sweep.candidates.get_or_create(&CategoryLabels {
                category: (*category).into(),
            }));
            for outcome in known.sweep_outcomes {
                drop(i.sweep.deletions.get_or_create(&CategoryOutcomeLabels {
                    category: (*category).into(),
                    outcome: (*outcome).into(),
                }));
            }
        }
        for reason in known.sweep_abort_reasons {
            drop(i.sweep.aborted.get_or_create(&ReasonLabels {
                reason: (*reason).into(),
            }));
        }
    }

    /// Start timing a reconcile of `kind`. When the guard drops (also on `?` early returns and
    /// panics), the reconcile is counted and its duration observed.
    pub fn reconcile_timer(&self, kind: &str) -> ReconcileTimer {
        ReconcileTimer {
            metrics: self.clone(),
            kind: kind.to_string(),
            start: Instant::now(),
        }
    }

    /// Count a failed reconcile. `category` is the error's CamelCase category, the same word
    /// its Event reason uses (`ProviderUnavailable`, `ProviderUnauthorized`, `KubeApiError`,
    /// `InvalidSpec`, …).
    pub fn reconcile_error(&self, kind: &str, category: &str) {
        self.inner
            .reconcile
            .errors
            .get_or_create(&KindCategoryLabels {
                kind: kind.into(),
                category: category.into(),
            })
            .inc();
    }

    /// Record one provider call: `outcome` is a fixed word (`ok`, `not_found`, `transient`,
    /// `timeout`, …) and `secs` its wall time.
    pub fn provider_call(&self, provider: &str, operation: &str, outcome: &str, secs: f64) {
        self.inner
            .provider
            .calls
            .get_or_create(&ProviderCallLabels {
                provider: provider.into(),
                operation: operation.into(),
                outcome: outcome.into(),
            })
            .inc();
        self.inner
            .provider
            .duration
            .get_or_create(&ProviderOpLabels {
                provider: provider.into(),
                operation: operation.into(),
            })
            .observe(secs);
    }

    /// Record one sweeper deletion attempt; `outcome` e.g. `deleted`, `failed`, `dry_run`.
    pub fn sweep_deleted(&self, category: &str, outcome: &str) {
        self.inner
            .sweep
            .deletions
            .get_or_create(&CategoryOutcomeLabels {
                category: category.into(),
                outcome: outcome.into(),
            })
            .inc();
    }

    /// Set how many `category` resources the current pass found eligible for deletion.
    pub fn sweep_candidates(&self, category: &str, count: usize) {
        self.inner
            .sweep
            .candidates
            .get_or_create(&CategoryLabels {
                category: category.into(),
            })
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// Count a pass aborted for `reason` (e.g. `enumeration_failed`, `deletion_cap`).
    pub fn sweep_aborted(&self, reason: &str) {
        self.inner
            .sweep
            .aborted
            .get_or_create(&ReasonLabels {
                reason: reason.into(),
            })
            .inc();
    }

    /// Count a pass that completed, and stamp its time (alert on staleness of this stamp).
    pub fn sweep_completed(&self) {
        self.inner.sweep.passes.inc();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        self.inner.sweep.last_success.set(now.as_secs_f64());
    }

    /// Count one request to the Kubernetes API server (see [`crate::kube_client`]).
    pub fn kube_request(&self, verb: &str, resource: &str) {
        self.inner
            .kube_requests
            .get_or_create(&VerbResourceLabels {
                verb: verb.into(),
                resource: resource.into(),
            })
            .inc();
    }

    /// Count one Sandbox served from a warm pool: `mode` is `warm` or `cold`.
    pub fn warm_pool_claim(&self, mode: &str) {
        self.inner
            .claims
            .get_or_create(&ModeLabels { mode: mode.into() })
            .inc();
    }

    /// Publish whether this replica is the leader.
    pub fn set_leader(&self, leader: bool) {
        self.inner.leader.set(i64::from(leader));
    }

    /// Everything in the Prometheus text exposition format (see [`CONTENT_TYPE`]).
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail; an Err could only come from a metric's own
        // encoder, and then a partial page is still more useful than none.
        if let Err(e) =
            prometheus_client::encoding::prometheus_text::encode(&mut out, &self.inner.registry)
        {
            tracing::warn!(error = %e, "encoding metrics failed; the page is incomplete");
        }
        out
    }
}

/// Times one reconcile; records on drop. See [`Metrics::reconcile_timer`].
#[must_use = "the reconcile is recorded when this guard is dropped; bind it to a variable"]
pub struct ReconcileTimer {
    metrics: Metrics,
    kind: String,
    start: Instant,
}

impl ReconcileTimer {
    /// Time since the timer started.
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }
}

impl Drop for ReconcileTimer {
    fn drop(&mut self) {
        let labels = KindLabels {
            kind: std::mem::take(&mut self.kind),
        };
        let inner = &self.metrics.inner;
        inner
            .reconcile
            .duration
            .get_or_create(&labels)
            .observe(self.start.elapsed().as_secs_f64());
        inner.reconcile.total.get_or_create(&labels).inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_contains_every_metric_after_recording() {
        let m = Metrics::new();
        {
            let _t = m.reconcile_timer("Sandbox");
        }
        m.reconcile_error("Sandbox", "transient");
        m.provider_call("docker", "create", "ok", 0.25);
        m.sweep_deleted("sandbox", "deleted");
        m.sweep_candidates("volume", 3);
        m.sweep_aborted("enumeration_failed");
        m.sweep_completed();
        m.clone().set_leader(true);

        let text = m.render();
        for needle in [
            "sandbox_operator_reconciles_total{kind=\"Sandbox\"} 1",
            "sandbox_operator_reconcile_errors_total{kind=\"Sandbox\",category=\"transient\"} 1",
            "sandbox_operator_reconcile_duration_seconds_count{kind=\"Sandbox\"} 1",
            "sandbox_operator_reconcile_duration_seconds_bucket{kind=\"Sandbox\",le=\"+Inf\"} 1",
            "sandbox_operator_provider_calls_total{provider=\"docker\",operation=\"create\",outcome=\"ok\"} 1",
            "sandbox_operator_provider_call_duration_seconds_sum{provider=\"docker\",operation=\"create\"} 0.25",
            "sandbox_operator_sweep_deletions_total{category=\"sandbox\",outcome=\"deleted\"} 1",
            "sandbox_operator_sweep_candidates{category=\"volume\"} 3",
            "sandbox_operator_sweep_aborted_total{reason=\"enumeration_failed\"} 1",
            "sandbox_operator_sweep_passes_total 1",
            "sandbox_operator_sweep_last_success_timestamp_seconds ",
            "sandbox_operator_leader 1",
            "sandbox_operator_build_info{version=\"",
            "# TYPE sandbox_operator_reconcile_duration_seconds histogram",
        ] {
            assert!(text.contains(needle), "missing `{needle}` in:\n{text}");
        }

        m.set_leader(false);
        assert!(m.render().contains("sandbox_operator_leader 0"));
    }

    #[test]
    fn timer_observes_on_drop_only() {
        let m = Metrics::new();
        let t = m.reconcile_timer("SandboxVolume");
        assert!(!m.render().contains("kind=\"SandboxVolume\""));
        assert!(t.elapsed() < Duration::from_secs(60));
        drop(t);
        assert!(
            m.render()
                .contains("sandbox_operator_reconciles_total{kind=\"SandboxVolume\"} 1")
        );
    }
}
