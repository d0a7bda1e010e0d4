//! The core lifecycle on Docker: a sandbox is one container, named after the request's
//! deterministic name.
//!
//! Mapping decisions, each made so the provider reports what is true rather than what was
//! asked for:
//!
//! - **command** replaces the image's entrypoint *and* command (`Entrypoint: [""]`,
//!   `Cmd: argv`), so the argv is the whole main process, pid 1.
//! - **disk** is not passed to the engine: overlay2 enforces `--storage-opt size` only on
//!   xfs with project quotas, so the request is recorded in a label and reported with
//!   `disk_enforced = false`. **memory** sets the swap ceiling to the same value, the same
//!   as [`SetResources`](crate::provider::SetResources) does, so creation and update never
//!   drift apart.
//! - **egress**: absent `allowed_domains` is unrestricted, on the sandbox's namespace
//!   network (see `networks`: no sandbox reaches another); `Some([])` is network mode
//!   `none`, an honest full cut-off; a non-empty allow-list puts the sandbox behind the provider's egress gateway
//!   (the `egress` module), and is `Unsupported` when none is configured (rule 10). There is no proxy in front of a container, so an idle policy other
//!   than `Off` is `Unsupported` too.
//! - **images** follow the request's `imagePullPolicy` (see the `pull` module): an image the
//!   engine has is never pulled under `IfNotPresent`/`Never`, so templates and local images
//!   need no registry; a pull runs in the background and the create answers `Transient`
//!   (`PullingImage`) until it is done. A template is never pulled, and never replaced by
//!   the base image.
//! - **volumes** must exist before a sandbox mounts them: Docker would silently create an
//!   unlabelled volume for a missing name, which nothing would ever reclaim.
//! - **find** enumerates with one filtered list call and nothing else, so a sweep of 10,000
//!   containers costs one list, not 10,000 inspects. Its descriptors are summaries: id,
//!   state, labels, image, template, creation time (whole seconds: the list rounds down) and
//!   rule 6 exactly — the list's state `created` means never started (a start that failed
//!   leaves it `created` too), so `started_at` is `Never` then; any other state has run, and
//!   the list carries no start time, so `started_at` is `Unknown` (ran, time not listed). Ports,
//!   resources, command and env are left empty: [`describe`](crate::provider::Provider::describe)
//!   one id for the whole picture.
//! - **started_at** is the engine's `State.StartedAt`, the *latest* start (Docker keeps no
//!   first-start time). What rule 6 needs holds exactly: it is `Never` if and only if the
//!   container never ran (a start that failed leaves it `created` with a zero time); a
//!   container in any other state without a start time reads `Unknown`.

use std::collections::{BTreeMap, HashMap};

use async_trait::async_trait;
use bollard::Docker;
use bollard::models::{
    ContainerCreateBody, ContainerInspectResponse, ContainerStateStatusEnum, ContainerSummary,
    ContainerSummaryStateEnum, HostConfig, Mount, MountType, PortBinding, PortMap,
    RestartPolicyNameEnum,
};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, InspectContainerOptions, ListContainersOptionsBuilder,
    RemoveContainerOptionsBuilder, StartContainerOptions, StopContainerOptionsBuilder,
};
use chrono::{DateTime, Datelike, Utc};

use super::{DISK_ADVISORY_LABEL, DockerProvider, IMAGE_DIGEST_LABEL, is_not_found, map_err};
use crate::provider::labels::{self, TEMPLATE};
use crate::provider::validate;
use crate::provider::{
    AppliedResources, BulkFiles, CapacityProbe, CreateRequest, Egress, EgressPolicy, ExecOutput,
    ExecRequest, Files, Hibernation, IdleAction, ImagePull, Inventory, PortMapping, PortRequest,
    Provider, ProviderError, ProviderEvents, ProviderResult, Resources, RestartPolicy,
    SandboxDescriptor, SandboxQuery, SandboxState, SetResources, StartedAt, Templates, VolumeMount,
    VolumeQuery, Volumes,
};

/// Seconds a stop waits for the main process to exit after SIGTERM before SIGKILL
/// (Docker's own default).
pub(crate) const STOP_TIMEOUT_SECS: i32 = 10;

