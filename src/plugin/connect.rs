//! Reaching the API server as kubectl does (kubeconfig, context, namespace), sending a request
//! for a Sandbox's subresource, and upgrading one to a WebSocket with the subprotocols that
//! subresource speaks.
//!
//! The upgrade is done here over kube's [`Client::send`] (so the kubeconfig's credentials,
//! TLS and proxy apply) rather than with kube's own `Client::connect`: that one hands back a
//! stream of the tungstenite major version kube was built with (not ours) and always offers
//! the exec subprotocols, also for port-forward.

use std::path::Path;

use http::header::{
    CONNECTION, SEC_WEBSOCKET_ACCEPT, SEC_WEBSOCKET_KEY, SEC_WEBSOCKET_PROTOCOL,
    SEC_WEBSOCKET_VERSION, UPGRADE,
};
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use kube::client::Body;
use tower::ServiceExt;

use crate::kube_client::StreamingBody;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::handshake::client::generate_key;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;

use super::api::{Subresource, subresource_url};
use super::errors::{PluginError, Refusal, refusal};

/// A WebSocket to the API server.
pub type Socket = WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>;

/// A client and the namespace a command acts in.
#[derive(Clone)]
pub struct Target {
    /// The API server's client, with the kubeconfig's credentials.
    pub client: Client,
    /// `-n`, else the context's namespace, else `default`.
    pub namespace: String,
    /// The API server's URL, for messages.
    pub server: String,
    /// The configuration the client was made from, for a client whose request bodies stream.
    pub config: Config,
}

/// One Sandbox's subresource: what a request is about (for its URL and its error messages).
#[derive(Debug, Clone, Copy)]
pub struct At<'a> {
    /// The namespace.
    pub ns: &'a str,
    /// The Sandbox.
    pub name: &'a str,
    /// The subresource.
    pub sub: Subresource,
}

impl At<'_> {
    /// The subresource's URL with this query.
    pub fn url(&self, query: &[(&str, String)]) -> String {
        subresource_url(self.ns, self.name, self.sub, query)
    }
}

/// Loads the client configuration the way kubectl does: `--kubeconfig`, else `$KUBECONFIG`
/// (merged), else `~/.kube/config`, else the in-cluster service account; `--context` picks
/// the context.
pub async fn load_config(
    kubeconfig: Option<&Path>,
    context: Option<&str>,
) -> Result<Config, PluginError> {
    let options = KubeConfigOptions {
        context: context.map(str::to_string),
        ..KubeConfigOptions::default()
    };
    let bad = |e: &dyn std::fmt::Display| PluginError::Config(format!("kubeconfig: {e}"));
    match (kubeconfig, context) {
        (Some(path), _) => {
            let kc = Kubeconfig::read_from(path).map_err(|e| {
                PluginError::Config(format!("reading kubeconfig {}: {e}", path.display()))
            })?;
            Config::from_custom_kubeconfig(kc, &options)
                .await
                .map_err(|e| bad(&e))
        }
        (None, Some(_)) => Config::from_kubeconfig(&options).await.map_err(|e| bad(&e)),
        (None, None) => Config::infer().await.map_err(|e| bad(&e)),
    }
}

impl Target {
    /// A client for `config`, acting in `namespace` (or the config's default namespace).
    ///
    /// kube's default retry of 429/503/504 is off: it backs off for minutes (15 tries up to
    /// 1000 s apart), which for an unavailable APIService would hang the command instead of
    /// saying what is wrong.
    pub fn new(mut config: Config, namespace: Option<String>) -> Result<Target, PluginError> {
        config.default_retry = false;
        let namespace = namespace.unwrap_or_else(|| config.default_namespace.clone());
        let server = config.cluster_url.to_string();
        let client = crate::kube_client::client(config.clone())
            .map_err(|e| PluginError::Config(format!("building the API client: {e}")))?;
        Ok(Target {
            client,
            namespace,
            server,
            config,
        })
    }
}

