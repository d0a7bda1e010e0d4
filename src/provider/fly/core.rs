//! The core lifecycle on Fly Machines: a sandbox is one machine of the configured app, named
//! after the request's deterministic name, its owner labels in the machine's metadata.

use std::collections::BTreeMap;

use async_trait::async_trait;
use serde_json::{Value, json};

use super::FIRST_STARTED_KEY;
use super::FlyProvider;
use super::config::{machine_config, refuse_unsupported};
use super::describe::{descriptor, first_started};
use super::machines::MAX_WAIT;
use super::ports;
use super::volumes::fly_volume_name;
use super::wire::Machine;
use crate::provider::labels::OWNER;
use crate::provider::{
    BulkFiles, CreateRequest, ErrorKind, ExecOutput, ExecRequest, Files, Hibernation, Provider,
    ProviderError, ProviderEvents, ProviderResult, SandboxDescriptor, SandboxQuery, SetResources,
    Volumes,
};

impl FlyProvider {
    /// `GET` one machine as a descriptor; `None` when it does not exist or is destroyed. A
    /// running machine whose first start is not recorded yet gets it recorded (see
    /// [`Self::record_first_start`]).
    pub(crate) async fn describe_machine(
        &self,
        id: &str,
    ) -> ProviderResult<Option<SandboxDescriptor>> {
        let host = self.settings.public_host();
        let Some(machine) = self.get_machine(id).await? else {
            return Ok(None);
        };
        self.record_first_start(&machine).await;
        Ok(descriptor(&machine, &host))
    }

    /// Writes the first-start time into the metadata of a machine seen running without one
    /// (rule 6): the API keeps only recent events, so without the record a machine that
    /// ran would, once its start events are gone, look like one that never did. One write
    /// per machine: the next describe finds the key. The time is the earliest start event
    /// still listed, else now (the machine runs now, so it started no later than that). A
    /// failed write is logged and tried again on the next describe; the descriptor never
    /// depends on it.
    async fn record_first_start(&self, machine: &Machine) {
        if machine.state != "started" || machine.read().metadata.contains_key(FIRST_STARTED_KEY) {
            return;
        }
        let first = first_started(machine).unwrap_or_else(chrono::Utc::now);
        if let Err(e) = self
            .set_metadata(&machine.id, FIRST_STARTED_KEY, &first.to_rfc3339(), None)
            .await
        {
            tracing::debug!(machine = %machine.id, error = %e, "recording the first start failed; retried on the next describe");
        }
    }

    /// The `config.mounts` entries for the request's volumes (each must exist).
    async fn mounts(&self, request: &CreateRequest) -> ProviderResult<Vec<Value>> {
        let mut mounts = Vec::new();
        for mount in &request.volumes {
            let volume = self.volume_named(&mount.volume_name).await?.ok_or_else(|| {
                ProviderError::not_found(format!(
                    "volume {:?} (for {}) does not exist on Fly app {}; create its SandboxVolume \
                     first",
                    mount.volume_name, mount.mount_path, self.settings.app
                ))
            })?;
            mounts.push(json!({
                "volume": volume.id,
                "path": mount.mount_path,
                "name": fly_volume_name(&mount.volume_name)?,
            }));
        }
        Ok(mounts)
    }

    /// A public port for every requested sandbox port (see `ports`). The caller holds the
    /// allocation lock until the machine exists.
    async fn public_ports(&self, request: &CreateRequest) -> ProviderResult<BTreeMap<u16, u16>> {
        if request.ports.is_empty() {
            return Ok(BTreeMap::new());
        }
        let mut taken = ports::taken(&self.list_machines(&[]).await?);
        let (first, last) = (
            self.settings.first_public_port,
            self.settings.last_public_port,
        );
        let mut chosen = BTreeMap::new();
        for port in &request.ports {
            let public = ports::choose(&mut taken, &request.name, port.sandbox_port, first, last)
                .ok_or_else(|| {
                ProviderError::transient(format!(
                    "every public port {first}..={last} of app {} is taken; widen the \
                         provider's firstPublicPort/lastPublicPort or delete Sandboxes",
                    self.settings.app
                ))
            })?;
            chosen.insert(port.sandbox_port, public);
        }
        Ok(chosen)
    }
}

