//! The aggregated API's routes: discovery, `/healthz`, and the subresources of
//! `sandboxes/{name}`. Every subresource request goes through the same stages in order:
//! authenticate (front proxy) → authorize (SubjectAccessReview) → look the Sandbox up →
//! serve. Authorization comes before the lookup, so a user learns nothing about Sandboxes
//! they may not reach, not even whether one exists.

use std::sync::{Arc, RwLock};

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{Response, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::{any, get};

use super::authn::{self, FrontProxy, Peer, UserInfo};
use super::authz::{Attributes, Authorizer};
use super::discovery;
use super::lookup::Directory;
use super::params::Subresource;
use super::status::AccessError;
use super::{exec, files, log, portforward};

/// The front proxy's current settings, refreshed while the server runs.
#[derive(Clone, Default)]
pub struct FrontProxyCell(Arc<RwLock<Arc<FrontProxy>>>);

impl FrontProxyCell {
    /// A cell holding `front`.
    pub fn new(front: FrontProxy) -> Self {
        FrontProxyCell(Arc::new(RwLock::new(Arc::new(front))))
    }

    /// The current settings.
    pub fn get(&self) -> Arc<FrontProxy> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replaces them.
    pub fn set(&self, front: FrontProxy) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(front);
    }
}

/// What every handler shares.
#[derive(Clone)]
pub struct AccessState {
    /// Finds Sandboxes and their providers.
    pub directory: Arc<dyn Directory>,
    /// Decides who may do what.
    pub authorizer: Arc<dyn Authorizer>,
    /// The front proxy's settings.
    pub front: FrontProxyCell,
    /// Largest `files` upload.
    pub max_upload_bytes: u64,
}

/// The router. Each request must carry the connection's [`Peer`] as an extension (the
/// listener adds it).
pub fn router(state: AccessState) -> Router {
    let base = format!("/apis/{}/{}", discovery::GROUP, discovery::VERSION);
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(|| async { "ok" }))
        .route("/apis", get(|s, r| discover(s, r, discovery::group_list)))
        .route(
            &format!("/apis/{}", discovery::GROUP),
            get(|s, r| discover(s, r, discovery::api_group)),
        )
        .route(&base, get(|s, r| discover(s, r, discovery::resource_list)))
        .route(
            &format!("{base}/namespaces/{{namespace}}/sandboxes/{{name}}/{{subresource}}"),
            any(subresource),
        )
        .with_state(state)
}

fn user(state: &AccessState, request: &Request) -> Result<UserInfo, AccessError> {
    let peer = request
        .extensions()
        .get::<Peer>()
        .cloned()
        .unwrap_or_default();
    authn::authenticate(&state.front.get(), &peer, request.headers())
}

/// A discovery document, to any user the front proxy vouches for.
async fn discover(
    State(state): State<AccessState>,
    request: Request,
    document: fn() -> serde_json::Value,
) -> Response<Body> {
    if let Err(e) = user(&state, &request) {
        return e.into_response();
    }
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        document().to_string(),
    )
        .into_response()
}

async fn subresource(
    State(state): State<AccessState>,
    Path((namespace, name, segment)): Path<(String, String, String)>,
    request: Request,
) -> Response<Body> {
    match serve(state, namespace, name, &segment, request).await {
        Ok(response) => response,
        Err(e) => {
            tracing::debug!(error = %e, "aggregated API request refused");
            e.into_response()
        }
    }
}

async fn serve(
    state: AccessState,
    namespace: String,
    name: String,
    segment: &str,
    request: Request,
) -> Result<Response<Body>, AccessError> {
    let Some(sub) = Subresource::parse(segment) else {
        return Err(AccessError::NotFound(format!(
            "sandboxes has no subresource {segment:?} (served: exec, attach, log, portforward, files)"
        )));
    };
    let user = user(&state, &request)?;
    let attrs = Attributes {
        verb: sub.verb(),
        subresource: sub.name(),
        namespace,
        name,
    };
    state.authorizer.authorize(&user, &attrs).await?;
    let target = state
        .directory
        .find(&attrs.namespace, &attrs.name, sub.need())
        .await?;
    match sub {
        Subresource::Exec => exec::serve(target, request).await,
        Subresource::Attach => Err(AccessError::NotImplemented(format!(
            "provider {} cannot attach to a sandbox's main process; use exec",
            target.handle.name()
        ))),
        Subresource::Log => log::serve(target, request).await,
        Subresource::PortForward => portforward::serve(target, request).await,
        Subresource::Files => files::serve(target, request, state.max_upload_bytes).await,
    }
}
