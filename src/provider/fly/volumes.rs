//! Named volumes as Fly volumes.
//!
//! **Names.** A Fly volume name is 1-30 lowercase letters, digits and underscores, and is not
//! unique; the seam's names are the operator's (`sbxv-<uid>`, 41 characters). The mapping is
//! reversible, so a listed volume reads back under the seam's name:
//!
//! - `pfx-<uuid>` with a 4-character prefix becomes `pfx_` + the UUID's 128 bits in base 36
//!   (25 characters): exactly 30 characters;
//! - any other name of at most 29 lowercase letters, digits and `-` has its `-` replaced by
//!   `_` (never 30 characters long, so the two forms cannot be confused);
//! - anything else is `Invalid`, naming the volume.
//!
//! **Labels.** Fly volumes carry no labels or metadata, so the owner labels cannot be stored:
//! `labels` reads back empty. The sweeper therefore never claims a Fly volume (it only
//! touches resources labelled with its instance); a SandboxVolume's own finalizer removes its
//! volume (`reclaimPolicy: Delete`). A volume outlives its object only if someone removes the
//! finalizer by hand.
//!
//! **Attachment** (rule 4) is the volume's `attached_machine_id` or any live machine whose
//! config mounts it — one listing of volumes and one of machines; when either fails the call
//! fails. Removal is refused (`Conflict`, naming the machines) while attached.

use std::collections::BTreeMap;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde_json::json;

use super::FlyProvider;
use super::wire::{Machine, Volume};
use crate::provider::{ErrorKind, ProviderError, ProviderResult, VolumeInfo, VolumeQuery, Volumes};

/// Size of a volume the seam creates, in GB (the seam has no size; Fly's smallest is 1).
const VOLUME_SIZE_GB: u64 = 1;
/// Length of a Fly volume name (and of the UUID form).
const MAX_FLY_NAME: usize = 30;
/// Base-36 digits of a 128-bit number.
const UUID_DIGITS: usize = 25;

/// The Fly volume name of seam volume `name` (see the module docs).
pub(crate) fn fly_volume_name(name: &str) -> ProviderResult<String> {
    if let Some((prefix, uuid)) = name.split_once('-')
        && prefix.len() == 4
        && prefix
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && let Some(bits) = parse_uuid(uuid)
    {
        return Ok(format!("{prefix}_{}", base36(bits)));
    }
    let plain = name.len() < MAX_FLY_NAME
        && !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if plain {
        return Ok(name.replace('-', "_"));
    }
    Err(ProviderError::invalid(format!(
        "volume name {name:?} cannot be a Fly volume name: use at most 29 lowercase letters, \
         digits and '-', or the operator's own `sbxv-<uid>` form"
    )))
}

/// The seam name of Fly volume `fly` (the inverse of [`fly_volume_name`]).
pub(crate) fn seam_volume_name(fly: &str) -> String {
    if fly.len() == MAX_FLY_NAME
        && let Some((prefix, digits)) = fly.split_once('_')
        && prefix.len() == 4
        && let Some(bits) = parse_base36(digits)
    {
        let hex = format!("{bits:032x}");
        return format!(
            "{prefix}-{}-{}-{}-{}-{}",
            &hex[0..8],
            &hex[8..12],
            &hex[12..16],
            &hex[16..20],
            &hex[20..32]
        );
    }
    fly.replace('_', "-")
}

fn parse_uuid(text: &str) -> Option<u128> {
    let groups: Vec<&str> = text.split('-').collect();
    let shape = groups.iter().map(|g| g.len()).collect::<Vec<_>>() == [8, 4, 4, 4, 12];
    let lower_hex = text
        .chars()
        .all(|c| c == '-' || c.is_ascii_digit() || ('a'..='f').contains(&c));
    if !shape || !lower_hex {
        return None;
    }
    u128::from_str_radix(&groups.concat(), 16).ok()
}

fn base36(mut n: u128) -> String {
    let mut digits = vec![b'0'; UUID_DIGITS];
    for slot in digits.iter_mut().rev() {
        let d = (n % 36) as u32;
        *slot = char::from_digit(d, 36).map_or(b'0', |c| c as u8);
        n /= 36;
    }
    String::from_utf8(digits).unwrap_or_default()
}

fn parse_base36(text: &str) -> Option<u128> {
    if text.len() != UUID_DIGITS {
        return None;
    }
    text.chars().try_fold(0u128, |acc, c| {
        acc.checked_mul(36)?
            .checked_add(u128::from(c.to_digit(36)?))
    })
}

impl FlyProvider {
    /// The live Fly volumes called `fly_name` (names are not unique on Fly).
    async fn volumes_named(&self, fly_name: &str) -> ProviderResult<Vec<Volume>> {
        Ok(self
            .list_fly_volumes()
            .await?
            .into_iter()
            .filter(|v| v.name == fly_name)
            .collect())
    }

    /// The one live Fly volume for seam volume `name`; `None` when there is none, `Conflict`
    /// when Fly holds several of that name (the operator never creates a second one).
    pub(crate) async fn volume_named(&self, name: &str) -> ProviderResult<Option<Volume>> {
        let fly_name = fly_volume_name(name)?;
        let mut found = self.volumes_named(&fly_name).await?;
        match found.len() {
            0 => Ok(None),
            1 => Ok(found.pop()),
            n => Err(ProviderError::conflict(format!(
                "app {} holds {n} Fly volumes named {fly_name} (volume {name}); remove the extra \
                 ones with `fly volumes destroy`",
                self.settings.app
            ))),
        }
    }

