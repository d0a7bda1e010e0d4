//! `kubectl sandbox`: the plugin binary's logic (`src/bin/kubectl-sandbox.rs` only calls
//! [`main`]). A client of the aggregated API `subresources.sandboxes.dev`
//! ([`crate::access`]): `exec`, `attach`, `logs`, `cp` and `port-forward` on a Sandbox with the
//! user's own kubeconfig identity, speaking the same channel protocols as Pod exec and
//! port-forward ([`crate::access::channel`]).

pub mod api;
pub mod cli;
pub mod connect;
pub mod cp;
pub mod errors;
pub mod exec;
pub mod forward;
pub mod logs;
pub mod pack;
pub mod terminal;

use clap::Parser;

use cli::{Cli, Command};
use connect::{Target, load_config};
use errors::PluginError;

/// Runs the plugin with the process's arguments; returns its exit code: the remote process's
/// for `exec`/`attach`, 1 after an error (printed to stderr as `error: …`).
pub fn main() -> i32 {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: starting the runtime: {e}");
            return 1;
        }
    };
    let code = match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            1
        }
    };
    // Stdin is read on a blocking thread that may wait for a key press forever after the
    // remote process ended; dropping the runtime would wait for it.
    runtime.shutdown_background();
    code
}

/// Loads the kubeconfig and runs the command.
async fn run(cli: Cli) -> Result<i32, PluginError> {
    // The one TLS crypto provider of this crate (kube's rustls is built on aws-lc-rs).
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let config = load_config(cli.kubeconfig.as_deref(), cli.context.as_deref()).await?;
    let target = Target::new(config, cli.namespace)?;
    match &cli.command {
        Command::Exec(args) => exec::exec(&target, args).await,
        Command::Attach(args) => exec::attach(&target, args).await,
        Command::Logs(args) => logs::logs(&target, args).await,
        Command::Cp(args) => cp::cp(&target, args).await,
        Command::PortForward(args) => forward::port_forward(&target, args).await,
    }
}
