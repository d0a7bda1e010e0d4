//! The `sandbox-operator` command line.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

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
    /// Run one sweeper pass now and print what it reclaimed, kept and why, as a table.
    /// Exit code: 0 the pass completed, 1 it could not run or was aborted (nothing deleted),
    /// 2 it left work (the per-pass cap was reached or a deletion failed).
    Sweep(sandbox_operator::controller::sweeper::cli::SweepArgs),
    /// The egress gateway that Docker sandboxes with an allow-list reach the network
    /// through (run by the operator as a container; see the README's egress section).
    Gateway(sandbox_operator::gateway::GatewayArgs),
    /// Print the version.
    Version,
}

/// The operator's runtime: tokio's multi-threaded one, with worker stacks of 8 MiB instead
/// of 2. A pass's futures nest deep (a template fetch streams through the store's client, the
/// engine's and the provider handle's), and a stack overflow aborts the whole operator; an
/// unoptimised build overflowed 2 MiB once. The memory is only reserved, not used.
fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_stack_size(8 << 20)
        .build()
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => match runtime() {
            Ok(rt) => {
                let result = rt
                    .block_on(sandbox_operator::run::run(args))
                    .map_err(|e| e.to_string());
                // `run` bounds its own stop; a blocking call that is still running (and
                // cannot be cancelled) must not keep the process from exiting after it.
                rt.shutdown_timeout(Duration::from_secs(2));
                result
            }
            Err(e) => Err(format!("cannot start the async runtime: {e}")),
        },
        Command::Sweep(args) => return sandbox_operator::controller::sweeper::cli::main(args),
        Command::Gateway(args) => sandbox_operator::gateway::main(args),
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
