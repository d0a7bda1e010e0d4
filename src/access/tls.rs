//! The listener's TLS: our serving certificate, and client certificates verified against the
//! front proxy's CA (the API server's requestheader CA). A client that presents no
//! certificate still completes the handshake, so it gets a `401` Status it can read; one
//! whose certificate does not chain to that CA fails the handshake.

use std::path::Path;
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;

/// Our serving certificate chain and key, in DER.
pub struct ServingCert {
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

impl Clone for ServingCert {
    fn clone(&self) -> Self {
        ServingCert {
            chain: self.chain.clone(),
            key: self.key.clone_key(),
        }
    }
}

impl ServingCert {
    /// Reads PEM files. The message names the file and never shows the key's content.
    pub fn from_files(cert: &Path, key: &Path) -> Result<ServingCert, String> {
        let read =
            |p: &Path| std::fs::read(p).map_err(|e| format!("cannot read {}: {e}", p.display()));
        ServingCert::from_pem(&read(cert)?, &read(key)?)
            .map_err(|e| format!("{} / {}: {e}", cert.display(), key.display()))
    }

    /// Parses a PEM certificate chain and a PEM private key.
    pub fn from_pem(cert: &[u8], key: &[u8]) -> Result<ServingCert, String> {
        let chain = CertificateDer::pem_slice_iter(cert)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("not a PEM certificate chain: {e}"))?;
        if chain.is_empty() {
            return Err("no certificate in the PEM file".into());
        }
        let key = PrivateKeyDer::from_pem_slice(key)
            .map_err(|_| "no readable PEM private key".to_string())?;
        Ok(ServingCert { chain, key })
    }
}

/// The server configuration: our certificate, HTTP/1.1 only (WebSocket upgrades), and client
/// certificates checked against `client_ca_pem` when there is one.
pub fn server_config(
    cert: &ServingCert,
    client_ca_pem: Option<&str>,
) -> Result<Arc<ServerConfig>, String> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let verifier = match client_ca_pem {
        Some(pem) => {
            let mut roots = RootCertStore::empty();
            for ca in CertificateDer::pem_slice_iter(pem.as_bytes()) {
                let ca = ca.map_err(|e| format!("requestheader CA is not PEM: {e}"))?;
                roots
                    .add(ca)
                    .map_err(|e| format!("requestheader CA is not usable: {e}"))?;
            }
            WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                .allow_unauthenticated()
                .build()
                .map_err(|e| format!("requestheader CA: {e}"))?
        }
        None => WebPkiClientVerifier::no_client_auth(),
    };
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_client_cert_verifier(verifier)
        .with_single_cert(cert.chain.clone(), cert.key.clone_key())
        .map_err(|e| format!("serving certificate and key do not match or are unusable: {e}"))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The common name of a verified client certificate chain's leaf.
pub fn peer_common_name(chain: Option<&[CertificateDer<'_>]>) -> Option<String> {
    let leaf = chain?.first()?;
    let (_, cert) = x509_parser::parse_x509_certificate(leaf.as_ref()).ok()?;
    let cn = cert.subject().iter_common_name().next()?;
    cn.as_str().ok().map(str::to_string)
}
