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
//!   through the provider seam (the access layer's directory), never a provider module;
//! - [`ports`]: port URLs, any other port of a sandbox over HTTP and WebSocket through the
//!   provider's port-forward, dispatched by host before routing.
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
pub mod ports;
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
    /// This replica could not register as an envd peer.
    #[error("E2B API: {0}")]
    Peers(#[from] envd::process::peers::PeerError),
}

/// A bound E2B API server, ready to run.
pub struct E2bApiServer {
    listener: TcpListener,
    router: axum::Router,
    peers: Arc<envd::process::peers::Peers>,
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
        let (peers, replica) = join_peers(config, &listener, &state.operator, instance).await?;
        tracing::info!(address = %config.address, tag = peers.tag(), "serving the E2B-compatible API");
        Ok(Some(E2bApiServer {
            listener,
            router: ports::wrap(routes::router(state.clone()), state)
                .layer(axum::Extension(replica)),
            peers,
        }))
    }

    /// The bound address.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.local_addr().ok()
    }

    /// Serves until `stop`, registered as an envd peer until then.
    pub async fn run(self, stop: impl Future<Output = ()> + Send + 'static) {
        let stop = futures::FutureExt::shared(Box::pin(stop));
        let E2bApiServer {
            listener,
            router,
            peers,
        } = self;
        let graceful = stop.clone();
        let serve = async move {
            // envd's Connect streams are small frames in a row: no Nagle delay between them.
            let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
                let _ = tcp.set_nodelay(true);
            });
            let served = axum::serve(listener, router)
                .with_graceful_shutdown(graceful)
                .await;
            if let Err(e) = served {
                tracing::error!(error = %e, "E2B API: the listener failed");
            }
        };
        tokio::join!(serve, peers.hold(stop));
    }
}

/// This replica registered as an envd peer, and the process service's state.
async fn join_peers(
    config: &E2bApiConfig,
    listener: &TcpListener,
    client: &Client,
    instance: &str,
) -> Result<(Arc<envd::process::peers::Peers>, envd::process::Replica), E2bApiStartError> {
    let bound = listener
        .local_addr()
        .map_err(|source| E2bApiStartError::Bind {
            addr: config.address,
            source,
        })?;
    let url = config.peer_url(bound);
    let peers = envd::process::peers::Peers::join(client.clone(), instance, &url).await?;
    let peers = Arc::new(peers);
    let replica = envd::process::Replica::new(peers.clone())
        .map_err(|e| E2bApiStartError::Settings(format!("the envd peer client: {e}")))?;
    Ok((peers, replica))
}
