//! The HTTPS listener: TLS with the front proxy's CA as client-certificate roots, one hyper
//! HTTP/1 connection per client with upgrades (the WebSockets), and the connection's verified
//! [`Peer`] handed to every request on it. The front proxy's settings are re-read
//! periodically, so a rotated requestheader CA is picked up without a restart.

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use kube::Client;
use rustls::ServerConfig;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;

use super::authn::{FrontProxy, Peer};
use super::routes::FrontProxyCell;
use super::tls::{self, ServingCert};

/// How often the front proxy's settings are re-read.
const REFRESH: Duration = Duration::from_secs(60);
/// A client that has not finished its TLS handshake by then is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The current TLS configuration and front-proxy settings, replaced together.
#[derive(Clone)]
pub struct Trust {
    tls: Arc<RwLock<Arc<ServerConfig>>>,
    /// The settings the routes authenticate with.
    pub front: FrontProxyCell,
    cert: ServingCert,
}

impl Trust {
    /// Trust built from `front` (no client CA yet when it has none).
    pub fn new(cert: ServingCert, front: FrontProxy) -> Result<Trust, String> {
        let config = tls::server_config(&cert, front.client_ca_pem.as_deref())?;
        Ok(Trust {
            tls: Arc::new(RwLock::new(config)),
            front: FrontProxyCell::new(front),
            cert,
        })
    }

    /// Installs new front-proxy settings (and the TLS configuration they imply).
    pub fn update(&self, front: FrontProxy) -> Result<(), String> {
        let config = tls::server_config(&self.cert, front.client_ca_pem.as_deref())?;
        *self.tls.write().unwrap_or_else(|e| e.into_inner()) = config;
        self.front.set(front);
        Ok(())
    }

    fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.tls.read().unwrap_or_else(|e| e.into_inner()).clone())
    }

    /// Re-reads the settings every [`REFRESH`] until `stop`; a failed read keeps the last.
    pub async fn refresh(self, client: Client, stop: impl std::future::Future<Output = ()>) {
        tokio::pin!(stop);
        loop {
            tokio::select! {
                () = &mut stop => return,
                () = tokio::time::sleep(REFRESH) => {}
            }
            let result = FrontProxy::load(&client).await.and_then(|f| self.update(f));
            if let Err(e) = result {
                tracing::warn!(error = %e, "aggregated API: keeping the last front-proxy settings");
            }
        }
    }
}

/// Accepts connections until `stop`.
pub async fn serve(
    listener: TcpListener,
    trust: Trust,
    router: Router,
    stop: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(stop);
    loop {
        let accepted = tokio::select! {
            () = &mut stop => return,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((tcp, addr)) => {
                // Exec and port-forward frames are small writes in a row: without this,
                // Nagle holds each one until the API server acknowledges the last.
                let _ = tcp.set_nodelay(true);
                tokio::spawn(connection(tcp, addr, trust.acceptor(), router.clone()));
            }
            Err(e) => {
                tracing::warn!(error = %e, "aggregated API: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// One client connection: handshake, then HTTP/1 with upgrades.
async fn connection(
    tcp: tokio::net::TcpStream,
    addr: SocketAddr,
    acceptor: TlsAcceptor,
    router: Router,
) {
    let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            tracing::debug!(%addr, error = %e, "aggregated API: TLS handshake refused");
            return;
        }
        Err(_) => return,
    };
    let peer = Peer {
        common_name: tls::peer_common_name(tls.get_ref().1.peer_certificates()),
    };
    serve_http(TokioIo::new(tls), peer, router).await;
}

/// Serves HTTP/1 (with upgrades) on `io`, every request carrying `peer`.
pub async fn serve_http<I>(io: I, peer: Peer, router: Router)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
        request.extensions_mut().insert(peer.clone());
        router.clone().oneshot(request.map(axum::body::Body::new))
    });
    let served = hyper::server::conn::http1::Builder::new()
        .serve_connection(io, service)
        .with_upgrades()
        .await;
    if let Err(e) = served {
        tracing::debug!(error = %e, "aggregated API: connection ended with an error");
    }
}
