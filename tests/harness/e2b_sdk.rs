//! The official E2B SDKs driving the operator's E2B-compatible API: the pinned Python SDK
//! (installed by tests/setup/e2b-py.sh), the driver tests/e2b/driver.py and its scenario
//! modules; the pinned JS SDK (tests/setup/e2b-js.sh) and tests/e2b/driver.mjs; API keys as Secrets for a ServiceAccount, and operator options serving the API.
//! The SDK reaches envd through the same listener (`E2B_SANDBOX_URL`), as a platform team
//! that fronts the operator with one Service would.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use serde_json::Value;

use super::cluster::{apply_yaml_ok, kubectl, kubectl_ok};
use super::operator::OperatorOptions;
use super::tenant::ensure_crd;
use super::{cache, repo, unique, wait_for};

/// The SDK's Python, installed (idempotently) by the set-up script.
pub fn sdk_python() -> PathBuf {
    let version = set_up("e2b-py.sh", "E2B_PY_VERSION");
    cache().join(format!("e2b-py/{version}/bin/python"))
}

/// The pinned version a set-up script names in its line `NAME=version`, after running it
/// (idempotent: a few ms when already installed).
fn set_up(script: &str, name: &str) -> String {
    let path = repo().join("tests/setup").join(script);
    let out = Command::new("bash")
        .arg(&path)
        .output()
        .unwrap_or_else(|e| panic!("run tests/setup/{script}: {e}"));
    assert!(
        out.status.success(),
        "tests/setup/{script} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&path).expect("script");
    let prefix = format!("{name}=");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("{name} in {script}"))
        .to_string()
}

/// The JS SDK's node_modules, installed (idempotently) by the set-up script.
pub fn sdk_js_modules() -> PathBuf {
    let version = set_up("e2b-js.sh", "E2B_JS_VERSION");
    cache().join(format!("e2b-js/{version}/node_modules"))
}

/// Which official SDK drives the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SdkKind {
    /// `e2b` from PyPI, tests/e2b/driver.py.
    Python,
    /// `e2b` from npm, tests/e2b/driver.mjs.
    Js,
}

/// The SDK pointed at one operator's E2B API (REST and envd on one listener).
pub struct Sdk {
    kind: SdkKind,
    interpreter: PathBuf,
    modules: Option<PathBuf>,
    url: String,
    /// With [`Sdk::serving`]: per key, one driver process answering its scenarios.
    server: Option<Mutex<HashMap<String, Server>>>,
}

/// A driver started as `driver serve` for one key: a scenario a line in, an answer a line
/// out, so a test of many scenarios starts the interpreter and the SDK once, not each time.
struct Server {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    stderr: tempfile::NamedTempFile,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Sdk {
    /// The Python SDK against the API on `127.0.0.1:port`.
    pub fn python(port: u16) -> Sdk {
        Sdk {
            kind: SdkKind::Python,
            interpreter: sdk_python(),
            modules: None,
            url: format!("http://127.0.0.1:{port}"),
            server: None,
        }
    }

    /// The JS SDK (on the machine's `node`) against the API on `127.0.0.1:port`.
    pub fn js(port: u16) -> Sdk {
        Sdk {
            kind: SdkKind::Js,
            interpreter: PathBuf::from("node"),
            modules: Some(sdk_js_modules()),
            url: format!("http://127.0.0.1:{port}"),
            server: None,
        }
    }

    /// Which SDK this is.
    pub fn kind(&self) -> SdkKind {
        self.kind
    }

    /// The name this SDK gives the error `what` (`Authentication`, `SandboxNotFound`, …):
    /// Python's classes end in `Exception`, JS's in `Error`.
    pub fn error_name(&self, what: &str) -> String {
        match self.kind {
            SdkKind::Python => format!("{what}Exception"),
            SdkKind::Js => format!("{what}Error"),
        }
    }

    /// This SDK answering every scenario from one driver process per key (`driver serve`):
    /// each scenario still connects to its sandbox afresh, as another client would, but the
    /// interpreter and the SDK start once.
    pub fn serving(mut self) -> Sdk {
        self.server = Some(Mutex::new(HashMap::new()));
        self
    }

    /// The driver (tests/e2b/driver.py or driver.mjs) as a command with `key` and `args`.
    fn driver(&self, key: &str, args: &[&str]) -> Command {
        let driver = match self.kind {
            SdkKind::Python => "tests/e2b/driver.py",
            SdkKind::Js => "tests/e2b/driver.mjs",
        };
        let mut command = Command::new(&self.interpreter);
        if let Some(modules) = &self.modules {
            command.env("E2B_JS_MODULES", modules);
        }
        command
            .arg(repo().join(driver))
            .args(args)
            .env("E2B_API_URL", &self.url)
            .env("E2B_SANDBOX_URL", &self.url)
            .env("E2B_DOMAIN", "e2b.test")
            .env("E2B_API_KEY", key)
            .env_remove("E2B_DEBUG");
        command
    }

