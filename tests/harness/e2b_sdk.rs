//! The official E2B SDKs driving the operator's E2B-compatible API: the pinned Python SDK
//! (installed by tests/setup/e2b-py.sh), the driver tests/e2b/driver.py and its scenario
//! modules, API keys as Secrets for a ServiceAccount, and operator options serving the API.
//! The SDK reaches envd through the same listener (`E2B_SANDBOX_URL`), as a platform team
//! that fronts the operator with one Service would.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use super::cluster::{apply_yaml_ok, kubectl, kubectl_ok};
use super::operator::OperatorOptions;
use super::tenant::ensure_crd;
use super::{cache, repo, unique, wait_for};

/// The SDK's Python, installed (idempotently) by the set-up script.
pub fn sdk_python() -> PathBuf {
    let out = Command::new("bash")
        .arg(repo().join("tests/setup/e2b-py.sh"))
        .output()
        .expect("run tests/setup/e2b-py.sh");
    assert!(
        out.status.success(),
        "tests/setup/e2b-py.sh failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let script = std::fs::read_to_string(repo().join("tests/setup/e2b-py.sh")).expect("script");
    let version = script
        .lines()
        .find_map(|l| l.strip_prefix("E2B_PY_VERSION="))
        .expect("E2B_PY_VERSION in e2b-py.sh");
    cache().join(format!("e2b-py/{version}/bin/python"))
}

/// The SDK pointed at one operator's E2B API (REST and envd on one listener).
pub struct Sdk {
    python: PathBuf,
    url: String,
}

impl Sdk {
    /// The Python SDK against the API on `127.0.0.1:port`.
    pub fn python(port: u16) -> Sdk {
        Sdk {
            python: sdk_python(),
            url: format!("http://127.0.0.1:{port}"),
        }
    }

    /// Runs `scenario` of tests/e2b/driver.py with `key`; its JSON answer.
    pub fn run(&self, key: &str, scenario: &str, args: Value) -> Value {
        let out = Command::new(&self.python)
            .arg(repo().join("tests/e2b/driver.py"))
            .arg(scenario)
            .arg(args.to_string())
            .env("E2B_API_URL", &self.url)
            .env("E2B_SANDBOX_URL", &self.url)
            .env("E2B_DOMAIN", "e2b.test")
            .env("E2B_API_KEY", key)
            .env_remove("E2B_DEBUG")
            .output()
            .expect("run the SDK driver");
        let stdout = String::from_utf8_lossy(&out.stdout);
        serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
            panic!(
                "driver {scenario}: {e}; stdout: {stdout}; stderr: {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
    }

    /// As [`Sdk::run`], asserting the SDK raised no exception.
    pub fn ok(&self, key: &str, scenario: &str, args: Value) -> Value {
        let answer = self.run(key, scenario, args);
        assert!(answer.get("error").is_none(), "{scenario}: {answer}");
        answer
    }
}

/// A ServiceAccount allowed to manage Sandboxes in `ns`, and an API key Secret for it.
pub fn key_for(ns: &str) -> String {
    let key = format!("e2b_{}", unique("k").replace('-', ""));
    let yaml = format!(
        r#"apiVersion: v1
kind: ServiceAccount
metadata: {{name: agent}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: e2b-agent}}
rules:
  - apiGroups: [sandboxes.dev]
    resources: [sandboxes, sandboxtemplates]
    verbs: [get, list, watch, create, patch, update, delete]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: e2b-agent}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: e2b-agent}}
subjects: [{{kind: ServiceAccount, name: agent, namespace: {ns}}}]
---
apiVersion: v1
kind: Secret
metadata: {{name: e2b-key}}
type: sandboxes.dev/e2b-api-key
stringData: {{apiKey: {key}, serviceAccount: agent}}
"#
    );
    apply_yaml_ok(&yaml, ns);
    key
}

/// Operator options on the Docker provider serving the E2B API on `port`, the template
/// `base` aliased to the base image.
pub fn options(port: u16) -> OperatorOptions {
    let base = super::docker::base_image();
    OperatorOptions {
        config_extra: format!(
            "providers:\n  - name: docker\n    type: docker\ne2bApi:\n  enabled: true\n  \
             address: 127.0.0.1:{port}\n  domain: e2b.test\n  templates:\n    base: {base:?}\n"
        ),
        ..OperatorOptions::default()
    }
}

/// A port free on loopback now.
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("free port");
    l.local_addr().expect("addr").port()
}

/// The E2B API listens.
pub async fn api_up(port: u16) {
    wait_for(
        "the E2B API to listen",
        Duration::from_secs(60),
        || async move {
            std::net::TcpStream::connect(("127.0.0.1", port))
                .map(drop)
                .map_err(|e| e.to_string())
        },
    )
    .await;
}

/// This branch's Sandbox CRD when the installed one lacks the lifetime action `Sleep` (the
/// API server is shared by every branch's tests; [`ensure_crd`] checks older fields only).
pub fn ensure_sleep_crd() {
    ensure_crd();
    let path = "jsonpath={.spec.versions[0].schema.openAPIV3Schema.properties.spec.properties.lifetime.properties.action.enum}";
    let installed = kubectl(&["get", "crd", "sandboxes.sandboxes.dev", "-o", path], None);
    if String::from_utf8_lossy(&installed.stdout).contains("Sleep") {
        return;
    }
    let crd = repo().join("crds/sandboxes.sandboxes.dev.yaml");
    let crd = crd.to_string_lossy();
    kubectl_ok(
        &["apply", "--server-side", "--force-conflicts", "-f", &crd],
        None,
    );
    let established = [
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/sandboxes.sandboxes.dev",
    ];
    kubectl_ok(&established, None);
}
