//! The operator configuration file.
//!
//! One YAML file (rendered by the Helm chart from its values) says which providers exist, which
//! S3 template stores they use, how the sweeper behaves and which operator *instance* this is.
//! The instance name becomes the `sandboxes.dev/managed-by` label value, so two operators in one
//! cluster never touch each other's provider resources.
//!
//! Secrets are never written into the file: a [`SecretSource`] names an environment variable or
//! a file (a mounted Secret), and is resolved only when a provider is built. Errors name the
//! variable or the file, never the value.
//!
//! Keys are camelCase and unknown keys are refused (`deny_unknown_fields`), so a typo such as
//! `intervalSec` fails at startup with the misspelled key and its location instead of silently
//! falling back to a default.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use crate::provider::{ProviderConfig, ProviderType};
pub use crate::secret::{SecretError, SecretSource};
use crate::validation::{Issue, Issues, check_dns_label, check_url, format_issues, list_or_none};

/// Environment variable that overrides [`OperatorConfig::instance`] (handy for a second
/// operator in the same cluster without a second configuration file).
pub const ENV_INSTANCE: &str = "SANDBOX_OPERATOR_INSTANCE";

/// Name of the provider used when no configuration file is given.
pub const DEFAULT_PROVIDER_NAME: &str = "docker";

/// Everything that can go wrong while loading the configuration or resolving a secret.
///
/// Messages name the file, field path, environment variable or secret file involved and say
/// how to fix it. They never contain a secret value.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The configuration file could not be read.
    #[error("cannot read operator configuration file {}: {source}", path.display())]
    Read {
        /// The file that was asked for.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not valid YAML or does not match the schema (unknown key, wrong type …).
    #[error("operator configuration file {}: {message}", path.display())]
    Parse {
        /// The file being parsed.
        path: PathBuf,
        /// Parser message, including the field path and line/column where known.
        message: String,
    },
    /// The file parsed but its content is inconsistent; every problem found is listed.
    #[error("operator configuration is invalid:{}", format_issues(.0))]
    Invalid(Vec<Issue>),
    /// A secret reference could not be resolved.
    #[error(transparent)]
    Secret(#[from] SecretError),
}

/// The whole operator configuration (the file's top level).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct OperatorConfig {
    /// Name of this operator instance; the value of the `sandboxes.dev/managed-by` label on
    /// every provider resource it creates and the only label value its sweeper will touch.
    /// Must be a DNS-1123 label (it is also part of the leader-election Lease name).
    pub instance: String,
    /// Provider used by Sandboxes that do not name one. When absent and exactly one provider
    /// is configured, that one is the default; see [`OperatorConfig::default_provider_name`].
    pub default_provider: Option<String>,
    /// The configured providers, by unique name.
    pub providers: Vec<ProviderConfig>,
    /// S3-compatible template stores that providers may reference by name.
    pub template_stores: Vec<TemplateStoreConfig>,
    /// Reclaiming of provider resources that no object owns any more.
    pub sweeper: SweeperConfig,
    /// Safety-net resync period in seconds (jittered by ±10 %). Drift is noticed through
    /// provider events; this only bounds how long a missed event can go unnoticed.
    pub resync_secs: u64,
    /// Maximum concurrent calls into one provider, so one slow provider never stalls others.
    /// The operator's own upkeep takes at most three quarters of them (`registry::limit`).
    pub provider_concurrency: usize,
    /// Timeout in seconds for any single provider call.
    pub provider_timeout_secs: u64,
    /// Images every namespace may boot from a provider's shared image cache without proving
    /// it could pull them (see `controller::sandbox::images`): references, or prefixes ending
    /// in `*`. Default: the base image ([`DEFAULT_OPEN_IMAGES`]).
    pub open_images: Vec<String>,
    /// The aggregated API (`subresources.sandboxes.dev`): off unless enabled.
    pub access: crate::access::AccessConfig,
    /// The E2B-compatible API (`e2bApi:`): off unless enabled.
    pub e2b_api: crate::e2bapi::E2bApiConfig,
    /// Set when `instance` came from [`ENV_INSTANCE`], so validation messages point there.
    #[serde(skip)]
    instance_from_env: bool,
}

/// The default `openImages`: the base image every install builds or loads.
pub const DEFAULT_OPEN_IMAGES: &[&str] = &["sandbox-operator/base:bookworm"];

/// [`DEFAULT_OPEN_IMAGES`], owned.
pub fn default_open_images() -> Vec<String> {
    DEFAULT_OPEN_IMAGES.iter().map(|s| s.to_string()).collect()
}

