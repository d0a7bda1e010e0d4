//! Settings of one E2B provider: the `e2b:` block of a provider in the operator
//! configuration. Defaults live here and nowhere else.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::provider::{Provider, ProviderKind, ProviderResult};
use crate::secret::SecretSource;
use crate::validation::{Issues, check_url};

/// The public E2B API.
pub const DEFAULT_API_URL: &str = "https://api.e2b.dev";
/// The environment variable the API key is read from when `apiKey` is not given (the name
/// E2B's own SDKs and CLI use).
pub const DEFAULT_API_KEY_ENV: &str = "E2B_API_KEY";
/// E2B's default template.
pub const DEFAULT_TEMPLATE: &str = "base";
/// Sandbox timeout E2B enforces between keep-alive refreshes (the SDKs' default).
pub const DEFAULT_TIMEOUT_SECS: u64 = 300;
/// How often the provider lists its sandboxes (keep-alive and drift).
pub const DEFAULT_WATCH_INTERVAL_SECS: u64 = 30;
/// User commands and file operations run as inside the sandbox.
pub const DEFAULT_USER: &str = "root";
/// The longest timeout E2B accepts on any plan (24 h).
const MAX_TIMEOUT_SECS: u64 = 24 * 3600;

/// What E2B does with a sandbox whose timeout passes because the keep-alive could not run
/// (the operator was down longer than `timeoutSecs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnTimeout {
    /// Pause it with its memory (`autoPause`): nothing is lost, and the controller resumes a
    /// `Running` Sandbox it finds paused.
    #[default]
    Pause,
    /// Kill it (E2B's own default): the controller then recreates or reports it according to
    /// `restartPolicy`, as for any sandbox the provider lost.
    Kill,
}

/// Settings of an E2B provider.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct E2bSettings {
    /// E2B API base URL.
    #[serde(default = "default_api_url")]
    pub api_url: String,
    /// API key (by reference); absent = the `E2B_API_KEY` environment variable.
    #[serde(default = "default_api_key")]
    pub api_key: SecretSource,
    /// Shared envd host that routes by the `E2b-Sandbox-Id` header (E2B's
    /// `https://sandbox.<domain>`). Absent = each sandbox's own host,
    /// `https://49983-<sandboxID>.<domain>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_url: Option<String>,
    /// Sandbox domain used when E2B's answer names none; absent = the API host without its
    /// leading `api.` (`api.e2b.dev` → `e2b.dev`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// E2B template for Sandboxes that name no `image` (`spec.image` names an E2B template
    /// id or alias on this provider); absent = `base`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// The timeout E2B enforces, in seconds; the provider refreshes it long before it
    /// passes, for as long as the sandbox should run.
    #[serde(default = "default_timeout_secs")]
    pub timeout_secs: u64,
    /// How often one paginated list of this operator's sandboxes runs, in seconds: it drives
    /// the keep-alive and reports drift.
    #[serde(default = "default_watch_interval_secs")]
    pub watch_interval_secs: u64,
    /// What E2B does at the timeout if the keep-alive could not run in time.
    #[serde(default)]
    pub on_timeout: OnTimeout,
    /// User that commands and file operations run as inside the sandbox.
    #[serde(default = "default_user")]
    pub user: String,
}

fn default_api_url() -> String {
    DEFAULT_API_URL.into()
}
fn default_api_key() -> SecretSource {
    SecretSource::env(DEFAULT_API_KEY_ENV)
}
fn default_timeout_secs() -> u64 {
    DEFAULT_TIMEOUT_SECS
}
fn default_watch_interval_secs() -> u64 {
    DEFAULT_WATCH_INTERVAL_SECS
}
fn default_user() -> String {
    DEFAULT_USER.into()
}

impl Default for E2bSettings {
    fn default() -> Self {
        E2bSettings {
            api_url: default_api_url(),
            api_key: default_api_key(),
            sandbox_url: None,
            domain: None,
            template: None,
            timeout_secs: DEFAULT_TIMEOUT_SECS,
            watch_interval_secs: DEFAULT_WATCH_INTERVAL_SECS,
            on_timeout: OnTimeout::default(),
            user: default_user(),
        }
    }
}

