//! The Docker provider (bollard): the embedded default.
//!
//! Everything Docker can honestly do is offered; what it cannot (an enforced disk ceiling on
//! most storage drivers, an idle policy) is reported as such, never faked:
//!
//! - a sandbox is a container named after the request's deterministic name, carrying the
//!   owner labels; `command` replaces the image's entrypoint and command (it is the whole
//!   main process);
//! - hibernation is `docker pause` (the cgroup freezer: processes preserved), with `stop` as
//!   the fallback that is reported as such;
//! - templates are `docker commit` images tagged `<template_repository>:<template id>`, with
//!   capture paths on mounted storage copied in through the archive API (sharing them through
//!   an S3 store is the controller-side templates service's work, not the provider's);
//! - images follow Kubernetes' `imagePullPolicy`, pulled with the request's matching registry
//!   credentials, one background pull per image (see `pull`);
//! - volumes are named local volumes; `set_resources` is `docker update`;
//! - exec, exact file I/O and bulk tar transfer go through the exec and archive APIs (under
//!   gVisor, through exec only: see `execfiles`);
//! - domain egress allow-lists are enforced by an egress gateway of our own, when the settings
//!   configure one (see `egress`; without it only "unrestricted" and "none" can be honoured);
//!   capacity, egress observation and the event stream have their own modules.
//!
//! # API version
//!
//! The client starts at bollard's default API version and negotiates down to the engine's on
//! first use (Debian's Docker 20.10 serves API 1.41 at most, and refuses newer clients). The
//! negotiated version lives in the `Docker` handle shared by every clone, so it happens once
//! per provider. Code in this module reaches the engine through `DockerProvider::engine`,
//! which performs that negotiation; [`DockerProvider::connect_negotiated`] does it eagerly.

mod core;
pub mod defaults;
pub mod firewall;
mod forward;
pub mod hardening;
mod hibernation;
pub mod hostclose;
pub mod hostguard;
mod imageconfig;
mod interactive;
mod logs;
pub mod networks;
mod pull;
mod resources;
mod runtime;
mod templates;
pub mod tls;
mod volumes;

mod settings;
mod socket;

mod bulk;
mod cache;
mod capacity;
mod egress;
mod events;
mod exec;
mod execfiles;
mod files;
mod freeze;

use std::sync::Arc;

use bollard::Docker;
use tokio::sync::OnceCell;

pub use egress::{COMPONENT, COMPONENT_LABEL, EgressGatewaySettings};
pub use settings::DockerSettings;

use super::{ProviderError, ProviderResult};

/// Per-request timeout of the engine client, in seconds. Long operations (commit, archive
/// transfers) fit inside it; a hung engine cannot stall a caller for longer.
const CLIENT_TIMEOUT_SECS: u64 = 120;

/// Label on a template image: the caller's template id.
pub const TEMPLATE_ID_LABEL: &str = "sandboxes.dev/template-id";
/// Label on a template image: the capture paths it was committed with (a JSON array).
pub const CAPTURE_PATHS_LABEL: &str = "sandboxes.dev/capture-paths";
/// Label on a template image: the free-form label given at capture time.
pub const TEMPLATE_LABEL_LABEL: &str = "sandboxes.dev/template-label";
/// Label on a template image: the image the captured sandbox was created from (inherited
/// through templates of templates), for providers that boot it and restore the capture.
pub const BASE_IMAGE_LABEL: &str = "sandboxes.dev/base-image";
/// Label on a container: the requested (advisory, NOT enforced) disk ceiling in bytes.
/// Docker cannot enforce a disk ceiling on overlay2 without xfs project quotas, so the
/// request is recorded here for status, never passed to the engine.
pub const DISK_ADVISORY_LABEL: &str = "sandboxes.dev/disk-bytes";
/// Label on a container: the exact image it was created from (`repository@sha256:…`, or the
/// engine's image id for an image no registry knows), so `describe` reports it without
/// another engine call.
pub const IMAGE_DIGEST_LABEL: &str = "sandboxes.dev/image-digest";

/// A Docker engine as a sandbox provider.
#[derive(Clone)]
pub struct DockerProvider {
    /// Provider name as Sandboxes refer to it.
    pub(crate) name: String,
    pub(crate) settings: DockerSettings,
    /// The engine client. Reach it through [`DockerProvider::engine`], which negotiates the
    /// API version first; using this field directly before negotiation fails against engines
    /// older than bollard's default API version.
    pub(crate) docker: Docker,
    /// Set once the API version has been negotiated (shared by clones, like the client).
    negotiated: Arc<OnceCell<()>>,
    /// Image pulls in flight and just finished (one per image and credential), shared by
    /// clones.
    pulls: Arc<pull::Pulls>,
    /// Who keeps the host firewall, once decided (see `hardening`), shared by clones.
    firewall: Arc<OnceCell<&'static str>>,
    /// When the host firewall was last installed (see `hostguard::RECHECK_EVERY`), shared by
    /// clones.
    firewall_checked: Arc<tokio::sync::Mutex<Option<std::time::Instant>>>,
    /// The egress gateway, when the settings configure one (shared by clones).
    gateway: Option<Arc<egress::Gateway>>,
    /// The namespace networks ensured so far (shared by clones; see `networks`).
    networks: Arc<networks::Known>,
    /// Keeps exec starts and pauses of one container apart (shared by clones; see `freeze`).
    pub(crate) freeze: Arc<freeze::FreezeGate>,
}