#[async_trait]
impl Provider for DockerProvider {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> &'static str {
        "docker"
    }

    /// The configured defaults, with the hardening's pids ceiling.
    fn default_resources(&self) -> Resources {
        let pids = self.settings.hardening.default_pids_limit;
        Resources {
            pids: (pids > 0).then_some(pids),
            ..self.settings.defaults.resources()
        }
    }

    /// Creates the container without starting it. See the module docs for how each field
    /// maps, and which ones are refused rather than ignored.
    async fn create(&self, request: &CreateRequest) -> ProviderResult<SandboxDescriptor> {
        // Everything that can be refused without asking the engine is refused first, so an
        // unsupported spec never leaves anything behind.
        let mut body = create_body(request, &self.settings.publish_host)?;
        let profile = self.isolation_profile().await?;
        super::hardening::apply(&mut body, &self.settings.hardening, &profile);
        self.settings.defaults.apply(&mut body);
        self.apply_runtime(&mut body);
        let network = match request.allowed_domains.as_deref() {
            Some([]) => None,
            Some(list) => {
                self.place_behind_gateway(&mut body, &request.name, list)
                    .await?;
                None
            }
            None => Some(self.place_in_namespace(&mut body, &request.owner).await?),
        };
        let docker = self.engine().await?;
        let pulled = self.resolve_image(docker, request, &mut body).await?;
        require_volumes(docker, request).await?;
        self.create_on_network(docker, request, body, network.as_ref())
            .await?;
        let mut created = self.describe(&request.name).await?.ok_or_else(|| {
            ProviderError::transient(format!(
                "sandbox {:?} was created but disappeared before it could be described",
                request.name
            ))
        })?;
        created.image_pull = pulled;
        Ok(created)
    }

    async fn describe(&self, id: &str) -> ProviderResult<Option<SandboxDescriptor>> {
        Ok(self
            .inspect(id)
            .await?
            .map(|container| self.descriptor(container)))
    }

    /// One list call narrowed by label filters (all states), nothing else: summaries (see
    /// the module docs). Any failure fails the whole enumeration (rule 1).
    async fn find(&self, query: &SandboxQuery) -> ProviderResult<Vec<SandboxDescriptor>> {
        let docker = self.engine().await?;
        let mut label_filters: Vec<String> = query
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        if let Some(owner) = &query.owner {
            label_filters.push(format!("{}={owner}", labels::OWNER));
        }
        let mut filters: HashMap<String, Vec<String>> = HashMap::new();
        if !label_filters.is_empty() {
            filters.insert("label".into(), label_filters);
        }
        let options = ListContainersOptionsBuilder::default()
            .all(true)
            .filters(&filters)
            .build();
        let listed = docker
            .list_containers(Some(options))
            .await
            .map_err(|e| map_err("listing sandboxes", e))?;

        let wanted = |state: SandboxState| {
            query
                .states
                .as_ref()
                .is_none_or(|states| states.contains(&state))
        };
        let mut found: Vec<SandboxDescriptor> = listed
            .into_iter()
            .filter_map(summary_descriptor)
            .filter(|d| wanted(d.state))
            .collect();
        found.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(found)
    }

    /// One listing of every container serves all three parts: the sandboxes (narrowed by
    /// label here), the volumes' attachment and the templates' use — so a sweep pass costs
    /// one container listing plus a volume and an image listing, not three container
    /// listings. Deleting a volume or a template still re-checks its users at that moment
    /// (the engine refuses an attached volume; `remove_template` lists again). The same
    /// complete listing lets the pass reclaim empty namespace networks (see `networks`). At
    /// most once a minute, a pass also re-checks the host firewall (`hostguard`).
    async fn inventory(&self, labels: &BTreeMap<String, String>) -> ProviderResult<Inventory> {
        let containers = self
            .all_containers()
            .await
            .map_err(|e| e.context("listing sandboxes"))?;
        let volume_query = VolumeQuery {
            labels: labels.clone(),
            ..VolumeQuery::default()
        };
        let volumes = self.volumes_held_by(&volume_query, &containers).await?;
        // The listing is complete here, so it is the sweeper's proof a network is unused.
        if let Err(e) = self.prune_networks(labels, &containers).await {
            tracing::warn!(provider = %self.name, error = %e, "namespace networks not pruned; next pass retries");
        }
        self.recheck_firewall().await;
        let templates = self.templates_used_by(None, Some(&containers)).await?;
        let mut sandboxes: Vec<SandboxDescriptor> = containers
            .into_iter()
            .filter(|c| {
                let own = c.labels.as_ref();
                labels
                    .iter()
                    .all(|(k, v)| own.and_then(|l| l.get(k)) == Some(v))
            })
            .filter_map(summary_descriptor)
            .collect();
        sandboxes.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(Inventory {
            sandboxes,
            volumes: Some(volumes),
            templates: Some(crate::provider::retain_labelled(templates, labels)),
        })
    }

    async fn start(&self, id: &str) -> ProviderResult<()> {
        let docker = self.engine().await?;
        match docker
            .start_container(id, None::<StartContainerOptions>)
            .await
        {
            // 304 (already running) is a success in bollard.
            Ok(()) => Ok(()),
            // Its namespace network was reclaimed between its create and this start.
            Err(e) if super::networks::is_network_gone(&e) => {
                self.restore_network_of(id).await?;
                docker
                    .start_container(id, None::<StartContainerOptions>)
                    .await
                    .map_err(|e| map_err(&format!("starting sandbox {id}"), e))
            }
            Err(e) if is_not_found(&e) => Err(not_found(id, e)),
            Err(e) if let Some(full) = super::networks::network_full(id, &e) => Err(full),
            Err(e) => {
                // A paused container cannot be started; it can be unpaused into running.
                match self.status(id).await? {
                    Some(ContainerStateStatusEnum::PAUSED) => self.unpause(id).await,
                    Some(ContainerStateStatusEnum::RUNNING) => Ok(()),
                    _ => Err(map_err(&format!("starting sandbox {id}"), e)),
                }
            }
        }
    }

    async fn stop(&self, id: &str) -> ProviderResult<()> {
        let docker = self.engine().await?;
        // A frozen process cannot act on SIGTERM, so a paused container would always wait
        // out the whole timeout and be killed: thaw it first so it can exit cleanly.
        if self.status(id).await? == Some(ContainerStateStatusEnum::PAUSED) {
            self.unpause(id).await?;
        }
        let options = StopContainerOptionsBuilder::default()
            .t(STOP_TIMEOUT_SECS)
            .build();
        match docker.stop_container(id, Some(options)).await {
            // 304 (already stopped) is a success in bollard.
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Err(not_found(id, e)),
            Err(e) => Err(map_err(&format!("stopping sandbox {id}"), e)),
        }
    }

    /// `docker pause`: the cgroup freezer keeps every process, frozen. Pausing a paused
    /// sandbox is a success; a sandbox that is not running cannot be paused (`Conflict`).
    async fn sleep(&self, id: &str) -> ProviderResult<()> {
        let docker = self.engine().await?;
        let paused = {
            let _gate = self.freeze.pause(id).await;
            docker.pause_container(id).await
        };
        match paused {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Err(not_found(id, e)),
            Err(e) => match self.status(id).await? {
                Some(ContainerStateStatusEnum::PAUSED) => Ok(()),
                Some(other) if other != ContainerStateStatusEnum::RUNNING => {
                    Err(ProviderError::conflict(format!(
                        "sandbox {id} is {other}, not running, so it cannot be put to sleep; start it first"
                    )))
                }
                _ => Err(map_err(&format!("pausing sandbox {id}"), e)),
            },
        }
    }

    /// `docker unpause`; a running sandbox is already awake, and a stopped one is started.
    async fn wake(&self, id: &str) -> ProviderResult<()> {
        match self.status(id).await? {
            None => Err(ProviderError::not_found(format!(
                "sandbox {id} does not exist"
            ))),
            Some(ContainerStateStatusEnum::PAUSED) => self.unpause(id).await,
            Some(ContainerStateStatusEnum::RUNNING) => Ok(()),
            Some(_) => self.start(id).await,
        }
    }

    /// Force-removes the container with its anonymous volumes; named volumes survive (they
    /// are `SandboxVolume`s with their own lifecycle). Absent is a success (rule 5).
    async fn destroy(&self, id: &str) -> ProviderResult<()> {
        let docker = self.engine().await?;
        let options = RemoveContainerOptionsBuilder::default()
            .force(true)
            .v(true)
            .build();
        self.thaw_before_removal(id).await?;
        let removed = docker.remove_container(id, Some(options)).await;
        if matches!(&removed, Ok(())) || matches!(&removed, Err(e) if is_not_found(e)) {
            self.forget_policy(id).await;
        }
        match removed {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            // Someone else's removal of it is already under way: it is going away.
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 409,
                message,
            }) if message.contains("already in progress") => Ok(()),
            Err(e) => Err(map_err(&format!("removing sandbox {id}"), e)),
        }
    }

    async fn exec(&self, id: &str, request: &ExecRequest) -> ProviderResult<ExecOutput> {
        self.run_exec(id, request).await
    }

    fn hibernation(&self) -> Option<&dyn Hibernation> {
        Some(self)
    }

    fn volumes(&self) -> Option<&dyn Volumes> {
        Some(self)
    }

    fn templates(&self) -> Option<&dyn Templates> {
        Some(self)
    }

    /// `docker update` is unsupported under gVisor: no in-place changes there.
    fn resources(&self) -> Option<&dyn SetResources> {
        (!self.is_gvisor()).then_some(self as &dyn SetResources)
    }

    fn capacity(&self) -> Option<&dyn CapacityProbe> {
        Some(self)
    }

    fn files(&self) -> Option<&dyn Files> {
        Some(self)
    }

    fn bulk_files(&self) -> Option<&dyn BulkFiles> {
        Some(self)
    }

    fn egress(&self) -> Option<&dyn Egress> {
        Some(self)
    }

    fn egress_policy(&self) -> Option<&dyn EgressPolicy> {
        self.gateway.as_ref().map(|_| self as &dyn EgressPolicy)
    }

    fn events(&self) -> Option<&dyn ProviderEvents> {
        Some(self)
    }

    fn image_cache(&self) -> Option<&dyn crate::provider::ImageCache> {
        Some(self)
    }

    fn streaming_exec(&self) -> Option<&dyn crate::provider::stream::StreamingExec> {
        Some(self)
    }

    /// Every exec is a `runc exec` (or `runsc exec`) behind the engine.
    fn warm_exec(&self) -> bool {
        true
    }

    fn logs(&self) -> Option<&dyn crate::provider::stream::Logs> {
        Some(self)
    }

    /// Needs the engine's container networks reachable from the operator (see `forward`).
    fn port_forward(&self) -> Option<&dyn crate::provider::stream::PortForward> {
        Some(self)
    }
}

