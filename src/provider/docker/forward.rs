//! TCP port-forward ([`PortForward`]) on Docker: one TCP connection from the operator to the
//! port on the container's own address on its network (the namespace's bridge, or the egress
//! gateway's network; see `networks`).
//!
//! **What it needs:** the operator must reach the engine's container networks — it runs on
//! the engine's host (as a host process or a Pod with the host's network), or has a route to
//! the engine's bridges. A remote engine (TCP or TLS endpoint) without such a route gets a
//! `Transient` error saying so. Published ports are not used: a sandbox need not publish a
//! port to be forwarded to. A sandbox without a network (created with no egress at all) has
//! no address to reach: that is `Unsupported`, named as such.

use std::net::IpAddr;
use std::time::Duration;

use async_trait::async_trait;
use bollard::models::ContainerInspectResponse;
use tokio::net::TcpStream;

use super::DockerProvider;
use super::core::container_state;
use crate::provider::stream::{PortForward, TunnelStream};
use crate::provider::{ProviderError, ProviderResult, SandboxState};

/// How long a connection to the container's address may take before it is called
/// unreachable (a bridge answers at once, even with a refusal).
const CONNECT_BOUND: Duration = Duration::from_secs(10);

#[async_trait]
impl PortForward for DockerProvider {
    async fn connect(&self, id: &str, port: u16) -> ProviderResult<TunnelStream> {
        let container = self.inspect(id).await?.ok_or_else(|| {
            ProviderError::not_found(format!(
                "sandbox {id} does not exist; nothing to forward to"
            ))
        })?;
        let state = container
            .state
            .as_ref()
            .and_then(|s| s.status)
            .map(container_state);
        if state != Some(SandboxState::Running) {
            return Err(ProviderError::conflict(format!(
                "port-forward to sandbox {id}: it is not running ({state:?}); start it first"
            )));
        }
        let ip = address(&container).ok_or_else(|| {
            ProviderError::unsupported(format!(
                "port-forward to sandbox {id}: it has no network address (it was created \
                 without network access, egress none), so no port of it can be reached"
            ))
        })?;
        dial(id, ip, port).await
    }
}

/// The container's first address on any of its networks.
fn address(container: &ContainerInspectResponse) -> Option<IpAddr> {
    let networks = container.network_settings.as_ref()?.networks.as_ref()?;
    let mut names: Vec<&String> = networks.keys().collect();
    names.sort();
    names.into_iter().find_map(|name| {
        networks[name]
            .ip_address
            .as_deref()
            .filter(|ip| !ip.is_empty())
            .and_then(|ip| ip.parse().ok())
    })
}

async fn dial(id: &str, ip: IpAddr, port: u16) -> ProviderResult<TunnelStream> {
    match tokio::time::timeout(CONNECT_BOUND, TcpStream::connect((ip, port))).await {
        Ok(Ok(stream)) => {
            stream.set_nodelay(true).ok();
            Ok(Box::pin(stream))
        }
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            Err(ProviderError::transient(format!(
                "port-forward to sandbox {id}: nothing listens on port {port} (connection to \
                 {ip}:{port} refused)"
            )))
        }
        Ok(Err(e)) => Err(unreachable(id, ip, port, &e.to_string())),
        Err(_) => Err(unreachable(
            id,
            ip,
            port,
            &format!("no answer within {CONNECT_BOUND:?}"),
        )),
    }
}

fn unreachable(id: &str, ip: IpAddr, port: u16, why: &str) -> ProviderError {
    ProviderError::transient(format!(
        "port-forward to sandbox {id}: cannot reach {ip}:{port} ({why}); Docker port-forward \
         connects from the operator to the container's address on the engine's bridge \
         network, so the operator must run on the engine's host (or have a route to its \
         container networks)"
    ))
}