    /// Runs `scenario` of the driver with `key`; its JSON answer.
    pub fn run(&self, key: &str, scenario: &str, args: Value) -> Value {
        if let Some(server) = &self.server {
            return self.served(server, key, scenario, args);
        }
        let out = self
            .driver(key, &[scenario, &args.to_string()])
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

    /// [`Sdk::run`] by the driver serving `key` (started on its first scenario).
    fn served(
        &self,
        servers: &Mutex<HashMap<String, Server>>,
        key: &str,
        scenario: &str,
        args: Value,
    ) -> Value {
        let mut servers = servers.lock().unwrap_or_else(|e| e.into_inner());
        let s = servers
            .entry(key.to_string())
            .or_insert_with(|| self.serve(key));
        let asked = serde_json::json!({"scenario": scenario, "args": args});
        writeln!(s.stdin, "{asked}").expect("ask the SDK driver");
        let mut line = String::new();
        let read = s.stdout.read_line(&mut line).expect("read the SDK driver");
        serde_json::from_str(line.trim()).unwrap_or_else(|e| {
            let stderr = std::fs::read_to_string(s.stderr.path()).unwrap_or_default();
            panic!("driver {scenario} ({read} bytes): {e}; stdout: {line}; stderr: {stderr}")
        })
    }

    fn serve(&self, key: &str) -> Server {
        let stderr = tempfile::NamedTempFile::new().expect("a stderr file");
        let mut child = self
            .driver(key, &["serve"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr.reopen().expect("stderr file"))
            .spawn()
            .expect("start the SDK driver");
        Server {
            stdin: child.stdin.take().expect("stdin"),
            stdout: BufReader::new(child.stdout.take().expect("stdout")),
            child,
            stderr,
        }
    }

    /// As [`Sdk::run`], asserting the SDK raised no exception.
    pub fn ok(&self, key: &str, scenario: &str, args: Value) -> Value {
        let answer = self.run(key, scenario, args);
        assert!(answer.get("error").is_none(), "{scenario}: {answer}");
        answer
    }
}

/// A sandbox made by `Sandbox.create()` and used at once by `commands.run("echo hi")` in
/// the same SDK process, as an SDK user does (create answers once the sandbox runs); its id.
pub fn created_and_ran(sdk: &Sdk, key: &str) -> String {
    let r = sdk.ok(key, "create_and_run", serde_json::json!({"timeout": 600}));
    assert_eq!(r["stdout"], "hi\n", "{r}");
    assert_eq!(r["exit_code"], 0, "{r}");
    r["sandbox_id"].as_str().expect("id").to_string()
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
  - apiGroups: [sandboxes.dev]
    resources: [sandboxwarmpools]
    verbs: [get]
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

/// Operator options on the Docker provider serving the E2B API on `port` ([`api_config`]).
pub fn options(port: u16) -> OperatorOptions {
    OperatorOptions {
        config_extra: format!(
            "providers:\n  - name: docker\n    type: docker\n{}",
            api_config(port)
        ),
        ..OperatorOptions::default()
    }
}

/// The `e2bApi` section serving the API on `127.0.0.1:port`, the template `base` aliased
/// to the base image: the Docker engine has it, and the test nodes import it too, so the
/// alias boots on either provider.
pub fn api_config(port: u16) -> String {
    let base = super::docker::base_image();
    format!(
        "e2bApi:\n  enabled: true\n  address: 127.0.0.1:{port}\n  domain: e2b.test\n  \
         templates:\n    base: {base:?}\n"
    )
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

/// A `reattach` scenario's answer: the output produced before the reattach replayed, the
/// typed line echoed, exit 0, and `pid` listed running `/bin/bash -l -c cmd` meanwhile.
pub fn assert_reattached(r: &Value, pid: u64, cmd: &str) {
    assert_eq!(r["stdout"], "tick-1\ntick-2\ngot-hello\n", "{r}");
    assert_eq!(r["exit_code"], 0, "{r}");
    let listed = r["listed"].as_array().expect("listed");
    let me = listed
        .iter()
        .find(|p| p["pid"] == pid)
        .unwrap_or_else(|| panic!("pid {pid} not listed: {r}"));
    assert_eq!(me["cmd"], "/bin/bash", "{r}");
    assert_eq!(me["args"], serde_json::json!(["-l", "-c", cmd]), "{r}");
}
