//! Named volumes on Docker (`local` driver).
//!
//! Attachment is decided over every container, stopped ones included (a stopped sandbox
//! still owns its data), from the engine's container list. Docker's `volume=` list filter is
//! a regular-expression match on names and mount destinations, so it only narrows the list;
//! the exact volume name is then checked on each container's mounts.
//!
//! Sizes are not reported (`None`): the engine computes volume sizes only in `system df`,
//! which walks every volume on disk — far too costly for a listing.

use std::collections::{BTreeMap, HashMap};

use async_trait::async_trait;
use bollard::models::{ContainerSummary, Volume, VolumeCreateRequest};
use bollard::query_parameters::{
    ListContainersOptionsBuilder, ListVolumesOptionsBuilder, RemoveVolumeOptionsBuilder,
};

use super::core::parse_time;
use super::{DockerProvider, is_not_found, map_err};
use crate::provider::labels::OWNER_UID;
use crate::provider::validate;
use crate::provider::{ProviderError, ProviderResult, VolumeInfo, VolumeQuery, Volumes};

/// The name a container is known by (its name without the leading `/`, else its id).
pub(crate) fn summary_name(c: &ContainerSummary) -> String {
    c.names
        .as_ref()
        .and_then(|n| n.first())
        .map(|n| n.trim_start_matches('/').to_string())
        .or_else(|| c.id.clone())
        .unwrap_or_default()
}

/// Named volumes mounted by a listed container.
fn mounted_volumes(c: &ContainerSummary) -> impl Iterator<Item = &str> {
    c.mounts
        .iter()
        .flatten()
        .filter(|m| m.typ.as_deref() == Some("volume"))
        .filter_map(|m| m.name.as_deref())
}

impl DockerProvider {
    /// Every container (all states) that mounts `name`. `Err` when the engine could not be
    /// asked — callers decide whether that reads as "attached" (rule 4) or fails.
    pub(crate) async fn volume_holders(&self, name: &str) -> ProviderResult<Vec<String>> {
        let docker = self.engine().await?;
        let filters = HashMap::from([("volume".to_string(), vec![name.to_string()])]);
        let options = ListContainersOptionsBuilder::default()
            .all(true)
            .filters(&filters)
            .build();
        let containers = docker
            .list_containers(Some(options))
            .await
            .map_err(|e| map_err(&format!("listing the sandboxes that hold volume {name}"), e))?;
        let mut holders: Vec<String> = containers
            .iter()
            .filter(|c| mounted_volumes(c).any(|v| v == name))
            .map(summary_name)
            .collect();
        holders.sort();
        Ok(holders)
    }

    /// Lists volumes with the label filter applied by the engine, then prefix and
    /// attachment from `containers` (every container in every state, listed by the caller).
    pub(super) async fn volumes_held_by(
        &self,
        query: &VolumeQuery,
        containers: &[ContainerSummary],
    ) -> ProviderResult<Vec<VolumeInfo>> {
        let docker = self.engine().await?;
        let mut filters: HashMap<String, Vec<String>> = HashMap::new();
        if !query.labels.is_empty() {
            filters.insert(
                "label".into(),
                query
                    .labels
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect(),
            );
        }
        let options = ListVolumesOptionsBuilder::default()
            .filters(&filters)
            .build();
        let listed = docker
            .list_volumes(Some(options))
            .await
            .map_err(|e| map_err("listing volumes", e))?;
        let holders = volume_holders(containers);
        let mut out: Vec<VolumeInfo> = listed
            .volumes
            .unwrap_or_default()
            .into_iter()
            .filter(|v| {
                query
                    .name_prefix
                    .as_deref()
                    .is_none_or(|prefix| v.name.starts_with(prefix))
            })
            // The engine's label filter already applied; checked again so a filter the
            // engine ignored can never widen what a caller may delete.
            .filter(|v| {
                query
                    .labels
                    .iter()
                    .all(|(k, val)| v.labels.get(k) == Some(val))
            })
            .map(|v| {
                let attached_to = holders.get(&v.name).cloned().unwrap_or_default();
                volume_info(v, !attached_to.is_empty(), attached_to)
            })
            .filter(|v| query.attached.is_none_or(|want| v.attached == want))
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }
}

