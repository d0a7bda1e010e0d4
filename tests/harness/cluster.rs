//! The test control plane: a real kube-apiserver + etcd started by `tests/cluster/up.sh`,
//! the CRDs installed once per test binary, kubectl and a kube client against it, a fresh
//! namespace per test, and manifests applied the way a user would.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};

use super::{cache, repo, unique};

struct ClusterInfo {
    kubeconfig: PathBuf,
}

static CLUSTER: OnceLock<ClusterInfo> = OnceLock::new();

/// A Sandbox label that keeps the chart's finalizer policy off it (value `skip`; not `off`,
/// which YAML 1.1 readers such as kubectl take for a boolean): the test cluster runs the
/// policy as a cluster-wide chart install does, with this opt-out, so a test can see the
/// operator add the finalizer itself.
pub const POLICY_OPT_OUT: &str = "sandboxes.dev/test-finalizer-policy";

/// Starts (or reuses) the control plane and installs the CRDs and the chart's finalizer
/// policy (see [`POLICY_OPT_OUT`]), once per test binary.
fn cluster() -> &'static ClusterInfo {
    CLUSTER.get_or_init(|| {
        let up = Command::new("bash")
            .arg(repo().join("tests/cluster/up.sh"))
            .output()
            .expect("run tests/cluster/up.sh");
        assert!(
            up.status.success(),
            "tests/cluster/up.sh failed:\n{}",
            String::from_utf8_lossy(&up.stderr)
        );
        let kubeconfig = cache().join("cluster/kubeconfig");
        assert!(
            kubeconfig.exists(),
            "no kubeconfig at {}",
            kubeconfig.display()
        );
        let info = ClusterInfo { kubeconfig };
        let out = kubectl_with(
            &info.kubeconfig,
            &[
                "apply",
                "--server-side",
                "--force-conflicts",
                "-f",
                &repo().join("crds").to_string_lossy(),
            ],
            None,
        );
        assert!(
            out.status.success(),
            "installing CRDs failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let out = kubectl_with(
            &info.kubeconfig,
            &[
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                "crd/sandboxes.sandboxes.dev",
                "crd/sandboxvolumes.sandboxes.dev",
                "crd/sandboxtemplates.sandboxes.dev",
                "crd/sandboxbudgets.sandboxes.dev",
                "crd/sandboxwarmpools.sandboxes.dev",
            ],
            None,
        );
        assert!(
            out.status.success(),
            "CRDs not Established: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        served(&info.kubeconfig);
        let selector = format!(
            r#"{{"matchExpressions":[{{"key":"{POLICY_OPT_OUT}","operator":"NotIn","values":["skip"]}}]}}"#
        );
        let policy = Command::new("bash")
            .arg(repo().join("tests/cluster/finalizer-policy.sh"))
            .arg(selector)
            .stdin(Stdio::null())
            .output()
            .expect("run tests/cluster/finalizer-policy.sh");
        assert!(
            policy.status.success(),
            "installing the finalizer policy failed: {}",
            String::from_utf8_lossy(&policy.stderr)
        );
        info
    })
}

