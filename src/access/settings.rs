//! The `access` section of the operator configuration: whether this replica serves the
//! aggregated API, where, and with which serving certificate.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Default listen address of the aggregated API (what the chart's Service targets).
pub const DEFAULT_ADDRESS: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 8443);

/// Default largest `files` upload: a tar is imported whole, so it is held in memory once.
pub const DEFAULT_MAX_UPLOAD_BYTES: u64 = 1 << 30;

/// `access:` in the configuration file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct AccessConfig {
    /// Serve `subresources.sandboxes.dev` on every replica (leader or not).
    pub enabled: bool,
    /// Listen address (HTTPS).
    pub address: SocketAddr,
    /// PEM serving certificate (chain), trusted by the APIService's `caBundle`. Every
    /// replica must present one that bundle trusts: the chart mounts one Secret in all.
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of the serving certificate.
    pub tls_key_file: Option<PathBuf>,
    /// Largest tar body a `files` upload may carry, in bytes.
    pub max_upload_bytes: u64,
}

impl Default for AccessConfig {
    fn default() -> Self {
        AccessConfig {
            enabled: false,
            address: DEFAULT_ADDRESS,
            tls_cert_file: None,
            tls_key_file: None,
            max_upload_bytes: DEFAULT_MAX_UPLOAD_BYTES,
        }
    }
}

impl AccessConfig {
    /// The certificate and key files, or what to set when they are missing.
    pub fn tls_files(&self) -> Result<(&PathBuf, &PathBuf), String> {
        match (&self.tls_cert_file, &self.tls_key_file) {
            (Some(cert), Some(key)) => Ok((cert, key)),
            _ => Err(
                "access.enabled needs access.tlsCertFile and access.tlsKeyFile (a serving \
                      certificate the APIService's caBundle trusts; the Helm chart generates \
                      one and mounts it)"
                    .into(),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::OperatorConfig;

    #[test]
    fn the_charts_access_section_parses_and_names_missing_files() {
        let text = "instance: r\nproviders:\n  - name: docker\n    type: docker\naccess:\n  address: 0.0.0.0:8443\n  enabled: true\n  maxUploadBytes: 1073741824\n  tlsCertFile: /etc/a/tls.crt\n  tlsKeyFile: /etc/a/tls.key\n";
        let config = OperatorConfig::from_yaml(text).unwrap();
        config.validate().unwrap();
        assert!(config.access.enabled);
        assert_eq!(config.access.address.port(), 8443);
        assert!(config.access.tls_files().is_ok());
        let bare = OperatorConfig::from_yaml("access: {enabled: true}").unwrap();
        let why = bare.access.tls_files().unwrap_err();
        assert!(why.contains("access.tlsCertFile"), "{why}");
        assert!(!OperatorConfig::default().access.enabled);
    }
}
