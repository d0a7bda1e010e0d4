//! The Kubernetes provider: each sandbox is a Pod on the cluster's own nodes, placed by its
//! scheduler and isolated by a RuntimeClass of the provider's settings.
//!
//! Every Pod, Service, pull Secret and volume claim of a provider lives in ONE namespace of
//! its settings, not in the Sandbox's namespace: sandboxes run untrusted code, and a namespace
//! of their own keeps them away from the tenants' Secrets, service accounts and workloads, lets
//! the operator hold a namespaced Role instead of cluster-wide Pod and exec rights, carries
//! one Pod Security and NetworkPolicy setup, and works when the provider's cluster is not the
//! operator's (a kubeconfig of another cluster). The id is the Pod's name, which is our
//! external name (`sbx-<uid>`).
//!
//! Seam operations and the API calls they make:
//!
//! | operation | API calls |
//! |---|---|
//! | create | GET/POST the NetworkPolicy (once per provider), POST env Secret (only with env from Secrets), POST Pod (gated: not started), PATCH the env Secret's owner, POST pull Secret (only with a matching pull credential), POST Service (only with ports) |
//! | start / wake | GET Pod; PATCH it to drop the gate (and the env Secret's owner), or (exited) DELETE + POST its successor |
//! | stop / sleep | GET Pod; DELETE it + POST a gated successor marked stopped (the env Secret's owner follows) |
//! | describe | GET Pod (+ GET Service, or the Pod IP, when it publishes ports) |
//! | find | LIST Pods by label selector, every page (`continue`) |
//! | destroy | DELETE Pod, Service, pull and env Secrets (absent = success) |
//! | exec, files, bulk files | GET Pod; the Pod `exec` subresource over WebSocket |
//! | volumes | PersistentVolumeClaims; attachment from the Pods that mount them |
//!
//! What it cannot do is absent, never faked: a Pod cannot be paused, so there is no
//! hibernation (`sleep` is a stop: processes end); no native templates (the controller's
//! templates service captures and restores over exec); no in-place resize; no capacity
//! probe; no egress enforcement (refused at create).

mod errors;
mod exec;
mod files;
mod forward;
mod interactive;
mod lifecycle;
mod logs;
pub mod network_policy;
pub mod pod;
mod pull;
pub mod resources;
mod secrets;
mod service;
pub mod settings;
mod volumes;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Secret, Service};
use kube::Api;
use kube::config::{KubeConfigOptions, Kubeconfig};

pub use settings::{KubernetesSettings, PortAddress};

use crate::provider::{
    BulkFiles, ExecOutput, ExecRequest, Files, Provider, ProviderError, ProviderResult,
    SandboxDescriptor, SandboxQuery, Volumes,
};

/// A Kubernetes cluster as a provider.
pub struct KubernetesProvider {
    name: String,
    client: kube::Client,
    settings: KubernetesSettings,
    /// Set once the namespace's default-deny NetworkPolicy is in place (see
    /// [`network_policy`]).
    policy_ensured: tokio::sync::OnceCell<()>,
}

impl KubernetesProvider {
    /// Builds the provider with a client from `settings.kubeconfig`, or the operator's own
    /// cluster configuration (in-cluster, or `KUBECONFIG`) when none is set.
    pub async fn connect(name: &str, settings: KubernetesSettings) -> ProviderResult<Self> {
        let config = match &settings.kubeconfig {
            Some(path) => {
                let kubeconfig = Kubeconfig::read_from(path).map_err(|e| {
                    ProviderError::invalid(format!(
                        "kubernetes.kubeconfig {path:?} cannot be read ({e}); give a readable \
                         kubeconfig file"
                    ))
                })?;
                kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                    .await
                    .map_err(|e| {
                        ProviderError::invalid(format!(
                            "kubernetes.kubeconfig {path:?} is not usable ({e})"
                        ))
                    })?
            }
            None => kube::Config::infer().await.map_err(|e| {
                ProviderError::invalid(format!(
                    "no cluster configuration for the kubernetes provider ({e}); run in a \
                     cluster, set KUBECONFIG, or set kubernetes.kubeconfig"
                ))
            })?,
        };
        let client = crate::kube_client::client(config).map_err(|e| {
            ProviderError::invalid(format!("a client for the kubernetes provider: {e}"))
        })?;
        Ok(Self::with_client(name, client, settings))
    }