impl DockerProvider {
    /// Builds a client for the configured engine without contacting it; the API version is
    /// negotiated on the first call (see the module docs).
    ///
    /// Fails with `Invalid` for an endpoint that cannot be used at all (a malformed
    /// address), and with `Transient` when a unix socket does not exist yet — a daemon that
    /// is still starting is not a configuration error.
    pub fn connect(name: impl Into<String>, settings: DockerSettings) -> ProviderResult<Self> {
        let version = bollard::API_DEFAULT_VERSION;
        let docker = match settings.endpoint.as_deref() {
            None => Docker::connect_with_defaults().map(|d| d.with_timeout(client_timeout())),
            Some(ep) if ep.starts_with("unix://") || ep.starts_with('/') => {
                Docker::connect_with_unix(ep, CLIENT_TIMEOUT_SECS, version)
            }
            Some(ep) => match &settings.tls {
                Some(tls) => {
                    let (key, cert, ca) = tls.paths().map_err(|field| {
                        ProviderError::invalid(format!(
                            "docker.tls.{field} must be a file (a PEM of a mounted Secret)"
                        ))
                    })?;
                    Docker::connect_with_ssl(ep, key, cert, ca, CLIENT_TIMEOUT_SECS, version)
                }
                None => Docker::connect_with_http(ep, CLIENT_TIMEOUT_SECS, version),
            },
        }
        .map_err(|e| match e {
            bollard::errors::Error::SocketNotFoundError(path) => ProviderError::transient(format!(
                "Docker socket {path} does not exist (is dockerd running?); check the provider's endpoint setting"
            )),
            other => ProviderError::invalid(format!(
                "cannot use Docker endpoint {:?}: {other}; fix the provider's endpoint setting",
                settings.endpoint
            )),
        })?;
        let pull_timeout = settings.image_pull_timeout();
        let name = name.into();
        let gateway = settings
            .egress
            .clone()
            .map(|s| Arc::new(egress::Gateway::new(&name, s)));
        Ok(DockerProvider {
            gateway,
            name,
            settings,
            docker,
            negotiated: Arc::new(OnceCell::new()),
            pulls: Arc::new(pull::Pulls::new(pull_timeout)),
            firewall: Arc::new(OnceCell::new()),
            firewall_checked: Arc::default(),
            networks: Arc::default(),
            freeze: Arc::default(),
        })
    }

    /// Like [`connect`](Self::connect), then negotiates the API version right away, so an
    /// unreachable or incompatible engine shows up at start-up instead of on the first call.
    pub async fn connect_negotiated(
        name: impl Into<String>,
        settings: DockerSettings,
    ) -> ProviderResult<Self> {
        let provider = Self::connect(name, settings)?;
        provider.engine().await?;
        Ok(provider)
    }

    /// The provider's settings.
    pub fn settings(&self) -> &DockerSettings {
        &self.settings
    }

    /// The engine client, with the API version negotiated (once per provider, retried on
    /// the next call when the engine could not be reached).
    pub(crate) async fn engine(&self) -> ProviderResult<&Docker> {
        self.negotiated
            .get_or_try_init(|| async {
                self.docker
                    .clone()
                    .negotiate_version()
                    .await
                    .map(|_| ())
                    .map_err(|e| self.map_engine_err("negotiating the Docker API version", e))
            })
            .await?;
        Ok(&self.docker)
    }

    /// The image reference a template id is stored under.
    pub(crate) fn template_image(&self, template_id: &str) -> String {
        format!("{}:{template_id}", self.settings.template_repository)
    }
}

fn client_timeout() -> std::time::Duration {
    std::time::Duration::from_secs(CLIENT_TIMEOUT_SECS)
}

/// The HTTP status of an engine error response, if it was one.
pub(crate) fn status_of(err: &bollard::errors::Error) -> Option<u16> {
    match err {
        bollard::errors::Error::DockerResponseServerError { status_code, .. } => Some(*status_code),
        _ => None,
    }
}

/// Whether an engine error says the object does not exist.
pub(crate) fn is_not_found(err: &bollard::errors::Error) -> bool {
    status_of(err) == Some(404)
}

/// Maps a bollard error to a provider error category, keeping `context` (what we were
/// doing, to what) in front of the engine's message.
pub(crate) fn map_err(context: &str, err: bollard::errors::Error) -> ProviderError {
    use bollard::errors::Error as E;
    match err {
        E::DockerResponseServerError {
            status_code,
            message,
        } => {
            let msg = format!("{context}: {message}");
            match status_code {
                404 => ProviderError::not_found(msg),
                409 => ProviderError::conflict(msg),
                400 => ProviderError::invalid(msg),
                _ => ProviderError::transient(msg),
            }
        }
        E::RequestTimeoutError => ProviderError::transient(format!(
            "{context}: the Docker engine did not answer within {CLIENT_TIMEOUT_SECS} s"
        )),
        other => ProviderError::transient(format!(
            "{context}: Docker engine unreachable or failed: {other}"
        )),
    }
}
