//! The Kubernetes client, with every request it sends counted in
//! `sandbox_operator_kube_requests_total{verb, resource}`.
//!
//! The count is how an operator's steady load on the API server is seen and bounded: watches
//! instead of polls should leave only watch re-opens and Lease renewals once nothing changes
//! (`make bench` reports requests/s at idle against object count from this metric). Labels
//! are derived from the request line only — method, path shape and `watch=true` — so they are
//! bounded: a verb from a fixed set and a resource plural (with its subresource), never a
//! namespace or an object name.
//!
//! [`paging`] is the one way a list is read in pages, for the providers and the controllers
//! alike.

pub mod paging;

use http::{Method, Request, Uri};
use http_body_util::BodyExt;
use hyper_timeout::TimeoutConnector;
use hyper_util::client::legacy::connect::{Connect, HttpConnector};
use hyper_util::rt::TokioExecutor;
use kube::client::retry::RetryPolicy;
use kube::client::{ClientBuilder, ConfigExt, DynBody};
use kube::{Client, Config};
use tower::retry::RetryLayer;
use tower::util::MapRequestLayer;
use tower::{BoxError, ServiceBuilder, ServiceExt};
use tower_http::ServiceExt as _;
use tower_http::trace::TraceLayer;

use crate::metrics::Metrics;

/// The client stack [`builder`] makes (kube's own `GenericService`, which it does not export).
pub type Stack =
    tower::util::BoxService<Request<kube::client::Body>, http::Response<Box<DynBody>>, BoxError>;

/// A client from the inferred configuration (in-cluster, else `KUBECONFIG`), counting its
/// requests into `metrics`.
pub async fn counted(metrics: &Metrics) -> kube::Result<Client> {
    let config = Config::infer().await.map_err(kube::Error::InferConfig)?;
    let metrics = metrics.clone();
    let count = MapRequestLayer::new(move |request: Request<kube::client::Body>| {
        let (verb, resource) = classify(request.method(), request.uri());
        metrics.kube_request(verb, &resource);
        request
    });
    Ok(builder(config)?.with_layer(&count).build())
}

/// A client for `config`: see [`builder`].
pub fn client(config: Config) -> kube::Result<Client> {
    Ok(builder(config)?.build())
}

/// kube's own client stack (base URI, retries, authentication, extra headers, tracing,
/// timeouts, rustls), with `TCP_NODELAY` on its connections. kube leaves Nagle's algorithm
/// on, and a resumed TLS session then costs every new connection 40 ms: the client's
/// `Finished` and the request go out as two writes, the second held until the API server
/// acknowledges the first, which it delays (it has nothing to send on a resumption). A
/// connection is new after each exec, attach or dropped watch (none goes back to the pool),
/// so the E2B API's create and the Kubernetes provider's claim paid it on every call.
pub fn builder(config: Config) -> kube::Result<ClientBuilder<Stack>> {
    let hyper: hyper_util::client::legacy::Client<_, kube::client::Body> =
        hyper_util::client::legacy::Builder::new(TokioExecutor::new()).build(connector(&config)?);
    let retry = config
        .default_retry
        .then(|| RetryLayer::new(RetryPolicy::server_retry()));
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(retry)
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .layer(TraceLayer::new_for_http())
        .map_err(BoxError::from)
        .service(hyper);
    let boxed = service
        .map_response_body(|body| Box::new(BodyExt::map_err(body, BoxError::from)) as Box<DynBody>)
        .boxed();
    Ok(ClientBuilder::new(boxed, config.default_namespace))
}

/// A request body sent while it is still being produced.
pub type StreamingBody = http_body_util::combinators::BoxBody<bytes::Bytes, std::io::Error>;

/// The client stack [`streaming`] makes.
pub type Streaming = tower::util::BoxService<
    Request<StreamingBody>,
    http::Response<hyper::body::Incoming>,
    BoxError,
>;

/// A client whose request bodies are streams. kube's own `Body` can only be built whole, so an
/// upload through [`client`] is packed entirely before its first byte is sent; this one sends
/// each piece as it is packed. The same connections, base URI, authentication and extra
/// headers as [`builder`], without retries: a streamed body cannot be sent twice.
pub fn streaming(config: &Config) -> kube::Result<Streaming> {
    let hyper: hyper_util::client::legacy::Client<_, StreamingBody> =
        hyper_util::client::legacy::Builder::new(TokioExecutor::new()).build(connector(config)?);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(hyper);
    Ok(service.boxed())
}

