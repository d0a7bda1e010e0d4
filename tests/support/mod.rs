//! End-to-end harness: the real test control plane (tests/cluster/up.sh), the CRDs, a fresh
//! namespace per test, and the operator running as its own built binary, scoped to that
//! namespace with its own instance name — so tests run in parallel without seeing each
//! other's objects or provider resources.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bollard::Docker;
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};

/// The repository root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Where the test infrastructure caches its binaries and state.
pub fn cache() -> PathBuf {
    std::env::var_os("SANDBOX_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into()))
                .join(".cache/sandbox-operator")
        })
}

/// The base image tests boot.
pub fn base_image() -> String {
    std::env::var("SANDBOX_BASE_IMAGE").unwrap_or_else(|_| "sandbox-operator/base:bookworm".into())
}

struct ClusterInfo {
    kubeconfig: PathBuf,
}

static CLUSTER: OnceLock<ClusterInfo> = OnceLock::new();

/// Starts (or reuses) the control plane and installs the CRDs, once per test binary.
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
            ],
            None,
        );
        assert!(
            out.status.success(),
            "CRDs not Established: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        info
    })
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

/// A Docker client (API version negotiated: Debian's engine speaks 1.41).
pub async fn docker() -> Docker {
    Docker::connect_with_defaults()
        .expect("docker")
        .negotiate_version()
        .await
        .expect("negotiate docker API")
}

/// A unique, DNS-safe name with a prefix.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{:08x}", fastrand::u32(..))
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
pub fn apply_yaml(yaml: &str, namespace: &str) -> Output {
    kubectl(
        &["apply", "-n", namespace, "-f", "-"],
        Some(&retarget(yaml, namespace)),
    )
}

/// Polls `check` every 200 ms until it returns `Some`, or panics after `timeout` with `what`
/// and the last observation — a condition with a deadline, never a fixed sleep.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        let last = match check().await {
            Ok(v) => return v,
            Err(why) => why,
        };
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}; last: {last}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A namespace for one test.
pub async fn namespace(prefix: &str) -> String {
    use k8s_openapi::api::core::v1::Namespace;
    let name = unique(prefix);
    let api: kube::Api<Namespace> = kube::Api::all(client().await);
    let ns: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).expect("ns");
    api.create(&Default::default(), &ns)
        .await
        .expect("create namespace");
    name
}

/// A running operator process.
pub struct Operator {
    child: Option<Child>,
    /// Its instance name (`sandboxes.dev/managed-by`).
    pub instance: String,
    /// The namespace it watches (and holds its Lease in).
    pub namespace: String,
    /// Address of /metrics, /healthz, /readyz.
    pub metrics_addr: String,
    /// Its log file.
    pub log: PathBuf,
}

/// How to start an operator.
#[derive(Clone, Default)]
pub struct OperatorOptions {
    /// Extra environment (e.g. a failpoint).
    pub env: Vec<(String, String)>,
    /// Extra configuration YAML appended to the generated file (providers etc).
    pub config_extra: String,
    /// Lease duration in seconds (default 15).
    pub lease_secs: Option<u64>,
}

impl Operator {
    /// Starts the built binary watching `namespace` with instance `instance`.
    pub fn start(namespace: &str, instance: &str, opts: &OperatorOptions) -> Operator {
        let dir = repo().join("target/e2e");
        std::fs::create_dir_all(&dir).expect("log dir");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .expect("free port")
            .local_addr()
            .expect("addr")
            .port();
        let metrics_addr = format!("127.0.0.1:{port}");
        let config = dir.join(format!("{instance}.yaml"));
        let mut text = format!("instance: {instance}\nresyncSecs: 600\n");
        if opts.config_extra.is_empty() {
            text.push_str("providers:\n  - name: docker\n    type: docker\n");
        } else {
            text.push_str(&opts.config_extra);
        }
        std::fs::write(&config, text).expect("write config");
        let log = dir.join(format!("{instance}-{port}.log"));
        let file = std::fs::File::create(&log).expect("log file");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_sandbox-operator"));
        cmd.arg("run")
            .arg("--config")
            .arg(&config)
            .arg("--namespace")
            .arg(namespace)
            .arg("--metrics-addr")
            .arg(&metrics_addr)
            .arg("--lease-duration-secs")
            .arg(opts.lease_secs.unwrap_or(15).to_string())
            .env("KUBECONFIG", kubeconfig())
            .env("POD_NAMESPACE", namespace)
            .env("RUST_LOG", "info,sandbox_operator=debug,kube_runtime=warn")
            .stdout(file.try_clone().expect("log"))
            .stderr(file);
        for (k, v) in &opts.env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("start operator");
        Operator {
            child: Some(child),
            instance: instance.into(),
            namespace: namespace.into(),
            metrics_addr,
            log,
        }
    }

