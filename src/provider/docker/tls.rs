//! A remote Docker engine over mutual TLS.
//!
//! A `tcp://` endpoint without TLS is plain HTTP: whoever can reach the port drives the
//! engine, which is root on its host. So a TCP endpoint needs `tls` — the engine's CA and a
//! client certificate and key, as files of a mounted Kubernetes Secret — unless
//! `allowPlainTcp: true` says the network is trusted. The engine (`dockerd --tlsverify`)
//! checks the client certificate against its CA; the client checks the engine's certificate
//! against the configured CA (bollard also trusts the system's roots, which in the operator's
//! scratch image are none).
//!
//! A refused client certificate surfaces on the first call as `Unauthorized`, naming the
//! settings to fix, instead of a generic "unreachable".

use serde::{Deserialize, Serialize};

use super::DockerProvider;
use crate::provider::ProviderError;
use crate::secret::SecretSource;
use crate::validation::Issues;

/// The client side of mutual TLS with the engine: three PEM files from a mounted Secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EngineTls {
    /// The CA the engine's certificate must chain to (`ca.pem`).
    pub ca: SecretSource,
    /// The client certificate the engine verifies (`cert.pem`).
    pub cert: SecretSource,
    /// The client certificate's private key (`key.pem`).
    pub key: SecretSource,
}

impl EngineTls {
    /// The three files in bollard's order (key, cert, CA), or the field that is not a file.
    pub(crate) fn paths(
        &self,
    ) -> Result<(&std::path::Path, &std::path::Path, &std::path::Path), String> {
        let key = file_of("key", &self.key)?;
        let cert = file_of("cert", &self.cert)?;
        let ca = file_of("ca", &self.ca)?;
        Ok((key, cert, ca))
    }
}

/// The file of a `file:` source; the field name when it is not one.
fn file_of<'a>(name: &str, source: &'a SecretSource) -> Result<&'a std::path::Path, String> {
    source
        .file
        .as_deref()
        .filter(|_| source.env.is_none())
        .ok_or_else(|| name.to_string())
}

/// Whether an endpoint is reached over TCP (plain or TLS).
pub(crate) fn is_tcp(endpoint: &str) -> bool {
    ["tcp://", "http://", "https://"]
        .iter()
        .any(|s| endpoint.starts_with(s))
}

/// Reports a TCP endpoint without TLS (unless allowed) and TLS settings that cannot work.
pub(super) fn validate(
    endpoint: Option<&str>,
    tls: Option<&EngineTls>,
    allow_plain_tcp: bool,
    at: &str,
    issues: &mut Issues,
) {
    let tcp = endpoint.is_some_and(is_tcp);
    match tls {
        None if tcp && !allow_plain_tcp => issues.push(
            format!("{at}.endpoint"),
            "a TCP endpoint without TLS lets anyone who reaches the port drive the engine (root on \
             its host); set tls (ca, cert and key files from a mounted Secret, engine started with \
             --tlsverify) or, on a trusted network only, allowPlainTcp: true",
        ),
        Some(_) if !tcp => issues.push(
            format!("{at}.tls"),
            "TLS applies to a tcp:// endpoint only; set endpoint: tcp://HOST:2376 or remove tls",
        ),
        Some(tls) => {
            if let Err(field) = tls.paths() {
                issues.push(
                    format!("{at}.tls.{field}"),
                    "must be a `file:` (a PEM file of a mounted Secret); the engine client reads \
                     certificates from files",
                );
            }
        }
        None => {}
    }
}

impl DockerProvider {
    /// Maps a failed first call on a TLS endpoint: a handshake the engine refused (wrong or
    /// unknown client certificate, wrong CA) is `Unauthorized` naming the settings; anything
    /// else keeps its usual mapping. The TLS cause sits deep in the error's source chain
    /// (hyper → io → rustls), so the whole chain is read.
    pub(crate) fn map_engine_err(
        &self,
        context: &str,
        err: bollard::errors::Error,
    ) -> ProviderError {
        if self.settings.tls.is_none() {
            return self
                .socket_cause(context, &err)
                .unwrap_or_else(|| super::map_err(context, err));
        }
        let mut chain = Vec::new();
        let mut cause: Option<&dyn std::error::Error> = Some(&err);
        while let Some(e) = cause {
            chain.push(e.to_string());
            cause = e.source();
        }
        let chain = chain.join(": ");
        let lower = chain.to_ascii_lowercase();
        let tls = ["alert", "certificate", "handshake", "tls"]
            .iter()
            .any(|w| lower.contains(w));
        if !tls {
            return super::map_err(context, err);
        }
        ProviderError::unauthorized(format!(
            "{context}: the TLS handshake with the Docker engine failed ({chain}); check that \
             docker.tls.cert and docker.tls.key are a pair signed by the CA the engine trusts \
             (--tlscacert), and that docker.tls.ca is the CA of the engine's certificate"
        ))
        .with_reason("EngineTlsRefused")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files() -> EngineTls {
        EngineTls {
            ca: SecretSource::file("/tls/ca.pem"),
            cert: SecretSource::file("/tls/cert.pem"),
            key: SecretSource::file("/tls/key.pem"),
        }
    }

    #[test]
    fn plain_tcp_needs_tls_or_an_explicit_allowance() {
        let mut issues = Issues::default();
        validate(Some("tcp://h:2375"), None, false, "d", &mut issues);
        assert_eq!(issues.iter().next().unwrap().0, "d.endpoint");
        let mut ok = Issues::default();
        validate(Some("tcp://h:2375"), None, true, "d", &mut ok);
        validate(Some("tcp://h:2376"), Some(&files()), false, "d", &mut ok);
        validate(Some("unix:///s"), None, false, "d", &mut ok);
        validate(None, None, false, "d", &mut ok);
        assert!(ok.is_empty(), "{ok:?}");
    }

    #[test]
    fn tls_needs_tcp_and_files() {
        let mut issues = Issues::default();
        validate(Some("unix:///s"), Some(&files()), false, "d", &mut issues);
        let mut env = files();
        env.key = SecretSource::env("KEY");
        validate(Some("tcp://h:2376"), Some(&env), false, "d", &mut issues);
        let paths: Vec<&str> = issues.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(paths, ["d.tls", "d.tls.key"]);
    }
}
