//! Settings of one Fly Machines provider: the `fly:` block of a provider in the operator
//! configuration.

use serde::{Deserialize, Serialize};

use crate::secret::SecretSource;
use crate::validation::{Issues, check_dns_label, check_url};

/// The public Machines API.
pub const DEFAULT_API_URL: &str = "https://api.machines.dev";

/// Settings of a Fly Machines provider.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FlySettings {
    /// Machines API base URL.
    #[serde(default = "default_api_url")]
    pub api_url: String,
    /// Fly organization slug apps are created in.
    pub org: String,
    /// Prefix of the Fly app names this operator creates. Fly app names are global, so pick
    /// one unique to your organization.
    pub app_prefix: String,
    /// API token (by reference).
    pub token: SecretSource,
}

fn default_api_url() -> String {
    DEFAULT_API_URL.into()
}

impl FlySettings {
    /// Reports every setting that cannot work, under `at` (e.g. `providers[1].fly`).
    pub fn validate(&self, at: &str, issues: &mut Issues) {
        check_url(&self.api_url, &format!("{at}.apiUrl"), issues);
        if self.org.trim().is_empty() {
            issues.push(
                format!("{at}.org"),
                "is empty; set your Fly organization slug",
            );
        }
        if let Err(why) = check_dns_label(&self.app_prefix) {
            issues.push(
                format!("{at}.appPrefix"),
                format!("{why}; it starts every Fly app name this operator creates"),
            );
        }
        self.token.validate(&format!("{at}.token"), issues);
    }
}