impl Default for OperatorConfig {
    fn default() -> Self {
        OperatorConfig {
            instance: "default".into(),
            default_provider: None,
            providers: Vec::new(),
            template_stores: Vec::new(),
            sweeper: SweeperConfig::default(),
            resync_secs: 600,
            provider_concurrency: 16,
            provider_timeout_secs: 120,
            open_images: default_open_images(),
            access: crate::access::AccessConfig::default(),
            e2b_api: crate::e2bapi::E2bApiConfig::default(),
            instance_from_env: false,
        }
    }
}

/// One S3-compatible template store (see the template-archive scheme in the design).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TemplateStoreConfig {
    /// Name providers use in `templateStore` (DNS-1123 label).
    pub name: String,
    /// Bucket name.
    pub bucket: String,
    /// Endpoint URL for non-AWS S3 (MinIO, R2 …); absent = AWS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Region; absent = the SDK's default chain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// Key prefix inside the bucket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// Path-style addressing (most self-hosted S3 servers need it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_style: Option<bool>,
    /// Access key id (by reference); absent together with `secretAccessKey` = the SDK's
    /// default credential chain (IRSA, instance profile, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_key_id: Option<SecretSource>,
    /// Secret access key (by reference).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_access_key: Option<SecretSource>,
    /// Session token for temporary credentials (by reference).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_token: Option<SecretSource>,
}

/// Sweeper policy: how the leader reclaims provider resources no object owns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct SweeperConfig {
    /// Run the periodic sweeper at all.
    pub enabled: bool,
    /// Seconds between passes.
    pub interval_secs: u64,
    /// Minimum age in seconds before an orphan or never-started resource is destroyed; keeps
    /// the sweeper away from resources whose create is still in flight.
    pub grace_secs: u64,
    /// Report what would be deleted, delete nothing.
    pub dry_run: bool,
    /// Upper bound on deletions in one pass; a pass that would exceed it stops there, so a
    /// bug or a wrong picture cannot wipe a provider.
    pub max_deletions_per_pass: usize,
}

impl Default for SweeperConfig {
    fn default() -> Self {
        SweeperConfig {
            enabled: true,
            interval_secs: 300,
            grace_secs: 600,
            dry_run: false,
            max_deletions_per_pass: 50,
        }
    }
}

impl SweeperConfig {
    /// Time between passes.
    pub fn interval(&self) -> Duration {
        Duration::from_secs(self.interval_secs)
    }

    /// Minimum age before deletion.
    pub fn grace(&self) -> Duration {
        Duration::from_secs(self.grace_secs)
    }
}

impl OperatorConfig {
    /// The configuration used when no file is given: instance `default`, one Docker provider
    /// named `docker` (the embedded default) which is also the default provider.
    pub fn builtin() -> Self {
        OperatorConfig {
            default_provider: Some(DEFAULT_PROVIDER_NAME.into()),
            providers: vec![ProviderConfig::docker_default(DEFAULT_PROVIDER_NAME)],
            ..OperatorConfig::default()
        }
    }