    fn info(&self, volume: &Volume, machines: &[Machine]) -> VolumeInfo {
        let mut attached_to: Vec<String> = machines
            .iter()
            .filter(|m| !matches!(m.state.as_str(), "destroyed" | "destroying"))
            .filter(|m| m.read().mounts.iter().any(|mt| mt.volume == volume.id))
            .map(|m| m.id.clone())
            .collect();
        if let Some(id) = &volume.attached_machine_id
            && !attached_to.contains(id)
        {
            attached_to.push(id.clone());
        }
        VolumeInfo {
            name: seam_volume_name(&volume.name),
            attached: !attached_to.is_empty(),
            attached_to,
            labels: BTreeMap::new(),
            created_at: volume
                .created_at
                .as_deref()
                .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
                .map(|t| t.with_timezone(&Utc)),
            size_bytes: volume.size_gb.map(|gb| gb * 1024 * 1024 * 1024),
        }
    }
}

#[async_trait]
impl Volumes for FlyProvider {
    /// `GET /volumes`, then `POST /volumes` when absent. The labels cannot be stored (see the
    /// module docs); an existing volume of the name is this one (the name derives from its
    /// owner's UID), so creating it again is a success.
    async fn create_volume(
        &self,
        name: &str,
        _labels: &BTreeMap<String, String>,
    ) -> ProviderResult<VolumeInfo> {
        let machines = self.list_machines(&[]).await?;
        if let Some(existing) = self.volume_named(name).await? {
            return Ok(self.info(&existing, &machines));
        }
        let mut body = json!({ "name": fly_volume_name(name)?, "size_gb": VOLUME_SIZE_GB });
        if let Some(region) = &self.settings.region {
            body["region"] = json!(region);
        }
        let created = self
            .create_fly_volume(&body)
            .await
            .map_err(|e| e.context(format!("creating volume {name}")))?;
        Ok(self.info(&created, &machines))
    }

    /// `GET /volumes` + `GET /machines`, then `DELETE /volumes/{id}`. Absent = success;
    /// attached = `Conflict` naming the machines.
    async fn remove_volume(&self, name: &str) -> ProviderResult<()> {
        let Some(volume) = self.volume_named(name).await? else {
            return Ok(());
        };
        let machines = self.list_machines(&[]).await?;
        let info = self.info(&volume, &machines);
        if info.attached {
            return Err(ProviderError::conflict(format!(
                "volume {name} is attached to machine(s) {}; delete their Sandboxes first",
                info.attached_to.join(", ")
            )));
        }
        match self.delete_fly_volume(&volume.id).await {
            Ok(()) => Ok(()),
            Err(e) if e.is(ErrorKind::NotFound) => Ok(()),
            Err(e) => Err(e.context(format!("removing volume {name}"))),
        }
    }

    /// `GET /volumes` + `GET /machines`.
    async fn get_volume(&self, name: &str) -> ProviderResult<Option<VolumeInfo>> {
        let Some(volume) = self.volume_named(name).await? else {
            return Ok(None);
        };
        let machines = self.list_machines(&[]).await?;
        Ok(Some(self.info(&volume, &machines)))
    }

    /// `GET /volumes` + `GET /machines`; any failure fails the listing (rule 1).
    async fn list_volumes(&self, query: &VolumeQuery) -> ProviderResult<Vec<VolumeInfo>> {
        let volumes = self.list_fly_volumes().await?;
        let machines = self.list_machines(&[]).await?;
        let mut out = Vec::new();
        for volume in &volumes {
            let info = self.info(volume, &machines);
            let matches = query
                .name_prefix
                .as_deref()
                .is_none_or(|p| info.name.starts_with(p))
                && query
                    .labels
                    .iter()
                    .all(|(k, v)| info.labels.get(k) == Some(v))
                && query.attached.is_none_or(|a| a == info.attached);
            if matches {
                out.push(info);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operator_volume_names_fit_fly_and_read_back_unchanged() {
        let name = "sbxv-0f8e2b1c-3d4a-4b5c-9d6e-7f8091a2b3c4";
        let fly = fly_volume_name(name).unwrap();
        assert_eq!(fly.len(), 30);
        assert!(
            fly.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
            "{fly}"
        );
        assert_eq!(seam_volume_name(&fly), name);
        let max = "sbxv-ffffffff-ffff-ffff-ffff-ffffffffffff";
        assert_eq!(seam_volume_name(&fly_volume_name(max).unwrap()), max);
    }

    #[test]
    fn short_names_swap_dashes_and_the_rest_is_refused() {
        assert_eq!(fly_volume_name("conf-data-1").unwrap(), "conf_data_1");
        assert_eq!(seam_volume_name("conf_data_1"), "conf-data-1");
        for bad in ["", "Upper", "a_b", "x.y", &"a".repeat(30)] {
            assert!(fly_volume_name(bad).is_err(), "{bad}");
        }
    }
}
