//! Create, describe, find, start, stop and destroy: Pods (and their Service and pull Secret)
//! through the API server.

use std::time::{Duration, Instant};

use chrono::Utc;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};

use super::KubernetesProvider;
use super::errors::{absent_ok, from_kube};
use super::pod::{self, STOPPED};
use crate::kube_client::paging::list_all;
use crate::provider::labels::OWNER;
use crate::provider::{
    CreateRequest, ErrorKind, ProviderError, ProviderResult, SandboxDescriptor, SandboxQuery,
    SandboxState,
};

/// How long a replaced Pod may take to leave the API server.
const GONE_WITHIN: Duration = Duration::from_secs(60);
/// How long a start waits for the container to run (scheduling and an image pull included).
const START_WITHIN: Duration = Duration::from_secs(90);
/// Polling interval while waiting for a Pod to go or to run.
const POLL: Duration = Duration::from_millis(100);

fn not_found(id: &str, namespace: &str) -> ProviderError {
    ProviderError::not_found(format!(
        "sandbox {id} does not exist (no Pod {id} in namespace {namespace})"
    ))
}

/// Immediate deletion: the API server forgets the Pod at once and its kubelet ends the
/// containers (see the README on what that means for a stop).
fn delete_now(uid: Option<String>) -> DeleteParams {
    DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: uid.map(|uid| Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..Default::default()
    }
}

impl KubernetesProvider {
    /// The Pod of sandbox `id`, `None` when there is none.
    pub(super) async fn get_pod(&self, id: &str) -> ProviderResult<Option<Pod>> {
        absent_ok(self.pods().get(id).await, &format!("reading Pod {id}"))
    }

    /// The Pod of sandbox `id`, `NotFound` when there is none.
    pub(super) async fn must_get_pod(&self, id: &str) -> ProviderResult<Pod> {
        self.get_pod(id)
            .await?
            .ok_or_else(|| not_found(id, &self.settings.namespace))
    }

