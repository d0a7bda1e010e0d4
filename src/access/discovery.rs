//! Discovery documents of `subresources.sandboxes.dev/v1alpha1`: what the aggregator checks
//! to mark the APIService Available, and what `kubectl api-resources` lists.

use serde_json::{Value, json};

use super::params::Subresource;

/// The API group.
pub const GROUP: &str = "subresources.sandboxes.dev";
/// Its one version.
pub const VERSION: &str = "v1alpha1";

fn group_version() -> String {
    format!("{GROUP}/{VERSION}")
}

fn group() -> Value {
    let version = json!({"groupVersion": group_version(), "version": VERSION});
    json!({
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": GROUP,
        "versions": [version],
        "preferredVersion": version,
    })
}

/// `/apis`.
pub fn group_list() -> Value {
    let mut g = group();
    if let Some(o) = g.as_object_mut() {
        o.remove("kind");
        o.remove("apiVersion");
    }
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [g]})
}

/// `/apis/subresources.sandboxes.dev`.
pub fn api_group() -> Value {
    group()
}

/// `/apis/subresources.sandboxes.dev/v1alpha1`.
pub fn resource_list() -> Value {
    let resources: Vec<Value> = Subresource::ALL
        .into_iter()
        .map(|s| {
            json!({
                "name": format!("sandboxes/{}", s.name()),
                "singularName": "",
                "namespaced": true,
                "kind": "Sandbox",
                "verbs": [s.verb()],
            })
        })
        .collect();
    json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version(),
        "resources": resources,
    })
}
