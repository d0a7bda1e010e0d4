//! The Kubernetes provider's test world: the real node(s) of `tests/setup/node.sh`
//! registered with the test API server, a namespace per test for the provider's Pods, and
//! cleanup of everything a test made there (the namespace, and the cluster-scoped hostPath
//! PersistentVolumes of the provider's test mode with their directories).

use std::path::PathBuf;
use std::time::Duration;

use sandbox_operator::provider::kubernetes::{KubernetesProvider, KubernetesSettings, PortAddress};

use super::{cache, cluster, node};

/// The real test node(s), started once per test binary (see [`super::node`]).
pub async fn node() {
    node::ensure();
}

/// Where the provider's test-mode hostPath volumes live on the (same-host) nodes.
pub fn volume_dir() -> PathBuf {
    cache().join("k8s-volumes")
}

/// Provider settings for the test node: Pods in `namespace`, the `runc` RuntimeClass the
/// node setup creates, ClusterIP addresses (the host runs kube-proxy), hostPath volumes.
pub fn settings(namespace: &str) -> KubernetesSettings {
    KubernetesSettings {
        kubeconfig: Some(cluster::kubeconfig().to_string_lossy().into_owned()),
        namespace: namespace.to_string(),
        runtime_class_name: Some(node::RUNTIME_CLASS.into()),
        port_address: PortAddress::ClusterIP,
        host_path_volumes: Some(volume_dir().to_string_lossy().into_owned()),
        ..Default::default()
    }
}

/// A provider on the test cluster with its own fresh namespace.
pub async fn provider(name: &str, namespace: &str) -> KubernetesProvider {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    KubernetesProvider::connect(name, settings(namespace))
        .await
        .expect("a Kubernetes provider for the test cluster")
}

/// A provider whose API server is a local port nobody listens on.
pub fn unreachable(namespace: &str) -> KubernetesProvider {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let port = sandbox_doubles::ports::quiet_port();
    let url = format!("https://127.0.0.1:{port}").parse().expect("url");
    let mut config = kube::Config::new(url);
    config.connect_timeout = Some(Duration::from_secs(2));
    config.read_timeout = Some(Duration::from_secs(2));
    let client = kube::Client::try_from(config).expect("a client for a closed port");
    KubernetesProvider::with_client("kubernetes-unreachable", client, settings(namespace))
}

/// Removes a test's namespace (with every Pod, Service, Secret and claim in it), the
/// hostPath PersistentVolumes labelled with `instance`, and their directories. Runs on drop,
/// so a panicking test cleans up too.
pub struct Cleanup {
    /// The provider namespace.
    pub namespace: String,
    /// The operator instance label of everything the test made.
    pub instance: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let selector = format!("sandboxes.dev/managed-by={}", self.instance);
        let _ = cluster::kubectl(
            &[
                "delete",
                "pv",
                "-l",
                &selector,
                "--wait=false",
                "--ignore-not-found",
            ],
            None,
        );
        let _ = cluster::kubectl(
            &[
                "delete",
                "namespace",
                &self.namespace,
                "--wait=false",
                "--ignore-not-found",
            ],
            None,
        );
        let _ = std::fs::remove_dir_all(volume_dir().join(&self.namespace));
    }
}

/// Pods are scheduled, pulled and started by a real kubelet: longer than a container takes.
pub const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// The Kubernetes side of an end-to-end world ([`super::world::World`]): the provider's Pod
/// namespace, and the cleanup of everything made there.
pub struct Kubernetes {
    /// The provider's namespace for this test's Pods.
    pub pods_ns: String,
    _cleanup: Cleanup,
}

impl super::world::Backend for Kubernetes {
    const NAME: &'static str = "k8s";
    const TYPE: &'static str = "kubernetes";
    const TIMEOUT: Duration = READY_TIMEOUT;

    fn settings(&self) -> String {
        let s = settings(&self.pods_ns);
        format!(
            "      kubeconfig: {}\n      namespace: {}\n      runtimeClassName: runc\n      \
             hostPathVolumes: {}\n",
            s.kubeconfig.unwrap_or_default(),
            self.pods_ns,
            s.host_path_volumes.unwrap_or_default(),
        )
    }
}

impl super::world::World<Kubernetes> {
    /// A world on the test node(s): the Sandbox namespace `<prefix>-…` (also the operator
    /// instance) and the provider's Pod namespace `<prefix>-pods-…`.
    pub async fn kubernetes(prefix: &str) -> Self {
        node().await;
        let ns = cluster::namespace(prefix).await;
        let pods_ns = cluster::namespace(&format!("{prefix}-pods")).await;
        let backend = Kubernetes {
            _cleanup: Cleanup {
                namespace: pods_ns.clone(),
                instance: ns.clone(),
            },
            pods_ns,
        };
        Self::around(ns, backend).await
    }

    /// Pods in the provider's namespace.
    pub async fn pods(&self) -> kube::Api<k8s_openapi::api::core::v1::Pod> {
        kube::Api::namespaced(cluster::client().await, &self.pods_ns)
    }

    /// The Pods of this test's operator instance.
    pub async fn our_pods(&self) -> Vec<k8s_openapi::api::core::v1::Pod> {
        let selector = format!("sandboxes.dev/managed-by={}", self.ns);
        self.pods()
            .await
            .list(&kube::api::ListParams::default().labels(&selector))
            .await
            .expect("list pods")
            .items
    }

    /// The provider itself, to exec and move files the way the controller does.
    pub async fn provider(&self) -> KubernetesProvider {
        provider("k8s", &self.pods_ns).await
    }
}
