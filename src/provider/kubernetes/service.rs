//! A sandbox's published ports: one Service per sandbox (named like its Pod, selecting it by
//! its owner-uid label), and the address the provider reports, per `portAddress`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::PostParams;

use super::errors::{absent_ok, from_kube};
use super::pod::CONTAINER;
use super::{KubernetesProvider, PortAddress};
use crate::provider::labels::{KIND, MANAGED_BY, OWNER, OWNER_UID};
use crate::provider::{PortMapping, ProviderError, ProviderResult};

const OWNER_LABELS: [&str; 4] = [MANAGED_BY, OWNER_UID, OWNER, KIND];

/// The Service of a sandbox Pod: its name, its owner labels, its declared ports, selecting
/// it by its owner-uid label. Built from the Pod, so a Service lost since create is rebuilt
/// on the next start.
fn build(pod: &Pod, node_port: bool) -> Option<Service> {
    let labels = pod.metadata.labels.as_ref()?;
    let owner: BTreeMap<String, String> = labels
        .iter()
        .filter(|(k, _)| OWNER_LABELS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let selector = BTreeMap::from([(OWNER_UID.to_string(), labels.get(OWNER_UID)?.clone())]);
    let ports = container_ports(pod);
    if ports.is_empty() {
        return None;
    }
    Some(Service {
        metadata: ObjectMeta {
            name: pod.metadata.name.clone(),
            labels: Some(owner),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            selector: Some(selector),
            type_: Some(if node_port { "NodePort" } else { "ClusterIP" }.into()),
            ports: Some(
                ports
                    .iter()
                    .map(|(port, protocol)| ServicePort {
                        name: Some(format!("{protocol}-{port}")),
                        port: i32::from(*port),
                        protocol: Some(protocol.to_ascii_uppercase()),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }),
        status: None,
    })
}

/// The container's declared ports as (port, protocol).
fn container_ports(pod: &Pod) -> Vec<(u16, String)> {
    pod.spec
        .as_ref()
        .and_then(|s| s.containers.iter().find(|c| c.name == CONTAINER))
        .and_then(|c| c.ports.as_ref())
        .map(|ports| {
            ports
                .iter()
                .filter_map(|p| {
                    let port = u16::try_from(p.container_port).ok()?;
                    let protocol = p.protocol.as_deref().unwrap_or("TCP").to_ascii_lowercase();
                    Some((port, protocol))
                })
                .collect()
        })
        .unwrap_or_default()
}

impl KubernetesProvider {
    /// Creates the Service of a Pod that declares ports; one already there for the same
    /// owner is kept (a retried create, a start), one of another owner is a `Conflict`.
    pub(super) async fn ensure_service(&self, pod: &Pod) -> ProviderResult<()> {
        let node_port = self.settings.port_address == PortAddress::NodePort;
        let Some(service) = build(pod, node_port) else {
            return Ok(());
        };
        let name = service.metadata.name.clone().unwrap_or_default();
        let uid = pod.metadata.labels.as_ref().and_then(|l| l.get(OWNER_UID));
        let what = format!("creating Service {name}");
        match self
            .services()
            .create(&PostParams::default(), &service)
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => {
                let existing = self
                    .services()
                    .get(&name)
                    .await
                    .map_err(|e| from_kube(e, &what))?;
                if super::owner_uid(&existing.metadata) == uid.map(String::as_str) {
                    Ok(())
                } else {
                    Err(ProviderError::conflict(format!(
                        "Service {name} in namespace {} belongs to someone else; remove it",
                        self.settings.namespace
                    )))
                }
            }
            Err(e) => Err(from_kube(e, &what)),
        }
    }

    /// Where each declared port of a running Pod answers; none while its Service is
    /// missing (the next start rebuilds it).
    pub(super) async fn port_mappings(&self, pod: &Pod) -> ProviderResult<Vec<PortMapping>> {
        let ports = container_ports(pod);
        if ports.is_empty() {
            return Ok(Vec::new());
        }
        let id = pod.metadata.name.clone().unwrap_or_default();
        let status = pod.status.as_ref();
        let mapping = |port: u16, protocol: &str, host: &str, outside: u16| PortMapping {
            sandbox_port: port,
            protocol: protocol.to_string(),
            host: host.to_string(),
            port: outside,
        };
        if self.settings.port_address == PortAddress::PodIP {
            let Some(ip) = status.and_then(|s| s.pod_ip.clone()) else {
                return Ok(Vec::new());
            };
            return Ok(ports
                .iter()
                .map(|(p, proto)| mapping(*p, proto, &ip, *p))
                .collect());
        }
        let what = format!("reading Service {id}");
        let Some(service) = absent_ok(self.services().get(&id).await, &what)? else {
            return Ok(Vec::new());
        };
        let spec = service.spec.unwrap_or_default();
        let (host, node_port) = match self.settings.port_address {
            PortAddress::NodePort => (status.and_then(|s| s.host_ip.clone()), true),
            _ => (spec.cluster_ip.clone().filter(|ip| ip != "None"), false),
        };
        let Some(host) = host else {
            return Ok(Vec::new());
        };
        let service_ports = spec.ports.unwrap_or_default();
        Ok(ports
            .iter()
            .filter_map(|(p, proto)| {
                let sp = service_ports.iter().find(|sp| sp.port == i32::from(*p))?;
                let outside = if node_port {
                    u16::try_from(sp.node_port?).ok()?
                } else {
                    *p
                };
                Some(mapping(*p, proto, &host, outside))
            })
            .collect())
    }
}
