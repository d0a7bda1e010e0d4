//! The access layer: how users and agents reach a sandbox with their own Kubernetes identity.
//! An aggregated API (`subresources.sandboxes.dev`) serves exec, attach, log, port-forward and
//! files as subresources of a Sandbox; it reaches providers only through the seam's optional
//! capabilities ([`crate::provider::stream`], [`crate::provider::BulkFiles`]) and the
//! registry, never a provider module directly.
//!
//! Every replica serves it, leader or not: an APIService whose backend is unavailable blocks
//! namespace deletion cluster-wide, so the API must not wait for an election.
//!
//! - [`listener`]: HTTPS, the front proxy's client certificate, one [`authn::Peer`] per
//!   connection;
//! - [`routes`]: discovery and the subresources, each request authenticated ([`authn`]),
//!   authorized ([`authz`], its decisions kept briefly by [`authz_cache`]) and looked up ([`lookup`]) before it is served by [`exec`],
//!   [`log`], [`portforward`] or [`files`];
//! - [`channel`]: the Pod exec/port-forward channel codec, shared with the plugin.

pub mod activity;
pub mod authn;
pub mod authz;
pub mod authz_cache;
pub mod channel;
pub mod discovery;
pub mod exec;
pub mod files;
pub mod listener;
pub mod log;
pub mod lookup;
pub mod params;
pub mod portforward;
pub mod routes;
pub mod settings;
pub mod status;
pub mod tls;
pub mod upgrade;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use kube::Client;
use tokio::net::TcpListener;

use crate::registry::ProviderRegistry;
use authn::FrontProxy;
use listener::Trust;
pub use settings::AccessConfig;

/// The aggregated API could not start.
#[derive(Debug, thiserror::Error)]
pub enum AccessStartError {
    /// The `access` settings or the serving certificate are wrong.
    #[error("aggregated API: {0}")]
    Settings(String),
    /// The address could not be bound.
    #[error("aggregated API: cannot listen on {addr}: {source}; set access.address")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
}

/// A bound aggregated API server, ready to run.
pub struct AccessServer {
    listener: TcpListener,
    trust: Trust,
    router: axum::Router,
    client: Client,
}

impl AccessServer {
    /// Binds the listener and builds the server from `config`; `None` when not enabled.
    pub async fn bind(
        config: &AccessConfig,
        client: Client,
        providers: ProviderRegistry,
    ) -> Result<Option<AccessServer>, AccessStartError> {
        if !config.enabled {
            return Ok(None);
        }
        let (cert, key) = config.tls_files().map_err(AccessStartError::Settings)?;
        let cert = tls::ServingCert::from_files(cert, key).map_err(AccessStartError::Settings)?;
        let front = FrontProxy::load(&client).await.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "aggregated API: no front-proxy settings yet; refusing requests until they are read");
            FrontProxy::default()
        });
        let trust = Trust::new(cert, front).map_err(AccessStartError::Settings)?;
        let listener =
            TcpListener::bind(config.address)
                .await
                .map_err(|source| AccessStartError::Bind {
                    addr: config.address,
                    source,
                })?;
        let state = routes::AccessState {
            directory: Arc::new(lookup::Sandboxes::new(client.clone(), providers)),
            authorizer: Arc::new(authz_cache::CachedAuthorizer::new(Arc::new(
                authz::SubjectAccessReviews::new(client.clone()),
            ))),
            front: trust.front.clone(),
            max_upload_bytes: config.max_upload_bytes,
        };
        tracing::info!(address = %config.address, "serving the aggregated API subresources.sandboxes.dev");
        Ok(Some(AccessServer {
            listener,
            trust,
            router: routes::router(state),
            client,
        }))
    }

    /// The bound address.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.local_addr().ok()
    }

    /// Serves until `stop`, re-reading the front proxy's settings meanwhile.
    pub async fn run(self, stop: impl Future<Output = ()>) {
        let refresh = self
            .trust
            .clone()
            .refresh(self.client, std::future::pending());
        tokio::select! {
            () = listener::serve(self.listener, self.trust, self.router, stop) => {}
            () = refresh => {}
        }
    }
}

#[cfg(test)]
pub(crate) mod fake;
#[cfg(test)]
mod tests;
