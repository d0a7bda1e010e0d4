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
use kube::client::ClientBuilder;
use kube::{Client, Config};
use tower::util::MapRequestLayer;

use crate::metrics::Metrics;

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
    Ok(ClientBuilder::try_from(config)?.with_layer(&count).build())
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