/// The stages of [`Provider::create`] that talk to the engine.
impl DockerProvider {
    /// Sets the body's image: the template's (never pulled, never replaced by the base image)
    /// or the request's / the default image under its pull policy. Returns the pull that ran.
    async fn resolve_image(
        &self,
        docker: &Docker,
        request: &CreateRequest,
        body: &mut ContainerCreateBody,
    ) -> ProviderResult<Option<ImagePull>> {
        let fallback = self.settings.default_image.as_ref();
        let image = match (&request.template, request.image.as_ref().or(fallback)) {
            (Some(template), _) => return self.template_boot(docker, template, body).await,
            (None, Some(image)) => image,
            (None, None) => {
                return Err(ProviderError::invalid(format!(
                    "spec.image is not set and Docker provider {:?} has no default image; set spec.image \
                     or spec.templateRef",
                    self.name
                )));
            }
        };
        let boot = self
            .image_for_create(
                &request.name,
                image,
                request.image_pull_policy,
                &request.registry_credentials,
            )
            .await?;
        if let (Some(labels), Some(digest)) = (body.labels.as_mut(), &boot.digest) {
            labels.insert(IMAGE_DIGEST_LABEL.to_string(), digest.clone());
        }
        body.image = Some(boot.reference);
        Ok(boot.pull)
    }

    /// Sets the body's image to the template's, which must exist: a missing template is
    /// `NotFound`, never a boot from the base image.
    async fn template_boot(
        &self,
        docker: &Docker,
        template: &str,
        body: &mut ContainerCreateBody,
    ) -> ProviderResult<Option<ImagePull>> {
        validate::resource_name("template", template).map_err(ProviderError::invalid)?;
        let image = self.template_image(template);
        match docker.inspect_image(&image).await {
            Ok(_) => {
                body.image = Some(image);
                Ok(None)
            }
            Err(e) if is_not_found(&e) => Err(ProviderError::not_found(format!(
                "template {template:?} (image {image}) does not exist on Docker provider {:?}; \
                 a sandbox is never booted from the base image instead: commit or fetch the \
                 template first, or fix spec.templateRef",
                self.name
            ))),
            Err(e) => Err(map_err(&format!("looking up template {template:?}"), e)),
        }
    }

    /// Creates the container; when its namespace network vanished since it was ensured
    /// (reclaimed by the sweeper), ensures it again and retries once.
    async fn create_on_network(
        &self,
        docker: &Docker,
        request: &CreateRequest,
        body: ContainerCreateBody,
        network: Option<&super::networks::NamespaceNetwork>,
    ) -> ProviderResult<()> {
        let Some(network) = network else {
            return self.create_container(docker, request, body).await;
        };
        match self.create_container(docker, request, body.clone()).await {
            Err(e)
                if e.is(crate::provider::ErrorKind::NotFound)
                    && e.message().contains(&network.name) =>
            {
                self.forget_network(&network.name).await;
                self.ensure_network(network).await?;
                self.create_container(docker, request, body).await
            }
            other => other,
        }
    }

