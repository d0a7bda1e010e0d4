//! Per-namespace networks: the wall between tenants on one engine.
//!
//! A sandbox with unrestricted egress sits on the bridge network of its namespace (one per
//! operator instance, provider and namespace), never on the engine's shared default bridge.
//! Each such network has inter-container traffic off (`enable_icc=false`): the engine drops
//! every packet between two containers on it, so no sandbox reaches another one — of another
//! namespace (a different bridge, which the engine isolates from every other network, and the
//! host firewall's wall too, whatever becomes of the engine's rules: `firewall::wall_rules`)
//! nor of its own. Same-namespace traffic is off too because a namespace is a tenant, not a
//! trust zone: one team's sandboxes each run different unreviewed code, and a sandbox that
//! needs to talk to another does so through its published ports, which the platform team
//! controls (`publishHost`). It is also the one rule that needs no exception list to audit.
//!
//! Names are deterministic — `sbx-<namespace>-<hash>` with the hash of instance, provider and
//! namespace — and so is the Linux bridge (`sbxns-<hash>`, the interface the host firewall
//! matches, see `firewall`). The bridge name is unique on the host, so two creators racing
//! for the same network cannot make two of them: the loser's create fails and it adopts the
//! winner's. The networks carry the operator's instance label and a component label, so the
//! sweeper knows them; an existing network with inter-container traffic on is refused, never
//! used.
//!
//! Engine cost: a network is ensured once per provider and namespace (remembered in memory);
//! a create whose network vanished meanwhile (the sweeper reclaimed it) ensures it again and
//! retries once. Empty networks are reclaimed during the sweeper's inventory pass only from a
//! complete listing of every container, and the engine itself refuses to remove a network
//! that still has an endpoint — a create racing the removal recreates it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use bollard::models::{ContainerCreateBody, ContainerSummary, NetworkCreateRequest};
use bollard::query_parameters::ListNetworksOptionsBuilder;
use sha2::{Digest, Sha256};
use tokio::sync::Mutex;

use super::egress::COMPONENT_LABEL;
use super::{DockerProvider, firewall, is_not_found, map_err, status_of};
use crate::provider::labels::{MANAGED_BY, Owner};
use crate::provider::{ProviderError, ProviderResult};

/// [`COMPONENT_LABEL`] value of a namespace network.
pub const COMPONENT: &str = "namespace-network";
/// Label on a namespace network: the namespace it serves.
pub const NAMESPACE_LABEL: &str = "sandboxes.dev/namespace";
/// The engine's bridge option that switches inter-container traffic.
pub const ICC_OPTION: &str = "com.docker.network.bridge.enable_icc";
/// The engine's bridge option that names the Linux bridge.
const BRIDGE_NAME_OPTION: &str = "com.docker.network.bridge.name";

/// Seconds a namespace network lives at least: one just ensured for a create whose container
/// is not listed yet is never taken for empty.
pub const MIN_AGE_SECS: i64 = 30;

/// The networks this provider has ensured (shared by clones).
#[derive(Default)]
pub(crate) struct Known(Mutex<HashSet<String>>);

/// One namespace's network: its name, bridge and labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceNetwork {
    /// The engine's network name.
    pub name: String,
    /// The Linux bridge (at most 15 characters).
    pub bridge: String,
    labels: HashMap<String, String>,
}

/// The network of `owner`'s namespace on provider `provider`.
pub fn for_owner(provider: &str, owner: &Owner) -> NamespaceNetwork {
    let digest = Sha256::digest(format!(
        "{}\0{provider}\0{}",
        owner.instance, owner.namespace
    ));
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    NamespaceNetwork {
        name: format!("sbx-{}-{}", owner.namespace, &hex[..8]),
        bridge: format!("{}{}", firewall::SANDBOX_BRIDGE_PREFIX, &hex[..9]),
        labels: HashMap::from([
            (MANAGED_BY.to_string(), owner.instance.clone()),
            (COMPONENT_LABEL.to_string(), COMPONENT.to_string()),
            (NAMESPACE_LABEL.to_string(), owner.namespace.clone()),
        ]),
    }
}

impl NamespaceNetwork {
    fn request(&self) -> NetworkCreateRequest {
        NetworkCreateRequest {
            name: self.name.clone(),
            driver: Some("bridge".into()),
            options: Some(HashMap::from([
                (ICC_OPTION.to_string(), "false".to_string()),
                (BRIDGE_NAME_OPTION.to_string(), self.bridge.clone()),
            ])),
            labels: Some(self.labels.clone()),
            ..Default::default()
        }
    }
}

/// How often a network create is tried when the engine failed to program its own iptables
/// rules for it. The engine rewrites its jump rules on every network create and removal, and
/// concurrent ones race there (seen under the test suite: `unable to remove jump to
/// DOCKER-ISOLATION-STAGE-1 rule in FORWARD chain ... RULE_DELETE failed`); the network is
/// not created, and the next try finds the chains settled.
const CREATE_ATTEMPTS: u32 = 3;

