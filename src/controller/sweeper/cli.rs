//! `sandbox-operator sweep`: one pass on demand, printed as a table.
//!
//! The table goes to stdout, logs to stderr, so `sweep --dry-run > plan.txt` captures only
//! the table. The exit code says whether the pass completed: `0` completed, `1` it could not
//! run or a pass was aborted (nothing was deleted by it), `2` it ran but left work behind
//! (the per-pass cap was reached or a deletion failed) — run it again.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use tracing_subscriber::EnvFilter;

use super::Sweeper;
use super::report::{PassReport, exit_code};
use crate::config::{ConfigError, OperatorConfig};
use crate::metrics::Metrics;
use crate::registry::{BuildError, ProviderRegistry};

/// Flags of `sandbox-operator sweep`.
#[derive(Debug, clap::Args)]
pub struct SweepArgs {
    /// Operator configuration file (YAML): the instance name, the providers and the
    /// `sweeper` policy (grace period, dry run, cap). Without it: instance `default` and one
    /// Docker provider named `docker`.
    #[arg(long, env = "SANDBOX_OPERATOR_CONFIG")]
    pub config: Option<PathBuf>,
    /// List what would be deleted and delete nothing. A configuration with
    /// `sweeper.dryRun: true` is a dry run too.
    #[arg(long)]
    pub dry_run: bool,
    /// Sweep only this configured provider (default: every configured provider).
    #[arg(long)]
    pub provider: Option<String>,
    /// Override `sweeper.graceSecs`: the minimum age, in seconds, of anything reclaimed.
    #[arg(long)]
    pub grace_secs: Option<u64>,
    /// Override `sweeper.maxDeletionsPerPass` (at least 1).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_deletions: Option<u64>,
    /// Log filter for stderr when RUST_LOG is unset.
    #[arg(long, default_value = "warn")]
    pub log_filter: String,
}

/// Why the command could not run a pass at all.
#[derive(Debug, thiserror::Error)]
pub enum SweepCliError {
    /// The configuration file is wrong.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// No Kubernetes client.
    #[error("cannot build a Kubernetes client (set KUBECONFIG or run in a cluster): {0}")]
    Kube(#[from] kube::Error),
    /// A provider could not be set up.
    #[error(transparent)]
    Providers(#[from] BuildError),
    /// `--provider` names no configured provider.
    #[error("--provider {wanted:?} is not configured; configured providers: {known:?}")]
    UnknownProvider {
        /// What was asked for.
        wanted: String,
        /// What the configuration has.
        known: Vec<String>,
    },
    /// The async runtime could not start.
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
}

/// The command: set up, run one pass per selected provider, print, exit.
pub fn main(args: SweepArgs) -> ExitCode {
    let filter = std::env::var("RUST_LOG")
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| args.log_filter.clone());
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(EnvFilter::try_new(&filter).unwrap_or_else(|_| EnvFilter::new("warn")))
        .try_init();
    let result = tokio::runtime::Runtime::new()
        .map_err(SweepCliError::Runtime)
        .and_then(|rt| rt.block_on(run(&args)));
    match result {
        Ok(reports) => {
            for report in &reports {
                println!("{}", report.render_table());
            }
            ExitCode::from(exit_code(&reports))
        }
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::from(1)
        }
    }
}

/// Loads the configuration, builds the selected providers and runs one pass over each.
pub async fn run(args: &SweepArgs) -> Result<Vec<PassReport>, SweepCliError> {
    // One process-wide TLS provider before any client exists (as `run` does).
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let mut config = OperatorConfig::load(args.config.as_deref())?;
    if let Some(wanted) = &args.provider {
        let known: Vec<String> = config.providers.iter().map(|p| p.name.clone()).collect();
        config.providers.retain(|p| &p.name == wanted);
        if config.providers.is_empty() {
            return Err(SweepCliError::UnknownProvider {
                wanted: wanted.clone(),
                known,
            });
        }
    }
    let kube_config = kube::Config::infer()
        .await
        .map_err(kube::Error::InferConfig)?;
    let client = crate::kube_client::client(kube_config)?;
    let metrics = Metrics::new();
    let providers = ProviderRegistry::from_config(&config, &metrics).await?;
    let mut sweeper = Sweeper::new(client, metrics, &config.instance, &config.sweeper);
    if args.dry_run {
        sweeper = sweeper.with_dry_run(true);
    }
    if let Some(grace) = args.grace_secs {
        sweeper = sweeper.with_grace(Duration::from_secs(grace));
    }
    if let Some(max) = args.max_deletions {
        sweeper = sweeper.with_max_deletions(usize::try_from(max).unwrap_or(usize::MAX));
    }
    Ok(sweeper.pass_all(&providers).await)
}