    /// Load the configuration: parse `path` (or take [`builtin`](Self::builtin) when `None`),
    /// apply environment overrides ([`ENV_INSTANCE`]) and [`validate`](Self::validate).
    pub fn load(path: Option<&Path>) -> Result<OperatorConfig, ConfigError> {
        let mut config = match path {
            None => OperatorConfig::builtin(),
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    path: path.to_path_buf(),
                    source,
                })?;
                OperatorConfig::parse(&text).map_err(|message| ConfigError::Parse {
                    path: path.to_path_buf(),
                    message,
                })?
            }
        };
        config.apply_env(|name| std::env::var(name).ok());
        config.validate()?;
        Ok(config)
    }

    /// Parse YAML text without validating. An empty document yields the defaults (with no
    /// providers, which [`validate`](Self::validate) then rejects).
    pub fn from_yaml(text: &str) -> Result<OperatorConfig, ConfigError> {
        OperatorConfig::parse(text).map_err(|message| ConfigError::Parse {
            path: PathBuf::from("<inline>"),
            message,
        })
    }

    fn parse(text: &str) -> Result<OperatorConfig, String> {
        if text.trim().is_empty() {
            return Ok(OperatorConfig::default());
        }
        serde_yaml::from_str(text).map_err(|e| e.to_string())
    }

    /// Apply environment overrides, reading variables through `lookup` (testable without
    /// touching the process environment).
    pub fn apply_env(&mut self, lookup: impl Fn(&str) -> Option<String>) {
        if let Some(instance) = lookup(ENV_INSTANCE) {
            self.instance = instance;
            self.instance_from_env = true;
        }
    }

    /// Check internal consistency. Every problem is reported at once, each with its field
    /// path and a fix.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut issues = Issues::default();
        self.check_instance(&mut issues);
        self.check_providers(&mut issues);
        self.check_default_provider(&mut issues);
        for (i, store) in self.template_stores.iter().enumerate() {
            check_template_store(store, &format!("templateStores[{i}]"), &mut issues);
        }
        check_unique(
            self.template_stores.iter().map(|s| s.name.as_str()),
            "templateStores",
            "template store",
            &mut issues,
        );
        self.check_timing(&mut issues);
        for (i, entry) in self.open_images.iter().enumerate() {
            if let Err(why) = crate::provider::image::check_open_image(entry) {
                issues.push(format!("openImages[{i}]"), why);
            }
        }
        if issues.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid(issues.into_vec()))
        }
    }

    /// `instance` is a DNS label (it names the managed-by label value and the Lease).
    fn check_instance(&self, issues: &mut Issues) {
        let instance_path = if self.instance_from_env {
            format!("instance (from {ENV_INSTANCE})")
        } else {
            "instance".to_string()
        };
        if let Err(why) = check_dns_label(&self.instance) {
            issues.push(
                instance_path,
                format!(
                    "{why}; it becomes the `sandboxes.dev/managed-by` label value and part of the \
                     leader Lease name, so use lowercase letters, digits and '-' (e.g. `default`)"
                ),
            );
        }
    }

    /// At least one provider; each named by a unique DNS label, with the settings block of
    /// its type (checked by the provider's own rules) and a known template store.
    fn check_providers(&self, issues: &mut Issues) {
        if self.providers.is_empty() {
            issues.push(
                "providers",
                "no provider is configured; add at least one, e.g. \
                 `providers: [{name: docker, type: docker}]`",
            );
        }
        let store_names: BTreeSet<&str> = self
            .template_stores
            .iter()
            .map(|s| s.name.as_str())
            .collect();
        for (i, p) in self.providers.iter().enumerate() {
            let at = format!("providers[{i}]");
            if let Err(why) = check_dns_label(&p.name) {
                issues.push(
                    format!("{at}.name"),
                    format!("{why}; Sandboxes refer to providers by this name"),
                );
            }
            p.check(&at, issues);
            if let Some(store) = &p.template_store
                && !store_names.contains(store.as_str())
            {
                issues.push(
                    format!("{at}.templateStore"),
                    format!(
                        "unknown template store `{store}`; define it under `templateStores` or \
                         remove this field (known: {})",
                        list_or_none(store_names.iter().copied())
                    ),
                );
            }
        }
        check_unique(
            self.providers.iter().map(|p| p.name.as_str()),
            "providers",
            "provider",
            issues,
        );
    }

    /// `defaultProvider`, when set, names a configured provider.
    fn check_default_provider(&self, issues: &mut Issues) {
        if let Some(default) = &self.default_provider
            && !self.providers.iter().any(|p| &p.name == default)
        {
            issues.push(
                "defaultProvider",
                format!(
                    "unknown provider `{default}`; name one of the configured providers ({}) or \
                     remove `defaultProvider`",
                    list_or_none(self.providers.iter().map(|p| p.name.as_str()))
                ),
            );
        }
    }

    /// Periods, bounds and the sweeper's policy are positive.
    fn check_timing(&self, issues: &mut Issues) {
        if self.resync_secs == 0 {
            issues.push(
                "resyncSecs",
                "must be greater than 0; the default is 600 (10 minutes)",
            );
        }
        if self.provider_concurrency == 0 {
            issues.push(
                "providerConcurrency",
                "must be greater than 0 (0 would block every provider call); the default is 16",
            );
        }
        if self.provider_timeout_secs == 0 {
            issues.push(
                "providerTimeoutSecs",
                "must be greater than 0; the default is 120",
            );
        }
        let sw = &self.sweeper;
        if !sw.enabled {
            return;
        }
        if sw.interval_secs == 0 {
            issues.push(
                "sweeper.intervalSecs",
                "must be greater than 0 (the default is 300); to turn the sweeper off set \
                 `sweeper.enabled: false`",
            );
        }
        if sw.max_deletions_per_pass == 0 {
            issues.push(
                "sweeper.maxDeletionsPerPass",
                "must be greater than 0 (the default is 50); to only report set \
                 `sweeper.dryRun: true`, to turn the sweeper off set `sweeper.enabled: false`",
            );
        }
    }

    /// The provider a Sandbox without `spec.provider` uses: `defaultProvider`, else the only
    /// configured provider, else none (Sandboxes must then name one).
    pub fn default_provider_name(&self) -> Option<&str> {
        match (&self.default_provider, self.providers.as_slice()) {
            (Some(name), _) => Some(name.as_str()),
            (None, [only]) => Some(only.name.as_str()),
            _ => None,
        }
    }

    /// Look up a provider by name.
    pub fn provider(&self, name: &str) -> Option<&ProviderConfig> {
        self.providers.iter().find(|p| p.name == name)
    }

    /// Look up a template store by name.
    pub fn template_store(&self, name: &str) -> Option<&TemplateStoreConfig> {
        self.template_stores.iter().find(|s| s.name == name)
    }

    /// The unjittered resync period.
    pub fn resync(&self) -> Duration {
        Duration::from_secs(self.resync_secs)
    }

    /// A resync period drawn uniformly from ±10 % around [`resync`](Self::resync); call it
    /// per scheduling so objects spread out instead of resyncing together.
    pub fn jittered_resync(&self) -> Duration {
        crate::jitter::random(self.resync())
    }

    /// Timeout for one provider call.
    pub fn provider_timeout(&self) -> Duration {
        Duration::from_secs(self.provider_timeout_secs)
    }

    /// Resolve every secret reference now and report all that fail (names only). Lets `run`
    /// fail at startup instead of at the first reconcile that needs a credential.
    pub fn check_secrets(&self) -> Result<(), Vec<SecretError>> {
        let mut errors = Vec::new();
        let mut check = |src: &SecretSource, field: String| {
            if let Err(e) = src.resolve_for(&field) {
                errors.push(e);
            }
        };
        for (i, p) in self.providers.iter().enumerate() {
            let Ok(settings) = p.settings() else {
                continue; // a missing block is a validation issue, not a secret's
            };
            for (key, src) in settings.kind().secrets() {
                check(src, format!("providers[{i}].{}.{key}", p.type_));
            }
        }
        for (i, s) in self.template_stores.iter().enumerate() {
            for (key, src) in [
                ("accessKeyId", &s.access_key_id),
                ("secretAccessKey", &s.secret_access_key),
                ("sessionToken", &s.session_token),
            ] {
                if let Some(src) = src {
                    check(src, format!("templateStores[{i}].{key}"));
                }
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }
}

/// Names are unique within `list`: each repeat is reported at its own index.
fn check_unique<'a>(
    names: impl Iterator<Item = &'a str>,
    list: &str,
    what: &str,
    issues: &mut Issues,
) {
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, name) in names.enumerate() {
        if let Some(first) = seen.insert(name, i) {
            issues.push(
                format!("{list}[{i}].name"),
                format!(
                    "duplicate {what} name `{name}` (also {list}[{first}]); give each {what} a \
                     unique name"
                ),
            );
        }
    }
}

