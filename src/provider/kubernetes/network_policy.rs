//! The default-deny NetworkPolicy of the sandboxes namespace: one object, ensured by the
//! provider before its first create, that selects every sandbox Pod (any Pod carrying the
//! owner-uid label, whichever operator instance made it).
//!
//! - Ingress: no rule, so nothing reaches a sandbox over the Pod network: not another
//!   sandbox (every tenant's sandboxes share this namespace, so this is what keeps the
//!   tenants apart), not a tenant's own Pods elsewhere. Exec, files and logs go through the
//!   API server and the kubelet, not the Pod network. Published ports answer only the peers
//!   the settings list (`networkPolicy.ingressCidrs`).
//! - Egress: the public internet only. Loopback, RFC 1918, CGNAT, link-local (the cloud
//!   metadata endpoint `169.254.169.254` with it), Azure's wire server and IPv6 loopback,
//!   link-local and ULA are excepted, which also covers the cluster's Pod and Service
//!   ranges, the API server and the nodes in every usual setup. DNS is allowed to the
//!   cluster's DNS Pods only: a Pod's resolver is the cluster DNS Service, whose address is
//!   private. The gateway's rule for the same ranges is [`crate::gateway::destination`].
//!
//! Enforcement is the CNI's: a plugin without NetworkPolicy support (plain bridge, flannel)
//! stores the object and enforces nothing.

use std::collections::BTreeMap;

use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer,
    NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Api;
use kube::api::PostParams;
use serde::{Deserialize, Serialize};

use super::KubernetesProvider;
use super::errors::{absent_ok, from_kube};
use crate::provider::ProviderResult;
use crate::provider::labels::OWNER_UID;
use crate::validation::Issues;

/// The policy's name in the sandboxes namespace.
pub const NAME: &str = "sandboxes-default-deny";

/// IPv4 destinations no sandbox reaches.
pub const DENIED_V4: [&str; 8] = [
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "168.63.129.16/32",
];
/// IPv6 destinations no sandbox reaches.
pub const DENIED_V6: [&str; 3] = ["::1/128", "fe80::/10", "fc00::/7"];

/// The `networkPolicy` block of the provider's settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct NetworkPolicySettings {
    /// Keep the default-deny policy in the namespace; off only where the cluster's own
    /// policies already cover sandbox Pods.
    pub enabled: bool,
    /// The namespace of the cluster's DNS Pods.
    pub dns_namespace: String,
    /// The labels of the cluster's DNS Pods.
    pub dns_pod_labels: BTreeMap<String, String>,
    /// Who may reach sandbox Pods (published ports): CIDRs, none by default.
    pub ingress_cidrs: Vec<String>,
}

impl Default for NetworkPolicySettings {
    fn default() -> Self {
        NetworkPolicySettings {
            enabled: true,
            dns_namespace: "kube-system".into(),
            dns_pod_labels: BTreeMap::from([("k8s-app".into(), "kube-dns".into())]),
            ingress_cidrs: Vec::new(),
        }
    }
}

impl NetworkPolicySettings {
    /// Reports an ingress CIDR that does not parse, under `at`.
    pub fn validate(&self, at: &str, issues: &mut Issues) {
        for (i, cidr) in self.ingress_cidrs.iter().enumerate() {
            if !cidr.contains('/') || crate::provider::docker::firewall::parse_cidr(cidr).is_none()
            {
                issues.push(
                    format!("{at}.ingressCidrs[{i}]"),
                    format!("{cidr:?} is not a CIDR; write e.g. 10.0.0.0/24"),
                );
            }
        }
    }
}

fn block(cidr: &str, except: &[&str]) -> NetworkPolicyPeer {
    NetworkPolicyPeer {
        ip_block: Some(IPBlock {
            cidr: cidr.into(),
            except: (!except.is_empty()).then(|| except.iter().map(|c| c.to_string()).collect()),
        }),
        ..Default::default()
    }
}

fn dns_rule(settings: &NetworkPolicySettings) -> NetworkPolicyEgressRule {
    let port = |protocol: &str| NetworkPolicyPort {
        protocol: Some(protocol.into()),
        port: Some(IntOrString::Int(53)),
        end_port: None,
    };
    let namespace = BTreeMap::from([(
        "kubernetes.io/metadata.name".to_string(),
        settings.dns_namespace.clone(),
    )]);
    NetworkPolicyEgressRule {
        to: Some(vec![NetworkPolicyPeer {
            namespace_selector: Some(LabelSelector {
                match_labels: Some(namespace),
                match_expressions: None,
            }),
            pod_selector: Some(LabelSelector {
                match_labels: Some(settings.dns_pod_labels.clone()),
                match_expressions: None,
            }),
            ip_block: None,
        }]),
        ports: Some(vec![port("UDP"), port("TCP")]),
    }
}

