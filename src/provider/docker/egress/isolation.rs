//! The gateway's internal network keeps sandboxes apart: inter-container traffic is off.
//!
//! Why: every allow-listed sandbox of every namespace sits on this one network, so with
//! inter-container traffic on, a sandbox of one tenant could connect to any port of another
//! tenant's sandbox. With it off the engine drops every packet between two containers on the
//! bridge — the gateway's included — so the host firewall lets exactly one path through:
//! sandbox to the gateway's DNS and proxy ports on this bridge, and the gateway's replies
//! (`firewall::gateway_rules`, installed by the provider through the firewall helper when the
//! gateway is first ensured). One network per provider and one rule set keep the engine calls
//! where they were; per-namespace gateway networks would attach the gateway to every one.
//!
//! A network left by an older version with inter-container traffic on is recreated when the
//! gateway is its only user (the gateway container is replaced with it); while a sandbox is
//! still attached, sandboxes behind the gateway are refused with an error naming the fix,
//! never placed on it.

use std::collections::HashMap;
use std::net::Ipv4Addr;

use bollard::Docker;
use bollard::query_parameters::RemoveContainerOptionsBuilder;

use super::gateway::Gateway;
use super::settings::layout;
use crate::provider::docker::networks::ICC_OPTION;
use crate::provider::docker::{is_not_found, map_err};
use crate::provider::{ProviderError, ProviderResult};

/// The engine's bridge option that names the Linux bridge.
const BRIDGE_NAME_OPTION: &str = "com.docker.network.bridge.name";

/// Where sandboxes reach the gateway: its address and its network's Linux bridge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reach {
    /// The gateway's address on its internal network.
    pub(crate) ip: Ipv4Addr,
    /// The Linux bridge of that network (what the firewall rules match).
    pub(crate) bridge: String,
}

/// What an existing gateway network is.
pub(super) struct Found {
    subnet: Option<String>,
    bridge: String,
    /// Inter-container traffic is off.
    pub(super) isolated: bool,
    /// Containers attached other than the gateway.
    others: Vec<String>,
}

impl Found {
    /// Where sandboxes reach the gateway on this network.
    pub(super) fn reach(&self, name: &str) -> ProviderResult<Reach> {
        let subnet = self
            .subnet
            .as_deref()
            .ok_or_else(|| ProviderError::invalid(format!("network {name} has no IPv4 subnet")))?;
        let layout =
            layout(subnet).map_err(|e| ProviderError::invalid(format!("network {name}: {e}")))?;
        Ok(Reach {
            ip: layout.gateway,
            bridge: self.bridge.clone(),
        })
    }
}

/// The network `name`, if it exists; `gateway` is the gateway container's name.
pub(super) async fn inspect(
    docker: &Docker,
    name: &str,
    gateway: &str,
) -> ProviderResult<Option<Found>> {
    let network = match docker.inspect_network(name, None).await {
        Ok(n) => n,
        Err(e) if is_not_found(&e) => return Ok(None),
        Err(e) => return Err(map_err(&format!("inspecting network {name}"), e)),
    };
    let options = network.options.unwrap_or_default();
    let id = network.id.unwrap_or_default();
    let bridge = match options.get(BRIDGE_NAME_OPTION) {
        Some(bridge) => bridge.clone(),
        // The engine's own naming of a user-defined bridge.
        None => format!("br-{}", id.get(..12).unwrap_or(&id)),
    };
    let others = network
        .containers
        .unwrap_or_default()
        .into_values()
        .filter_map(|c| c.name)
        .filter(|n| n != gateway)
        .collect();
    Ok(Some(Found {
        subnet: network
            .ipam
            .and_then(|i| i.config)
            .and_then(|c| c.into_iter().find_map(|c| c.subnet))
            .filter(|s| s.contains('.')),
        bridge,
        isolated: options.get(ICC_OPTION).map(String::as_str) == Some("false"),
        others,
    }))
}

/// The options of a new gateway network: no host address on the bridge, no
/// inter-container traffic.
pub(super) fn options() -> HashMap<String, String> {
    HashMap::from([
        (
            "com.docker.network.bridge.inhibit_ipv4".to_string(),
            "true".to_string(),
        ),
        (ICC_OPTION.to_string(), "false".to_string()),
    ])
}

impl Gateway {
    /// Removes a gateway network with inter-container traffic on, and the gateway on it, so
    /// that it is recreated isolated; refuses while a sandbox is attached.
    pub(super) async fn retire(&self, docker: &Docker, found: &Found) -> ProviderResult<()> {
        let name = self.network();
        if !found.others.is_empty() {
            return Err(ProviderError::unsupported(format!(
                "the egress gateway's network {name} was created with inter-container traffic \
                 on, so sandboxes on it could reach each other, and {} still use it; delete \
                 those sandboxes (or `docker network disconnect` them) and the operator \
                 recreates the network isolated",
                found.others.join(", ")
            )));
        }
        tracing::info!(network = %name, "recreating the egress network with inter-container traffic off");
        let container = self.container();
        let options = RemoveContainerOptionsBuilder::default().force(true).build();
        match docker.remove_container(&container, Some(options)).await {
            Ok(()) => {}
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(map_err(&format!("removing egress gateway {container}"), e)),
        }
        match docker.remove_network(&name).await {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(map_err(&format!("removing network {name}"), e)),
        }
    }
}
