//! Settings of one Docker provider: the `docker:` block of a provider in the operator
//! configuration. Defaults live here and nowhere else.

use serde::{Deserialize, Serialize};
use std::sync::Arc;

use super::hardening::HardeningSettings;
use super::tls::EngineTls;
use crate::provider::{Change, Provider, ProviderKind, ProviderResult};
use crate::validation::Issues;

/// Address published ports bind to unless configured: loopback, so a sandbox is not exposed
/// to the network unless the configuration says so.
pub const DEFAULT_PUBLISH_HOST: &str = "127.0.0.1";
/// Repository committed templates are tagged into unless configured.
pub const DEFAULT_TEMPLATE_REPOSITORY: &str = "sandbox-operator/template";

/// How long one image pull may take unless configured.
pub const DEFAULT_IMAGE_PULL_TIMEOUT_SECONDS: u64 = 600;

/// Settings of a Docker provider. Every field has a default, so the block may be omitted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct DockerSettings {
    /// Engine endpoint (`unix:///var/run/docker.sock`, `tcp://host:2375`); absent = the
    /// environment's default (`DOCKER_HOST`, then the local socket).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Host address published ports bind to.
    pub publish_host: String,
    /// Image for Sandboxes that name neither an image nor a template.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_image: Option<String>,
    /// Repository committed templates are tagged into (`<repository>:<template id>`).
    pub template_repository: String,
    /// Longest time one image pull may take before it is abandoned (and retried by the next
    /// create, with backoff).
    pub image_pull_timeout_seconds: u64,
    /// Hardened defaults of every sandbox and the host firewall (see `hardening`).
    pub hardening: HardeningSettings,
    /// OCI runtime every sandbox of this provider runs under, as registered with the engine
    /// (`runsc` for gVisor); absent = the engine's default runtime.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
    /// Mutual TLS with a `tcp://` engine (see `tls`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<EngineTls>,
    /// Allows a `tcp://` endpoint without TLS (plain HTTP): only on a trusted network.
    pub allow_plain_tcp: bool,
    /// The egress gateway that enforces domain allow-lists; absent = non-empty allow-lists
    /// are refused (see the `egress` module).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub egress: Option<super::EgressGatewaySettings>,
    /// CPU and memory ceilings of a sandbox whose spec is silent, and the log cap of every
    /// sandbox (see `defaults`).
    pub defaults: super::defaults::SandboxDefaults,
}

impl Default for DockerSettings {
    fn default() -> Self {
        DockerSettings {
            endpoint: None,
            publish_host: DEFAULT_PUBLISH_HOST.into(),
            default_image: None,
            template_repository: DEFAULT_TEMPLATE_REPOSITORY.into(),
            image_pull_timeout_seconds: DEFAULT_IMAGE_PULL_TIMEOUT_SECONDS,
            hardening: HardeningSettings::default(),
            runtime: None,
            tls: None,
            allow_plain_tcp: false,
            egress: None,
            defaults: super::defaults::SandboxDefaults::default(),
        }
    }
}

impl DockerSettings {
    /// [`Self::image_pull_timeout_seconds`] as a duration.
    pub fn image_pull_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.image_pull_timeout_seconds)
    }

    /// Reports every setting that cannot work, under `at` (e.g. `providers[0].docker`).
    pub fn validate(&self, at: &str, issues: &mut Issues) {
        if self.publish_host.parse::<std::net::IpAddr>().is_err() {
            issues.push(
                format!("{at}.publishHost"),
                format!(
                    "`{}` is not an IP address; use one such as `127.0.0.1` (loopback only) or \
                     `0.0.0.0` (all interfaces)",
                    self.publish_host
                ),
            );
        }
        if let Some(endpoint) = &self.endpoint {
            let ok = ["unix://", "tcp://", "http://", "https://", "npipe://"]
                .iter()
                .any(|scheme| endpoint.starts_with(scheme));
            if !ok {
                issues.push(
                    format!("{at}.endpoint"),
                    format!(
                        "`{endpoint}` has no known scheme; use `unix:///var/run/docker.sock` or \
                         `tcp://HOST:PORT`, or remove it for the default"
                    ),
                );
            }
        }
        if self.image_pull_timeout_seconds == 0 {
            issues.push(
                format!("{at}.imagePullTimeoutSeconds"),
                format!(
                    "must be at least 1; remove it for the default {DEFAULT_IMAGE_PULL_TIMEOUT_SECONDS}"
                ),
            );
        }
        super::tls::validate(
            self.endpoint.as_deref(),
            self.tls.as_ref(),
            self.allow_plain_tcp,
            at,
            issues,
        );
        self.hardening.validate(&format!("{at}.hardening"), issues);
        super::runtime::validate(self.runtime.as_deref(), &format!("{at}.runtime"), issues);
        if let Some(egress) = &self.egress {
            egress.validate(&format!("{at}.egress"), issues);
        }
        self.defaults.validate(&format!("{at}.defaults"), issues);
        if self.template_repository.trim().is_empty() {
            issues.push(
                format!("{at}.templateRepository"),
                format!(
                    "is empty; remove it for the default `{DEFAULT_TEMPLATE_REPOSITORY}` or name \
                     a local repository"
                ),
            );
        }
    }
}

/// Registered in [`factory`](crate::provider::factory).
#[async_trait::async_trait]
impl ProviderKind for DockerSettings {
    fn without_block() -> Result<Self, &'static str> {
        Ok(Self::default())
    }

    fn check(&self, at: &str, issues: &mut Issues) {
        self.validate(at, issues);
    }

    fn echo_words(change: Change) -> &'static [&'static str] {
        super::events::echo_words(change)
    }

    fn open_template_store(&mut self, endpoint: &str) {
        self.hardening.open_template_store(endpoint);
    }

    /// Installs the host firewall at start-up already (a failure is logged here and refuses
    /// each create until it succeeds), so no create pays for it.
    async fn build(&self, name: &str) -> ProviderResult<Arc<dyn Provider>> {
        let provider = super::DockerProvider::connect_negotiated(name, self.clone()).await?;
        if let Err(e) = provider.isolation_profile().await {
            tracing::warn!(provider = %name, error = %e, "host firewall not installed yet");
        }
        Ok(Arc::new(provider))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_absent_block_and_an_empty_one_mean_the_defaults() {
        let empty: DockerSettings = serde_yaml::from_str("{}").unwrap();
        assert_eq!(empty, DockerSettings::default());
        assert_eq!(empty.publish_host, "127.0.0.1");
        assert_eq!(empty.template_repository, "sandbox-operator/template");
    }

    #[test]
    fn validation_names_each_bad_field() {
        let bad = DockerSettings {
            publish_host: "localhost".into(),
            endpoint: Some("docker.sock".into()),
            template_repository: " ".into(),
            ..DockerSettings::default()
        };
        let mut issues = Issues::default();
        bad.validate("providers[0].docker", &mut issues);
        let paths: Vec<&str> = issues.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(
            paths,
            [
                "providers[0].docker.publishHost",
                "providers[0].docker.endpoint",
                "providers[0].docker.templateRepository"
            ]
        );
    }
}
