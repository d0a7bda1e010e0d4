//! Running and adopting a provider's egress gateway container.
//!
//! Per provider there is one internal network (`internal: true`, and the bridge gets no
//! address on the host — `inhibit_ipv4` — so a sandbox on it reaches neither the outside nor
//! the host; inter-container traffic off, so sandboxes on it reach only the gateway — see
//! `isolation`), one gateway container on it at a fixed address (base+2 of the subnet; the
//! engine hands sandboxes addresses from the upper half only) and also on an outside network,
//! and one named volume holding the policy files. All three carry the
//! [`COMPONENT_LABEL`] and NO `sandboxes.dev/managed-by` label: the sweeper only ever
//! looks at resources with its instance label, so it never takes the gateway for an orphan.
//!
//! Adoption is by name: an existing network, volume and container are used as they are; a
//! container whose configuration hash label differs from what the settings ask for is
//! replaced. A supervisor task re-checks every `checkIntervalSeconds` and starts (or
//! recreates) the gateway when it is not running; it ends when the provider is dropped.
//! The gateway has no restart policy of its own, so it is the operator that brings it back —
//! and until then every sandbox behind it is cut off (fail closed).

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use bollard::Docker;
use bollard::models::{
    ContainerCreateBody, EndpointIpamConfig, EndpointSettings, HostConfig, Ipam, IpamConfig, Mount,
    MountType, NetworkConnectRequest, NetworkCreateRequest, NetworkingConfig, VolumeCreateRequest,
};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, RemoveContainerOptionsBuilder, StartContainerOptions,
};
use sha2::{Digest, Sha256};
use tokio::sync::Mutex;

use super::isolation::{self, Reach};
use super::settings::{EgressGatewaySettings, IMAGE_BINARY, layout};
use crate::provider::docker::{is_not_found, map_err, status_of};
use crate::provider::{ProviderError, ProviderResult};

/// Label on the gateway's container, network and volume: what they are.
pub const COMPONENT_LABEL: &str = "sandboxes.dev/component";
/// Its value.
pub const COMPONENT: &str = "egress-gateway";
/// Label on the gateway container: the hash of its configuration.
const CONFIG_LABEL: &str = "sandboxes.dev/egress-gateway-config";
/// Label: the provider the gateway serves.
const PROVIDER_LABEL: &str = "sandboxes.dev/provider";
/// Where the policy volume is mounted in the gateway.
pub const POLICY_DIR: &str = "/policy";
/// Where a host binary is mounted in the gateway.
const MOUNTED_BINARY: &str = "/opt/sandbox-operator/sandbox-operator";
/// The unprivileged user the gateway runs as.
const GATEWAY_USER: &str = "65532:65532";

/// One provider's egress gateway.
pub(crate) struct Gateway {
    provider: String,
    settings: EgressGatewaySettings,
    /// Serialises ensure passes; holds where sandboxes reach the gateway once known.
    state: Mutex<Option<Reach>>,
    supervised: AtomicBool,
    /// Where the firewall already lets sandboxes reach the gateway (see `isolation`).
    pub(crate) opened: Mutex<Option<Reach>>,
}

impl Gateway {
    pub(crate) fn new(provider: &str, settings: EgressGatewaySettings) -> Self {
        Gateway {
            provider: provider.to_string(),
            settings,
            state: Mutex::new(None),
            supervised: AtomicBool::new(false),
            opened: Mutex::new(None),
        }
    }

    /// The gateway container's name.
    pub(crate) fn container(&self) -> String {
        self.settings
            .name
            .clone()
            .unwrap_or_else(|| format!("sandbox-egress-{}", self.provider))
    }

    /// The internal network sandboxes with an allow-list sit on.
    pub(crate) fn network(&self) -> String {
        format!("{}-net", self.container())
    }

    /// The TCP ports the gateway proxies (it also answers DNS on UDP 53).
    pub(crate) fn ports(&self) -> &[u16] {
        &self.settings.ports
    }