    /// Builds the provider on an existing client.
    pub fn with_client(name: &str, client: kube::Client, settings: KubernetesSettings) -> Self {
        KubernetesProvider {
            name: name.to_string(),
            client,
            settings,
            policy_ensured: tokio::sync::OnceCell::new(),
        }
    }

    /// The settings it was built with.
    pub fn settings(&self) -> &KubernetesSettings {
        &self.settings
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.settings.namespace)
    }
    fn services(&self) -> Api<Service> {
        Api::namespaced(self.client.clone(), &self.settings.namespace)
    }
    fn secrets(&self) -> Api<Secret> {
        Api::namespaced(self.client.clone(), &self.settings.namespace)
    }
    fn claims(&self) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.client.clone(), &self.settings.namespace)
    }
}

/// The owner-uid label of an object of the provider's namespace: whose it is, when a create
/// finds the name taken.
fn owner_uid(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Option<&str> {
    meta.labels
        .as_ref()
        .and_then(|l| l.get(crate::provider::labels::OWNER_UID))
        .map(String::as_str)
}

#[async_trait]
impl Provider for KubernetesProvider {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> &'static str {
        "kubernetes"
    }

    /// Files go through exec, and a created Pod is gated until its start.
    fn files_need_running(&self) -> bool {
        true
    }

    /// Every exec is a kubelet stream and a runtime exec in the Pod's container.
    fn warm_exec(&self) -> bool {
        true
    }

    /// The Pod limits a silent spec gets (`defaultResources`), so a namespace's budget counts
    /// what the Pod may really take.
    fn default_resources(&self) -> crate::provider::Resources {
        self.settings.default_resources.resources()
    }

    async fn create(
        &self,
        request: &crate::provider::CreateRequest,
    ) -> ProviderResult<SandboxDescriptor> {
        self.create_sandbox(request).await
    }

    async fn describe(&self, id: &str) -> ProviderResult<Option<SandboxDescriptor>> {
        match self.get_pod(id).await? {
            Some(pod) => {
                self.record_first_start(&pod);
                Ok(Some(self.describe_pod(&pod).await?))
            }
            None => Ok(None),
        }
    }

    async fn find(&self, query: &SandboxQuery) -> ProviderResult<Vec<SandboxDescriptor>> {
        self.find_sandboxes(query).await
    }

    async fn start(&self, id: &str) -> ProviderResult<()> {
        self.start_sandbox(id).await
    }

    async fn stop(&self, id: &str) -> ProviderResult<()> {
        self.stop_sandbox(id).await
    }

    /// A Pod cannot be paused: sleeping is stopping (the processes end), and the
    /// hibernation capability is absent so nobody believes otherwise.
    async fn sleep(&self, id: &str) -> ProviderResult<()> {
        self.stop_sandbox(id).await
    }

    async fn wake(&self, id: &str) -> ProviderResult<()> {
        self.start_sandbox(id).await
    }

    async fn destroy(&self, id: &str) -> ProviderResult<()> {
        self.destroy_sandbox(id).await
    }

    async fn exec(&self, id: &str, request: &ExecRequest) -> ProviderResult<ExecOutput> {
        self.run_exec(id, request).await
    }

    fn volumes(&self) -> Option<&dyn Volumes> {
        Some(self)
    }

    fn files(&self) -> Option<&dyn Files> {
        Some(self)
    }

    fn bulk_files(&self) -> Option<&dyn BulkFiles> {
        Some(self)
    }

    fn streaming_exec(&self) -> Option<&dyn crate::provider::stream::StreamingExec> {
        Some(self)
    }

    fn logs(&self) -> Option<&dyn crate::provider::stream::Logs> {
        Some(self)
    }

    fn port_forward(&self) -> Option<&dyn crate::provider::stream::PortForward> {
        Some(self)
    }

    fn relabel(&self) -> Option<&dyn crate::provider::Relabel> {
        Some(self)
    }
}

/// A Pod's labels change in place (a merge patch of its metadata); the Pod keeps running.
#[async_trait]
impl crate::provider::Relabel for KubernetesProvider {
    async fn add_labels(
        &self,
        id: &str,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> ProviderResult<()> {
        let patch = serde_json::json!({"metadata": {"labels": labels}});
        let params = kube::api::PatchParams::default();
        self.pods()
            .patch(id, &params, &kube::api::Patch::Merge(&patch))
            .await
            .map_err(|e| errors::from_kube(e, &format!("labelling Pod {id}")))?;
        Ok(())
    }
}
