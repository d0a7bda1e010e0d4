//! The Docker provider (bollard): the embedded default.
//!
//! Everything Docker can honestly do is offered; what it cannot (domain egress filtering,
//! an enforced disk ceiling on most storage drivers) is reported as such, never faked.

use bollard::Docker;

use super::{ProviderError, ProviderResult};

/// Settings of one Docker provider instance.
#[derive(Debug, Clone)]
pub struct DockerConfig {
    /// Provider name as Sandboxes refer to it.
    pub name: String,
    /// Engine endpoint: `unix:///var/run/docker.sock`, `tcp://host:port`, or `None` for the
    /// environment's default (`DOCKER_HOST`, then the local socket).
    pub endpoint: Option<String>,
    /// Address published ports bind to. `127.0.0.1` by default: a sandbox is not exposed to
    /// the network unless the operator's configuration says so.
    pub publish_host: String,
    /// Image used when a Sandbox names neither an image nor a template.
    pub default_image: Option<String>,
    /// Repository committed templates are tagged into (`<repository>:<template id>`).
    pub template_repository: String,
}

impl Default for DockerConfig {
    fn default() -> Self {
        DockerConfig {
            name: "docker".into(),
            endpoint: None,
            publish_host: "127.0.0.1".into(),
            default_image: None,
            template_repository: "sandbox-operator/template".into(),
        }
    }
}

/// A Docker engine as a sandbox provider.
#[derive(Clone)]
pub struct DockerProvider {
    pub(crate) config: DockerConfig,
    pub(crate) docker: Docker,
}

impl DockerProvider {
    /// Connects (lazily: no request is made here) to the configured engine.
    pub fn connect(config: DockerConfig) -> ProviderResult<Self> {
        let docker = match config.endpoint.as_deref() {
            None => Docker::connect_with_defaults(),
            Some(ep) if ep.starts_with("unix://") || ep.starts_with('/') => {
                Docker::connect_with_unix(ep, 120, bollard::API_DEFAULT_VERSION)
            }
            Some(ep) => Docker::connect_with_http(ep, 120, bollard::API_DEFAULT_VERSION),
        }
        .map_err(|e| {
            ProviderError::Invalid(format!(
                "cannot use Docker endpoint {:?}: {e}; fix the provider's endpoint setting",
                config.endpoint
            ))
        })?;
        Ok(DockerProvider { config, docker })
    }

    /// The provider's settings.
    pub fn config(&self) -> &DockerConfig {
        &self.config
    }
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
                404 => ProviderError::NotFound(msg),
                409 => ProviderError::Conflict(msg),
                400 => ProviderError::Invalid(msg),
                _ => ProviderError::Transient(msg),
            }
        }
        other => ProviderError::Transient(format!("{context}: Docker engine unreachable or failed: {other}")),
    }
}
