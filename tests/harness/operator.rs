//! The operator run as its own built binary, out of cluster against the test control plane,
//! scoped to one namespace with its own instance name — so tests run in parallel without
//! seeing each other's objects or provider resources.

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use super::cluster::kubeconfig;
use super::{repo, wait_for};

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
        let port = sandbox_doubles::ports::quiet_port();
        let metrics_addr = format!("127.0.0.1:{port}");
        let config = dir.join(format!("{instance}.yaml"));
        let mut text = format!("instance: {instance}\nresyncSecs: 600\n");
        if opts.config_extra.is_empty() {
            text.push_str("providers:\n  - name: docker\n    type: docker\n");
        } else {
            text.push_str(&opts.config_extra);
        }
        // The base image the tests boot is open to every namespace, also when
        // SANDBOX_BASE_IMAGE names another than the operator's default.
        if !text.contains("openImages:") {
            if !text.ends_with('\n') {
                text.push('\n');
            }
            let base = super::docker::base_image();
            text.push_str(&format!("openImages: [{base:?}]\n"));
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
