//! The `sandbox-operator` command line.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Kubernetes operator for isolated code sandboxes.
#[derive(Parser)]
#[command(name = "sandbox-operator", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the CustomResourceDefinitions, or write one YAML file per CRD into --out.
    Crds {
        /// Directory to write `<plural>.<group>.yaml` files into (created if missing).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Run the operator: controllers (while holding the leader Lease), /metrics, /healthz,
    /// /readyz; stops gracefully on SIGTERM.
    Run(sandbox_operator::run::RunArgs),
    /// Print the version.
    Version,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => match tokio::runtime::Runtime::new() {
            Ok(rt) => rt.block_on(sandbox_operator::run::run(args)).map_err(|e| e.to_string()),
            Err(e) => Err(format!("cannot start the async runtime: {e}")),
        },
        Command::Crds { out } => sandbox_operator::api::crds::write(out.as_deref()),
        Command::Version => {
            println!("sandbox-operator {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}