    fn volume(&self) -> String {
        format!("{}-policy", self.container())
    }

    /// The binary the gateway container runs.
    pub(crate) fn binary(&self) -> &'static str {
        if self.settings.host_binary.is_some() {
            MOUNTED_BINARY
        } else {
            IMAGE_BINARY
        }
    }

    fn labels(&self) -> HashMap<String, String> {
        HashMap::from([
            (COMPONENT_LABEL.to_string(), COMPONENT.to_string()),
            (PROVIDER_LABEL.to_string(), self.provider.clone()),
        ])
    }

    /// Makes sure network, volume and a running gateway exist; returns where sandboxes
    /// reach it. Starts the supervisor on first success.
    pub(crate) async fn ensure(self: &Arc<Self>, docker: &Docker) -> ProviderResult<Reach> {
        let reach = self.ensure_once(docker).await?;
        if !self.supervised.swap(true, Ordering::SeqCst) {
            let every = Duration::from_secs(self.settings.check_interval_seconds.max(1));
            tokio::spawn(supervise(Arc::downgrade(self), docker.clone(), every));
        }
        Ok(reach)
    }

    /// One pass of [`ensure`](Self::ensure), without the supervisor.
    async fn ensure_once(&self, docker: &Docker) -> ProviderResult<Reach> {
        let mut state = self.state.lock().await;
        let reach = self.ensure_network(docker).await?;
        self.ensure_volume(docker).await?;
        self.ensure_container(docker, reach.ip).await?;
        *state = Some(reach.clone());
        Ok(reach)
    }

    /// Where sandboxes reach the gateway on the internal network, creating the network when
    /// missing and recreating one with inter-container traffic on (see `isolation`).
    async fn ensure_network(&self, docker: &Docker) -> ProviderResult<Reach> {
        let name = self.network();
        if let Some(found) = isolation::inspect(docker, &name, &self.container()).await? {
            if found.isolated {
                return found.reach(&name);
            }
            self.retire(docker, &found).await?;
        }
        let subnet = match &self.settings.subnet {
            Some(s) => s.clone(),
            None => self.free_subnet(docker, &name).await?,
        };
        let l = layout(&subnet).map_err(ProviderError::invalid)?;
        let request = NetworkCreateRequest {
            name: name.clone(),
            driver: Some("bridge".into()),
            internal: Some(true),
            ipam: Some(Ipam {
                config: Some(vec![IpamConfig {
                    subnet: Some(l.subnet.clone()),
                    ip_range: Some(l.sandboxes.clone()),
                    gateway: Some(l.bridge.to_string()),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            options: Some(isolation::options()),
            labels: Some(self.labels()),
            ..Default::default()
        };
        let created = docker.create_network(request).await;
        // Created by us, or concurrently by someone else (409): use what is there.
        if let Err(e) = created
            && status_of(&e) != Some(409)
        {
            return Err(map_err(&format!("creating the egress network {name}"), e));
        }
        match isolation::inspect(docker, &name, &self.container()).await? {
            Some(found) if found.isolated => found.reach(&name),
            Some(_) => Err(ProviderError::unsupported(format!(
                "network {name} was just created with inter-container traffic on by someone \
                 else; remove it and the operator recreates it isolated"
            ))),
            None => Err(ProviderError::transient(format!(
                "network {name} vanished right after its create"
            ))),
        }
    }

    async fn subnet_of(&self, docker: &Docker, name: &str) -> ProviderResult<Option<String>> {
        match docker.inspect_network(name, None).await {
            Ok(n) => Ok(n
                .ipam
                .and_then(|i| i.config)
                .and_then(|c| c.into_iter().find_map(|c| c.subnet))
                .filter(|s| s.contains('.'))),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(map_err(&format!("inspecting network {name}"), e)),
        }
    }

    /// A subnet the engine considers free: it is asked to create a throw-away network from
    /// its pools, which is read and removed again (a fixed gateway address needs a subnet
    /// given explicitly).
    async fn free_subnet(&self, docker: &Docker, name: &str) -> ProviderResult<String> {
        let probe = format!("{name}-probe-{:08x}", fastrand::u32(..));
        let request = NetworkCreateRequest {
            name: probe.clone(),
            internal: Some(true),
            labels: Some(self.labels()),
            ..Default::default()
        };
        docker
            .create_network(request)
            .await
            .map_err(|e| map_err("asking the engine for a free subnet", e))?;
        let subnet = self.subnet_of(docker, &probe).await;
        let removed = docker.remove_network(&probe).await;
        let subnet = subnet?.ok_or_else(|| {
            ProviderError::transient(format!("the engine gave network {probe} no IPv4 subnet"))
        })?;
        removed.map_err(|e| map_err(&format!("removing network {probe}"), e))?;
        Ok(subnet)
    }

    async fn ensure_volume(&self, docker: &Docker) -> ProviderResult<()> {
        let request = VolumeCreateRequest {
            name: Some(self.volume()),
            labels: Some(self.labels()),
            ..Default::default()
        };
        docker
            .create_volume(request)
            .await
            .map(|_| ())
            .map_err(|e| map_err(&format!("creating volume {}", self.volume()), e))
    }

    /// The container's configuration hash: a change of settings or address replaces it.
    fn config_hash(&self, ip: Ipv4Addr) -> String {
        let material = serde_json::json!({"settings": self.settings, "ip": ip.to_string()});
        let digest = Sha256::digest(material.to_string().as_bytes());
        digest.iter().take(12).map(|b| format!("{b:02x}")).collect()
    }

    async fn ensure_container(&self, docker: &Docker, ip: Ipv4Addr) -> ProviderResult<()> {
        let name = self.container();
        let wanted = self.config_hash(ip);
        match docker.inspect_container(&name, None).await {
            Ok(c) => {
                let hash = c
                    .config
                    .as_ref()
                    .and_then(|c| c.labels.as_ref())
                    .and_then(|l| l.get(CONFIG_LABEL).cloned());
                let running = c.state.as_ref().and_then(|s| s.running).unwrap_or(false);
                if hash.as_deref() != Some(wanted.as_str()) {
                    tracing::info!(gateway = %name, "egress gateway configuration changed: replacing it");
                    let options = RemoveContainerOptionsBuilder::default().force(true).build();
                    docker
                        .remove_container(&name, Some(options))
                        .await
                        .map_err(|e| map_err(&format!("replacing egress gateway {name}"), e))?;
                } else if running {
                    return Ok(());
                } else {
                    tracing::warn!(gateway = %name, "egress gateway not running: starting it");
                    return self.start(docker, &name).await;
                }
            }
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(map_err(&format!("inspecting egress gateway {name}"), e)),
        }
        self.create(docker, &name, ip, wanted).await?;
        self.start(docker, &name).await
    }

    async fn start(&self, docker: &Docker, name: &str) -> ProviderResult<()> {
        match docker
            .start_container(name, None::<StartContainerOptions>)
            .await
        {
            Ok(()) => Ok(()),
            Err(e) if status_of(&e) == Some(304) => Ok(()),
            Err(e) => Err(map_err(&format!("starting egress gateway {name}"), e)),
        }
    }

    /// The gateway's argv: where it listens, where its per-sandbox policies live, and the
    /// settings that shape what it forwards.
    fn command(&self, ip: Ipv4Addr) -> Vec<String> {
        let s = &self.settings;
        let mut cmd = vec![
            "gateway".to_string(),
            "serve".into(),
            "--listen".into(),
            ip.to_string(),
            "--policy-dir".into(),
            POLICY_DIR.into(),
            "--ports".into(),
            s.ports
                .iter()
                .map(u16::to_string)
                .collect::<Vec<_>>()
                .join(","),
        ];
        if let Some(dns) = &s.upstream_dns {
            cmd.extend(["--upstream-dns".to_string(), dns.clone()]);
        }
        if !s.allow_private_cidrs.is_empty() {
            cmd.extend([
                "--allow-private-cidrs".to_string(),
                s.allow_private_cidrs.join(","),
            ]);
        }
        cmd
    }

    /// The policy volume, plus the operator binary from the engine's host (read-only) when
    /// `hostBinary` says to run that instead of the image's.
    fn mounts(&self) -> Vec<Mount> {
        let mut mounts = vec![Mount {
            target: Some(POLICY_DIR.into()),
            source: Some(self.volume()),
            typ: Some(MountType::VOLUME),
            ..Default::default()
        }];
        if let Some(binary) = &self.settings.host_binary {
            mounts.push(Mount {
                target: Some(MOUNTED_BINARY.into()),
                source: Some(binary.clone()),
                typ: Some(MountType::BIND),
                read_only: Some(true),
                ..Default::default()
            });
        }
        mounts
    }

    /// The container body: unprivileged and read-only, at the fixed address `ip` on the
    /// internal network, labelled with the configuration `hash` so a change replaces it.
    fn create_body(&self, ip: Ipv4Addr, hash: String) -> ContainerCreateBody {
        let mut labels = self.labels();
        labels.insert(CONFIG_LABEL.into(), hash);
        ContainerCreateBody {
            image: Some(self.settings.image.clone()),
            entrypoint: Some(vec![self.binary().to_string()]),
            cmd: Some(self.command(ip)),
            user: Some(GATEWAY_USER.into()),
            labels: Some(labels),
            host_config: Some(HostConfig {
                network_mode: Some(self.network()),
                mounts: Some(self.mounts()),
                cap_drop: Some(vec!["ALL".into()]),
                security_opt: Some(vec!["no-new-privileges".into()]),
                readonly_rootfs: Some(true),
                // Low ports without CAP_NET_BIND_SERVICE (a namespaced sysctl).
                sysctls: Some(HashMap::from([(
                    "net.ipv4.ip_unprivileged_port_start".to_string(),
                    "0".to_string(),
                )])),
                ..Default::default()
            }),
            networking_config: Some(NetworkingConfig {
                endpoints_config: Some(HashMap::from([(
                    self.network(),
                    EndpointSettings {
                        ipam_config: Some(EndpointIpamConfig {
                            ipv4_address: Some(ip.to_string()),
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                )])),
            }),
            ..Default::default()
        }
    }

    /// Creates the gateway container and connects it to the outside network it forwards to.
    async fn create(
        &self,
        docker: &Docker,
        name: &str,
        ip: Ipv4Addr,
        hash: String,
    ) -> ProviderResult<()> {
        let options = CreateContainerOptionsBuilder::default().name(name).build();
        match docker
            .create_container(Some(options), self.create_body(ip, hash))
            .await
        {
            Ok(_) => {}
            // Created concurrently: the next pass adopts it.
            Err(e) if status_of(&e) == Some(409) => return Ok(()),
            Err(e) => return Err(map_err(&format!("creating egress gateway {name}"), e)),
        }
        let network = &self.settings.network;
        let connect = NetworkConnectRequest {
            container: name.to_string(),
            endpoint_config: Some(EndpointSettings::default()),
        };
        docker.connect_network(network, connect).await.map_err(|e| {
            map_err(
                &format!("connecting egress gateway {name} to network {network}"),
                e,
            )
        })
    }
}

/// Keeps the gateway running until the provider that owns it is dropped.
async fn supervise(gateway: Weak<Gateway>, docker: Docker, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        let Some(gateway) = gateway.upgrade() else {
            return;
        };
        if let Err(e) = gateway.ensure_once(&docker).await {
            tracing::warn!(gateway = %gateway.container(), error = %e, "egress gateway check failed; retrying");
        }
    }
}
