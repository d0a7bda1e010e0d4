//! Helm, the kstatus library (as Flux reads health) and the Argo CD health check, as the
//! tests of the chart and of GitOps health run them.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use super::cluster::kubeconfig;
use super::{cache, repo};

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

/// `helm template …` with `args` (after `template`), its documents as JSON; panics with
/// helm's output when it fails.
pub fn helm_template(args: &[&str]) -> Vec<serde_json::Value> {
    use serde::Deserialize;
    let mut all = vec!["template"];
    all.extend_from_slice(args);
    let out = helm(&all);
    assert!(
        out.status.success(),
        "helm template: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let yaml = String::from_utf8_lossy(&out.stdout).into_owned();
    serde_yaml::Deserializer::from_str(&yaml)
        .map(|doc| serde_yaml::Value::deserialize(doc).expect("valid YAML"))
        .filter(|v| !v.is_null())
        .map(|v| serde_json::to_value(v).expect("YAML → JSON"))
        .collect()
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