#[async_trait]
impl Provider for FlyProvider {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> &'static str {
        "fly"
    }

    /// The guest size Fly is asked for when the spec names none (see `config::guest`).
    fn default_resources(&self) -> crate::provider::Resources {
        super::config::default_resources()
    }

    /// `POST /apps/{app}/machines` with `skip_launch: true` and the config of `config`; before
    /// it, `GET /volumes` for mounts and `GET /machines` for public ports when the request
    /// has any. A taken name (409) is `Conflict`, so the caller adopts instead.
    async fn create(&self, request: &CreateRequest) -> ProviderResult<SandboxDescriptor> {
        refuse_unsupported(request)?;
        let image = request
            .image
            .clone()
            .or_else(|| self.settings.default_image.clone())
            .ok_or_else(|| {
                ProviderError::invalid(format!(
                    "spec.image is not set and Fly provider {:?} has no defaultImage; set \
                     spec.image",
                    self.name
                ))
            })?;
        self.ensure_app().await?;
        let mounts = self.mounts(request).await?;
        let _allocation = if request.ports.is_empty() {
            None
        } else {
            Some(self.allocation.lock().await)
        };
        let public = self.public_ports(request).await?;
        let config = machine_config(request, &image, mounts, &public)?;
        let mut body = json!({ "name": request.name, "config": config, "skip_launch": true });
        if let Some(region) = &self.settings.region {
            body["region"] = json!(region);
        }
        let machine = match self.create_machine(&body).await {
            Ok(m) => m,
            Err(e) if e.is(ErrorKind::Conflict) => {
                return Err(ProviderError::conflict(format!(
                    "a machine named {:?} already exists in Fly app {}; find it by its owner-uid \
                     label and adopt it instead of creating another ({})",
                    request.name,
                    self.settings.app,
                    e.message()
                )));
            }
            Err(e) => return Err(e.context(format!("creating sandbox {}", request.name))),
        };
        descriptor(&machine, &self.settings.public_host()).ok_or_else(|| {
            ProviderError::transient(format!(
                "machine {} for {} was destroyed right after it was created",
                machine.id, request.name
            ))
        })
    }

    /// `GET /apps/{app}/machines/{id}`.
    async fn describe(&self, id: &str) -> ProviderResult<Option<SandboxDescriptor>> {
        self.describe_machine(id).await
    }

    /// `GET /apps/{app}/machines?metadata.{k}=v…` for every label (and the owner), following
    /// every page; the same filters are applied again here. Any failure is `Err` (rule 1).
    async fn find(&self, query: &SandboxQuery) -> ProviderResult<Vec<SandboxDescriptor>> {
        let mut filters: Vec<(String, String)> = query
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if let Some(owner) = &query.owner {
            filters.push((OWNER.to_string(), owner.clone()));
        }
        let host = self.settings.public_host();
        let machines = self
            .list_machines(&filters)
            .await
            .map_err(|e| e.context("finding sandboxes"))?;
        Ok(machines
            .iter()
            .filter_map(|m| descriptor(m, &host))
            .filter(|d| filters.iter().all(|(k, v)| d.labels.get(k) == Some(v)))
            .filter(|d| query.states.as_ref().is_none_or(|s| s.contains(&d.state)))
            .collect())
    }

    /// Under the lease: `POST .../start`, `GET .../wait?state=started`.
    async fn start(&self, id: &str) -> ProviderResult<()> {
        self.power_start(id).await
    }

    /// Under the lease: `POST .../stop`, `GET .../wait?state=stopped`.
    async fn stop(&self, id: &str) -> ProviderResult<()> {
        self.power_stop(id).await
    }

    /// [`Hibernation::hibernate`] (suspend, or stop when Fly refuses).
    async fn sleep(&self, id: &str) -> ProviderResult<()> {
        self.hibernate(id).await.map(|_| ())
    }

    /// Under the lease: `POST .../start`, `GET .../wait?state=started`.
    async fn wake(&self, id: &str) -> ProviderResult<()> {
        self.power_start(id).await
    }

    /// Under the lease: `DELETE .../{id}?force=true`, then `GET .../wait?state=destroyed`.
    /// Absent at any step = success (rule 5).
    async fn destroy(&self, id: &str) -> ProviderResult<()> {
        let deleted = self
            .leased(id, |nonce| async move {
                self.delete_machine(id, Some(&nonce)).await
            })
            .await;
        match deleted {
            Ok(()) => {}
            Err(e) if e.is(ErrorKind::NotFound) => return Ok(()),
            Err(e) => return Err(e.context(format!("destroying machine {id}"))),
        }
        match self.wait(id, "destroyed", None, MAX_WAIT).await {
            Err(e) if !e.is(ErrorKind::NotFound) => Err(e),
            _ => Ok(()),
        }
    }

    /// `POST .../exec`; see the `exec` module.
    async fn exec(&self, id: &str, request: &ExecRequest) -> ProviderResult<ExecOutput> {
        self.run_exec(id, request).await
    }

    fn hibernation(&self) -> Option<&dyn Hibernation> {
        Some(self)
    }

    fn volumes(&self) -> Option<&dyn Volumes> {
        Some(self)
    }

    fn resources(&self) -> Option<&dyn SetResources> {
        Some(self)
    }

    fn files(&self) -> Option<&dyn Files> {
        Some(self)
    }

    fn bulk_files(&self) -> Option<&dyn BulkFiles> {
        Some(self)
    }

    fn events(&self) -> Option<&dyn ProviderEvents> {
        Some(self)
    }
}
