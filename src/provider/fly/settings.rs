//! Settings of one Fly Machines provider: the `fly:` block of a provider in the operator
//! configuration. Defaults live here and nowhere else.

use serde::{Deserialize, Serialize};
use std::sync::Arc;

use crate::provider::{Change, Provider, ProviderKind, ProviderResult};
use crate::secret::SecretSource;
use crate::validation::{Issues, check_dns_label, check_url};

/// The public Machines API.
pub const DEFAULT_API_URL: &str = "https://api.machines.dev";
/// The environment variable the token is read from when `token` is not set (flyctl's name).
pub const DEFAULT_TOKEN_ENV: &str = "FLY_API_TOKEN";
/// First public port handed to a sandbox port (see the module docs on routing).
pub const DEFAULT_FIRST_PUBLIC_PORT: u16 = 10_000;
/// Last public port handed to a sandbox port.
pub const DEFAULT_LAST_PUBLIC_PORT: u16 = 19_999;
/// Seconds between two drift scans (one listing of the app).
pub const DEFAULT_DRIFT_INTERVAL_SECS: u64 = 30;
/// Seconds a lease taken around a mutation lasts if it is never released.
pub const DEFAULT_LEASE_TTL_SECS: u64 = 60;

/// Settings of a Fly Machines provider.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FlySettings {
    /// Machines API base URL (without `/v1`).
    #[serde(default = "default_api_url")]
    pub api_url: String,
    /// The Fly app every sandbox of this provider is a machine of. It must exist unless
    /// `org` is set, in which case the provider creates it on first use.
    pub app: String,
    /// Organization slug the app is created in when it does not exist; absent = never create
    /// it (a missing app is then an error naming this setting).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub org: Option<String>,
    /// Region machines and volumes are placed in; absent = Fly's choice (near the API
    /// client). Volumes and the machines mounting them must share a region, so set it when
    /// Sandboxes use SandboxVolumes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// API token, by reference; absent = the `FLY_API_TOKEN` environment variable.
    #[serde(default = "default_token")]
    pub token: SecretSource,
    /// Host name in sandbox URLs; absent = `<app>.fly.dev`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_host: Option<String>,
    /// First public port given to a sandbox port.
    #[serde(default = "default_first_port")]
    pub first_public_port: u16,
    /// Last public port given to a sandbox port (inclusive).
    #[serde(default = "default_last_port")]
    pub last_public_port: u16,
    /// Image for Sandboxes that name neither an image nor a template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_image: Option<String>,
    /// Seconds between two drift scans of the app.
    #[serde(default = "default_drift_interval")]
    pub drift_interval_seconds: u64,
    /// Seconds a lease around a mutation lasts when it is not released (a crashed operator).
    #[serde(default = "default_lease_ttl")]
    pub lease_ttl_seconds: u64,
    /// The private network (Fly's 6PN) the app is created in; absent = a network named after
    /// the app, so no other app of the organization reaches its machines over the private
    /// network (the organization's shared default network is never used). Machines of one
    /// app — every sandbox of this provider, whatever its namespace — share it: a provider
    /// (an app) per namespace keeps tenants' sandboxes apart. Set only when the operator
    /// creates the app (`org`); an existing app keeps the network it was created with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
}

fn default_api_url() -> String {
    DEFAULT_API_URL.into()
}
fn default_token() -> SecretSource {
    SecretSource::env(DEFAULT_TOKEN_ENV)
}
fn default_first_port() -> u16 {
    DEFAULT_FIRST_PUBLIC_PORT
}
fn default_last_port() -> u16 {
    DEFAULT_LAST_PUBLIC_PORT
}
fn default_drift_interval() -> u64 {
    DEFAULT_DRIFT_INTERVAL_SECS
}
fn default_lease_ttl() -> u64 {
    DEFAULT_LEASE_TTL_SECS
}

impl FlySettings {
    /// Settings for `app` with every default.
    pub fn for_app(app: impl Into<String>) -> Self {
        FlySettings {
            api_url: default_api_url(),
            app: app.into(),
            org: None,
            region: None,
            token: default_token(),
            public_host: None,
            first_public_port: DEFAULT_FIRST_PUBLIC_PORT,
            last_public_port: DEFAULT_LAST_PUBLIC_PORT,
            default_image: None,
            drift_interval_seconds: DEFAULT_DRIFT_INTERVAL_SECS,
            lease_ttl_seconds: DEFAULT_LEASE_TTL_SECS,
            network: None,
        }
    }