/// kube's rustls connector with the config's timeouts, and `TCP_NODELAY` (see [`builder`]).
fn connector(config: &Config) -> kube::Result<impl Connect + Clone + Send + Sync + 'static> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    let https = config.rustls_https_connector_with_connector(http)?;
    let mut connector = TimeoutConnector::new(https);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    Ok(connector)
}

/// The Kubernetes verb and `resource[/subresource]` of a request, read from its method and
/// path (`/api/v1/...` or `/apis/{group}/{version}/...`). API discovery (`/api`, `/apis`,
/// `/apis/{group}[/{version}]`, which the readiness probe reads every 10 s) is the resource
/// `discovery`; any other path (`/version`, `/readyz`) is `other`.
pub fn classify(method: &Method, uri: &Uri) -> (&'static str, String) {
    let segments: Vec<&str> = uri.path().split('/').filter(|s| !s.is_empty()).collect();
    let rest = match segments.as_slice() {
        ["api", _version, rest @ ..] if !rest.is_empty() => rest,
        ["apis", _group, _version, rest @ ..] if !rest.is_empty() => rest,
        ["api" | "apis", ..] => return (verb_of(method, false, true), "discovery".into()),
        _ => return (verb_of(method, false, true), "other".into()),
    };
    // `namespaces/{ns}/{resource}…` addresses a namespaced resource; `namespaces` alone or
    // `namespaces/{name}` is the Namespace resource itself.
    let rest = match rest {
        ["namespaces", _ns, inner @ ..] if !inner.is_empty() => inner,
        other => other,
    };
    let (resource, named) = match rest {
        [] => ("other".to_string(), true), // unreachable: `rest` is never empty here
        [plural] => ((*plural).to_string(), false),
        [plural, _name] => ((*plural).to_string(), true),
        [plural, _name, sub, ..] => (format!("{plural}/{sub}"), true),
    };
    let watch = uri
        .query()
        .is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
    (verb_of(method, watch, named), resource)
}

/// The verb of a request by its method; `named` tells a get from a list and a delete from a
/// deletecollection.
fn verb_of(method: &Method, watch: bool, named: bool) -> &'static str {
    match *method {
        Method::GET if watch => "watch",
        Method::GET if named => "get",
        Method::GET => "list",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if named => "delete",
        Method::DELETE => "deletecollection",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(method: Method, uri: &str) -> (&'static str, String) {
        classify(&method, &uri.parse::<Uri>().expect("uri"))
    }

    #[test]
    fn namespaced_custom_resources_and_their_subresources() {
        let base = "/apis/sandboxes.dev/v1alpha1/namespaces/team-a/sandboxes";
        assert_eq!(c(Method::GET, base), ("list", "sandboxes".into()));
        assert_eq!(
            c(Method::GET, &format!("{base}?watch=true&resourceVersion=7")),
            ("watch", "sandboxes".into())
        );
        assert_eq!(
            c(Method::GET, &format!("{base}/box-1")),
            ("get", "sandboxes".into())
        );
        assert_eq!(
            c(
                Method::PATCH,
                &format!("{base}/box-1/status?fieldManager=x")
            ),
            ("patch", "sandboxes/status".into())
        );
        assert_eq!(c(Method::POST, base), ("create", "sandboxes".into()));
        assert_eq!(
            c(Method::DELETE, &format!("{base}/box-1")),
            ("delete", "sandboxes".into())
        );
        assert_eq!(
            c(Method::DELETE, base),
            ("deletecollection", "sandboxes".into())
        );
    }

    #[test]
    fn core_cluster_scoped_and_namespace_paths() {
        assert_eq!(
            c(Method::GET, "/api/v1/namespaces/team-a/secrets/token"),
            ("get", "secrets".into())
        );
        assert_eq!(
            c(Method::GET, "/api/v1/namespaces/team-a"),
            ("get", "namespaces".into())
        );
        assert_eq!(
            c(Method::GET, "/api/v1/namespaces"),
            ("list", "namespaces".into())
        );
        assert_eq!(
            c(
                Method::PUT,
                "/apis/coordination.k8s.io/v1/namespaces/ops/leases/sandbox-operator"
            ),
            ("update", "leases".into())
        );
        assert_eq!(
            c(
                Method::POST,
                "/apis/events.k8s.io/v1/namespaces/team-a/events"
            ),
            ("create", "events".into())
        );
        assert_eq!(c(Method::GET, "/version"), ("get", "other".into()));
        assert_eq!(c(Method::GET, "/apis"), ("get", "discovery".into()));
        assert_eq!(
            c(Method::GET, "/apis/sandboxes.dev/v1alpha1"),
            ("get", "discovery".into())
        );
        assert_eq!(c(Method::GET, "/api/v1"), ("get", "discovery".into()));
    }
}