/// Waits until the API server serves writes of the CRDs' kinds. `Established` comes first:
/// a just-started API server answered a create right after it with ServiceUnavailable,
/// "Resource kind sandboxes.dev/v1alpha1, Kind=Sandbox not found" (seen in CI on a new
/// machine). A server-side dry run goes through the whole write path; any answer but that
/// one (an invalid probe object included) says the kind is served.
fn served(kubeconfig: &Path) {
    let probe: String = ["Sandbox", "SandboxWarmPool"]
        .map(|kind| {
            format!(
                "apiVersion: sandboxes.dev/v1alpha1\nkind: {kind}\nmetadata:\n  \
                 name: served-probe\n  namespace: default\n---\n"
            )
        })
        .concat();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let out = kubectl_with(
            kubeconfig,
            &["create", "--dry-run=server", "-f", "-"],
            Some(&probe),
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !stderr.contains("ServiceUnavailable") {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the CRDs' kinds not served 60 s after Established: {stderr}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// Path of the kubeconfig the operator and kubectl use.
pub fn kubeconfig() -> PathBuf {
    cluster().kubeconfig.clone()
}

/// The pinned kubectl.
pub fn kubectl_bin() -> PathBuf {
    cache().join("bin/kubectl")
}

fn kubectl_with(kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> Output {
    let mut cmd = Command::new(kubectl_bin());
    cmd.env("KUBECONFIG", kubeconfig)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if stdin.is_some() {
        cmd.stdin(Stdio::piped());
    }
    let mut child = cmd.spawn().expect("spawn kubectl");
    if let Some(input) = stdin {
        use std::io::Write;
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(input.as_bytes())
            .expect("write kubectl stdin");
    }
    child.wait_with_output().expect("kubectl output")
}

/// Runs kubectl against the test cluster.
pub fn kubectl(args: &[&str], stdin: Option<&str>) -> Output {
    kubectl_with(&kubeconfig(), args, stdin)
}

/// A kube client for the test cluster.
pub async fn client() -> Client {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let kc = Kubeconfig::read_from(kubeconfig()).expect("read kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("kube config");
    Client::try_from(config).expect("kube client")
}

/// Reads a manifest from `examples/`, moves every document into `namespace`, and applies it
/// with `kubectl apply`, as a user would. Panics with kubectl's error output on failure.
pub fn apply_example(file: &str, namespace: &str) {
    let text = std::fs::read_to_string(repo().join("examples").join(file)).expect("read example");
    let out = kubectl(
        &["apply", "-n", namespace, "-f", "-"],
        Some(&retarget(&text, namespace)),
    );
    assert!(
        out.status.success(),
        "kubectl apply {file} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Rewrites `metadata.namespace` of every document to `namespace`.
pub fn retarget(yaml: &str, namespace: &str) -> String {
    use serde::Deserialize;
    let mut docs = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(yaml) {
        let mut value = serde_yaml::Value::deserialize(doc).expect("yaml");
        if value.is_null() {
            continue;
        }
        if let Some(meta) = value.get_mut("metadata").and_then(|m| m.as_mapping_mut()) {
            meta.insert("namespace".into(), namespace.into());
        }
        docs.push(serde_yaml::to_string(&value).expect("yaml"));
    }
    docs.join("---\n")
}

/// Applies an inline manifest into `namespace`.
///
/// Retried while the API server's mutating admission policies cannot type the kind yet
/// (ServiceUnavailable, [`UNTYPED`]). Their type converters follow the OpenAPI the server
/// serves, which changes as APIServices come and go: a create right after a test had
/// registered its APIService failed that way (CI on a new machine, `access_aggregated`).
/// Any other answer stands.
pub fn apply_yaml(yaml: &str, namespace: &str) -> Output {
    let yaml = retarget(yaml, namespace);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let out = kubectl(&["apply", "-n", namespace, "-f", "-"], Some(&yaml));
        let untyped = String::from_utf8_lossy(&out.stderr).contains(UNTYPED);
        if !untyped || std::time::Instant::now() >= deadline {
            return out;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// What the API server answers a write whose kind its mutating admission policies cannot
/// type yet.
pub const UNTYPED: &str = "There can be a delay between when CustomResourceDefinitions are created";

/// Label on every test namespace: the pid of the test process that created it.
pub const TEST_PID_LABEL: &str = "test.sandboxes.dev/pid";

/// A namespace for one test, labelled with this process's pid (`TEST_PID_LABEL`).
pub async fn namespace(prefix: &str) -> String {
    use k8s_openapi::api::core::v1::Namespace;
    let name = unique(prefix);
    let api: kube::Api<Namespace> = kube::Api::all(client().await);
    // The creating process's pid lets `tests/cluster/gc.sh` (run at the end of `make test`)
    // remove the namespaces of test processes that have exited, whatever way they ended.
    let ns: Namespace = serde_json::from_value(serde_json::json!({"metadata": {
        "name": name,
        "labels": {TEST_PID_LABEL: std::process::id().to_string()},
    }}))
    .expect("ns");
    api.create(&Default::default(), &ns)
        .await
        .expect("create namespace");
    name
}

/// `kubectl get <resource> <name> -n <namespace> -o json`, as text; `Err` with kubectl's
/// message when it fails.
pub fn get_json(resource: &str, name: &str, namespace: &str) -> Result<String, String> {
    let out = kubectl(
        &["get", resource, name, "-n", namespace, "-o", "json"],
        None,
    );
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// Runs kubectl and returns its stdout; panics with the command and everything kubectl
/// printed when it fails.
pub fn kubectl_ok(args: &[&str], stdin: Option<&str>) -> String {
    let out = kubectl(args, stdin);
    assert!(
        out.status.success(),
        "kubectl {} failed:\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// [`apply_yaml`], panicking with kubectl's error when the apply fails.
pub fn apply_yaml_ok(yaml: &str, namespace: &str) {
    let out = apply_yaml(yaml, namespace);
    assert!(
        out.status.success(),
        "kubectl apply failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// events.k8s.io Events in `namespace` about the object `name`: (type, reason, note).
pub async fn events_about(namespace: &str, name: &str) -> Vec<(String, String, String)> {
    use k8s_openapi::api::events::v1::Event;
    let api: kube::Api<Event> = kube::Api::namespaced(client().await, namespace);
    api.list(&Default::default())
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .map(|e| {
            (
                e.type_.unwrap_or_default(),
                e.reason.unwrap_or_default(),
                e.note.unwrap_or_default(),
            )
        })
        .collect()
}

/// How many events.k8s.io Events in `namespace` with `reason` each object has.
pub async fn events_per_object(
    namespace: &str,
    reason: &str,
) -> std::collections::BTreeMap<String, usize> {
    use k8s_openapi::api::events::v1::Event;
    let api: kube::Api<Event> = kube::Api::namespaced(client().await, namespace);
    let listed = api.list(&Default::default()).await.expect("list events");
    let mut per_object = std::collections::BTreeMap::new();
    for e in listed.items {
        if e.reason.as_deref() == Some(reason) {
            let name = e.regarding.and_then(|r| r.name).unwrap_or_default();
            *per_object.entry(name).or_default() += 1;
        }
    }
    per_object
}

/// Creates the Secret `name` in `namespace`: `type_` (`None` for Opaque) and `string_data`,
/// a JSON object of key → value.
pub async fn create_secret(
    namespace: &str,
    name: &str,
    type_: Option<&str>,
    string_data: serde_json::Value,
) {
    use k8s_openapi::api::core::v1::Secret;
    let mut secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "stringData": string_data,
    }))
    .expect("a Secret");
    secret.type_ = type_.map(str::to_string);
    kube::Api::<Secret>::namespaced(client().await, namespace)
        .create(&Default::default(), &secret)
        .await
        .unwrap_or_else(|e| panic!("creating Secret {namespace}/{name}: {e}"));
}