/// Whether a network create failed in the engine's own iptables programming.
fn rules_raced(e: &bollard::errors::Error) -> bool {
    matches!(e, bollard::errors::Error::DockerResponseServerError { status_code: 500, message }
        if message.contains("iptables"))
}

impl DockerProvider {
    /// Puts a sandbox about to be created on its namespace's network, ensuring the network.
    pub(crate) async fn place_in_namespace(
        &self,
        body: &mut ContainerCreateBody,
        owner: &Owner,
    ) -> ProviderResult<NamespaceNetwork> {
        let network = for_owner(&self.name, owner);
        self.ensure_network(&network).await?;
        let host = body.host_config.get_or_insert_with(Default::default);
        host.network_mode = Some(network.name.clone());
        Ok(network)
    }

    /// Makes sure the network exists with inter-container traffic off (once per provider).
    pub(crate) async fn ensure_network(&self, network: &NamespaceNetwork) -> ProviderResult<()> {
        let mut known = self.networks.0.lock().await;
        if known.contains(&network.name) {
            return Ok(());
        }
        let docker = self.engine().await?;
        let mut attempt = 1;
        let created = loop {
            let created = docker.create_network(network.request()).await;
            match &created {
                Err(e) if attempt < CREATE_ATTEMPTS && rules_raced(e) => attempt += 1,
                _ => break created,
            }
            tokio::time::sleep(Duration::from_millis(50 * u64::from(attempt))).await;
        };
        if let Err(e) = created {
            // Taken (by name or bridge): adopt it if it is one of ours with ICC off.
            if !self.network_isolated(&network.name).await? {
                return Err(map_err(&format!("creating network {}", network.name), e));
            }
        }
        known.insert(network.name.clone());
        Ok(())
    }

    /// Ensures again the namespace network a container was created on (its start found the
    /// network reclaimed: a container that never ran holds no endpoint the engine protects).
    pub(crate) async fn restore_network_of(&self, id: &str) -> ProviderResult<()> {
        let container = self
            .inspect(id)
            .await?
            .ok_or_else(|| ProviderError::not_found(format!("sandbox {id} does not exist")))?;
        let labels: BTreeMap<String, String> = container
            .config
            .and_then(|c| c.labels)
            .unwrap_or_default()
            .into_iter()
            .collect();
        let owner = Owner::from_labels(&labels)
            .ok_or_else(|| ProviderError::invalid(format!("sandbox {id} has no owner labels")))?;
        let network = for_owner(&self.name, &owner);
        self.forget_network(&network.name).await;
        self.ensure_network(&network).await
    }

    /// Forgets that a network exists (a create found it gone).
    pub(crate) async fn forget_network(&self, name: &str) {
        self.networks.0.lock().await.remove(name);
    }

    /// Whether the network exists with inter-container traffic off; an existing network with
    /// it on is an error naming the fix.
    async fn network_isolated(&self, name: &str) -> ProviderResult<bool> {
        let docker = self.engine().await?;
        let inspected = match docker.inspect_network(name, None).await {
            Ok(n) => n,
            Err(e) if is_not_found(&e) => return Ok(false),
            Err(e) => return Err(map_err(&format!("inspecting network {name}"), e)),
        };
        let icc = inspected.options.as_ref().and_then(|o| o.get(ICC_OPTION));
        if icc.map(String::as_str) != Some("false") {
            return Err(ProviderError::invalid(format!(
                "network {name} exists with inter-container traffic on, so sandboxes on it could \
                 reach each other; remove it (`docker network rm {name}`) and the operator \
                 recreates it isolated"
            )));
        }
        Ok(true)
    }

    /// Removes this instance's namespace networks older than [`MIN_AGE_SECS`] that no
    /// container in `containers` (a complete listing, every state) is attached to or asks
    /// for. The engine refuses a network with an endpoint, which is left for the next pass;
    /// a container created into a network removed meanwhile restores it at its start.
    pub(crate) async fn prune_networks(
        &self,
        labels: &BTreeMap<String, String>,
        containers: &[ContainerSummary],
    ) -> ProviderResult<()> {
        let Some(instance) = labels.get(MANAGED_BY) else {
            return Ok(());
        };
        let docker = self.engine().await?;
        let filters = HashMap::from([(
            "label".to_string(),
            vec![
                format!("{MANAGED_BY}={instance}"),
                format!("{COMPONENT_LABEL}={COMPONENT}"),
            ],
        )]);
        let options = ListNetworksOptionsBuilder::default()
            .filters(&filters)
            .build();
        let listed = docker
            .list_networks(Some(options))
            .await
            .map_err(|e| map_err("listing namespace networks", e))?;
        let used = attached(containers);
        let settled = |created: Option<&str>| {
            created
                .and_then(super::core::parse_time)
                .is_some_and(|t| chrono::Utc::now() - t >= chrono::Duration::seconds(MIN_AGE_SECS))
        };
        for network in listed {
            let Some(name) = network.name else { continue };
            if used.contains(name.as_str()) || !settled(network.created.as_deref()) {
                continue;
            }
            self.forget_network(&name).await;
            match docker.remove_network(&name).await {
                Ok(()) => tracing::info!(network = %name, "removed an empty namespace network"),
                Err(e) if is_not_found(&e) => {}
                Err(e) if matches!(status_of(&e), Some(403 | 409)) => {}
                Err(e) => return Err(map_err(&format!("removing network {name}"), e)),
            }
        }
        Ok(())
    }
}

