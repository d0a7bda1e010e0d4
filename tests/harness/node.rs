//! The test nodes: real kubelets (each with its own containerd and runc), the scheduler,
//! the controller-manager and kube-proxy, started by `tests/setup/node.sh` next to the
//! control plane of [`super::cluster`]. What is on them is described in
//! `tests/setup/README.md`.

use std::process::Command;
use std::sync::OnceLock;

use super::{cluster, repo};

/// The RuntimeClass the set-up creates (handler `runc`).
pub const RUNTIME_CLASS: &str = "runc";

/// The label every test node carries (`=true`).
pub const NODE_LABEL: &str = "sandboxes.dev/test-node";

/// The image preloaded on every node; Pods use it with `imagePullPolicy: IfNotPresent` or
/// `Never` (no registry on the internet is reachable).
pub const BASE_IMAGE: &str = "sandbox-operator/base:bookworm";

static NODES: OnceLock<Vec<String>> = OnceLock::new();

/// Starts (or reuses) the nodes, once per test binary, and returns the names of the Ready
/// test nodes (`sbx-node-1`, ...), sorted.
pub fn ensure() -> &'static [String] {
    NODES.get_or_init(|| {
        // the control plane first (and the CRDs, which other tests in the binary expect)
        let _ = cluster::kubeconfig();
        let up = Command::new("bash")
            .arg(repo().join("tests/setup/node.sh"))
            .output()
            .expect("run tests/setup/node.sh");
        assert!(
            up.status.success(),
            "tests/setup/node.sh failed:\n{}",
            String::from_utf8_lossy(&up.stderr)
        );
        let out = cluster::kubectl(
            &[
                "get",
                "nodes",
                "-l",
                &format!("{NODE_LABEL}=true"),
                "-o",
                r#"jsonpath={range .items[*]}{.metadata.name} {.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}"#,
            ],
            None,
        );
        assert!(
            out.status.success(),
            "listing the test nodes failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut ready: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|line| line.strip_suffix(" True").map(str::to_string))
            .collect();
        ready.sort();
        assert!(!ready.is_empty(), "node.sh succeeded but no test node is Ready");
        ready
    })
}

/// Removes an image reference from every test node's containerd (absent is fine), so a
/// test that made a node pull leaves nothing behind. Each node's containerd listens on
/// `/run/sandbox-operator/node/<node>/containerd.sock` (see `tests/setup/node.sh`).
pub fn remove_image(reference: &str) {
    for name in ensure() {
        let socket = format!("/run/sandbox-operator/node/{name}/containerd.sock");
        let _ = Command::new("ctr")
            .args(["--address", &socket, "--namespace", "k8s.io"])
            .args(["images", "rm", reference])
            .output();
    }
}