    /// Writes the container's first start into the Pod's [`pod::STARTED_AT`] annotation the
    /// first time a describe sees it started (rule 6): the kubelet's report goes with the Pod,
    /// the annotation is what successors carry. One patch per Pod, sent off the describe's
    /// path: the describe already reports the start from the kubelet's own record, and a
    /// warm claim's describe is on its way to Ready (the patch was a fifth of it). A failed
    /// one is logged and tried again on the next describe; a stop copies the start into
    /// the successor Pod itself (see [`pod::successor`]).
    pub(super) fn record_first_start(&self, pod: &Pod) {
        let (Some(first), Some(name)) =
            (pod::first_start_to_record(pod), pod.metadata.name.clone())
        else {
            return;
        };
        let patch = serde_json::json!({"metadata": {"annotations": {
            pod::STARTED_AT: crate::api::rfc3339(first)
        }}});
        let pods = self.pods();
        tokio::spawn(async move {
            if let Err(e) = pods
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                tracing::debug!(pod = name, error = %e, "recording the first start failed; retried on the next describe");
            }
        });
    }

    /// A Pod as a descriptor, with its reachable ports when it runs.
    pub(super) async fn describe_pod(&self, pod: &Pod) -> ProviderResult<SandboxDescriptor> {
        let mut d = pod::descriptor(pod);
        if d.state == SandboxState::Running {
            d.ports = self.port_mappings(pod).await?;
        }
        Ok(d)
    }

    /// Create: the namespace's NetworkPolicy (once) and the env Secret the Pod will name,
    /// then the gated Pod (its name is the adoption key, so a taken name is a `Conflict`
    /// before the rest is touched), then the env Secret's owner, the pull Secret and the
    /// Service. When one of those fails, everything of the sandbox is removed again: a
    /// half-made sandbox is never handed out.
    pub(super) async fn create_sandbox(
        &self,
        request: &CreateRequest,
    ) -> ProviderResult<SandboxDescriptor> {
        let credential = super::pull::credential(request)?;
        let secret = credential.map(|_| super::pull::secret_name(&request.name));
        let pod = pod::build(request, &self.settings, secret.as_deref(), Utc::now())?;
        self.require_claims(request).await?;
        self.ensure_network_policy().await?;
        if let Some(env) = super::secrets::env_secret(request) {
            self.ensure_secret(&request.owner.uid, &env).await?;
        }
        let created = self
            .pods()
            .create(&PostParams::default(), &pod)
            .await
            .map_err(
                |e| match from_kube(e, &format!("creating Pod {}", request.name)) {
                    e if e.is(ErrorKind::Conflict) => ProviderError::conflict(format!(
                        "a Pod named {} already exists in namespace {}; find it by its owner-uid \
                     label and adopt it instead of creating another",
                        request.name, self.settings.namespace
                    )),
                    e => e,
                },
            )?;
        let rest = async {
            self.own_env_secret(&created).await?;
            if let Some(credential) = credential {
                self.ensure_pull_secret(request, credential).await?;
            }
            self.ensure_service(&created).await?;
            Ok::<(), ProviderError>(())
        };
        if let Err(e) = rest.await {
            let _ = self.destroy_sandbox(&request.name).await;
            return Err(e);
        }
        self.describe_pod(&created).await
    }

    /// Every mounted volume must exist: a Pod naming an absent claim would wait for it
    /// forever instead of failing.
    async fn require_claims(&self, request: &CreateRequest) -> ProviderResult<()> {
        for mount in &request.volumes {
            let what = format!("reading PersistentVolumeClaim {}", mount.volume_name);
            if absent_ok(self.claims().get(&mount.volume_name).await, &what)?.is_none() {
                return Err(ProviderError::not_found(format!(
                    "volume {} does not exist (no PersistentVolumeClaim in namespace {}); create \
                     its SandboxVolume first",
                    mount.volume_name, self.settings.namespace
                )));
            }
        }
        Ok(())
    }

    /// Lists Pods by label selector, following every page; rule 1: any failure is `Err`.
    pub(super) async fn find_sandboxes(
        &self,
        query: &SandboxQuery,
    ) -> ProviderResult<Vec<SandboxDescriptor>> {
        let mut labels = query.labels.clone();
        if let Some(owner) = &query.owner {
            labels.insert(OWNER.to_string(), owner.clone());
        }
        let selector = labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        let pods = self.pods();
        let fetch = |params: ListParams| {
            let pods = &pods;
            async move { pods.list(&params).await }
        };
        let listed = list_all(&ListParams::default().labels(&selector), fetch)
            .await
            .map_err(|e| from_kube(e, &format!("listing Pods by {selector:?}")))?;
        let mut found = Vec::new();
        for pod in &listed {
            let state = pod::state(pod);
            if query.states.as_ref().is_none_or(|s| s.contains(&state)) {
                found.push(self.describe_pod(pod).await?);
            }
        }
        Ok(found)
    }

    /// Start: a gated Pod loses its gate (the scheduler places it); an exited Pod is
    /// replaced by a fresh one; then it waits until the container has run (like a Docker
    /// start returns once the process runs), so a start that cannot happen — no node fits,
    /// the image cannot be pulled — is an error naming the reason, not a silent Pending.
    pub(super) async fn start_sandbox(&self, id: &str) -> ProviderResult<()> {
        self.release(id).await?;
        self.wait_started(id).await
    }

    async fn release(&self, id: &str) -> ProviderResult<()> {
        let pod = self.must_get_pod(id).await?;
        if pod.metadata.deletion_timestamp.is_some() {
            return Err(ProviderError::transient(format!(
                "Pod {id} is being deleted; it can be started once it is gone"
            )));
        }
        self.ensure_service(&pod).await?;
        self.own_env_secret(&pod).await?;
        if pod::gated(&pod) {
            let patch = serde_json::json!({
                "metadata": {"annotations": {STOPPED: null}},
                "spec": {"schedulingGates": null},
            });
            self.pods()
                .patch(id, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(|e| from_kube(e, &format!("starting Pod {id} (removing its gate)")))?;
            return Ok(());
        }
        if pod::state(&pod) == SandboxState::Stopped {
            return self.replace(&pod, false, false).await;
        }
        Ok(())
    }

    /// Polls until the sandbox's container has started (or ran and exited), or fails with
    /// the reason the kubelet or the scheduler gives.
    async fn wait_started(&self, id: &str) -> ProviderResult<()> {
        let deadline = Instant::now() + START_WITHIN;
        loop {
            let pod = self.must_get_pod(id).await?;
            if pod::started_at_here(&pod) {
                return Ok(());
            }
            if let Some(e) = pod::start_failure(&pod) {
                return Err(e);
            }
            if Instant::now() > deadline {
                return Err(ProviderError::transient(format!(
                    "sandbox {id} did not start within {START_WITHIN:?}: {}",
                    pod::pending_reason(&pod)
                )));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Stop: the running Pod is deleted (its processes end) and a gated successor keeps
    /// the sandbox's identity, first start time and the stopped mark.
    pub(super) async fn stop_sandbox(&self, id: &str) -> ProviderResult<()> {
        let pod = self.must_get_pod(id).await?;
        if pod::gated(&pod) {
            if pod::state(&pod) == SandboxState::Stopped {
                return Ok(());
            }
            let patch = serde_json::json!({"metadata": {"annotations": {STOPPED: "true"}}});
            self.pods()
                .patch(id, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(|e| from_kube(e, &format!("marking Pod {id} stopped")))?;
            return Ok(());
        }
        self.replace(&pod, true, true).await
    }

    /// Deletes `pod` and creates its successor under the same name once the old one is
    /// gone; the env Secret is released from the old Pod first and owned by the new one
    /// after. A crash in between leaves no Pod: the controller sees the sandbox gone
    /// (`NotFound`) and recreates it, as for any lost sandbox.
    async fn replace(&self, pod: &Pod, gated: bool, stopped: bool) -> ProviderResult<()> {
        let id = pod.metadata.name.clone().unwrap_or_default();
        let uid = pod.metadata.uid.clone();
        let next = pod::successor(pod, gated, stopped);
        self.disown_env_secret(pod).await?;
        match self.pods().delete(&id, &delete_now(uid.clone())).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(e) => return Err(from_kube(e, &format!("deleting Pod {id}"))),
        }
        self.wait_gone(&id, uid.as_deref()).await?;
        let created = self
            .pods()
            .create(&PostParams::default(), &next)
            .await
            .map_err(|e| from_kube(e, &format!("recreating Pod {id}")))?;
        self.own_env_secret(&created).await
    }

    /// Polls until the Pod `id` with `uid` has left the API server.
    async fn wait_gone(&self, id: &str, uid: Option<&str>) -> ProviderResult<()> {
        let deadline = Instant::now() + GONE_WITHIN;
        loop {
            match self.get_pod(id).await? {
                None => return Ok(()),
                Some(p) if p.metadata.uid.as_deref() != uid => return Ok(()),
                Some(_) if Instant::now() > deadline => {
                    return Err(ProviderError::transient(format!(
                        "Pod {id} was deleted but is still there after {GONE_WITHIN:?}"
                    )));
                }
                Some(_) => tokio::time::sleep(POLL).await,
            }
        }
    }

    /// Destroy: Pod, Service, pull and env Secrets; absent = success (rule 5).
    pub(super) async fn destroy_sandbox(&self, id: &str) -> ProviderResult<()> {
        let what = |kind: &str| format!("deleting {kind} {id}");
        absent_ok(
            self.pods().delete(id, &delete_now(None)).await,
            &what("Pod"),
        )?;
        absent_ok(
            self.services().delete(id, &DeleteParams::default()).await,
            &what("Service"),
        )?;
        let secret = super::pull::secret_name(id);
        absent_ok(
            self.secrets()
                .delete(&secret, &DeleteParams::default())
                .await,
            &what("pull Secret"),
        )?;
        let secret = super::secrets::env_secret_name(id);
        absent_ok(
            self.secrets()
                .delete(&secret, &DeleteParams::default())
                .await,
            &what("env Secret"),
        )?;
        Ok(())
    }
}
