//! Logging setup.
//!
//! Operators run under a log collector, so `json` (one object per line, with span fields) is
//! what a cluster wants; `text` is for a developer's terminal. `RUST_LOG`, when set, wins over
//! the filter passed in, so verbosity can be raised on a running Deployment by editing its env
//! without touching the configuration file or the command line.

use std::fmt;
use std::str::FromStr;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::FmtSpan;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Default filter: our crate at `info`, kube's noisy internals at `warn`.
pub const DEFAULT_FILTER: &str = "info,kube=warn,tower=warn,hyper=warn";

/// Output format of the log lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines (for terminals).
    #[default]
    Text,
    /// One JSON object per line (for log collectors).
    Json,
}

impl fmt::Display for LogFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        })
    }
}

impl FromStr for LogFormat {
    type Err = TelemetryError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            _ => Err(TelemetryError::UnknownFormat(s.to_string())),
        }
    }
}

/// Why logging could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The log format is neither `text` nor `json`.
    #[error("unknown log format `{0}`; use `text` or `json`")]
    UnknownFormat(String),
    /// The filter (from `RUST_LOG` or the argument) does not parse.
    #[error("invalid log filter `{filter}` (from {origin}): {message}")]
    Filter {
        /// The directive string.
        filter: String,
        /// `RUST_LOG` or `the configured default`.
        origin: &'static str,
        /// Parser message.
        message: String,
    },
    /// A global subscriber is already installed (init called twice).
    #[error("logging is already initialised: {0}")]
    AlreadyInitialised(String),
}

/// Install the global tracing subscriber.
///
/// The filter is `RUST_LOG` when that is set and non-empty, else `filter` (e.g.
/// [`DEFAULT_FILTER`]). A malformed filter is an error rather than a silent fallback, so a typo
/// does not quietly drop the logs someone asked for.
pub fn init(format: LogFormat, filter: &str) -> Result<(), TelemetryError> {
    let env = std::env::var("RUST_LOG")
        .ok()
        .filter(|v| !v.trim().is_empty());
    let filter = build_filter(env.as_deref(), filter)?;
    let registry = tracing_subscriber::registry().with(filter);
    let result = match format {
        LogFormat::Text => registry
            // Colour only on a terminal: escape codes in a log file or collector are noise.
            .with(
                tracing_subscriber::fmt::layer()
                    .with_target(true)
                    .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout())),
            )
            .try_init(),
        LogFormat::Json => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_current_span(true)
                    .with_span_list(false)
                    .with_span_events(FmtSpan::NONE),
            )
            .try_init(),
    };
    result.map_err(|e| TelemetryError::AlreadyInitialised(e.to_string()))
}

fn build_filter(env: Option<&str>, fallback: &str) -> Result<EnvFilter, TelemetryError> {
    let (filter, origin) = match env {
        Some(env) => (env, "RUST_LOG"),
        None => (fallback, "the configured default"),
    };
    EnvFilter::builder()
        .parse(filter)
        .map_err(|e| TelemetryError::Filter {
            filter: filter.to_string(),
            origin,
            message: e.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_parses() {
        assert_eq!("json".parse::<LogFormat>().unwrap(), LogFormat::Json);
        assert_eq!("TEXT".parse::<LogFormat>().unwrap(), LogFormat::Text);
        let err = "xml".parse::<LogFormat>().unwrap_err().to_string();
        assert!(err.contains("`xml`") && err.contains("json"), "{err}");
        assert_eq!(LogFormat::Json.to_string(), "json");
    }

    #[test]
    fn env_filter_wins_and_bad_filters_are_named() {
        let f = build_filter(Some("debug"), "info").unwrap();
        assert_eq!(f.to_string(), "debug");
        let f = build_filter(None, DEFAULT_FILTER).unwrap();
        assert!(f.to_string().contains("kube=warn"), "{f}");
        let err = build_filter(Some("sandbox_operator=loud"), "info")
            .unwrap_err()
            .to_string();
        assert!(err.contains("RUST_LOG") && err.contains("loud"), "{err}");
        let err = build_filter(None, "=[").unwrap_err().to_string();
        assert!(err.contains("configured default"), "{err}");
    }

    #[test]
    fn init_twice_is_an_error_not_a_panic() {
        // Only the second call can be asserted: another test in this process may have won.
        let _ = init(LogFormat::Json, "info");
        assert!(matches!(
            init(LogFormat::Text, "info"),
            Err(TelemetryError::AlreadyInitialised(_))
        ));
    }
}