    /// Creates the container under the request's name; a name taken is `Conflict` (adopt).
    async fn create_container(
        &self,
        docker: &Docker,
        request: &CreateRequest,
        body: ContainerCreateBody,
    ) -> ProviderResult<()> {
        let options = CreateContainerOptionsBuilder::default()
            .name(&request.name)
            .build();
        match docker.create_container(Some(options), body).await {
            Ok(_) => Ok(()),
            Err(e) if super::status_of(&e) == Some(409) => Err(ProviderError::conflict(format!(
                "a container named {:?} already exists on Docker provider {:?}; find it by its \
                 owner-uid label and adopt it instead of creating another",
                request.name, self.name
            ))),
            Err(e) => Err(map_err(&format!("creating sandbox {:?}", request.name), e)),
        }
    }
}

/// Every volume the request mounts exists: Docker would silently create an unlabelled volume
/// for a missing name, which nothing would ever reclaim.
async fn require_volumes(docker: &Docker, request: &CreateRequest) -> ProviderResult<()> {
    for mount in &request.volumes {
        match docker.inspect_volume(&mount.volume_name).await {
            Ok(_) => {}
            Err(e) if is_not_found(&e) => {
                return Err(ProviderError::not_found(format!(
                    "volume {:?} (for {}) does not exist; create its SandboxVolume first",
                    mount.volume_name, mount.mount_path
                )));
            }
            Err(e) => {
                return Err(map_err(
                    &format!("looking up volume {:?}", mount.volume_name),
                    e,
                ));
            }
        }
    }
    Ok(())
}

impl DockerProvider {
    /// Inspects a container by name (or full id); `None` when the engine has no such
    /// container. A partial-id match of Docker's is not accepted: ids here are names.
    pub(crate) async fn inspect(
        &self,
        id: &str,
    ) -> ProviderResult<Option<ContainerInspectResponse>> {
        let docker = self.engine().await?;
        match docker
            .inspect_container(id, None::<InspectContainerOptions>)
            .await
        {
            Ok(container) => {
                let name = container.name.as_deref().map(|n| n.trim_start_matches('/'));
                if name == Some(id) || container.id.as_deref() == Some(id) {
                    Ok(Some(container))
                } else {
                    Ok(None)
                }
            }
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(map_err(&format!("inspecting sandbox {id}"), e)),
        }
    }

    /// The engine's state word for a container, `None` when it does not exist.
    pub(crate) async fn status(
        &self,
        id: &str,
    ) -> ProviderResult<Option<ContainerStateStatusEnum>> {
        Ok(self.inspect(id).await?.map(|c| {
            c.state
                .and_then(|s| s.status)
                .unwrap_or(ContainerStateStatusEnum::EMPTY)
        }))
    }

    /// Unpauses; an already-running container is a success.
    pub(crate) async fn unpause(&self, id: &str) -> ProviderResult<()> {
        let docker = self.engine().await?;
        match docker.unpause_container(id).await {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Err(not_found(id, e)),
            Err(e) => match self.status(id).await? {
                Some(ContainerStateStatusEnum::RUNNING) => Ok(()),
                _ => Err(map_err(&format!("unpausing sandbox {id}"), e)),
            },
        }
    }

    /// The address a published port is reached at when the engine bound it to every
    /// interface: the engine's host for a TCP endpoint, loopback for a local socket.
    fn reachable_host(&self) -> String {
        match self.settings.endpoint.as_deref() {
            Some(ep) if ep.starts_with("tcp://") || ep.starts_with("http://") => {
                let rest = ep.split_once("://").map_or(ep, |(_, r)| r);
                let authority = rest.split('/').next().unwrap_or(rest);
                match authority.rsplit_once(':') {
                    Some((host, _)) if !host.is_empty() => host.to_string(),
                    _ => authority.to_string(),
                }
            }
            _ => "127.0.0.1".to_string(),
        }
    }

    /// Builds the descriptor from an inspect answer.
    pub(crate) fn descriptor(&self, c: ContainerInspectResponse) -> SandboxDescriptor {
        let id = c
            .name
            .as_deref()
            .map(|n| n.trim_start_matches('/').to_string())
            .or(c.id.clone())
            .unwrap_or_default();
        let state = c.state.unwrap_or_default();
        let status = state.status.unwrap_or(ContainerStateStatusEnum::EMPTY);
        let config = c.config.unwrap_or_default();
        let host = c.host_config.unwrap_or_default();
        let labels: BTreeMap<String, String> =
            config.labels.unwrap_or_default().into_iter().collect();
        let command: Vec<String> = config
            .entrypoint
            .unwrap_or_default()
            .into_iter()
            .filter(|s| !s.is_empty())
            .chain(config.cmd.unwrap_or_default())
            .collect();
        let exit_code = match status {
            ContainerStateStatusEnum::EXITED | ContainerStateStatusEnum::DEAD => state.exit_code,
            // A start that failed (e.g. the command does not exist) leaves it "created"
            // with the failure's exit code.
            ContainerStateStatusEnum::CREATED => state.exit_code.filter(|code| *code != 0),
            _ => None,
        };
        let mut volumes: Vec<String> = c
            .mounts
            .unwrap_or_default()
            .into_iter()
            .filter(|m| m.typ.as_deref() == Some("volume"))
            .filter_map(|m| m.name)
            .collect();
        volumes.sort();
        let ports = c
            .network_settings
            .and_then(|n| n.ports)
            .map(|p| ports_from_map(&p, &self.reachable_host()))
            .unwrap_or_default();
        let template_ref = labels.get(TEMPLATE).filter(|t| !t.is_empty()).cloned();
        // A template image carries the label of the sandbox it was committed from: only an
        // image boot's own label says what it booted.
        let image_digest = labels
            .get(IMAGE_DIGEST_LABEL)
            .filter(|d| !d.is_empty() && template_ref.is_none())
            .cloned();
        SandboxDescriptor {
            id,
            state: container_state(status),
            template_ref,
            image_digest,
            image_pull: None,
            isolation: labels.get(super::hardening::ISOLATION_LABEL).cloned(),
            resources: applied_resources(&host, &labels),
            labels,
            created_at: c.created.as_deref().and_then(parse_time),
            started_at: StartedAt::from_evidence(
                container_state(status),
                state.started_at.as_deref().and_then(parse_time),
                status == ContainerStateStatusEnum::CREATED,
            ),
            exit_code,
            image: config.image.filter(|i| !i.is_empty()),
            volumes,
            ports,
            command: (!command.is_empty()).then_some(command),
            restart_policy: restart_policy_from(host.restart_policy.and_then(|p| p.name)),
            env: parse_env(config.env.unwrap_or_default()),
        }
    }
}

