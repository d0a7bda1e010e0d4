//! Settings of one Fly Sprites provider: the `sprites:` block of a provider in the operator
//! configuration.

use serde::{Deserialize, Serialize};
use std::sync::Arc;

use crate::provider::{Provider, ProviderKind, ProviderResult};
use crate::secret::SecretSource;
use crate::validation::{Issues, check_url};

/// The public Sprites API.
pub const DEFAULT_API_URL: &str = "https://api.sprites.dev";

/// Settings of a Fly Sprites provider.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SpritesSettings {
    /// Sprites API base URL.
    #[serde(default = "default_api_url")]
    pub api_url: String,
    /// The Sprites organization the token belongs to (sprite names are unique within it).
    pub org: String,
    /// API token (by reference; sent as a bearer token, never logged or stored in status).
    pub token: SecretSource,
}

fn default_api_url() -> String {
    DEFAULT_API_URL.into()
}

impl SpritesSettings {
    /// Reports every setting that cannot work, under `at` (e.g. `providers[1].sprites`).
    pub fn validate(&self, at: &str, issues: &mut Issues) {
        check_url(&self.api_url, &format!("{at}.apiUrl"), issues);
        if self.org.trim().is_empty() {
            issues.push(
                format!("{at}.org"),
                "is empty; set your Sprites organization slug",
            );
        }
        self.token.validate(&format!("{at}.token"), issues);
    }
}

/// Registered in [`factory`](crate::provider::factory).
#[async_trait::async_trait]
impl ProviderKind for SpritesSettings {
    fn without_block() -> Result<Self, &'static str> {
        Err(
            "missing: a provider of type `sprites` needs a `sprites:` block with `org` and \
             `token` (e.g. `token: {env: SPRITES_TOKEN}`)",
        )
    }

    fn check(&self, at: &str, issues: &mut Issues) {
        self.validate(at, issues);
    }

    fn secrets(&self) -> Vec<(&'static str, &SecretSource)> {
        vec![("token", &self.token)]
    }

    async fn build(&self, name: &str) -> ProviderResult<Arc<dyn Provider>> {
        Ok(Arc::new(super::SpritesProvider::from_settings(name, self)?))
    }
}