    /// SIGKILL, as a crash.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, and wait for a graceful exit (bounded).
    pub fn terminate(&mut self) -> Option<std::process::ExitStatus> {
        let mut c = self.child.take()?;
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(c.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = c.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = c.kill();
        c.wait().ok()
    }

    /// Waits (bounded) for the process to exit by itself (e.g. at a failpoint).
    pub async fn wait_exit(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let c = self.child.as_mut().expect("running operator");
        let status = wait_for("operator to exit", timeout, || {
            let r = c.try_wait();
            async move { r.ok().flatten().ok_or_else(|| "still running".to_string()) }
        })
        .await;
        self.child = None;
        status
    }

    /// The operator's log so far (for assertion messages).
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// GET a path on the metrics server; `None` when it does not answer.
    pub fn http_get(&self, path: &str) -> Option<String> {
        http_get(&self.metrics_addr, path)
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A minimal HTTP/1.0 GET over a TCP socket; returns the whole response (status line,
/// headers, body) or `None` when nothing answers.
pub fn http_get(addr: &str, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

/// Removes every container and volume labelled with `instance` (a test's last resort when it
/// failed before its own cleanup ran).
pub fn purge_instance(instance: &str) {
    let filter = format!("label=sandboxes.dev/managed-by={instance}");
    if let Ok(out) = Command::new("docker")
        .args(["ps", "-aq", "--filter", &filter])
        .output()
    {
        for id in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            let _ = Command::new("docker").args(["rm", "-f", "-v", id]).output();
        }
    }
    if let Ok(out) = Command::new("docker")
        .args(["volume", "ls", "-q", "--filter", &filter])
        .output()
    {
        for id in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            let _ = Command::new("docker")
                .args(["volume", "rm", "-f", id])
                .output();
        }
    }
}

/// Purges an instance's provider resources when dropped.
pub struct Purge(pub String);

impl Drop for Purge {
    fn drop(&mut self) {
        purge_instance(&self.0);
    }
}

// ---- Helm, kstatus and the Argo CD health check (tests/helm.rs, gitops.rs, kubectl_ux.rs) ----

/// The pinned helm (built by tests/cluster/build.sh).
pub fn helm_bin() -> PathBuf {
    cache().join("bin/helm")
}

/// Runs helm against the test cluster; `stdin` is piped in when given.
pub fn helm(args: &[&str]) -> Output {
    Command::new(helm_bin())
        .env("KUBECONFIG", kubeconfig())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run helm")
}

/// Installs (once per test binary) what tests/setup/tools.sh provides: lua5.4, lua5.1 and the
/// kstatus tool in `cache()/bin/kstatus`.
pub fn ensure_tools() {
    static TOOLS: OnceLock<()> = OnceLock::new();
    TOOLS.get_or_init(|| {
        let out = Command::new("bash")
            .arg(repo().join("tests/setup/tools.sh"))
            .output()
            .expect("run tests/setup/tools.sh");
        assert!(
            out.status.success(),
            "tests/setup/tools.sh failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    });
}

/// Runs `program` with `input` on stdin; returns (success, stdout, stderr).
pub fn pipe(program: &Path, args: &[&str], input: &str) -> (bool, String, String) {
    use std::io::Write;
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {}: {e}", program.display()));
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .expect("write stdin");
    let out = child.wait_with_output().expect("wait");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// How the kstatus library (sigs.k8s.io/cli-utils, as used by Flux) reads an object given as
/// JSON: `(status, message)`, e.g. `("Current", "Resource is Ready")`.
pub fn kstatus(object_json: &str) -> (String, String) {
    ensure_tools();
    let (ok, out, err) = pipe(&cache().join("bin/kstatus"), &[], object_json);
    assert!(ok, "kstatus failed: {err}");
    let (status, message) = out
        .trim_end_matches('\n')
        .split_once('\t')
        .unwrap_or((out.trim(), ""));
    (status.to_string(), message.to_string())
}

/// What the Argo CD health check deploy/argocd/health.lua says about an object given as JSON,
/// run by `interpreter` (`lua5.4` or `lua5.1`) the way Argo CD runs it: `(status, message)`.
pub fn argocd_health(interpreter: &str, object_json: &str) -> (String, String) {
    ensure_tools();
    let harness = repo().join("tests/tools/argocd/run-health.lua");
    let script = repo().join("deploy/argocd/health.lua");
    let (ok, out, err) = pipe(
        Path::new(interpreter),
        &[&harness.to_string_lossy(), &script.to_string_lossy()],
        object_json,
    );
    assert!(ok, "{interpreter} health.lua failed: {err}");
    let (status, message) = out
        .trim_end_matches('\n')
        .split_once('\t')
        .unwrap_or((out.trim(), ""));
    (status.to_string(), message.to_string())
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