fn not_found(id: &str, err: bollard::errors::Error) -> ProviderError {
    ProviderError::not_found(format!("sandbox {id} does not exist: {err}"))
}

/// Docker's container-name rule (`[a-zA-Z0-9][a-zA-Z0-9_.-]+`).
fn validate_container_name(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric());
    let rest_ok =
        name.len() >= 2 && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if first_ok && rest_ok && name.len() <= 253 {
        Ok(())
    } else {
        Err(format!(
            "sandbox name {name:?} is not a valid Docker container name (2-253 of a-z A-Z 0-9 _ . -, \
             starting with a letter or digit)"
        ))
    }
}

/// The container body for a request, minus the image (resolved against the engine).
/// Pure, so every refusal and mapping is unit-tested without an engine.
///
/// The request is destructured without `..`: a field added to [`CreateRequest`] does not
/// compile here until Docker decides whether it can enforce it (rule 10).
pub(crate) fn create_body(
    request: &CreateRequest,
    publish_host: &str,
) -> ProviderResult<ContainerCreateBody> {
    let CreateRequest {
        name,
        command,
        restart_policy,
        env,
        resources,
        ports,
        volumes,
        allowed_domains,
        idle_action,
        // Labels, see `container_labels`.
        owner: _,
        labels: _,
        // Resolved against the engine by `create`: the template's image, or the image pulled
        // by the pull policy with the matching credentials (the template is also a label).
        template: _,
        image: _,
        image_pull_policy: _,
        registry_credentials: _,
        // Secret-derived env stays in the container's config with the rest (README: who reads it).
        secret_env_keys: _,
    } = request;
    validate_container_name(name).map_err(ProviderError::invalid)?;
    refuse_idle_action(*idle_action)?;
    let no_network = matches!(allowed_domains, Some(d) if d.is_empty());
    if no_network && !ports.is_empty() {
        return Err(ProviderError::invalid(
            "spec.ports cannot be published from a sandbox without network \
             (spec.egress.allowedDomains: []); remove one of them",
        ));
    }
    let labels = container_labels(request)?;
    let env = env_list(env)?;
    let (entrypoint, cmd) = entrypoint_and_cmd(command.as_deref())?;
    let (exposed, bindings) = published_ports(ports, publish_host)?;
    let mounts = volume_mounts(volumes)?;
    let (memory, nano_cpus) = super::resources::engine_limits(resources)?;
    let host_config = HostConfig {
        memory,
        // Swap ceiling = memory ceiling: no swap beyond the limit, identical to set_resources.
        memory_swap: memory,
        nano_cpus,
        pids_limit: resources.pids,
        restart_policy: Some(bollard::models::RestartPolicy {
            name: Some(restart_policy_name(*restart_policy)),
            maximum_retry_count: None,
        }),
        network_mode: no_network.then(|| "none".to_string()),
        port_bindings: (!bindings.is_empty()).then_some(bindings),
        mounts: (!mounts.is_empty()).then_some(mounts),
        ..Default::default()
    };
    Ok(ContainerCreateBody {
        env: (!env.is_empty()).then_some(env),
        cmd,
        entrypoint,
        labels: Some(labels.into_iter().collect()),
        exposed_ports: (!exposed.is_empty()).then_some(exposed),
        host_config: Some(host_config),
        ..Default::default()
    })
}

/// The owner labels and the request's own, the template booted and the advisory disk
/// ceiling (recorded, never enforced: see the module docs).
fn container_labels(request: &CreateRequest) -> ProviderResult<BTreeMap<String, String>> {
    let mut labels =
        labels::merge_labels(&request.owner, &request.labels).map_err(ProviderError::invalid)?;
    if let Some(template) = &request.template {
        labels.insert(TEMPLATE.to_string(), template.clone());
    }
    if let Some(disk) = request.resources.disk_bytes {
        labels.insert(DISK_ADVISORY_LABEL.to_string(), disk.to_string());
    }
    Ok(labels)
}

/// Docker has no proxy in front of its sandboxes: only `Off` (or nothing) can be honoured.
fn refuse_idle_action(idle_action: Option<IdleAction>) -> ProviderResult<()> {
    match idle_action {
        None | Some(IdleAction::Off) => Ok(()),
        Some(action) => Err(ProviderError::unsupported(format!(
            "Docker has no proxy in front of its sandboxes, so nothing would ever park one on idle \
             ({action:?}); remove spec.idleAction or set it to Off"
        ))),
    }
}

/// `KEY=value` entries; a name that is empty or holds `=` or NUL is refused.
fn env_list(env: &BTreeMap<String, String>) -> ProviderResult<Vec<String>> {
    let mut list = Vec::with_capacity(env.len());
    for (key, value) in env {
        if key.is_empty() || key.contains('=') || key.contains('\0') || value.contains('\0') {
            return Err(ProviderError::invalid(format!(
                "environment variable {key:?} is not a valid name (non-empty, no '=' or NUL); fix spec.env"
            )));
        }
        list.push(format!("{key}={value}"));
    }
    Ok(list)
}

/// The command replaces the image's entrypoint and command: `[""]` resets the entrypoint, so
/// the argv is the whole main process.
type EntrypointAndCmd = (Option<Vec<String>>, Option<Vec<String>>);

