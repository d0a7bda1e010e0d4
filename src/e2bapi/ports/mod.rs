//! Port URLs: `{port}-{sandboxID}.{domain}` (what the SDKs' `get_host(port)` gives), or the
//! `E2b-Sandbox-Id` and `E2b-Sandbox-Port` headers, for any port but envd's, reach that TCP
//! port inside the sandbox over HTTP and WebSocket, through the provider's port-forward
//! capability, on the E2B API's own listener. A request addressed this way never reaches
//! the REST or envd routes, whatever its path: the dispatch runs before routing.
//!
//! - [`gate`]: the sandbox found and the traffic access token checked;
//! - [`proxy`]: the request carried over the tunnel, upgrades spliced;
//! - [`error`]: E2B's JSON answers (502 closed port or unknown sandbox, 403 without token).

pub mod error;
pub mod gate;
pub mod proxy;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};

use super::envd::ENVD_PORT;
use super::envd::target::addressed;
use super::routes::E2bState;
use error::PortError;

/// `router` with port URL requests taken out before routing.
pub fn wrap(router: Router, state: E2bState) -> Router {
    router.layer(middleware::from_fn_with_state(state, dispatch))
}

/// A request naming a sandbox port other than envd's goes to the sandbox; every other
/// request to the routes.
async fn dispatch(State(s): State<E2bState>, request: Request, next: Next) -> Response {
    match addressed(request.headers(), s.site.domain.as_deref()) {
        Ok((sid, port)) if port != ENVD_PORT => match serve(&s, &sid, port, request).await {
            Ok(response) => response,
            Err(e) => e.into_response(),
        },
        _ => next.run(request).await,
    }
}

/// Admits the request, opens the port and carries the request there.
async fn serve(
    s: &E2bState,
    sid: &str,
    port: u16,
    request: Request<Body>,
) -> Result<Response, PortError> {
    let target = gate::admit(s, request.headers(), sid, port).await?;
    let tunnel = gate::connect(&target).await?;
    proxy::forward(&target, tunnel, request).await
}
