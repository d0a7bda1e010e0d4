//! Named volumes as PersistentVolumeClaims in the provider's namespace.
//!
//! Attachment is read from the Pods that mount a claim — every Pod of the namespace, gated
//! (stopped) ones included, since a stopped sandbox still owns its data. The claim's
//! StorageClass comes from the settings (the cluster's default when absent); a cluster
//! without a provisioner can use the test mode `hostPathVolumes`, where the provider itself
//! creates one hostPath PersistentVolume per claim, pre-bound to it, and deletes it with
//! the claim (Kubernetes never wipes a hostPath: its files stay on the node).

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{
    HostPathVolumeSource, ObjectReference, PersistentVolume, PersistentVolumeClaim,
    PersistentVolumeClaimSpec, PersistentVolumeSpec, Pod, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};

use super::KubernetesProvider;
use super::errors::{absent_ok, from_kube};
use crate::kube_client::paging::{each_page, list_all};
use crate::provider::labels::OWNER_UID;
use crate::provider::validate;
use crate::provider::{ProviderError, ProviderResult, VolumeInfo, VolumeQuery, Volumes};

/// How long a deleted claim may take to go (its protection finalizer).
const GONE_WITHIN: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(200);

fn size_of(claim: &PersistentVolumeClaim) -> Option<u64> {
    let q = claim.status.as_ref()?.capacity.as_ref()?.get("storage")?;
    crate::api::quantity::Quantity(q.0.clone()).to_bytes().ok()
}

fn info(claim: PersistentVolumeClaim, holders: Vec<String>) -> VolumeInfo {
    VolumeInfo {
        size_bytes: size_of(&claim),
        name: claim.metadata.name.unwrap_or_default(),
        attached: !holders.is_empty(),
        attached_to: holders,
        labels: claim.metadata.labels.unwrap_or_default(),
        created_at: claim
            .metadata
            .creation_timestamp
            .as_ref()
            .and_then(super::pod::chrono_time),
    }
}

impl KubernetesProvider {
    fn volumes_api(&self) -> Api<PersistentVolume> {
        Api::all(self.client.clone())
    }

    /// The hostPath PersistentVolume of claim `name` in test mode (cluster-scoped, so the
    /// namespace is part of its name).
    fn host_path_volume_name(&self, name: &str) -> String {
        format!("{}-{name}", self.settings.namespace)
    }

    /// Claim name → the Pods that mount it, over every Pod of the namespace (every page).
    async fn claim_holders(&self) -> ProviderResult<HashMap<String, Vec<String>>> {
        let mut holders: HashMap<String, Vec<String>> = HashMap::new();
        let pods = self.pods();
        let visit = |page: Vec<Pod>| {
            for pod in page {
                let pod_name = pod.metadata.name.clone().unwrap_or_default();
                let claims = pod
                    .spec
                    .and_then(|s| s.volumes)
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(|v| v.persistent_volume_claim.map(|c| c.claim_name));
                for claim in claims {
                    holders.entry(claim).or_default().push(pod_name.clone());
                }
            }
        };
        let fetch = |params: ListParams| {
            let pods = &pods;
            async move { pods.list(&params).await }
        };
        each_page(&ListParams::default(), fetch, visit)
            .await
            .map_err(|e| from_kube(e, "listing Pods to see which mount volumes"))?;
        Ok(holders)
    }