/// Whether an engine error says a container's network does not exist.
pub(crate) fn is_network_gone(err: &bollard::errors::Error) -> bool {
    match err {
        bollard::errors::Error::DockerResponseServerError {
            status_code: 404,
            message,
        } => message.contains("network") && message.contains("not found"),
        _ => false,
    }
}

/// The error for a start the engine refused because the sandbox's network has no free
/// address, naming the cause and the fix; `None` for any other error. Each namespace's
/// sandboxes share one network, sized by dockerd's `default-address-pools` (`size` 24 holds
/// 253), so a namespace holds at most that many running sandboxes. Transient: an address
/// frees up when one of them stops.
pub(crate) fn network_full(id: &str, err: &bollard::errors::Error) -> Option<ProviderError> {
    let bollard::errors::Error::DockerResponseServerError { message, .. } = err else {
        return None;
    };
    message.contains("no available IPv4 addresses").then(|| {
        ProviderError::transient(format!(
            "starting sandbox {id}: its namespace's network has no free address ({message}); \
             every sandbox of a namespace shares one network of dockerd's address-pool size: \
             stop or delete some of them, or give dockerd larger pools \
             (`default-address-pools` `size` 22 holds 1,021 per network)"
        ))
    })
}

/// Every network a container of the listing is attached to or asks for.
fn attached(containers: &[ContainerSummary]) -> HashSet<&str> {
    let mut used = HashSet::new();
    for c in containers {
        if let Some(mode) = c
            .host_config
            .as_ref()
            .and_then(|h| h.network_mode.as_deref())
        {
            used.insert(mode);
        }
        let networks = c
            .network_settings
            .as_ref()
            .and_then(|n| n.networks.as_ref());
        used.extend(
            networks
                .into_iter()
                .flat_map(|n| n.keys().map(String::as_str)),
        );
    }
    used
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_engines_own_rule_programming_is_tried_again() {
        let server =
            |status_code, message: &str| bollard::errors::Error::DockerResponseServerError {
                status_code,
                message: message.to_string(),
            };
        let raced = "unable to remove jump to DOCKER-ISOLATION-STAGE-1 rule in FORWARD chain:  \
            (iptables failed: iptables --wait -D FORWARD -j DOCKER-ISOLATION-STAGE-1: \
            RULE_DELETE failed (No such file or directory): rule in chain FORWARD\n (exit status 4))";
        assert!(rules_raced(&server(500, raced)));
        assert!(!rules_raced(&server(
            409,
            "network with name x already exists"
        )));
        assert!(!rules_raced(&server(
            500,
            "could not find an available address pool"
        )));
    }

    #[test]
    fn a_full_network_names_the_pool_size_and_other_errors_pass() {
        let full = bollard::errors::Error::DockerResponseServerError {
            status_code: 500,
            message: "no available IPv4 addresses on this network's address pools: n (x)".into(),
        };
        let err = network_full("s", &full).expect("recognised");
        assert!(
            err.message().contains("default-address-pools"),
            "{}",
            err.message()
        );
        let other = bollard::errors::Error::DockerResponseServerError {
            status_code: 500,
            message: "something else".into(),
        };
        assert!(network_full("s", &other).is_none());
    }

    fn owner(instance: &str, namespace: &str) -> Owner {
        Owner {
            instance: instance.into(),
            kind: "Sandbox".into(),
            namespace: namespace.into(),
            name: "s".into(),
            uid: "u".into(),
        }
    }

    #[test]
    fn names_are_deterministic_per_instance_provider_and_namespace() {
        let a = for_owner("docker", &owner("op", "team-a"));
        assert_eq!(a, for_owner("docker", &owner("op", "team-a")));
        assert!(a.name.starts_with("sbx-team-a-"), "{}", a.name);
        assert!(a.bridge.starts_with("sbxns-") && a.bridge.len() == 15);
        for other in [
            for_owner("docker", &owner("op", "team-b")),
            for_owner("docker2", &owner("op", "team-a")),
            for_owner("docker", &owner("op2", "team-a")),
        ] {
            assert_ne!(a.name, other.name);
            assert_ne!(a.bridge, other.bridge);
        }
        let request = a.request();
        assert_eq!(request.options.unwrap()[ICC_OPTION], "false");
        assert_eq!(request.labels.unwrap()[MANAGED_BY], "op");
    }
}
