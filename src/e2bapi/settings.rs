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
    /// The URL the other replicas reach this one's E2B API at, e.g. `http://10.0.0.7:3000`:
    /// they forward requests for this replica's processes there. Absent: `http://` the
    /// `POD_IP` environment variable (the chart sets it) and the port of `address`, else
    /// `address` itself (loopback when it names every interface).
    pub peer_address: Option<String>,
}

/// The environment variable with the pod's IP (downward API).
pub const ENV_POD_IP: &str = "POD_IP";

impl E2bApiConfig {
    /// The URL the other replicas reach this one at, serving on `bound`.
    pub fn peer_url(&self, bound: SocketAddr) -> String {
        if let Some(url) = &self.peer_address {
            return url.clone();
        }
        let pod_ip = std::env::var(ENV_POD_IP)
            .ok()
            .and_then(|ip| ip.parse::<std::net::IpAddr>().ok());
        let ip = match pod_ip {
            Some(ip) => ip,
            None if bound.ip().is_unspecified() => std::net::Ipv4Addr::LOCALHOST.into(),
            None => bound.ip(),
        };
        format!("http://{}", SocketAddr::new(ip, bound.port()))
    }
}

impl Default for E2bApiConfig {
    fn default() -> Self {
        E2bApiConfig {
            enabled: false,
            address: DEFAULT_ADDRESS,
            domain: None,
            templates: BTreeMap::new(),
            access_token_key_file: None,
            peer_address: None,
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

    #[test]
    fn the_peer_url_is_the_setting_else_the_pod_ip_else_the_address() {
        let bound: std::net::SocketAddr = "10.1.2.3:3000".parse().unwrap();
        let mut config = super::E2bApiConfig::default();
        if std::env::var_os(super::ENV_POD_IP).is_none() {
            assert_eq!(config.peer_url(bound), "http://10.1.2.3:3000");
            let any = "0.0.0.0:3001".parse().unwrap();
            assert_eq!(config.peer_url(any), "http://127.0.0.1:3001");
        }
        config.peer_address = Some("http://peer.example:3000".into());
        assert_eq!(config.peer_url(bound), "http://peer.example:3000");
    }
}
