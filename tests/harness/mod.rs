//! The one harness for integration tests: where the repository and the test cache are,
//! unique names, and polling with a deadline; one module per real thing the tests drive.
//!
//! - [`docker`]: the local engine — the base image, a per-test [`docker::TestEnv`] with a
//!   provider, and cleanup of everything labelled with a test's instance;
//! - [`cluster`]: the test control plane (`tests/cluster/up.sh`), kubectl, a kube client,
//!   namespaces, manifests, Secrets and Events;
//! - [`operator`]: the operator binary run out of cluster against that control plane;
//! - [`tools`]: helm, kstatus and the Argo CD health check;
//! - [`s3`]: the test S3 server's settings, a template store on it and the cleanup of a prefix;
//! - [`no_native_templates`]: Docker with its native templates hidden, the stand-in for a
//!   provider without image commit (Fly Machines, E2B);
//! - [`registry`]: the test image registry, images pushed to it, and its access log;
//! - [`kubernetes`]: the Kubernetes provider on the real test node(s), a namespace per test;
//! - [`node`]: real Kubernetes nodes (kubelet + containerd) for Pods (`tests/setup/node.sh`);
//! - [`image`]: the operator image from the test build, and loaded into the test nodes;
//! - [`engine_proxy`]: a counting proxy in front of the Docker engine (requests by path);
//! - [`objects`]: waiting on the objects a test applied (Ready, gone) and patching their spec;
//! - [`metrics`]: reading the operator's Prometheus metrics;
//! - [`dns`]: a stub DNS server whose answers the test decides;
//! - [`e2b`]: the E2B double as a [`world`]'s far side;
//! - [`e2b_sdk`]: the official E2B SDKs driving the operator's E2B-compatible API;
//! - [`tenant`]: one namespace with its own operator on the shared engine, for the image tests;
//! - [`plugin`]: the `kubectl sandbox` plugin run to its end or on a pseudo-terminal;
//! - [`world`]: one end-to-end world (namespace, operator, configuration) around a provider's
//!   far side, for the remote providers and Kubernetes.
//!
//! A test binary declares `mod harness;` and uses the modules it needs.

#![allow(dead_code)]

pub mod aggregated;
pub mod cluster;
pub mod dns;
pub mod docker;
pub mod e2b;
pub mod e2b_sdk;
pub mod engine_proxy;
pub mod image;
pub mod kubernetes;
pub mod metrics;
pub mod no_native_templates;
pub mod node;
pub mod objects;
pub mod operator;
pub mod plugin;
pub mod registry;
pub mod s3;
pub mod tenant;
pub mod tools;
pub mod world;

use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The repository root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Where the test infrastructure caches its binaries and state (`SANDBOX_CACHE`, default
/// `~/.cache/sandbox-operator`).
pub fn cache() -> PathBuf {
    std::env::var_os("SANDBOX_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into()))
                .join(".cache/sandbox-operator")
        })
}

/// A name no other test (or earlier run) uses: `<prefix>-<12 hex digits>`, lowercase and
/// DNS-safe, short enough for a namespace, a Helm release or a label value.
pub fn unique(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let salt = fastrand::u64(..) ^ (u64::from(std::process::id()) << 24) ^ n;
    format!("{prefix}-{:012x}", salt & 0xffff_ffff_ffff)
}

/// Polls `check` until it returns `Ok`, or panics after `timeout` naming `what` and the
/// last observation — a condition with a deadline, never a fixed sleep.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        let last = match check().await {
            Ok(value) => return value,
            Err(why) => why,
        };
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}; last: {last}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until this host connects to `addr:port`: the control that a probe's target is up
/// before a test asserts that a sandbox cannot reach it.
pub async fn host_reaches(addr: std::net::IpAddr, port: u16) {
    wait_for(
        &format!("{addr}:{port} answering this host"),
        Duration::from_secs(60),
        || async {
            std::net::TcpStream::connect_timeout(&(addr, port).into(), Duration::from_secs(2))
                .map(drop)
                .map_err(|e| e.to_string())
        },
    )
    .await;
}
