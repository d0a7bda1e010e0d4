//! Settings of one Kubernetes provider: the `kubernetes:` block of a provider in the
//! operator configuration. Defaults live here and nowhere else.

use serde::{Deserialize, Serialize};
use std::sync::Arc;

use super::network_policy::NetworkPolicySettings;
use super::resources::PodResourceDefaults;
use crate::api::quantity::Quantity;
use crate::provider::{Provider, ProviderKind, ProviderResult};
use crate::validation::{Issues, check_dns_label};

/// The namespace sandbox Pods live in when none is configured.
pub const DEFAULT_NAMESPACE: &str = "sandboxes";
/// The size of a volume's claim when the SandboxVolume gives none.
pub const DEFAULT_VOLUME_SIZE: &str = "1Gi";

/// Which address the provider reports for a sandbox's published ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum PortAddress {
    /// The Service's cluster IP and port: what answers from inside the cluster, where the
    /// operator normally runs (needs kube-proxy or an equivalent on the operator's node).
    #[default]
    ClusterIP,
    /// A node's InternalIP and the Service's node port: what answers from outside the
    /// cluster (needs kube-proxy or an equivalent on that node).
    NodePort,
    /// The Pod's own IP and the sandbox port (the Service still exists and selects the Pod):
    /// what answers from a node of a flat Pod network, such as the test node, which runs no
    /// kube-proxy.
    PodIP,
}

/// Settings of a Kubernetes provider.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KubernetesSettings {
    /// Path of a kubeconfig for the cluster that runs the sandboxes; absent = the
    /// operator's own cluster (in-cluster config, or `KUBECONFIG` out of cluster).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubeconfig: Option<String>,
    /// The one namespace every sandbox Pod, Service and claim of this provider lives in.
    #[serde(default = "default_namespace")]
    pub namespace: String,
    /// RuntimeClass for sandbox Pods (`gvisor`, `kata`); absent = the node's default runtime.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_class_name: Option<String>,
    /// User id the sandbox's processes run as, with `runAsNonRoot` enforced; absent = the
    /// image's own user (many images, the base image included, run as root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_as_user: Option<i64>,
    /// Which address published ports are reported at.
    #[serde(default)]
    pub port_address: PortAddress,
    /// StorageClass of volume claims; absent = the cluster's default StorageClass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
    /// Requested size of a volume claim.
    #[serde(default = "default_volume_size")]
    pub volume_size: String,
    /// TEST MODE for clusters without a volume provisioner: a directory on the node under
    /// which the provider creates one hostPath PersistentVolume per claim (bound to it,
    /// reclaimed with it). Only for single-node test clusters: hostPath data does not follow
    /// a Pod to another node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path_volumes: Option<String>,
    /// Requests and limits of a sandbox Pod whose Sandbox names no cpu, memory or disk.
    #[serde(default)]
    pub default_resources: PodResourceDefaults,
    /// The default-deny NetworkPolicy the provider keeps in `namespace`.
    #[serde(default)]
    pub network_policy: NetworkPolicySettings,
}

fn default_namespace() -> String {
    DEFAULT_NAMESPACE.into()
}
fn default_volume_size() -> String {
    DEFAULT_VOLUME_SIZE.into()
}

impl Default for KubernetesSettings {
    fn default() -> Self {
        KubernetesSettings {
            kubeconfig: None,
            namespace: default_namespace(),
            runtime_class_name: None,
            run_as_user: None,
            port_address: PortAddress::default(),
            storage_class_name: None,
            volume_size: default_volume_size(),
            host_path_volumes: None,
            default_resources: PodResourceDefaults::default(),
            network_policy: NetworkPolicySettings::default(),
        }
    }
}

impl KubernetesSettings {
    /// Reports every setting that cannot work, under `at` (e.g. `providers[1].kubernetes`).
    pub fn validate(&self, at: &str, issues: &mut Issues) {
        if let Err(e) = check_dns_label(&self.namespace) {
            issues.push(format!("{at}.namespace"), format!("{e}; name a namespace"));
        }
        if let Some(class) = &self.runtime_class_name
            && class.trim().is_empty()
        {
            issues.push(
                format!("{at}.runtimeClassName"),
                "is empty; name a RuntimeClass (e.g. gvisor) or remove the setting",
            );
        }
        if let Some(uid) = self.run_as_user
            && uid <= 0
        {
            issues.push(
                format!("{at}.runAsUser"),
                format!("is {uid}; give a non-root user id (> 0) or remove the setting"),
            );
        }
        if let Some(path) = &self.kubeconfig
            && path.trim().is_empty()
        {
            issues.push(
                format!("{at}.kubeconfig"),
                "is empty; give a kubeconfig path or remove the setting",
            );
        }
        if let Err(e) = Quantity(self.volume_size.clone()).to_bytes() {
            issues.push(
                format!("{at}.volumeSize"),
                format!("{e}; give a quantity such as 1Gi"),
            );
        }
        if let Some(dir) = &self.host_path_volumes
            && !dir.starts_with('/')
        {
            issues.push(
                format!("{at}.hostPathVolumes"),
                format!("{dir:?} is not an absolute path; give a directory on the node"),
            );
        }
        self.default_resources
            .validate(&format!("{at}.defaultResources"), issues);
        self.network_policy
            .validate(&format!("{at}.networkPolicy"), issues);
    }
}

/// Registered in [`factory`](crate::provider::factory).
#[async_trait::async_trait]
impl ProviderKind for KubernetesSettings {
    fn without_block() -> Result<Self, &'static str> {
        Ok(Self::default())
    }

    fn check(&self, at: &str, issues: &mut Issues) {
        self.validate(at, issues);
    }

    async fn build(&self, name: &str) -> ProviderResult<Arc<dyn Provider>> {
        Ok(Arc::new(
            super::KubernetesProvider::connect(name, self.clone()).await?,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_bad_settings_name_their_field() {
        let mut issues = Issues::default();
        KubernetesSettings::default().validate("k", &mut issues);
        assert!(issues.is_empty(), "{:?}", issues.into_vec());
        let bad = KubernetesSettings {
            namespace: "Not_A_Namespace".into(),
            run_as_user: Some(0),
            volume_size: "lots".into(),
            host_path_volumes: Some("relative".into()),
            ..Default::default()
        };
        let mut issues = Issues::default();
        bad.validate("k", &mut issues);
        let fields: Vec<String> = issues.iter().map(|(p, _)| p.clone()).collect();
        assert_eq!(
            fields,
            [
                "k.namespace",
                "k.runAsUser",
                "k.volumeSize",
                "k.hostPathVolumes"
            ]
        );
    }

    #[test]
    fn the_block_reads_from_yaml_with_defaults() {
        let s: KubernetesSettings =
            serde_yaml::from_str("runtimeClassName: gvisor\nportAddress: PodIP\n").unwrap();
        assert_eq!(s.namespace, DEFAULT_NAMESPACE);
        assert_eq!(s.runtime_class_name.as_deref(), Some("gvisor"));
        assert_eq!(s.port_address, PortAddress::PodIP);
        let s: KubernetesSettings = serde_yaml::from_str(
            "defaultResources: {cpu: 500m}\nnetworkPolicy: {ingressCidrs: [10.0.0.0/8]}\n",
        )
        .unwrap();
        assert_eq!(s.default_resources.cpu.as_str(), "500m");
        assert_eq!(
            s.default_resources.memory.as_str(),
            "1Gi",
            "the rest defaults"
        );
        assert!(s.network_policy.enabled);
        assert_eq!(s.network_policy.dns_namespace, "kube-system");
    }
}
