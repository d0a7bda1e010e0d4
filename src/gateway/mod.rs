//! The egress gateway (`sandbox-operator gateway serve`): the only way out for a Docker
//! sandbox with an allow-list.
//!
//! Such a sandbox sits on an internal Docker network whose only other member is this
//! gateway; its resolver is the gateway's DNS server ([`dns`]), which resolves only the names
//! on that sandbox's list and answers them with the gateway's own address, so every
//! connection to a listed name arrives at the gateway's proxy ([`proxy`]), which forwards it
//! by TLS SNI or HTTP Host ([`sniff`]) after checking the name again, and only to the
//! addresses [`destination`] permits: never loopback, private, link-local, CGNAT or
//! metadata addresses unless the provider allows a CIDR explicitly. Policies arrive as
//! files written by the operator ([`policy`]); names leave only through [`upstream`].
//!
//! The gateway needs no capability: it binds its ports on its internal address (the
//! container allows unprivileged low ports through a namespaced sysctl) and routes nothing.
//! When it is down, a sandbox behind it has no resolver and no route: egress fails closed.

pub mod allow;
pub mod destination;
pub mod dns;
pub mod policy;
pub mod proxy;
pub mod sniff;
pub mod upstream;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Subcommand};

/// `sandbox-operator gateway …`.
#[derive(Debug, Args)]
pub struct GatewayArgs {
    #[command(subcommand)]
    command: GatewayCommand,
}

#[derive(Debug, Subcommand)]
enum GatewayCommand {
    /// Serve DNS and the proxy on the internal address until stopped.
    Serve(ServeArgs),
    /// Remove one sandbox's policy file (the operator runs this when a sandbox is destroyed).
    Forget {
        /// Directory holding the policy files.
        #[arg(long)]
        policy_dir: PathBuf,
        /// The sandbox (container name) whose policy goes.
        sandbox: String,
    },
}

/// Options of `gateway serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The gateway's address on the sandboxes' internal network: DNS answers for listed
    /// names point here, and every listener binds here only.
    #[arg(long)]
    listen: Ipv4Addr,
    /// Directory holding one `<sandbox>.json` policy file per sandbox.
    #[arg(long)]
    policy_dir: PathBuf,
    /// Upstream DNS server (`IP:PORT`); default: the first nameserver of /etc/resolv.conf.
    #[arg(long)]
    upstream_dns: Option<SocketAddr>,
    /// TCP ports proxied (connections go to the same port upstream).
    #[arg(long, value_delimiter = ',', default_value = "80,443")]
    ports: Vec<u16>,
    /// How often the policy files and the sandboxes' addresses are re-read, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    refresh_ms: u64,
    /// Private CIDRs a listed name may resolve to and still be dialled (comma-separated;
    /// the provider's `egress.allowPrivateCidrs`). Metadata endpoints stay refused.
    #[arg(long, value_delimiter = ',', value_parser = destination::Cidr::parse)]
    allow_private_cidrs: Vec<destination::Cidr>,
}

/// Runs a gateway command to completion.
pub fn main(args: GatewayArgs) -> Result<(), String> {
    match args.command {
        GatewayCommand::Forget {
            policy_dir,
            sandbox,
        } => policy::forget(&policy_dir, &sandbox),
        GatewayCommand::Serve(args) => {
            crate::telemetry::init(crate::telemetry::LogFormat::Json, "info")
                .map_err(|e| e.to_string())?;
            tokio::runtime::Runtime::new()
                .map_err(|e| format!("cannot start the async runtime: {e}"))?
                .block_on(serve(args))
        }
    }
}

async fn serve(args: ServeArgs) -> Result<(), String> {
    let upstream = match args.upstream_dns {
        Some(addr) => upstream::Upstream::new(addr),
        None => std::fs::read_to_string("/etc/resolv.conf")
            .ok()
            .and_then(|t| upstream::Upstream::from_resolv_conf(&t))
            .ok_or("no --upstream-dns given and no nameserver in /etc/resolv.conf")?,
    };
    let policies = Arc::new(policy::Policies::new(
        &args.policy_dir,
        policy::system_lookup(),
    ));
    policies.refresh().await;

    let dns_socket = tokio::net::UdpSocket::bind((args.listen, 53))
        .await
        .map_err(|e| format!("binding DNS on {}:53: {e}", args.listen))?;
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(dns::serve(
        dns_socket,
        args.listen,
        policies.clone(),
        upstream.clone(),
    ));
    for port in &args.ports {
        let listener = tokio::net::TcpListener::bind((args.listen, *port))
            .await
            .map_err(|e| format!("binding the proxy on {}:{port}: {e}", args.listen))?;
        let dial = proxy::Dial {
            upstream: upstream.clone(),
            policy: destination::DialPolicy::new(args.allow_private_cidrs.clone()),
        };
        tasks.spawn(proxy::serve(listener, policies.clone(), dial));
    }
    let refresher = policies.clone();
    let every = Duration::from_millis(args.refresh_ms.max(100));
    tasks.spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            refresher.refresh().await;
        }
    });
    let allowed: Vec<String> = args
        .allow_private_cidrs
        .iter()
        .map(ToString::to_string)
        .collect();
    tracing::info!(listen = %args.listen, ports = ?args.ports, upstream = %upstream.server(), sandboxes = policies.len(), allowed_private = ?allowed, "egress gateway serving");

    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| e.to_string())?;
    tokio::select! {
        _ = terminate.recv() => Ok(()),
        _ = tokio::signal::ctrl_c() => Ok(()),
        ended = tasks.join_next() => Err(format!("a gateway task ended: {ended:?}")),
    }
}