/// Volume name → containers mounting it.
fn volume_holders(containers: &[ContainerSummary]) -> HashMap<String, Vec<String>> {
    let mut map: HashMap<String, Vec<String>> = HashMap::new();
    for c in containers {
        for volume in mounted_volumes(c) {
            map.entry(volume.to_string())
                .or_default()
                .push(summary_name(c));
        }
    }
    for holders in map.values_mut() {
        holders.sort();
        holders.dedup();
    }
    map
}

/// Volume info from the engine's record plus the attachment found for it.
fn volume_info(volume: Volume, attached: bool, attached_to: Vec<String>) -> VolumeInfo {
    VolumeInfo {
        created_at: volume.created_at.as_deref().and_then(parse_time),
        size_bytes: volume
            .usage_data
            .as_ref()
            .and_then(|u| u64::try_from(u.size).ok()),
        labels: volume.labels.into_iter().collect(),
        name: volume.name,
        attached,
        attached_to,
    }
}

#[async_trait]
impl Volumes for DockerProvider {
    /// Creates the volume, or accepts an existing one carrying the same owner UID label.
    /// Docker's create returns an existing volume instead of failing, so ownership is
    /// checked on the engine's answer, which also settles a race between two creators.
    async fn create_volume(
        &self,
        name: &str,
        labels: &BTreeMap<String, String>,
    ) -> ProviderResult<VolumeInfo> {
        validate::resource_name("volume", name).map_err(ProviderError::invalid)?;
        let docker = self.engine().await?;
        let volume = match docker.inspect_volume(name).await {
            Ok(existing) => existing,
            Err(e) if is_not_found(&e) => docker
                .create_volume(VolumeCreateRequest {
                    name: Some(name.to_string()),
                    labels: Some(labels.clone().into_iter().collect()),
                    ..Default::default()
                })
                .await
                .map_err(|e| map_err(&format!("creating volume {name}"), e))?,
            Err(e) => return Err(map_err(&format!("looking up volume {name}"), e)),
        };
        let ours = labels.get(OWNER_UID);
        let holder = volume.labels.get(OWNER_UID);
        if ours != holder {
            return Err(ProviderError::conflict(format!(
                "volume {name} already exists and belongs to {}; choose another volume name or remove that volume",
                holder.map_or(
                    "no sandboxes.dev object (it has no owner-uid label)".to_string(),
                    |uid| { format!("the object with UID {uid}") }
                )
            )));
        }
        let holders = self.volume_holders(name).await?;
        Ok(volume_info(volume, !holders.is_empty(), holders))
    }

    /// Removes an unattached volume. Attachment is checked over every container first (a
    /// failed check fails the removal), and the engine refuses too if one appears meanwhile.
    async fn remove_volume(&self, name: &str) -> ProviderResult<()> {
        validate::resource_name("volume", name).map_err(ProviderError::invalid)?;
        let holders = self.volume_holders(name).await?;
        if !holders.is_empty() {
            return Err(ProviderError::conflict(format!(
                "volume {name} is attached to {}; destroy those sandboxes (stopped ones count) before removing it",
                holders.join(", ")
            )));
        }
        let docker = self.engine().await?;
        let options = RemoveVolumeOptionsBuilder::default().force(false).build();
        match docker.remove_volume(name, Some(options)).await {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(map_err(&format!("removing volume {name}"), e)),
        }
    }

    /// One volume. When the containers cannot be listed, it reads as attached (rule 4).
    async fn get_volume(&self, name: &str) -> ProviderResult<Option<VolumeInfo>> {
        validate::resource_name("volume", name).map_err(ProviderError::invalid)?;
        let docker = self.engine().await?;
        let volume = match docker.inspect_volume(name).await {
            Ok(v) => v,
            Err(e) if is_not_found(&e) => return Ok(None),
            Err(e) => return Err(map_err(&format!("looking up volume {name}"), e)),
        };
        Ok(Some(match self.volume_holders(name).await {
            Ok(holders) => volume_info(volume, !holders.is_empty(), holders),
            Err(e) => {
                tracing::warn!(volume = name, error = %e, "attachment unknown; reporting attached");
                volume_info(volume, true, Vec::new())
            }
        }))
    }

    /// Lists volumes with the label filter applied by the engine, then prefix and
    /// attachment here. Fails when either the volumes or the containers cannot be listed
    /// (rule 1): a listing is what a sweeper deletes from.
    async fn list_volumes(&self, query: &VolumeQuery) -> ProviderResult<Vec<VolumeInfo>> {
        let containers = self
            .all_containers()
            .await
            .map_err(|e| e.context("deciding volume attachment"))?;
        self.volumes_held_by(query, &containers).await
    }
}
