//! One request carried to a sandbox port over a port-forward connection: hyper's HTTP/1
//! client on the tunnel. A WebSocket (any `Upgrade`) request is sent as it is; when the
//! sandbox switches protocols, both upgraded connections are spliced and bytes flow both
//! ways until either side ends. Each request has its own tunnel (no pooling), so a
//! sandbox's server sees one client connection per request.

use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, Request, Response, StatusCode, Uri, header};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;

use super::error::PortError;
use super::gate::{PortTarget, TRAFFIC_HEADER};
use crate::provider::stream::TunnelStream;

/// Headers of one hop only, never forwarded on a plain request (an upgrade keeps
/// `Connection` and `Upgrade`, which are its request).
const HOP_BY_HOP: &[HeaderName] = &[
    header::CONNECTION,
    header::TE,
    header::TRAILER,
    header::UPGRADE,
    header::PROXY_AUTHORIZATION,
];

/// Sends `request` to the sandbox over `tunnel`; the sandbox's response.
pub async fn forward(
    t: &PortTarget,
    tunnel: TunnelStream,
    mut request: Request<Body>,
) -> Result<Response<Body>, PortError> {
    let upgrade = wants_upgrade(request.headers());
    let client_side = upgrade.then(|| hyper::upgrade::on(&mut request));
    prepare(&mut request, upgrade);
    let failed = |e: hyper::Error| PortError::bad_gateway(&t.sid, t.port, e.to_string());
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tunnel))
        .await
        .map_err(failed)?;
    tokio::spawn(async move {
        if let Err(e) = connection.with_upgrades().await {
            tracing::debug!(error = %e, "E2B port URL: the connection to the sandbox ended");
        }
    });
    let mut response = sender.send_request(request).await.map_err(failed)?;
    match client_side {
        Some(client) if response.status() == StatusCode::SWITCHING_PROTOCOLS => {
            let sandbox = hyper::upgrade::on(&mut response);
            // An open WebSocket counts as traffic for idleness for as long as it lasts.
            let heartbeat = t.target.heartbeat.clone();
            tokio::spawn(async move {
                let _heartbeat = heartbeat;
                splice(client, sandbox).await
            });
            let (parts, _) = response.into_parts();
            Ok(Response::from_parts(parts, Body::empty()))
        }
        _ => Ok(response.map(Body::new)),
    }
}

/// Whether the client asks to switch protocols (`Connection: upgrade` with `Upgrade`).
fn wants_upgrade(headers: &HeaderMap) -> bool {
    let connection_upgrade = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    connection_upgrade && headers.contains_key(header::UPGRADE)
}

/// The request as the sandbox gets it: origin-form target, the same Host, no hop-by-hop
/// headers (unless upgrading) and never the traffic access token, which is for the operator.
fn prepare(request: &mut Request<Body>, upgrade: bool) {
    let target = request
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    *request.uri_mut() = target.parse().unwrap_or_else(|_| Uri::from_static("/"));
    let headers = request.headers_mut();
    headers.remove(TRAFFIC_HEADER);
    if !upgrade {
        for name in HOP_BY_HOP {
            headers.remove(name);
        }
    }
}

/// Copies bytes both ways between the client's and the sandbox's upgraded connections.
async fn splice(client: OnUpgrade, sandbox: OnUpgrade) {
    let (client, sandbox) = match tokio::try_join!(client, sandbox) {
        Ok(both) => both,
        Err(e) => {
            tracing::debug!(error = %e, "E2B port URL: an upgrade did not complete");
            return;
        }
    };
    let (mut client, mut sandbox) = (TokioIo::new(client), TokioIo::new(sandbox));
    if let Err(e) = tokio::io::copy_bidirectional(&mut client, &mut sandbox).await {
        tracing::debug!(error = %e, "E2B port URL: an upgraded connection ended");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(pairs: &[(&str, &str)]) -> Request<Body> {
        let mut b = Request::builder().uri("http://8080-x.e2b.test/a/b?c=d");
        for (k, v) in pairs {
            b = b.header(*k, *v);
        }
        b.body(Body::empty()).unwrap()
    }

    #[test]
    fn a_plain_request_loses_hop_headers_and_the_token_but_keeps_its_host() {
        let mut r = request(&[
            ("host", "8080-x.e2b.test"),
            ("connection", "keep-alive"),
            (TRAFFIC_HEADER, "secret"),
            ("x-app", "1"),
        ]);
        assert!(!wants_upgrade(r.headers()));
        prepare(&mut r, false);
        assert_eq!(r.uri(), "/a/b?c=d");
        assert_eq!(r.headers()["host"], "8080-x.e2b.test");
        assert_eq!(r.headers()["x-app"], "1");
        assert!(r.headers().get("connection").is_none());
        assert!(r.headers().get(TRAFFIC_HEADER).is_none());
    }

    #[test]
    fn an_upgrade_keeps_its_connection_and_upgrade_headers() {
        let mut r = request(&[
            ("connection", "keep-alive, Upgrade"),
            ("upgrade", "websocket"),
            (TRAFFIC_HEADER, "secret"),
        ]);
        assert!(wants_upgrade(r.headers()));
        prepare(&mut r, true);
        assert_eq!(r.headers()["upgrade"], "websocket");
        assert!(r.headers().get(TRAFFIC_HEADER).is_none());
        assert!(!wants_upgrade(
            request(&[("upgrade", "websocket")]).headers()
        ));
    }
}