fn entrypoint_and_cmd(command: Option<&[String]>) -> ProviderResult<EntrypointAndCmd> {
    match command {
        None => Ok((None, None)),
        Some(argv) if argv.is_empty() || argv[0].is_empty() => Err(ProviderError::invalid(
            "spec.command must name a program (its first element is empty); remove it to keep the \
             image's own command",
        )),
        Some(argv) => Ok((Some(vec![String::new()]), Some(argv.to_vec()))),
    }
}

/// Exposed ports and their bindings on `publish_host`, each on a port the engine picks.
fn published_ports(
    ports: &[PortRequest],
    publish_host: &str,
) -> ProviderResult<(Vec<String>, PortMap)> {
    let mut exposed = Vec::new();
    let mut bindings: PortMap = HashMap::new();
    for port in ports {
        let protocol = port.protocol.to_ascii_lowercase();
        if !matches!(protocol.as_str(), "tcp" | "udp" | "sctp") || port.sandbox_port == 0 {
            return Err(ProviderError::invalid(format!(
                "port {}/{} cannot be published: the port must be 1-65535 and the protocol tcp, udp or sctp; \
                 fix spec.ports",
                port.sandbox_port, port.protocol
            )));
        }
        let key = format!("{}/{protocol}", port.sandbox_port);
        exposed.push(key.clone());
        bindings.insert(
            key,
            Some(vec![PortBinding {
                host_ip: Some(publish_host.to_string()),
                // Empty = the engine picks a free port; read back by describe after start.
                host_port: Some(String::new()),
            }]),
        );
    }
    Ok((exposed, bindings))
}

/// Named-volume mounts at absolute paths below `/`.
fn volume_mounts(volumes: &[VolumeMount]) -> ProviderResult<Vec<Mount>> {
    let mut mounts = Vec::with_capacity(volumes.len());
    for volume in volumes {
        if !volume.mount_path.starts_with('/') || volume.mount_path == "/" {
            return Err(ProviderError::invalid(format!(
                "mount path {:?} of volume {:?} must be an absolute path below /; fix spec.volumes",
                volume.mount_path, volume.volume_name
            )));
        }
        validate::resource_name("volume", &volume.volume_name).map_err(ProviderError::invalid)?;
        mounts.push(Mount {
            target: Some(volume.mount_path.clone()),
            source: Some(volume.volume_name.clone()),
            typ: Some(MountType::VOLUME),
            read_only: Some(volume.read_only),
            ..Default::default()
        });
    }
    Ok(mounts)
}

/// The restart-policy name Docker uses for ours.
pub(crate) fn restart_policy_name(policy: RestartPolicy) -> RestartPolicyNameEnum {
    match policy {
        RestartPolicy::Never => RestartPolicyNameEnum::NO,
        RestartPolicy::OnFailure => RestartPolicyNameEnum::ON_FAILURE,
        RestartPolicy::Always => RestartPolicyNameEnum::ALWAYS,
    }
}

/// Ours for Docker's restart-policy name (`unless-stopped` restarts like `always`).
pub(crate) fn restart_policy_from(name: Option<RestartPolicyNameEnum>) -> RestartPolicy {
    match name {
        Some(RestartPolicyNameEnum::ON_FAILURE) => RestartPolicy::OnFailure,
        Some(RestartPolicyNameEnum::ALWAYS | RestartPolicyNameEnum::UNLESS_STOPPED) => {
            RestartPolicy::Always
        }
        _ => RestartPolicy::Never,
    }
}

/// Coarse state for the engine's state word (inspect).
///
/// `restarting` is a container between two runs of a crash loop: not serving, about to be
/// started again, hence `Creating`.
pub(crate) fn container_state(status: ContainerStateStatusEnum) -> SandboxState {
    use ContainerStateStatusEnum as S;
    match status {
        S::CREATED | S::RESTARTING => SandboxState::Creating,
        S::RUNNING | S::STOPPING => SandboxState::Running,
        S::PAUSED => SandboxState::Sleeping,
        S::EXITED | S::DEAD | S::REMOVING | S::EMPTY => SandboxState::Stopped,
    }
}

/// Coarse state for the engine's state word (list), the same mapping as
/// [`container_state`].
pub(crate) fn summary_state(status: ContainerSummaryStateEnum) -> SandboxState {
    use ContainerSummaryStateEnum as S;
    match status {
        S::CREATED | S::RESTARTING => SandboxState::Creating,
        S::RUNNING | S::STOPPING => SandboxState::Running,
        S::PAUSED => SandboxState::Sleeping,
        S::EXITED | S::DEAD | S::REMOVING | S::EMPTY => SandboxState::Stopped,
    }
}

/// A sandbox as the list call reports it (see the module docs): `None` for a summary
/// without a name or id.
pub(crate) fn summary_descriptor(c: ContainerSummary) -> Option<SandboxDescriptor> {
    let id = c
        .names
        .and_then(|n| n.into_iter().next())
        .map(|n| n.trim_start_matches('/').to_string())
        .or(c.id)?;
    let status = c.state.unwrap_or(ContainerSummaryStateEnum::EMPTY);
    let labels: BTreeMap<String, String> = c.labels.unwrap_or_default().into_iter().collect();
    let created_at = c.created.and_then(|secs| DateTime::from_timestamp(secs, 0));
    let never_started = status == ContainerSummaryStateEnum::CREATED;
    let template_ref = labels.get(TEMPLATE).filter(|t| !t.is_empty()).cloned();
    let image_digest = labels
        .get(IMAGE_DIGEST_LABEL)
        .filter(|d| !d.is_empty() && template_ref.is_none())
        .cloned();
    Some(SandboxDescriptor {
        isolation: labels.get(super::hardening::ISOLATION_LABEL).cloned(),
        id,
        state: summary_state(status),
        template_ref,
        image_digest,
        image_pull: None,
        labels,
        created_at,
        started_at: if never_started {
            StartedAt::Never
        } else {
            StartedAt::Unknown
        },
        exit_code: None,
        image: c.image.filter(|i| !i.is_empty()),
        volumes: Vec::new(),
        ports: Vec::new(),
        resources: Default::default(),
        command: None,
        restart_policy: Default::default(),
        env: BTreeMap::new(),
    })
}

