//! The E2B-compatible API: existing E2B SDK code runs against the operator unchanged. Each
//! E2B sandbox is a Sandbox object in the namespace its API key (a Secret) maps to, created
//! as that key's ServiceAccount, so kubectl, GitOps, the sweeper, budgets and RBAC apply. It
//! reaches sandboxes through Sandbox objects and the provider seam, never a provider module.
//!
//! One module per concern, so the envd protocol and port URLs can join as modules of their
//! own with routers of their own:
//! - [`settings`]: the `e2bApi` configuration section;
//! - [`keys`]: API keys as Secrets, compared in constant time; [`clients`]: impersonation;
//! - [`id`]: sandbox ids that name their namespace and object (what an envd router needs);
//! - [`wire`]: the E2B wire types; [`mapping`]: request ↔ Sandbox (pure); [`boot`]: what a
//!   template id names (a pool, a template or an image alias); [`view`]: the
//!   answers of get and list; [`token`]: envd access tokens;
//! - [`routes`], [`list`] and [`logs`]: the REST handlers, each starting from a [`caller`] (the key
//!   checked, the sandbox found); [`error`]: the `{code, message}` errors;
//! - [`ready`]: waiting until a created or resumed sandbox runs, as E2B answers;
//! - [`envd`]: the in-sandbox daemon's protocol, on the same listener, reaching the sandbox
//!   through the provider seam (the access layer's directory), never a provider module.
//!
//! Every replica serves it, leader or not.

pub mod boot;
pub mod caller;
pub mod clients;
pub mod envd;
pub mod error;
pub mod id;
pub mod keys;
pub mod list;
pub mod logs;
pub mod mapping;
pub mod ready;
pub mod routes;
pub mod settings;
pub mod token;
pub mod view;
pub mod wire;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use kube::Client;

use crate::access::lookup::Sandboxes;
use crate::registry::ProviderRegistry;
use tokio::net::TcpListener;

pub use settings::E2bApiConfig;

/// The E2B-compatible API could not start.
#[derive(Debug, thiserror::Error)]
pub enum E2bApiStartError {
    /// The settings are wrong.
    #[error("E2B API: {0}")]
    Settings(String),
    /// The address could not be bound.
    #[error("E2B API: cannot listen on {addr}: {source}; set e2bApi.address")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
}

/// A bound E2B API server, ready to run.
pub struct E2bApiServer {
    listener: TcpListener,
    router: axum::Router,
}

impl E2bApiServer {
    /// Binds the listener and starts watching the API keys; `None` when not enabled.
    pub async fn bind(
        config: &E2bApiConfig,
        client: Client,
        providers: ProviderRegistry,
        instance: &str,
    ) -> Result<Option<E2bApiServer>, E2bApiStartError> {
        if !config.enabled {
            return Ok(None);
        }
        let tokens = token::TokenKey::load(config.access_token_key_file.as_deref())
            .map_err(E2bApiStartError::Settings)?;
        let base = kube::Config::infer()
            .await
            .map_err(|e| E2bApiStartError::Settings(format!("the Kubernetes client: {e}")))?;
        let listener =
            TcpListener::bind(config.address)
                .await
                .map_err(|source| E2bApiStartError::Bind {
                    addr: config.address,
                    source,
                })?;
        let state = routes::E2bState {
            keys: keys::Keys::watch(client.clone()),
            sandboxes: Arc::new(Sandboxes::new(client.clone(), providers)),
            operator: client,
            clients: clients::Impersonation::new(base),
            site: Arc::new(routes::Site {
                domain: config.domain.clone(),
                templates: config.templates.clone(),
                tokens,
                client_id: instance.to_string(),
            }),
        };
        tracing::info!(address = %config.address, "serving the E2B-compatible API");
        Ok(Some(E2bApiServer {
            listener,
            router: routes::router(state),
        }))
    }

    /// The bound address.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.local_addr().ok()
    }

    /// Serves until `stop`.
    pub async fn run(self, stop: impl Future<Output = ()> + Send + 'static) {
        let served = axum::serve(self.listener, self.router)
            .with_graceful_shutdown(stop)
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "E2B API: the listener failed");
        }
    }
}
