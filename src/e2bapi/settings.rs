//! The `e2bApi` section of the operator configuration: whether this replica serves the
//! E2B-compatible API, where, under which domain, and which template names boot which image.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Default listen address of the E2B-compatible API.
pub const DEFAULT_ADDRESS: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 3000);

/// `e2bApi:` in the configuration file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct E2bApiConfig {
    /// Serve the E2B REST API on every replica (leader or not).
    pub enabled: bool,
    /// Listen address (plain HTTP; TLS is the Ingress's or Gateway's job).
    pub address: SocketAddr,
    /// The domain sandboxes are reached under (`{port}-{sandboxID}.{domain}`), returned to
    /// the SDK with every sandbox; absent: the SDK keeps its own `E2B_DOMAIN`.
    pub domain: Option<String>,
    /// Template names that boot an image when the namespace has no SandboxTemplate of that
    /// name, e.g. `base: sandbox-operator/base:bookworm`. A SandboxTemplate wins.
    pub templates: BTreeMap<String, String>,
    /// File holding the key the envd access tokens are derived with (any bytes, at least
    /// 32). Every replica needs the same one; absent: a random key per process, so tokens
    /// change when the process restarts and differ between replicas.
    pub access_token_key_file: Option<PathBuf>,
}

impl Default for E2bApiConfig {
    fn default() -> Self {
        E2bApiConfig {
            enabled: false,
            address: DEFAULT_ADDRESS,
            domain: None,
            templates: BTreeMap::new(),
            access_token_key_file: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::OperatorConfig;

    #[test]
    fn the_e2b_api_section_parses_and_is_off_by_default() {
        let text = "instance: r\nproviders:\n  - name: docker\n    type: docker\ne2bApi:\n  enabled: true\n  address: 127.0.0.1:3000\n  domain: sandboxes.example.com\n  templates:\n    base: sandbox-operator/base:bookworm\n";
        let config = OperatorConfig::from_yaml(text).unwrap();
        config.validate().unwrap();
        assert!(config.e2b_api.enabled);
        assert_eq!(config.e2b_api.address.port(), 3000);
        assert_eq!(
            config.e2b_api.templates["base"],
            "sandbox-operator/base:bookworm"
        );
        assert!(!OperatorConfig::default().e2b_api.enabled);
        assert!(OperatorConfig::from_yaml("e2bApi: {enabeld: true}").is_err());
    }
}
