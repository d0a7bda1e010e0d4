//! Shared helpers for integration tests against the real Docker engine.
//!
//! Every test gets its own operator-instance name ([`TestEnv`]); everything it creates carries
//! that name in `sandboxes.dev/managed-by`, and dropping the `TestEnv` removes exactly those
//! containers, images and volumes — also when the test panicked. Tests run in parallel, so
//! they never touch anything labelled with another instance.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::future::Future;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sandbox_operator::provider::docker::{DockerProvider, DockerSettings};
use sandbox_operator::provider::labels::{MANAGED_BY, Owner};
use sandbox_operator::provider::{CreateRequest, ExecRequest, Provider, Resources, RestartPolicy};

/// The base image tests boot from, unless `SANDBOX_BASE_IMAGE` names another.
pub const DEFAULT_BASE_IMAGE: &str = "sandbox-operator/base:bookworm";

/// A main process that idles and exits promptly on SIGTERM (a plain `sleep infinity` as
/// pid 1 ignores SIGTERM, so every stop would wait out the whole stop timeout).
pub const IDLE: &[&str] = &[
    "sh",
    "-c",
    "trap 'exit 0' TERM; while :; do sleep 0.1; done",
];

/// The base image tag (`SANDBOX_BASE_IMAGE`, default [`DEFAULT_BASE_IMAGE`]).
pub fn base_image() -> String {
    std::env::var("SANDBOX_BASE_IMAGE")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| DEFAULT_BASE_IMAGE.to_string())
}

/// A name no other test (or earlier run) uses: `<prefix>-<pid>-<time>-<counter>`, lowercase.
pub fn unique(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    format!(
        "{prefix}-{:x}-{:x}-{n}",
        std::process::id(),
        nanos & 0xffff_ffff_ffff
    )
}

/// One test's world: its own instance name, a provider, and cleanup on drop.
pub struct TestEnv {
    /// The operator-instance name every resource of this test is labelled with.
    pub instance: String,
    /// A provider on the local engine (API version negotiated).
    pub provider: DockerProvider,
}

impl TestEnv {
    /// Connects to the engine (`DOCKER_HOST` or the local socket) with the base image as
    /// the default image.
    pub async fn new(test: &str) -> TestEnv {
        let instance = unique(&format!("t-{test}"));
        let provider = DockerProvider::connect_negotiated(
            "docker-test",
            DockerSettings {
                default_image: Some(base_image()),
                ..Default::default()
            },
        )
        .await
        .expect("the Docker engine answers (run tests/setup/docker.sh)");
        TestEnv { instance, provider }
    }

    /// An owner in this test's instance; `name` should be unique within the test.
    pub fn owner(&self, kind: &str, name: &str) -> Owner {
        Owner {
            instance: self.instance.clone(),
            kind: kind.into(),
            namespace: "test".into(),
            name: name.into(),
            uid: unique("uid"),
        }
    }

    /// A unique resource name (container, volume, template id).
    pub fn name(&self, prefix: &str) -> String {
        unique(prefix)
    }

    /// A minimal create request: base image, idle main process, owned by a fresh owner.
    pub fn request(&self, name: &str) -> CreateRequest {
        CreateRequest {
            name: name.to_string(),
            owner: self.owner("Sandbox", name),
            image: Some(base_image()),
            template: None,
            command: Some(IDLE.iter().map(|s| s.to_string()).collect()),
            restart_policy: RestartPolicy::Never,
            env: BTreeMap::new(),
            labels: BTreeMap::new(),
            resources: Resources::default(),
            ports: vec![],
            volumes: vec![],
            allowed_domains: None,
            idle_action: None,
        }
    }

    /// Labels that select exactly this test's resources.
    pub fn instance_labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([(MANAGED_BY.to_string(), self.instance.clone())])
    }

    /// Runs `script` with `sh -c` in the sandbox; panics unless it exits 0. Returns stdout.
    pub async fn sh(&self, id: &str, script: &str) -> String {
        let out = self
            .provider
            .exec(id, &ExecRequest::shell(script, Duration::from_secs(30)))
            .await
            .unwrap_or_else(|e| panic!("exec {script:?} in {id}: {e}"));
        assert_eq!(
            out.exit_code,
            0,
            "{script:?} in {id} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for TestEnv {
    /// Removes everything labelled with this test's instance: containers (with anonymous
    /// volumes), then images (templates), then volumes. Uses the docker CLI because drop
    /// cannot await, and must work while a panic unwinds.
    fn drop(&mut self) {
        let filter = format!("label={MANAGED_BY}={}", self.instance);
        let list = |args: &[&str]| -> Vec<String> {
            Command::new("docker")
                .args(args)
                .output()
                .map(|o| {
                    String::from_utf8_lossy(&o.stdout)
                        .split_whitespace()
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default()
        };
        let remove = |base: &[&str], ids: Vec<String>| {
            if !ids.is_empty() {
                let _ = Command::new("docker").args(base).args(&ids).output();
            }
        };
        remove(
            &["rm", "-f", "-v"],
            list(&["ps", "-aq", "--no-trunc", "--filter", &filter]),
        );
        let mut images = list(&["images", "-aq", "--no-trunc", "--filter", &filter]);
        images.sort();
        images.dedup();
        remove(&["rmi", "-f"], images);
        remove(
            &["volume", "rm", "-f"],
            list(&["volume", "ls", "-q", "--filter", &filter]),
        );
    }
}

/// Polls `probe` until it yields `Some`, or panics naming `what` once `timeout` has passed.
/// The interval is short; the deadline is what bounds the test.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