/// Parses an engine timestamp (RFC 3339 with nanoseconds). Docker writes the zero time
/// `0001-01-01T00:00:00Z` for "never" (e.g. `StartedAt` of a never-started container),
/// which is `None` here — the whole point of rule 6.
pub(crate) fn parse_time(s: &str) -> Option<DateTime<Utc>> {
    let t = DateTime::parse_from_rfc3339(s).ok()?.with_timezone(&Utc);
    (t.year() > 1).then_some(t)
}

/// `KEY=value` pairs into a map (a bare `KEY` maps to an empty value).
pub(crate) fn parse_env(env: Vec<String>) -> BTreeMap<String, String> {
    env.into_iter()
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) => (k.to_string(), v.to_string()),
            None => (kv, String::new()),
        })
        .collect()
}

/// Port mappings from the engine's port map (`"8080/tcp" → [{HostIp, HostPort}]`). A
/// binding without an assigned host port (not running) is skipped; a wildcard host address
/// is replaced by `unspecified_host`.
pub(crate) fn ports_from_map(map: &PortMap, unspecified_host: &str) -> Vec<PortMapping> {
    let mut out = Vec::new();
    for (key, bindings) in map {
        let (port, protocol) = key.split_once('/').unwrap_or((key.as_str(), "tcp"));
        let Ok(sandbox_port) = port.parse::<u16>() else {
            continue;
        };
        for binding in bindings.iter().flatten() {
            let Some(host_port) = binding
                .host_port
                .as_deref()
                .and_then(|p| p.parse::<u16>().ok())
                .filter(|p| *p != 0)
            else {
                continue;
            };
            let host = match binding.host_ip.as_deref() {
                None | Some("") | Some("0.0.0.0") | Some("::") => unspecified_host.to_string(),
                Some(ip) => ip.to_string(),
            };
            out.push(PortMapping {
                sandbox_port,
                protocol: protocol.to_string(),
                host,
                port: host_port,
            });
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Resources as the engine holds them. Disk is never enforced here (see the module docs);
/// the requested value comes back from its label.
pub(crate) fn applied_resources(
    host: &HostConfig,
    labels: &BTreeMap<String, String>,
) -> AppliedResources {
    let cpu_millis = match host.nano_cpus.filter(|n| *n > 0) {
        Some(nanos) => Some(((nanos + 500_000) / 1_000_000) as u64),
        // A quota set by other means (`--cpu-quota`) limits the same way.
        None => match (host.cpu_quota, host.cpu_period) {
            (Some(q), Some(p)) if q > 0 && p > 0 => Some((q * 1000 / p) as u64),
            _ => None,
        },
    };
    AppliedResources {
        cpu_millis,
        memory_bytes: host.memory.filter(|m| *m > 0).map(|m| m as u64),
        disk_bytes: labels
            .get(DISK_ADVISORY_LABEL)
            .and_then(|d| d.parse::<u64>().ok()),
        disk_enforced: false,
        pids: host.pids_limit.filter(|p| *p > 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::ErrorKind;
    use crate::provider::labels::Owner;
    use crate::provider::{ImagePullPolicy, PortRequest, Resources, VolumeMount};

    fn request() -> CreateRequest {
        CreateRequest {
            name: "sbx-1234".into(),
            owner: Owner {
                instance: "ops".into(),
                kind: "Sandbox".into(),
                namespace: "team-a".into(),
                name: "web".into(),
                uid: "1234".into(),
            },
            image: Some("base".into()),
            template: None,
            command: None,
            restart_policy: RestartPolicy::Never,
            env: BTreeMap::new(),
            labels: BTreeMap::new(),
            resources: Resources::default(),
            ports: vec![],
            volumes: vec![],
            allowed_domains: None,
            idle_action: None,
            image_pull_policy: ImagePullPolicy::IfNotPresent,
            registry_credentials: vec![],
            secret_env_keys: Default::default(),
        }
    }

    #[test]
    fn zero_time_means_never() {
        assert_eq!(parse_time("0001-01-01T00:00:00Z"), None);
        assert_eq!(parse_time(""), None);
        assert_eq!(parse_time("garbage"), None);
        let t = parse_time("2024-05-01T10:11:12.123456789Z").unwrap();
        assert_eq!(t.timestamp(), 1_714_558_272);
        assert_eq!(t.timestamp_subsec_nanos(), 123_456_789);
        assert!(parse_time("2024-05-01T12:11:12+02:00").is_some());
    }

    #[test]
    fn states_map_to_the_coarse_lifecycle() {
        use ContainerStateStatusEnum as S;
        assert_eq!(container_state(S::CREATED), SandboxState::Creating);
        assert_eq!(container_state(S::RESTARTING), SandboxState::Creating);
        assert_eq!(container_state(S::RUNNING), SandboxState::Running);
        assert_eq!(container_state(S::PAUSED), SandboxState::Sleeping);
        assert_eq!(container_state(S::EXITED), SandboxState::Stopped);
        assert_eq!(container_state(S::DEAD), SandboxState::Stopped);
        use ContainerSummaryStateEnum as L;
        assert_eq!(summary_state(L::CREATED), SandboxState::Creating);
        assert_eq!(summary_state(L::RUNNING), SandboxState::Running);
        assert_eq!(summary_state(L::PAUSED), SandboxState::Sleeping);
        assert_eq!(summary_state(L::EXITED), SandboxState::Stopped);
    }

    #[test]
    fn restart_policies_round_trip() {
        for p in [
            RestartPolicy::Never,
            RestartPolicy::OnFailure,
            RestartPolicy::Always,
        ] {
            assert_eq!(restart_policy_from(Some(restart_policy_name(p))), p);
        }
        assert_eq!(restart_policy_from(None), RestartPolicy::Never);
        assert_eq!(
            restart_policy_from(Some(RestartPolicyNameEnum::UNLESS_STOPPED)),
            RestartPolicy::Always
        );
    }

    #[test]
    fn env_and_ports_are_parsed() {
        let env = parse_env(vec!["A=1".into(), "B=x=y".into(), "C".into()]);
        assert_eq!(env["A"], "1");
        assert_eq!(env["B"], "x=y");
        assert_eq!(env["C"], "");

        let map: PortMap = HashMap::from([
            (
                "8080/tcp".to_string(),
                Some(vec![
                    PortBinding {
                        host_ip: Some("0.0.0.0".into()),
                        host_port: Some("49153".into()),
                    },
                    PortBinding {
                        host_ip: Some("::".into()),
                        host_port: Some("49153".into()),
                    },
                ]),
            ),
            ("53/udp".to_string(), None),
            (
                "9000/tcp".to_string(),
                Some(vec![PortBinding {
                    host_ip: Some("127.0.0.1".into()),
                    host_port: Some("".into()),
                }]),
            ),
        ]);
        let ports = ports_from_map(&map, "10.0.0.5");
        assert_eq!(
            ports,
            vec![PortMapping {
                sandbox_port: 8080,
                protocol: "tcp".into(),
                host: "10.0.0.5".into(),
                port: 49153
            }]
        );
    }

    #[test]
    fn create_body_maps_every_field() {
        let mut r = request();
        r.command = Some(vec!["sh".into(), "-c".into(), "echo hi".into()]);
        r.restart_policy = RestartPolicy::OnFailure;
        r.env = BTreeMap::from([("A".into(), "1".into())]);
        r.labels = BTreeMap::from([("team".into(), "a".into())]);
        r.template = Some("tmpl".into());
        r.resources = Resources {
            cpu_millis: Some(500),
            memory_bytes: Some(64 << 20),
            disk_bytes: Some(1 << 30),
            pids: Some(100),
        };
        r.ports = vec![PortRequest {
            sandbox_port: 8080,
            protocol: "tcp".into(),
        }];
        r.volumes = vec![VolumeMount {
            volume_name: "vol-a".into(),
            mount_path: "/data".into(),
            read_only: false,
        }];
        let body = create_body(&r, "127.0.0.1").unwrap();
        assert_eq!(body.entrypoint, Some(vec![String::new()]));
        assert_eq!(body.cmd.as_deref().unwrap()[2], "echo hi");
        assert_eq!(body.env, Some(vec!["A=1".to_string()]));
        let labels = body.labels.unwrap();
        assert_eq!(labels["team"], "a");
        assert_eq!(labels[labels::OWNER_UID], "1234");
        assert_eq!(labels[TEMPLATE], "tmpl");
        assert_eq!(labels[DISK_ADVISORY_LABEL], (1u64 << 30).to_string());
        let host = body.host_config.unwrap();
        assert_eq!(host.memory, Some(64 << 20));
        assert_eq!(host.memory_swap, Some(64 << 20));
        assert_eq!(host.nano_cpus, Some(500_000_000));
        assert_eq!(host.pids_limit, Some(100));
        assert_eq!(host.storage_opt, None, "disk is never passed to the engine");
        assert_eq!(
            host.restart_policy.unwrap().name,
            Some(RestartPolicyNameEnum::ON_FAILURE)
        );
        let binding = &host.port_bindings.unwrap()["8080/tcp"];
        assert_eq!(
            binding.as_ref().unwrap()[0].host_ip.as_deref(),
            Some("127.0.0.1")
        );
        assert_eq!(host.mounts.unwrap()[0].source.as_deref(), Some("vol-a"));
        assert_eq!(host.network_mode, None);
    }

    #[test]
    fn create_body_refuses_what_docker_cannot_do() {
        let mut r = request();
        r.idle_action = Some(IdleAction::Suspend);
        assert!(matches!(
            create_body(&r, "127.0.0.1"),
            Err(e) if e.is(ErrorKind::Unsupported)
        ));
        r.idle_action = Some(IdleAction::Off);
        assert!(create_body(&r, "127.0.0.1").is_ok());

        let mut r = request();
        r.allowed_domains = Some(vec![]);
        let host = create_body(&r, "127.0.0.1").unwrap().host_config.unwrap();
        assert_eq!(host.network_mode.as_deref(), Some("none"));
        r.ports = vec![PortRequest {
            sandbox_port: 80,
            protocol: "tcp".into(),
        }];
        assert!(matches!(
            create_body(&r, "127.0.0.1"),
            Err(e) if e.is(ErrorKind::Invalid)
        ));

        let mut r = request();
        r.labels = BTreeMap::from([("sandboxes.dev/owner".into(), "x".into())]);
        assert!(matches!(
            create_body(&r, "127.0.0.1"),
            Err(e) if e.is(ErrorKind::Invalid) && e.message().contains("reserved prefix")
        ));

        let mut r = request();
        r.command = Some(vec![]);
        assert!(matches!(
            create_body(&r, "127.0.0.1"),
            Err(e) if e.is(ErrorKind::Invalid)
        ));

        let mut r = request();
        r.name = "/bad name".into();
        assert!(matches!(
            create_body(&r, "127.0.0.1"),
            Err(e) if e.is(ErrorKind::Invalid)
        ));
    }

    #[test]
    fn applied_resources_read_back() {
        let host = HostConfig {
            memory: Some(128 << 20),
            nano_cpus: Some(1_500_000_000),
            pids_limit: Some(-1),
            ..Default::default()
        };
        let labels = BTreeMap::from([(DISK_ADVISORY_LABEL.to_string(), "42".to_string())]);
        let applied = applied_resources(&host, &labels);
        assert_eq!(applied.memory_bytes, Some(128 << 20));
        assert_eq!(applied.cpu_millis, Some(1500));
        assert_eq!(applied.pids, None);
        assert_eq!(applied.disk_bytes, Some(42));
        assert!(!applied.disk_enforced);
    }
}