/// Sends `request` and returns a successful (2xx or 101) response; any other answer becomes
/// the [`PluginError`] that says what to do about it.
pub async fn send(
    target: &Target,
    at: At<'_>,
    request: Request<Body>,
) -> Result<Response<Body>, PluginError> {
    let response = target
        .client
        .send(request)
        .await
        .map_err(|e| unreachable(target, &e))?;
    accepted(response, at).await
}

/// [`send`] of a request whose body is sent while it is produced (an upload being packed).
pub async fn send_streaming(
    target: &Target,
    at: At<'_>,
    request: Request<StreamingBody>,
) -> Result<(), PluginError> {
    let client = crate::kube_client::streaming(&target.config)
        .map_err(|e| PluginError::Config(format!("building the API client: {e}")))?;
    let response = client
        .oneshot(request)
        .await
        .map_err(|e| unreachable(target, e.as_ref()))?;
    accepted(response, at).await.map(drop)
}

/// `response` when it succeeded (2xx or 101), else the refusal its status and body describe.
async fn accepted<B: hyper::body::Body>(
    response: Response<B>,
    at: At<'_>,
) -> Result<Response<B>, PluginError> {
    let status = response.status();
    if status.is_success() || status == StatusCode::SWITCHING_PROTOCOLS {
        return Ok(response);
    }
    let body = response
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    Err(refusal(
        Refusal::parse(status.as_u16(), &body),
        at.ns,
        at.name,
        at.sub,
    ))
}

/// The API server could not be asked at all.
fn unreachable(target: &Target, e: &(dyn std::error::Error + 'static)) -> PluginError {
    PluginError::Transport(format!(
        "cannot reach the API server at {}: {}; is the cluster up, and is it the \
         kubeconfig's current context (pick another with --context)?",
        target.server,
        causes(e)
    ))
}

/// An error and its sources, outermost first (the OS cause, e.g. "Connection refused", is
/// usually the last).
fn causes(e: &dyn std::error::Error) -> String {
    let mut parts = vec![e.to_string()];
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = s.source();
    }
    parts.join(": ")
}

/// Opens a WebSocket to `url` offering `protocols` (most preferred first); returns it with the
/// subprotocol the server chose.
pub async fn upgrade(
    target: &Target,
    at: At<'_>,
    url: String,
    protocols: &[&str],
) -> Result<(Socket, String), PluginError> {
    let key = generate_key();
    let request = Request::get(url)
        .header(CONNECTION, "Upgrade")
        .header(UPGRADE, "websocket")
        .header(SEC_WEBSOCKET_VERSION, "13")
        .header(SEC_WEBSOCKET_KEY, &key)
        .header(SEC_WEBSOCKET_PROTOCOL, protocols.join(", "))
        .body(Body::from(Vec::new()))
        .map_err(|e| PluginError::Usage(format!("building the request: {e}")))?;
    let response = send(target, at, request).await?;
    let protocol = check_upgrade(&response, &key, protocols)?;
    let upgraded = hyper::upgrade::on(response)
        .await
        .map_err(|e| PluginError::Transport(format!("upgrading to a WebSocket: {e}")))?;
    let socket = WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Client, None).await;
    Ok((socket, protocol))
}

/// Checks a WebSocket handshake answer: 101, the key's accept hash, one of our subprotocols.
fn check_upgrade(
    response: &Response<Body>,
    key: &str,
    protocols: &[&str],
) -> Result<String, PluginError> {
    let fail = |why: String| PluginError::Transport(format!("WebSocket handshake: {why}"));
    if response.status() != StatusCode::SWITCHING_PROTOCOLS {
        return Err(fail(format!("expected 101, got {}", response.status())));
    }
    let headers = response.headers();
    let accept = headers.get(SEC_WEBSOCKET_ACCEPT).map(|v| v.as_bytes());
    if accept != Some(derive_accept_key(key.as_bytes()).as_bytes()) {
        return Err(fail(
            "the server's Sec-WebSocket-Accept does not match".into(),
        ));
    }
    let chosen = headers
        .get(SEC_WEBSOCKET_PROTOCOL)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if !protocols.contains(&chosen) {
        return Err(fail(format!(
            "the server chose subprotocol {chosen:?}, not one of {protocols:?}"
        )));
    }
    Ok(chosen.to_string())
}