/// The policy, as the provider keeps it in `namespace`.
pub fn build(namespace: &str, settings: &NetworkPolicySettings) -> NetworkPolicy {
    let ingress = (!settings.ingress_cidrs.is_empty()).then(|| {
        vec![NetworkPolicyIngressRule {
            from: Some(
                settings
                    .ingress_cidrs
                    .iter()
                    .map(|c| block(c, &[]))
                    .collect(),
            ),
            ports: None,
        }]
    });
    NetworkPolicy {
        metadata: ObjectMeta {
            name: Some(NAME.into()),
            namespace: Some(namespace.into()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/managed-by".to_string(),
                "sandbox-operator".to_string(),
            )])),
            ..Default::default()
        },
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: None,
                match_expressions: Some(vec![LabelSelectorRequirement {
                    key: OWNER_UID.into(),
                    operator: "Exists".into(),
                    values: None,
                }]),
            }),
            policy_types: Some(vec!["Ingress".into(), "Egress".into()]),
            ingress,
            egress: Some(vec![
                NetworkPolicyEgressRule {
                    to: Some(vec![
                        block("0.0.0.0/0", &DENIED_V4),
                        block("::/0", &DENIED_V6),
                    ]),
                    ports: None,
                },
                dns_rule(settings),
            ]),
        }),
    }
}

impl KubernetesProvider {
    /// Creates the policy when it is absent and puts its spec back when it differs. Runs
    /// once per provider (the first create; a failure fails that create and is tried again
    /// by the next): a sandbox is never started without it.
    pub(super) async fn ensure_network_policy(&self) -> ProviderResult<()> {
        if !self.settings.network_policy.enabled {
            return Ok(());
        }
        self.policy_ensured
            .get_or_try_init(|| async {
                let api: Api<NetworkPolicy> =
                    Api::namespaced(self.client.clone(), &self.settings.namespace);
                let want = build(&self.settings.namespace, &self.settings.network_policy);
                let what = format!("ensuring NetworkPolicy {NAME}");
                match absent_ok(api.get(NAME).await, &what)? {
                    None => {
                        let created = api.create(&PostParams::default(), &want).await;
                        match created {
                            Ok(_) => Ok(()),
                            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
                            Err(e) => Err(from_kube(e, &what)),
                        }
                    }
                    Some(have) if have.spec == want.spec => Ok(()),
                    Some(have) => {
                        let mut next = want;
                        next.metadata.resource_version = have.metadata.resource_version;
                        api.replace(NAME, &PostParams::default(), &next)
                            .await
                            .map(|_| ())
                            .map_err(|e| from_kube(e, &what))
                    }
                }
            })
            .await
            .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::destination::classify;

    #[test]
    fn every_denied_range_is_one_the_gateway_refuses_too() {
        for cidr in DENIED_V4.iter().chain(DENIED_V6.iter()) {
            let (base, _) = cidr.split_once('/').unwrap();
            let ip: std::net::IpAddr = base.parse().unwrap();
            // 168.63.129.16 is public but only answers inside Azure (a metadata endpoint).
            assert!(classify(ip).is_some(), "{cidr} is dialled by the gateway");
        }
        assert!(classify("169.254.169.254".parse().unwrap()).is_some());
    }

    #[test]
    fn the_policy_denies_ingress_and_private_egress() {
        let p = build("sandboxes", &NetworkPolicySettings::default());
        let spec = p.spec.unwrap();
        assert_eq!(spec.ingress, None, "no ingress rule: everything denied");
        let egress = spec.egress.unwrap();
        let except = egress[0].to.as_ref().unwrap()[0]
            .ip_block
            .as_ref()
            .unwrap()
            .except
            .clone()
            .unwrap();
        assert!(except.contains(&"169.254.0.0/16".to_string()));
        assert_eq!(egress[1].ports.as_ref().unwrap().len(), 2, "DNS only");
        let mut issues = Issues::default();
        NetworkPolicySettings {
            ingress_cidrs: vec!["nope".into()],
            ..Default::default()
        }
        .validate("n", &mut issues);
        assert_eq!(issues.iter().count(), 1);
    }
}