/// One template store: a DNS-label name, a bucket, a URL endpoint, and credentials given
/// whole (both keys or neither; a session token only with them).
fn check_template_store(s: &TemplateStoreConfig, at: &str, issues: &mut Issues) {
    if let Err(why) = check_dns_label(&s.name) {
        issues.push(
            format!("{at}.name"),
            format!("{why}; providers refer to stores by this name"),
        );
    }
    if s.bucket.trim().is_empty() {
        issues.push(format!("{at}.bucket"), "is empty; set the bucket name");
    }
    if let Some(endpoint) = &s.endpoint {
        check_url(endpoint, &format!("{at}.endpoint"), issues);
    }
    match (&s.access_key_id, &s.secret_access_key) {
        (Some(_), None) => issues.push(
            format!("{at}.secretAccessKey"),
            "missing while `accessKeyId` is set; set both or neither (neither = the SDK's \
             default credential chain)",
        ),
        (None, Some(_)) => issues.push(
            format!("{at}.accessKeyId"),
            "missing while `secretAccessKey` is set; set both or neither",
        ),
        _ => {}
    }
    if s.session_token.is_some() && s.access_key_id.is_none() {
        issues.push(
            format!("{at}.sessionToken"),
            "only makes sense with `accessKeyId` and `secretAccessKey`; add them or remove it",
        );
    }
    for (key, src) in [
        ("accessKeyId", &s.access_key_id),
        ("secretAccessKey", &s.secret_access_key),
        ("sessionToken", &s.session_token),
    ] {
        if let Some(src) = src {
            src.validate(&format!("{at}.{key}"), issues);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kubernetes_provider_needs_no_block_and_its_settings_are_checked() {
        let ok: OperatorConfig =
            serde_yaml::from_str("providers:\n  - name: pods\n    type: kubernetes\n").unwrap();
        assert!(ok.validate().is_ok());
        match ok.providers[0].settings() {
            Ok(crate::provider::ProviderSettings::Kubernetes(k)) => {
                assert_eq!(k.namespace, "sandboxes")
            }
            other => panic!("{other:?}"),
        }
        let bad: OperatorConfig = serde_yaml::from_str(
            "providers:\n  - name: pods\n    type: kubernetes\n    kubernetes:\n      namespace: Bad_NS\n  - name: d\n    type: docker\n    kubernetes: {}\n",
        )
        .unwrap();
        let paths: Vec<String> = invalid(&bad).into_iter().map(|i| i.path).collect();
        assert!(
            paths.contains(&"providers[0].kubernetes.namespace".to_string()),
            "{paths:?}"
        );
        assert!(
            paths.contains(&"providers[1].kubernetes".to_string()),
            "{paths:?}"
        );
    }

    fn invalid(config: &OperatorConfig) -> Vec<Issue> {
        match config.validate() {
            Err(ConfigError::Invalid(issues)) => issues,
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    fn parse_ok(yaml: &str) -> OperatorConfig {
        OperatorConfig::from_yaml(yaml).unwrap()
    }

    fn has_issue(issues: &[Issue], path: &str, needle: &str) -> bool {
        issues
            .iter()
            .any(|i| i.path == path && i.message.contains(needle))
    }

    const FULL: &str = r#"
instance: team-a
defaultProvider: fly-eu
resyncSecs: 900
providerConcurrency: 8
providerTimeoutSecs: 60
providers:
  - name: local
    type: docker
    docker:
      endpoint: unix:///var/run/docker.sock
      publishHost: 0.0.0.0
      defaultImage: sandbox-base:bookworm
      templateRepository: registry.local/templates
  - name: fly-eu
    type: fly
    templateStore: s3
    fly:
      org: acme
      app: acme-sbx
      token: { env: FLY_API_TOKEN }
  - name: e2b
    type: e2b
    e2b:
      apiKey: { file: /var/run/secrets/e2b/api-key }
      template: base
templateStores:
  - name: s3
    bucket: templates
    endpoint: http://minio:9000
    region: us-east-1
    prefix: sandbox-templates/
    pathStyle: true
    accessKeyId: { env: S3_ACCESS_KEY_ID }
    secretAccessKey: { file: /var/run/secrets/s3/secret }
sweeper:
  enabled: true
  intervalSecs: 120
  graceSecs: 900
  dryRun: true
  maxDeletionsPerPass: 10
"#;

    #[test]
    fn full_file_parses_and_validates() {
        let c = parse_ok(FULL);
        c.validate().unwrap();
        assert_eq!(c.instance, "team-a");
        assert_eq!(c.default_provider_name(), Some("fly-eu"));
        assert_eq!(c.resync(), Duration::from_secs(900));
        assert_eq!(c.provider_concurrency, 8);
        assert_eq!(c.provider_timeout(), Duration::from_secs(60));
        let local = c.provider("local").unwrap();
        assert_eq!(local.type_, ProviderType::Docker);
        assert_eq!(
            local.docker.clone().unwrap_or_default().publish_host,
            "0.0.0.0"
        );
        let fly = c.provider("fly-eu").unwrap().fly.as_ref().unwrap();
        assert_eq!(fly.api_url, crate::provider::fly::DEFAULT_API_URL);
        assert_eq!(fly.token, SecretSource::env("FLY_API_TOKEN"));
        let e2b = c.provider("e2b").unwrap().e2b.as_ref().unwrap();
        assert_eq!(e2b.api_url, crate::provider::e2b::DEFAULT_API_URL);
        assert_eq!(e2b.template.as_deref(), Some("base"));
        let store = c.template_store("s3").unwrap();
        assert_eq!(store.path_style, Some(true));
        assert_eq!(store.session_token, None);
        assert!(c.sweeper.dry_run);
        assert_eq!(c.sweeper.max_deletions_per_pass, 10);
        assert_eq!(c.sweeper.interval(), Duration::from_secs(120));
    }

    #[test]
    fn serialisation_round_trips() {
        let c = parse_ok(FULL);
        let text = serde_yaml::to_string(&c).unwrap();
        assert_eq!(parse_ok(&text), c);
    }

    #[test]
    fn absent_path_gives_builtin_docker_default() {
        let c = OperatorConfig::builtin();
        c.validate().unwrap();
        assert_eq!(c.instance, "default");
        assert_eq!(c.providers.len(), 1);
        assert_eq!(c.providers[0].name, "docker");
        assert_eq!(c.providers[0].type_, ProviderType::Docker);
        assert_eq!(c.default_provider_name(), Some("docker"));
        assert_eq!(
            c.providers[0]
                .docker
                .clone()
                .unwrap_or_default()
                .publish_host,
            "127.0.0.1"
        );
        assert_eq!(c.resync(), Duration::from_secs(600));
        assert_eq!(c.provider_concurrency, 16);
        assert_eq!(c.provider_timeout_secs, 120);
        assert_eq!(c.sweeper, SweeperConfig::default());
        assert!(c.sweeper.enabled);
        assert_eq!(c.sweeper.interval_secs, 300);
        assert_eq!(c.sweeper.grace_secs, 600);
        assert!(!c.sweeper.dry_run);
        assert_eq!(c.sweeper.max_deletions_per_pass, 50);
    }

    #[test]
    fn minimal_file_takes_defaults_and_sole_provider_is_default() {
        let c = parse_ok("providers: [{name: docker, type: docker}]\n");
        c.validate().unwrap();
        assert_eq!(c.instance, "default");
        assert_eq!(c.default_provider, None);
        assert_eq!(c.default_provider_name(), Some("docker"));
        assert_eq!(c.sweeper, SweeperConfig::default());
    }

    #[test]
    fn no_default_when_several_providers_and_none_named() {
        let c = parse_ok("providers: [{name: a, type: docker}, {name: b, type: docker}]\n");
        c.validate().unwrap();
        assert_eq!(c.default_provider_name(), None);
    }

    #[test]
    fn load_reads_file_and_reports_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.yaml");
        std::fs::write(
            &path,
            "instance: from-file\nproviders: [{name: d, type: docker}]\n",
        )
        .unwrap();
        let c = OperatorConfig::load(Some(&path)).unwrap();
        // SANDBOX_OPERATOR_INSTANCE is not set by the test harness.
        if std::env::var_os(ENV_INSTANCE).is_none() {
            assert_eq!(c.instance, "from-file");
        }

        let missing = dir.path().join("nope.yaml");
        let err = OperatorConfig::load(Some(&missing))
            .unwrap_err()
            .to_string();
        assert!(err.contains("nope.yaml"), "{err}");

        std::fs::write(
            &path,
            "providers: [{name: d, type: docker}]\nsweeper: {intervalSec: 5}\n",
        )
        .unwrap();
        let err = OperatorConfig::load(Some(&path)).unwrap_err().to_string();
        assert!(err.contains("config.yaml"), "{err}");
        assert!(err.contains("intervalSec"), "{err}");
    }

    #[test]
    fn unknown_fields_are_named_with_their_location() {
        for (yaml, key, place) in [
            ("instanse: x\n", "instanse", ""),
            (
                "providers:\n  - name: d\n    type: docker\n    docker:\n      endpont: unix:///x\n",
                "endpont",
                "providers[0].docker",
            ),
            ("sweeper:\n  intervalSec: 5\n", "intervalSec", "sweeper"),
            (
                "providers:\n  - name: f\n    type: fly\n    fly: {org: o, app: p, token: {env: T, value: leaked}}\n",
                "value",
                "providers[0].fly.token",
            ),
        ] {
            let err = OperatorConfig::from_yaml(yaml).unwrap_err().to_string();
            assert!(err.contains(&format!("unknown field `{key}`")), "{err}");
            assert!(err.contains(place), "{place} not in: {err}");
            assert!(err.contains("line"), "no location in: {err}");
        }
    }

    #[test]
    fn unknown_provider_type_is_rejected() {
        let err = OperatorConfig::from_yaml("providers: [{name: k, type: kubevirt}]\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("kubevirt"), "{err}");
        assert!(err.contains("docker"), "{err}");
    }

    #[test]
    fn unknown_default_provider() {
        let c = parse_ok("defaultProvider: dokcer\nproviders: [{name: docker, type: docker}]\n");
        let issues = invalid(&c);
        assert!(
            has_issue(&issues, "defaultProvider", "unknown provider `dokcer`"),
            "{issues:?}"
        );
        assert!(
            has_issue(&issues, "defaultProvider", "`docker`"),
            "{issues:?}"
        );
    }

    #[test]
    fn duplicate_provider_names() {
        let c = parse_ok("providers: [{name: d, type: docker}, {name: d, type: docker}]\n");
        let issues = invalid(&c);
        assert!(
            has_issue(&issues, "providers[1].name", "duplicate provider name `d`"),
            "{issues:?}"
        );
        assert!(has_issue(&issues, "providers[1].name", "providers[0]"));
    }

    #[test]
    fn provider_type_without_its_settings_block() {
        let c = parse_ok("providers: [{name: f, type: fly}, {name: e, type: e2b}]\n");
        let issues = invalid(&c);
        assert!(
            has_issue(&issues, "providers[0].fly", "missing"),
            "{issues:?}"
        );
        assert!(
            has_issue(&issues, "providers[0].fly", "token"),
            "{issues:?}"
        );
        assert!(
            has_issue(&issues, "providers[1].e2b", "apiKey"),
            "{issues:?}"
        );
    }

    #[test]
    fn settings_block_for_another_type() {
        let c =
            parse_ok("providers:\n  - name: d\n    type: docker\n    e2b: {apiKey: {env: K}}\n");
        let issues = invalid(&c);
        assert!(
            has_issue(
                &issues,
                "providers[0].e2b",
                "remove this block or set `type: e2b`"
            ),
            "{issues:?}"
        );
    }

    #[test]
    fn zero_values_are_rejected_with_the_fix() {
        let c = parse_ok(
            "providers: [{name: d, type: docker}]\nresyncSecs: 0\nproviderConcurrency: 0\n\
             providerTimeoutSecs: 0\nsweeper: {intervalSecs: 0, maxDeletionsPerPass: 0}\n",
        );
        let issues = invalid(&c);
        assert!(has_issue(&issues, "resyncSecs", "greater than 0"));
        assert!(has_issue(&issues, "providerConcurrency", "greater than 0"));
        assert!(has_issue(&issues, "providerTimeoutSecs", "greater than 0"));
        assert!(has_issue(
            &issues,
            "sweeper.intervalSecs",
            "sweeper.enabled: false"
        ));
        assert!(has_issue(&issues, "sweeper.maxDeletionsPerPass", "dryRun"));
        assert_eq!(issues.len(), 5, "{issues:?}");

        // A disabled sweeper's interval does not matter.
        let c = parse_ok(
            "providers: [{name: d, type: docker}]\nsweeper: {enabled: false, intervalSecs: 0}\n",
        );
        c.validate().unwrap();
    }

    #[test]
    fn empty_file_has_no_provider() {
        let c = parse_ok("");
        let issues = invalid(&c);
        assert!(
            has_issue(&issues, "providers", "at least one"),
            "{issues:?}"
        );
    }

    #[test]
    fn names_must_be_dns_labels() {
        let c = parse_ok(
            "instance: Team_A\nproviders: [{name: My Docker, type: docker}]\n\
             templateStores: [{name: S3, bucket: b}]\n",
        );
        let issues = invalid(&c);
        assert!(has_issue(&issues, "instance", "DNS-1123"), "{issues:?}");
        assert!(has_issue(&issues, "providers[0].name", "DNS-1123"));
        assert!(has_issue(&issues, "templateStores[0].name", "DNS-1123"));
    }

    #[test]
    fn template_store_references_and_credentials() {
        let c = parse_ok(
            r#"
providers:
  - name: f
    type: fly
    templateStore: missing
    fly: {org: o, app: p, token: {env: T}}
templateStores:
  - name: s3
    bucket: ""
    endpoint: minio:9000
    accessKeyId: {env: A}
    sessionToken: {env: S}
  - name: s3
    bucket: b
"#,
        );
        let issues = invalid(&c);
        assert!(
            has_issue(
                &issues,
                "providers[0].templateStore",
                "unknown template store `missing`"
            ),
            "{issues:?}"
        );
        assert!(has_issue(&issues, "templateStores[0].bucket", "empty"));
        assert!(has_issue(
            &issues,
            "templateStores[0].endpoint",
            "http(s) URL"
        ));
        assert!(has_issue(
            &issues,
            "templateStores[0].secretAccessKey",
            "set both or neither"
        ));
        assert!(has_issue(
            &issues,
            "templateStores[1].name",
            "duplicate template store"
        ));
    }

    #[test]
    fn secret_sources_must_name_exactly_one_place() {
        let c = parse_ok(
            r#"
providers:
  - name: f
    type: fly
    fly: {org: o, app: p, token: {}}
  - name: e
    type: e2b
    e2b: {apiKey: {env: K, file: /k}}
  - name: g
    type: e2b
    e2b: {apiKey: {env: "sk-live-1234"}}
"#,
        );
        let issues = invalid(&c);
        assert!(
            has_issue(&issues, "providers[0].fly.token", "names no source"),
            "{issues:?}"
        );
        assert!(
            has_issue(&issues, "providers[1].e2b.apiKey", "both"),
            "{issues:?}"
        );
        assert!(
            has_issue(
                &issues,
                "providers[2].e2b.apiKey.env",
                "not an environment variable name"
            ),
            "{issues:?}"
        );
    }

    #[test]
    fn instance_env_override_applies_and_is_blamed() {
        let mut c = OperatorConfig::builtin();
        c.apply_env(|name| (name == ENV_INSTANCE).then(|| "blue".to_string()));
        assert_eq!(c.instance, "blue");
        c.validate().unwrap();

        let mut c = OperatorConfig::builtin();
        c.apply_env(|name| (name == ENV_INSTANCE).then(|| "Bad Name".to_string()));
        let issues = invalid(&c);
        assert!(
            has_issue(
                &issues,
                "instance (from SANDBOX_OPERATOR_INSTANCE)",
                "DNS-1123"
            ),
            "{issues:?}"
        );

        let mut c = OperatorConfig::builtin();
        c.apply_env(|_| None);
        assert_eq!(c.instance, "default");
    }

    #[test]
    fn issues_display_lists_every_problem() {
        let c = parse_ok("defaultProvider: x\nproviders: [{name: d, type: fly}]\n");
        let text = c.validate().unwrap_err().to_string();
        assert!(
            text.starts_with("operator configuration is invalid:"),
            "{text}"
        );
        assert!(
            text.contains("\n  - defaultProvider: unknown provider `x`"),
            "{text}"
        );
        assert!(text.contains("\n  - providers[0].fly: missing"), "{text}");
    }

    #[test]
    fn secret_from_env_resolves_and_errors_name_the_variable() {
        let src = SecretSource::env("MY_TOKEN");
        let value = src
            .resolve_with("providers[0].fly.token", |n| {
                (n == "MY_TOKEN").then(|| "s3cr3t".into())
            })
            .unwrap();
        assert_eq!(value, "s3cr3t");

        let err = src
            .resolve_with("providers[0].fly.token", |_| None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("MY_TOKEN"), "{err}");
        assert!(err.contains("providers[0].fly.token"), "{err}");

        let err = src
            .resolve_with("f", |_| Some("  ".into()))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("environment variable MY_TOKEN is empty"),
            "{err}"
        );
    }

    #[test]
    fn secret_from_file_resolves_trims_newline_and_never_prints_value() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "hunter2\n").unwrap();
        let src = SecretSource::file(&path);
        assert_eq!(src.resolve().unwrap(), "hunter2");

        std::fs::write(&path, "\n").unwrap();
        let err = src.resolve().unwrap_err().to_string();
        assert!(err.contains(&path.display().to_string()), "{err}");
        assert!(err.contains("empty"), "{err}");

        let gone = SecretSource::file(dir.path().join("absent"));
        let err = gone
            .resolve_for("templateStores[0].secretAccessKey")
            .unwrap_err();
        let text = err.to_string();
        assert!(text.contains("absent"), "{text}");
        assert!(text.contains("templateStores[0].secretAccessKey"), "{text}");
        assert!(!text.contains("hunter2"));

        let err = SecretSource::default().resolve().unwrap_err().to_string();
        assert!(err.contains("exactly one"), "{err}");
    }

    #[test]
    fn check_secrets_reports_each_unresolvable_reference() {
        let c = parse_ok(
            r#"
providers:
  - name: f
    type: fly
    fly: {org: o, app: p, token: {env: SANDBOX_OPERATOR_TEST_SURELY_UNSET_1}}
templateStores:
  - name: s
    bucket: b
    accessKeyId: {file: /nonexistent/sandbox-operator/a}
    secretAccessKey: {file: /nonexistent/sandbox-operator/b}
"#,
        );
        c.validate().unwrap();
        let errors = c.check_secrets().unwrap_err();
        assert_eq!(errors.len(), 3, "{errors:?}");
        assert!(
            errors[0]
                .to_string()
                .contains("SANDBOX_OPERATOR_TEST_SURELY_UNSET_1")
        );
        assert!(
            errors[1]
                .to_string()
                .contains("templateStores[0].accessKeyId")
        );
        assert!(OperatorConfig::builtin().check_secrets().is_ok());
    }

    #[test]
    fn jitter_stays_within_ten_percent() {
        for _ in 0..100 {
            let d = OperatorConfig::builtin().jittered_resync();
            assert!(
                d >= Duration::from_secs(540) && d <= Duration::from_secs(660),
                "{d:?}"
            );
        }
    }

    #[test]
    fn docker_settings_validation() {
        let c = parse_ok(
            "providers:\n  - name: d\n    type: docker\n    docker: {publishHost: localhost, endpoint: /var/run/docker.sock}\n",
        );
        let issues = invalid(&c);
        assert!(has_issue(
            &issues,
            "providers[0].docker.publishHost",
            "IP address"
        ));
        assert!(has_issue(
            &issues,
            "providers[0].docker.endpoint",
            "unix://"
        ));
    }

    #[test]
    fn open_images_default_to_the_base_image_and_bad_entries_are_named() {
        let c = parse_ok("providers: [{name: d, type: docker}]\n");
        assert_eq!(
            c.open_images,
            vec!["sandbox-operator/base:bookworm".to_string()]
        );
        let c = parse_ok(
            "providers: [{name: d, type: docker}]\nopenImages: [\"ghcr.io/team/*\", \"a/*/b\", \"\"]\n",
        );
        let issues = invalid(&c);
        assert!(
            has_issue(&issues, "openImages[1]", "trailing"),
            "{issues:?}"
        );
        assert!(has_issue(&issues, "openImages[2]", "empty"), "{issues:?}");
        assert_eq!(issues.len(), 2, "{issues:?}");
    }
}