impl E2bSettings {
    /// Reports every setting that cannot work, under `at` (e.g. `providers[2].e2b`).
    pub fn validate(&self, at: &str, issues: &mut Issues) {
        check_url(&self.api_url, &format!("{at}.apiUrl"), issues);
        self.api_key.validate(&format!("{at}.apiKey"), issues);
        if let Some(url) = &self.sandbox_url {
            check_url(url, &format!("{at}.sandboxUrl"), issues);
        }
        if self.watch_interval_secs == 0 {
            issues.push(
                format!("{at}.watchIntervalSecs"),
                "is 0; give the seconds between two lists of this operator's sandboxes (default 30)",
            );
        }
        // Two passes must fit inside the timeout with one to spare, or a single slow or
        // failed list lets E2B end a sandbox that should run.
        let min = 3 * self.watch_interval_secs.max(1);
        if self.timeout_secs < min || self.timeout_secs > MAX_TIMEOUT_SECS {
            issues.push(
                format!("{at}.timeoutSecs"),
                format!(
                    "is {}; it must be at least 3 × watchIntervalSecs ({min}) so the keep-alive \
                     refreshes it in time, and at most {MAX_TIMEOUT_SECS} (E2B's limit)",
                    self.timeout_secs
                ),
            );
        }
        if self.user.trim().is_empty() || self.user.contains(':') {
            issues.push(
                format!("{at}.user"),
                format!(
                    "`{}` is not a user name; use e.g. `root` or `user`",
                    self.user
                ),
            );
        }
    }

    /// The sandbox domain when E2B's answer names none.
    pub fn default_domain(&self) -> String {
        if let Some(domain) = &self.domain {
            return domain.clone();
        }
        let host = self
            .api_url
            .split("://")
            .nth(1)
            .unwrap_or(&self.api_url)
            .split(['/', ':'])
            .next()
            .unwrap_or_default();
        host.strip_prefix("api.").unwrap_or(host).to_string()
    }

    /// The E2B template for a Sandbox that names no image.
    pub fn default_template(&self) -> &str {
        self.template.as_deref().unwrap_or(DEFAULT_TEMPLATE)
    }

    /// The timeout as a duration.
    pub fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout_secs)
    }

    /// The watch interval as a duration.
    pub fn watch_interval(&self) -> Duration {
        Duration::from_secs(self.watch_interval_secs.max(1))
    }
}

/// Registered in [`factory`](crate::provider::factory).
#[async_trait::async_trait]
impl ProviderKind for E2bSettings {
    fn without_block() -> Result<Self, &'static str> {
        Err(
            "missing: a provider of type `e2b` needs an `e2b:` block with `apiKey` (e.g. \
             `apiKey: {env: E2B_API_KEY}`)",
        )
    }

    fn check(&self, at: &str, issues: &mut Issues) {
        self.validate(at, issues);
    }

    fn secrets(&self) -> Vec<(&'static str, &SecretSource)> {
        vec![("apiKey", &self.api_key)]
    }

    async fn build(&self, name: &str) -> ProviderResult<Arc<dyn Provider>> {
        Ok(Arc::new(super::E2bProvider::new(name, self.clone())?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_block_means_the_defaults_with_the_key_from_e2b_api_key() {
        let empty: E2bSettings = serde_yaml::from_str("{}").unwrap();
        assert_eq!(empty, E2bSettings::default());
        assert_eq!(empty.api_key, SecretSource::env("E2B_API_KEY"));
        assert_eq!(empty.default_domain(), "e2b.dev");
        assert_eq!(empty.default_template(), "base");
        let mut issues = Issues::default();
        empty.validate("providers[0].e2b", &mut issues);
        assert!(issues.is_empty(), "{issues:?}");
    }

    #[test]
    fn the_domain_follows_the_api_host_unless_set() {
        let s = E2bSettings {
            api_url: "http://127.0.0.1:3000/".into(),
            ..E2bSettings::default()
        };
        assert_eq!(s.default_domain(), "127.0.0.1");
        let s = E2bSettings {
            domain: Some("e2b.app".into()),
            ..s
        };
        assert_eq!(s.default_domain(), "e2b.app");
    }

    #[test]
    fn validation_names_each_bad_field() {
        let bad = E2bSettings {
            api_url: "api.e2b.dev".into(),
            sandbox_url: Some("sandbox".into()),
            watch_interval_secs: 30,
            timeout_secs: 60,
            user: "a:b".into(),
            ..E2bSettings::default()
        };
        let mut issues = Issues::default();
        bad.validate("providers[2].e2b", &mut issues);
        let paths: Vec<&str> = issues.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(
            paths,
            [
                "providers[2].e2b.apiUrl",
                "providers[2].e2b.sandboxUrl",
                "providers[2].e2b.timeoutSecs",
                "providers[2].e2b.user"
            ]
        );
        let unknown = serde_yaml::from_str::<E2bSettings>("{timeoutSec: 5}").unwrap_err();
        assert!(unknown.to_string().contains("timeoutSec"), "{unknown}");
    }
}