    fn claim(&self, name: &str, labels: &BTreeMap<String, String>) -> PersistentVolumeClaim {
        let test_mode = self.settings.host_path_volumes.is_some();
        PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                labels: Some(labels.clone()),
                ..Default::default()
            },
            spec: Some(PersistentVolumeClaimSpec {
                access_modes: Some(vec!["ReadWriteOnce".into()]),
                resources: Some(VolumeResourceRequirements {
                    requests: Some(BTreeMap::from([(
                        "storage".to_string(),
                        Quantity(self.settings.volume_size.clone()),
                    )])),
                    ..Default::default()
                }),
                storage_class_name: if test_mode {
                    Some(String::new())
                } else {
                    self.settings.storage_class_name.clone()
                },
                volume_name: test_mode.then(|| self.host_path_volume_name(name)),
                ..Default::default()
            }),
            status: None,
        }
    }

    /// Test mode: the hostPath PersistentVolume pre-bound to claim `name`.
    async fn ensure_host_path_volume(
        &self,
        dir: &str,
        name: &str,
        labels: &BTreeMap<String, String>,
    ) -> ProviderResult<()> {
        let pv_name = self.host_path_volume_name(name);
        let ns = &self.settings.namespace;
        let pv = PersistentVolume {
            metadata: ObjectMeta {
                name: Some(pv_name.clone()),
                labels: Some(labels.clone()),
                ..Default::default()
            },
            spec: Some(PersistentVolumeSpec {
                capacity: Some(BTreeMap::from([(
                    "storage".to_string(),
                    Quantity(self.settings.volume_size.clone()),
                )])),
                access_modes: Some(vec!["ReadWriteOnce".into()]),
                persistent_volume_reclaim_policy: Some("Retain".into()),
                storage_class_name: Some(String::new()),
                host_path: Some(HostPathVolumeSource {
                    path: format!("{}/{ns}/{name}", dir.trim_end_matches('/')),
                    type_: Some("DirectoryOrCreate".into()),
                }),
                claim_ref: Some(ObjectReference {
                    namespace: Some(ns.clone()),
                    name: Some(name.to_string()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            status: None,
        };
        match self.volumes_api().create(&PostParams::default(), &pv).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(from_kube(
                e,
                &format!("creating PersistentVolume {pv_name}"),
            )),
        }
    }
}

impl KubernetesProvider {
    /// Waits until claim `name` has left the API server: its protection finalizer holds it
    /// until the controller-manager has seen that no Pod uses it any more.
    async fn wait_claim_gone(&self, name: &str) -> ProviderResult<()> {
        let deadline = Instant::now() + GONE_WITHIN;
        let what = format!("reading PersistentVolumeClaim {name}");
        while absent_ok(self.claims().get(name).await, &what)?.is_some() {
            if Instant::now() > deadline {
                return Err(ProviderError::transient(format!(
                    "PersistentVolumeClaim {name} is still being deleted after {GONE_WITHIN:?} \
                     (a Pod may still use it)"
                )));
            }
            tokio::time::sleep(POLL).await;
        }
        Ok(())
    }
}

#[async_trait]
impl Volumes for KubernetesProvider {
    /// A claim (and, in test mode, its hostPath volume). An existing claim with our owner
    /// labels is a success; one of another owner is `Conflict`.
    async fn create_volume(
        &self,
        name: &str,
        labels: &BTreeMap<String, String>,
    ) -> ProviderResult<VolumeInfo> {
        validate::resource_name("volume name", name).map_err(ProviderError::invalid)?;
        if let Some(dir) = &self.settings.host_path_volumes {
            self.ensure_host_path_volume(dir, name, labels).await?;
        }
        let what = format!("creating PersistentVolumeClaim {name}");
        let claim = match self
            .claims()
            .create(&PostParams::default(), &self.claim(name, labels))
            .await
        {
            Ok(claim) => claim,
            Err(kube::Error::Api(s)) if s.code == 409 => {
                let existing = self
                    .claims()
                    .get(name)
                    .await
                    .map_err(|e| from_kube(e, &what))?;
                if super::owner_uid(&existing.metadata) != labels.get(OWNER_UID).map(String::as_str)
                {
                    return Err(ProviderError::conflict(format!(
                        "PersistentVolumeClaim {name} in namespace {} belongs to someone else",
                        self.settings.namespace
                    )));
                }
                existing
            }
            Err(e) => return Err(from_kube(e, &what)),
        };
        Ok(info(claim, Vec::new()))
    }

    /// Absent = success; a claim some Pod mounts is refused naming the Pods.
    async fn remove_volume(&self, name: &str) -> ProviderResult<()> {
        let holders = self.claim_holders().await?.remove(name).unwrap_or_default();
        if !holders.is_empty() {
            return Err(ProviderError::conflict(format!(
                "volume {name} is mounted by {}; destroy those sandboxes first",
                holders.join(", ")
            )));
        }
        let what = format!("deleting PersistentVolumeClaim {name}");
        absent_ok(
            self.claims().delete(name, &DeleteParams::default()).await,
            &what,
        )?;
        self.wait_claim_gone(name).await?;
        if self.settings.host_path_volumes.is_some() {
            let pv = self.host_path_volume_name(name);
            let what = format!("deleting PersistentVolume {pv}");
            absent_ok(
                self.volumes_api()
                    .delete(&pv, &DeleteParams::default())
                    .await,
                &what,
            )?;
        }
        Ok(())
    }

    async fn get_volume(&self, name: &str) -> ProviderResult<Option<VolumeInfo>> {
        let what = format!("reading PersistentVolumeClaim {name}");
        let Some(claim) = absent_ok(self.claims().get(name).await, &what)? else {
            return Ok(None);
        };
        let holders = self.claim_holders().await?.remove(name).unwrap_or_default();
        Ok(Some(info(claim, holders)))
    }

    /// Every page of claims by label, narrowed by name prefix and attachment. Rule 1: any
    /// failure, of the claims or of the Pods that decide attachment, is `Err`.
    async fn list_volumes(&self, query: &VolumeQuery) -> ProviderResult<Vec<VolumeInfo>> {
        let selector = query
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut holders = self.claim_holders().await?;
        let claims = self.claims();
        let fetch = |params: ListParams| {
            let claims = &claims;
            async move { claims.list(&params).await }
        };
        let listed = list_all(&ListParams::default().labels(&selector), fetch)
            .await
            .map_err(|e| from_kube(e, "listing PersistentVolumeClaims"))?;
        let mut found = Vec::new();
        for claim in listed {
            let name = claim.metadata.name.clone().unwrap_or_default();
            if query
                .name_prefix
                .as_ref()
                .is_some_and(|p| !name.starts_with(p))
            {
                continue;
            }
            let v = info(claim, holders.remove(&name).unwrap_or_default());
            if query.attached.is_none_or(|a| a == v.attached) {
                found.push(v);
            }
        }
        Ok(found)
    }
}
