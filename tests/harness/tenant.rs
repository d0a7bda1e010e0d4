//! One tenant of the shared engine for the image tests: a namespace with its own operator
//! instance (instance = namespace) and its Sandbox API, and Sandboxes that name an image, a
//! pull policy and a pull Secret.

use kube::Api;
use sandbox_operator::api::Sandbox;

use super::cluster::{apply_yaml_ok, client, kubectl, namespace};
use super::docker::Purge;
use super::operator::{Operator, OperatorOptions};
use super::repo;

/// A main process that idles and exits on TERM.
const IDLE: &str = r#"["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"]"#;

/// One test's namespace, its operator and its Sandbox API. Dropping it deletes the namespace
/// while the operator still runs (so the Sandboxes' finalizers are honoured and their
/// containers removed), then stops the operator and purges anything left behind.
pub struct Tenant {
    /// The namespace, also the operator instance.
    pub ns: String,
    /// Its operator.
    pub op: Operator,
    /// Sandboxes in `ns`.
    pub api: Api<Sandbox>,
    _purge: Purge,
}

impl Drop for Tenant {
    fn drop(&mut self) {
        let _ = kubectl(
            &[
                "delete",
                "namespace",
                &self.ns,
                "--wait=true",
                "--timeout=60s",
            ],
            None,
        );
    }
}

/// A tenant in a new namespace named after `prefix`, its operator started with `options`.
pub async fn tenant(prefix: &str, options: &OperatorOptions) -> Tenant {
    ensure_crd();
    let ns = namespace(prefix).await;
    let _purge = Purge(ns.clone());
    let op = Operator::start(&ns, &ns, options);
    let api = Api::namespaced(client().await, &ns);
    Tenant {
        ns,
        op,
        api,
        _purge,
    }
}

/// A Sandbox booting `image` under `policy`, with the pull Secret `secret` if any.
pub fn image_sandbox(name: &str, image: &str, policy: &str, secret: Option<&str>) -> String {
    let secrets = secret.map_or(String::new(), |s| {
        format!("  imagePullSecrets:\n    - name: {s}\n")
    });
    format!(
        "apiVersion: sandboxes.dev/v1alpha1\nkind: Sandbox\nmetadata:\n  name: {name}\nspec:\n  \
         image: {image:?}\n  imagePullPolicy: {policy}\n{secrets}  command: {IDLE}\n  \
         restartPolicy: Always\n"
    )
}

/// Applies `yaml` in `ns` (with this branch's CRD installed).
pub fn apply_sandboxes(yaml: &str, ns: &str) {
    ensure_crd();
    apply_yaml_ok(yaml, ns);
}

/// Installs this branch's Sandbox CRD unless the installed one already has its newest
/// fields (image pulls, idleness). The API server is shared by every branch's test runs, and
/// one that installs a CRD without these fields makes the API server prune them from our
/// objects.
pub fn ensure_crd() {
    let schema = ".spec.versions[0].schema.openAPIV3Schema.properties";
    let has = |path: &str, kind: &str| {
        let jsonpath = format!("jsonpath={{{schema}.{path}.type}}");
        let out = kubectl(
            &["get", "crd", "sandboxes.sandboxes.dev", "-o", &jsonpath],
            None,
        );
        String::from_utf8_lossy(&out.stdout).trim() == kind
    };
    if has("spec.properties.imagePullSecrets", "array")
        && has("spec.properties.idleTimeoutSeconds", "integer")
        && has("status.properties.lastIdle", "object")
    {
        return;
    }
    let crd = repo().join("crds/sandboxes.sandboxes.dev.yaml");
    let out = kubectl(
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            &crd.to_string_lossy(),
        ],
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = kubectl(
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/sandboxes.sandboxes.dev",
        ],
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
