//! The local Docker engine: the base image, a per-test world with a provider, and cleanup.
//!
//! Every test gets its own operator-instance name ([`TestEnv`]); everything it creates
//! carries that name in `sandboxes.dev/managed-by` (or, for what a test creates behind the
//! provider's back, in [`TEST_LABEL`]), and dropping the guard removes exactly those
//! containers, images and volumes — also when the test panicked. Tests run in parallel, so
//! they never touch anything labelled with another instance.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use sandbox_operator::provider::docker::{DockerProvider, DockerSettings};
use sandbox_operator::provider::labels::{MANAGED_BY, OWNER_UID, Owner};
use sandbox_operator::provider::{CreateRequest, ExecRequest, Provider, Resources, RestartPolicy};

use super::unique;

/// The base image tests boot, unless `SANDBOX_BASE_IMAGE` names another.
pub const DEFAULT_BASE_IMAGE: &str = "sandbox-operator/base:bookworm";

/// A label (outside the operator's reserved prefix) on what a test creates straight at the
/// engine, so the test's guard removes it without it looking like ours to the provider.
pub const TEST_LABEL: &str = "sandboxes.test/created-by";

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

/// [`IDLE`] as an argv.
pub fn idle() -> Vec<String> {
    IDLE.iter().map(|s| s.to_string()).collect()
}

/// A main process serving HTTP on 8080, in perl (the base image has no nc or python): the
/// target of the network walls' probes.
pub fn http_server() -> Vec<String> {
    let script = "use IO::Socket::INET; my $s = IO::Socket::INET->new(LocalPort => 8080, \
                  Listen => 16, ReuseAddr => 1) or die $!; while (my $c = $s->accept) { \
                  print $c \"HTTP/1.0 200 OK\\r\\n\\r\\nhello\"; close $c }";
    vec!["perl".into(), "-e".into(), script.into()]
}

/// A raw engine client (API version negotiated: Debian's engine speaks 1.41), to set things
/// up behind the provider's back and to check what the engine holds independently of it.
pub async fn engine() -> bollard::Docker {
    bollard::Docker::connect_with_defaults()
        .expect("a Docker client for the default endpoint")
        .negotiate_version()
        .await
        .expect("the Docker engine answers (run tests/setup/docker.sh)")
}

