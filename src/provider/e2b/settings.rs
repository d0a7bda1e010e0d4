//! Settings of one E2B provider: the `e2b:` block of a provider in the operator
//! configuration.

use serde::{Deserialize, Serialize};

use crate::secret::SecretSource;
use crate::validation::{Issues, check_url};

/// The public E2B API.
pub const DEFAULT_API_URL: &str = "https://api.e2b.dev";

/// Settings of an E2B provider.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct E2bSettings {
    /// E2B API base URL.
    #[serde(default = "default_api_url")]
    pub api_url: String,
    /// API key (by reference).
    pub api_key: SecretSource,
    /// E2B template used for Sandboxes that name neither an image nor a template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
}

fn default_api_url() -> String {
    DEFAULT_API_URL.into()
}

impl E2bSettings {
    /// Reports every setting that cannot work, under `at` (e.g. `providers[2].e2b`).
    pub fn validate(&self, at: &str, issues: &mut Issues) {
        check_url(&self.api_url, &format!("{at}.apiUrl"), issues);
        self.api_key.validate(&format!("{at}.apiKey"), issues);
    }
}
