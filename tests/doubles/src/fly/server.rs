//! The double's HTTP server: its own accept loop (so a fault can close a connection without
//! any response), a gate in front of the router that records every request, applies armed
//! faults and checks the bearer token, and the routes.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, Request, Response, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tower::ServiceExt;

use super::faults::{Fault, RequestRecord, lock};
use super::store::ApiError;
use super::{Shared, leases, machines, volumes};

/// The Machines API routes.
pub fn router(shared: Arc<Shared>) -> Router {
    let machine = "/v1/apps/{app}/machines/{id}";
    Router::new()
        .route(
            "/v1/apps",
            get(volumes::list_apps).post(volumes::create_app),
        )
        .route("/v1/apps/{app}", get(volumes::get_app))
        .route(
            "/v1/apps/{app}/machines",
            get(machines::list).post(machines::create),
        )
        .route(
            machine,
            get(machines::get)
                .post(machines::update)
                .delete(machines::destroy),
        )
        .route(&format!("{machine}/start"), post(machines::start))
        .route(&format!("{machine}/stop"), post(machines::stop))
        .route(&format!("{machine}/suspend"), post(machines::suspend))
        .route(&format!("{machine}/wait"), get(machines::wait))
        .route(&format!("{machine}/exec"), post(machines::exec))
        .route(
            &format!("{machine}/lease"),
            get(leases::show)
                .post(leases::acquire)
                .delete(leases::release),
        )
        .route(&format!("{machine}/metadata"), get(machines::metadata))
        .route(
            &format!("{machine}/metadata/{{key}}"),
            post(machines::set_metadata).delete(machines::delete_metadata),
        )
        .route(
            "/v1/apps/{app}/volumes",
            get(volumes::list).post(volumes::create),
        )
        .route(
            "/v1/apps/{app}/volumes/{id}",
            get(volumes::get)
                .put(volumes::update)
                .delete(volumes::delete),
        )
        .fallback(|| async { ApiError::not_found("no such endpoint") })
        .with_state(shared)
}

/// Accepts connections until `stop` turns true.
pub async fn serve(
    listener: TcpListener,
    shared: Arc<Shared>,
    router: Router,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let shared = shared.clone();
                let router = router.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        gate(shared.clone(), router.clone(), req)
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
            _ = stop.changed() => return,
        }
    }
}

/// Records the request, applies an armed fault, checks the token, then routes. An `Err`
/// makes hyper close the connection without answering (the "dropped" fault).
async fn gate(
    shared: Arc<Shared>,
    router: Router,
    req: Request<Incoming>,
) -> Result<Response<Body>, std::io::Error> {
    let _counted = super::InFlight::new(&shared);
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let authorized = authorized(&shared, req.headers());
    shared.log.push(RequestRecord {
        method: method.clone(),
        path: path.clone(),
        query: query.clone(),
        at: std::time::Instant::now(),
        authorized,
    });
    let mut truncate = false;
    match shared.faults.take(&method, &path, &query) {
        Some(Fault::Drop) => {
            return Err(std::io::Error::other(
                "connection dropped by fault injection",
            ));
        }
        Some(Fault::Status {
            code,
            message,
            classification,
            retry_after,
        }) => {
            let mut err = ApiError::new(code, message);
            err.body.status = classification;
            let mut response = err.into_response();
            if let Some(secs) = retry_after {
                response
                    .headers_mut()
                    .insert("retry-after", secs.to_string().parse().expect("digits"));
            }
            return Ok(response);
        }
        Some(Fault::Delay(delay)) => tokio::time::sleep(delay).await,
        Some(Fault::Truncate) => truncate = true,
        None => {}
    }
    if !authorized {
        return Ok(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "You must be authenticated to view this.",
        )
        .into_response());
    }
    let response = match router.oneshot(req.map(Body::new)).await {
        Ok(response) => response,
        Err(never) => match never {},
    };
    Ok(if truncate {
        cut(response).await
    } else {
        response
    })
}

/// Whether the request carries a valid token (`Authorization: Bearer …` or `FlyV1 …`).
fn authorized(shared: &Shared, headers: &HeaderMap) -> bool {
    let Some(value) = headers.get("authorization").and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let token = value
        .strip_prefix("Bearer ")
        .or_else(|| value.strip_prefix("FlyV1 "))
        .unwrap_or("");
    lock(&shared.tokens).contains(token)
}

/// Sends the headers and the first half of the body, then fails the body stream (hyper
/// aborts the connection mid-response).
async fn cut(response: Response<Body>) -> Response<Body> {
    let (mut parts, body) = response.into_parts();
    let bytes = axum::body::to_bytes(body, usize::MAX)
        .await
        .unwrap_or_default();
    let half = bytes.slice(0..bytes.len() / 2);
    parts.headers.remove("content-length");
    let chunks: Vec<Result<bytes::Bytes, std::io::Error>> = vec![
        Ok(half),
        Err(std::io::Error::other(
            "response truncated by fault injection",
        )),
    ];
    Response::from_parts(parts, Body::from_stream(futures::stream::iter(chunks)))
}