/// `sh -c script` in a container, via the docker CLI: stdout on success, stderr otherwise.
pub fn docker_sh(container: &str, script: &str) -> Result<String, String> {
    let out = std::process::Command::new("docker")
        .args(["exec", container, "sh", "-c", script])
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// Every container on `docker` labelled `key=value`, in every state.
pub async fn containers_labelled(
    docker: &bollard::Docker,
    key: &str,
    value: &str,
) -> Vec<bollard::models::ContainerSummary> {
    let filters =
        std::collections::HashMap::from([("label".to_string(), vec![format!("{key}={value}")])]);
    let options = bollard::query_parameters::ListContainersOptions {
        all: true,
        filters: Some(filters),
        ..Default::default()
    };
    docker
        .list_containers(Some(options))
        .await
        .expect("list containers")
}

/// Ids of every container labelled `sandboxes.dev/owner-uid=uid`, in every state, as
/// `docker ps` lists them (no client needed, so callable anywhere).
pub fn container_ids_owned_by(uid: &str) -> Vec<String> {
    let out = Command::new("docker")
        .args(["ps", "-aq", "--filter", &format!("label={OWNER_UID}={uid}")])
        .output()
        .expect("docker ps");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// A provider on the local engine (API version negotiated) with the base image as default.
pub async fn provider(name: &str) -> DockerProvider {
    provider_with(name, settings()).await
}

/// The settings of [`provider`]: the base image as default.
pub fn settings() -> DockerSettings {
    DockerSettings {
        default_image: Some(base_image()),
        ..Default::default()
    }
}

/// A provider on the local engine (API version negotiated) with these settings.
pub async fn provider_with(name: &str, settings: DockerSettings) -> DockerProvider {
    DockerProvider::connect_negotiated(name, settings)
        .await
        .expect("the Docker engine answers (run tests/setup/docker.sh)")
}

/// Removes every container (with its anonymous volumes), image, volume and network labelled
/// `key=value`. Uses the docker CLI because it runs from `Drop`, which cannot await and must
/// work while a panic unwinds.
pub fn remove_labelled(key: &str, value: &str) {
    let filter = format!("label={key}={value}");
    let list = |args: &[&str]| -> Vec<String> {
        let mut ids: Vec<String> = Command::new("docker")
            .args(args)
            .output()
            .map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .split_whitespace()
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        ids.sort();
        ids.dedup();
        ids
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
    remove(
        &["rmi", "-f"],
        list(&["images", "-aq", "--no-trunc", "--filter", &filter]),
    );
    remove(
        &["volume", "rm", "-f"],
        list(&["volume", "ls", "-q", "--filter", &filter]),
    );
    // Namespace networks, once their containers are gone.
    remove(
        &["network", "rm"],
        list(&["network", "ls", "-q", "--filter", &filter]),
    );
}

/// Removes from the engine the images a test pulled or pushed, also when it panics.
pub struct Images(pub Vec<String>);

impl Drop for Images {
    fn drop(&mut self) {
        for image in &self.0 {
            let _ = std::process::Command::new("docker")
                .args(["rmi", "-f", image])
                .output();
        }
    }
}

/// Removes everything of one instance when dropped: what carries it in
/// `sandboxes.dev/managed-by` and what a test created with it in [`TEST_LABEL`].
pub struct Purge(pub String);

impl Drop for Purge {
    fn drop(&mut self) {
        remove_labelled(MANAGED_BY, &self.0);
        remove_labelled(TEST_LABEL, &self.0);
    }
}

/// One test's world: its own instance name, a provider, and cleanup on drop.
pub struct TestEnv {
    /// The operator-instance name every resource of this test is labelled with.
    pub instance: String,
    /// A provider on the local engine (API version negotiated).
    pub provider: DockerProvider,
    _purge: Purge,
}

impl TestEnv {
    /// Connects to the engine (`DOCKER_HOST` or the local socket) with the base image as
    /// the default image.
    pub async fn new(test: &str) -> TestEnv {
        let instance = unique(&format!("t-{test}"));
        TestEnv {
            provider: provider("docker-test").await,
            _purge: Purge(instance.clone()),
            instance,
        }
    }

    /// Like [`TestEnv::new`], with a provider whose sandboxes reach the test S3 store on the
    /// host (templates published or fetched through it).
    pub async fn with_store(test: &str) -> TestEnv {
        TestEnv::with_settings(test, super::s3::reaching_store(settings())).await
    }

    /// Like [`TestEnv::new`], with a provider of these settings.
    pub async fn with_settings(test: &str, settings: DockerSettings) -> TestEnv {
        let instance = unique(&format!("t-{test}"));
        TestEnv {
            provider: provider_with("docker-test", settings).await,
            _purge: Purge(instance.clone()),
            instance,
        }
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
            command: Some(idle()),
            restart_policy: RestartPolicy::Never,
            env: BTreeMap::new(),
            labels: BTreeMap::new(),
            resources: Resources::default(),
            ports: vec![],
            volumes: vec![],
            allowed_domains: None,
            idle_action: None,
            image_pull_policy: Default::default(),
            registry_credentials: Vec::new(),
            secret_env_keys: Default::default(),
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

/// Thaws container `name`'s cgroup freezer by hand, whatever the engine thinks: the way out
/// of an engine wedged on a paused container (see `provider::docker::freeze`), so a test
/// that found one leaves an engine the rest of the suite can use. Best effort, cgroup v1
/// (`freezer.state`) or v2 (`cgroup.freeze`); the full id comes from the CLI, which a
/// wedged container's inspect may not answer, so the list is used.
pub async fn thaw(name: &str) {
    let listed = std::process::Command::new("docker")
        .args([
            "ps",
            "-a",
            "--no-trunc",
            "--filter",
            &format!("name=^{name}$"),
            "--format",
            "{{.ID}}",
        ])
        .output();
    let Ok(out) = listed else { return };
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if id.is_empty() {
        return;
    }
    let v1 = format!("/sys/fs/cgroup/freezer/docker/{id}/freezer.state");
    let v2 = format!("/sys/fs/cgroup/system.slice/docker-{id}.scope/cgroup.freeze");
    let _ = std::fs::write(v1, "THAWED");
    let _ = std::fs::write(v2, "0");
}