    /// The private network the app is created in (see `network`).
    pub fn network(&self) -> &str {
        self.network.as_deref().unwrap_or(&self.app)
    }

    /// The host sandbox URLs name.
    pub fn public_host(&self) -> String {
        self.public_host
            .clone()
            .unwrap_or_else(|| format!("{}.fly.dev", self.app))
    }

    /// Reports every setting that cannot work, under `at` (e.g. `providers[1].fly`).
    pub fn validate(&self, at: &str, issues: &mut Issues) {
        check_url(&self.api_url, &format!("{at}.apiUrl"), issues);
        if let Err(why) = check_dns_label(&self.app) {
            issues.push(
                format!("{at}.app"),
                format!("{why}; name the Fly app whose machines are the sandboxes"),
            );
        }
        if self.org.as_deref().is_some_and(|o| o.trim().is_empty()) {
            issues.push(
                format!("{at}.org"),
                "is empty; set your Fly organization slug or remove it",
            );
        }
        if self.first_public_port == 0 || self.first_public_port > self.last_public_port {
            issues.push(
                format!("{at}.firstPublicPort"),
                format!(
                    "{}..{} is not a port range; set 1 <= firstPublicPort <= lastPublicPort",
                    self.first_public_port, self.last_public_port
                ),
            );
        }
        if self.drift_interval_seconds == 0 {
            issues.push(
                format!("{at}.driftIntervalSeconds"),
                "is 0; set the seconds between two drift scans (default 30)",
            );
        }
        if self.lease_ttl_seconds == 0 {
            issues.push(
                format!("{at}.leaseTtlSeconds"),
                "is 0; set how long a lease lasts (default 60)",
            );
        }
        if let Some(Err(why)) = self.network.as_deref().map(check_dns_label) {
            issues.push(
                format!("{at}.network"),
                format!("{why}; name the private network of the app, or remove it for one named after the app"),
            );
        }
        self.token.validate(&format!("{at}.token"), issues);
    }
}

/// Registered in [`factory`](crate::provider::factory).
#[async_trait::async_trait]
impl ProviderKind for FlySettings {
    fn without_block() -> Result<Self, &'static str> {
        Err(
            "missing: a provider of type `fly` needs a `fly:` block with at least `app` (the Fly \
             app of its sandboxes); the token is read from FLY_API_TOKEN unless `token` says \
             otherwise",
        )
    }

    fn check(&self, at: &str, issues: &mut Issues) {
        self.validate(at, issues);
    }

    fn secrets(&self) -> Vec<(&'static str, &SecretSource)> {
        vec![("token", &self.token)]
    }

    fn echo_words(change: Change) -> &'static [&'static str] {
        super::drift::echo_words(change)
    }

    async fn build(&self, name: &str) -> ProviderResult<Arc<dyn Provider>> {
        Ok(Arc::new(
            super::FlyProvider::connect(name, self.clone()).await?,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_app_is_required() {
        let s: FlySettings = serde_yaml::from_str("app: acme-sandboxes").unwrap();
        assert_eq!(s, FlySettings::for_app("acme-sandboxes"));
        assert_eq!(s.token, SecretSource::env("FLY_API_TOKEN"));
        assert_eq!(s.public_host(), "acme-sandboxes.fly.dev");
        let mut issues = Issues::default();
        s.validate("providers[0].fly", &mut issues);
        assert!(issues.is_empty());
    }

    #[test]
    fn validation_names_each_bad_field() {
        let bad = FlySettings {
            api_url: "api.machines.dev".into(),
            app: "Acme".into(),
            org: Some(" ".into()),
            first_public_port: 20_000,
            last_public_port: 10_000,
            drift_interval_seconds: 0,
            network: Some("Team_Net".into()),
            ..FlySettings::for_app("x")
        };
        let mut issues = Issues::default();
        bad.validate("providers[1].fly", &mut issues);
        let paths: Vec<&str> = issues.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(
            paths,
            [
                "providers[1].fly.apiUrl",
                "providers[1].fly.app",
                "providers[1].fly.org",
                "providers[1].fly.firstPublicPort",
                "providers[1].fly.driftIntervalSeconds",
                "providers[1].fly.network",
            ]
        );
    }

    #[test]
    fn unknown_keys_are_refused() {
        let err = serde_yaml::from_str::<FlySettings>("app: a\nappPrefix: b").unwrap_err();
        assert!(err.to_string().contains("appPrefix"), "{err}");
    }
}
