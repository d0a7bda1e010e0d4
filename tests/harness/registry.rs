//! The test image registry: `tests/setup/registry.sh` (Debian's distribution registry on
//! loopback with htpasswd auth) run once per test binary, plus what the pull tests need around
//! it — pushing a fresh image, counting the registry's blob requests in its access log, and a
//! registry of a test's own that it can stop and start.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::auth::DockerCredentials;
use bollard::models::{ContainerConfig, ContainerCreateBody};
use bollard::query_parameters::{
    CommitContainerOptionsBuilder, CreateContainerOptions, PushImageOptionsBuilder,
    RemoveContainerOptionsBuilder, RemoveImageOptionsBuilder, StartContainerOptions,
    WaitContainerOptions,
};
use futures::{StreamExt, TryStreamExt};

/// The shared test registry, as `tests/setup/registry.sh` describes it.
#[derive(Clone, Debug)]
pub struct Registry {
    /// `127.0.0.1:PORT`.
    pub addr: String,
    /// The htpasswd user.
    pub user: String,
    /// Its password.
    pub password: String,
    /// The registry's log (access log lines included).
    pub log: PathBuf,
    /// The htpasswd file, for a registry of a test's own.
    pub htpasswd: PathBuf,
    /// The registry binary.
    pub bin: PathBuf,
}

/// Starts (or reuses) the shared test registry, once per test binary.
pub fn registry() -> Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY
        .get_or_init(|| {
            let out = Command::new("bash")
                .arg(concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/tests/setup/registry.sh"
                ))
                .output()
                .expect("run tests/setup/registry.sh");
            assert!(
                out.status.success(),
                "registry.sh failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
            let env: HashMap<String, String> = std::fs::read_to_string(&path)
                .expect("registry env file")
                .lines()
                .filter_map(|l| l.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            let get = |k: &str| {
                env.get(k)
                    .cloned()
                    .unwrap_or_else(|| panic!("{path} lacks {k}"))
            };
            Registry {
                addr: get("SANDBOX_REGISTRY"),
                user: get("SANDBOX_REGISTRY_USER"),
                password: get("SANDBOX_REGISTRY_PASSWORD"),
                log: PathBuf::from(get("SANDBOX_REGISTRY_LOG")),
                htpasswd: PathBuf::from(get("SANDBOX_REGISTRY_HTPASSWD")),
                bin: PathBuf::from(get("SANDBOX_REGISTRY_BIN")),
            }
        })
        .clone()
}

impl Registry {
    /// The engine's credentials for this registry.
    pub fn credentials(&self) -> DockerCredentials {
        DockerCredentials {
            username: Some(self.user.clone()),
            password: Some(self.password.clone()),
            serveraddress: Some(self.addr.clone()),
            ..Default::default()
        }
    }

    /// A `.dockerconfigjson` document for this registry with `password`.
    pub fn docker_config(&self, password: &str) -> String {
        serde_json::json!({"auths": {self.addr.clone(): {
            "username": self.user, "password": password
        }}})
        .to_string()
    }

    /// `GET /v2/<repository>/blobs/<digest>` requests in the access log, by digest.
    pub fn blob_gets(&self, repository: &str) -> HashMap<String, usize> {
        let needle = format!("\"GET /v2/{repository}/blobs/");
        let mut out = HashMap::new();
        for line in std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
        {
            if let Some(rest) = line.split(&needle).nth(1) {
                let digest = rest.split_whitespace().next().unwrap_or_default();
                *out.entry(digest.to_string()).or_insert(0) += 1;
            }
        }
        out
    }

    /// Requests for `repository`'s manifests by tag or digest (`HEAD` and `GET`).
    pub fn manifest_requests(&self, repository: &str) -> usize {
        let needle = format!(" /v2/{repository}/manifests/");
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(&needle) && !l.contains("level="))
            .count()
    }
}
/// Creates the `kubernetes.io/dockerconfigjson` Secret `name` in `namespace` for `registry`
/// with `password` (the right one, or a wrong one to see a pull refused).
pub async fn create_pull_secret(namespace: &str, name: &str, registry: &Registry, password: &str) {
    let config = registry.docker_config(password);
    super::cluster::create_secret(
        namespace,
        name,
        Some("kubernetes.io/dockerconfigjson"),
        serde_json::json!({".dockerconfigjson": config}),
    )
    .await;
}

/// Builds an image no registry or engine has seen — the base image plus one file holding
/// `marker` — pushes it to `registry` as `repository:tag`, removes it from the engine (so
/// using it means pulling it), and returns its digest reference `addr/repository@sha256:…`.
pub async fn push_fresh_image(
    docker: &Docker,
    base: &str,
    registry: &Registry,
    repository: &str,
    tag: &str,
    marker: &str,
) -> String {
    let target = format!("{}/{repository}", registry.addr);
    commit_marked_image(docker, base, &target, tag, marker).await;
    docker
        .push_image(
            &target,
            Some(PushImageOptionsBuilder::default().tag(tag).build()),
            Some(registry.credentials()),
        )
        .try_collect::<Vec<_>>()
        .await
        .expect("push");
    let pushed = format!("{target}:{tag}");
    let digest = docker
        .inspect_image(&pushed)
        .await
        .expect("inspect pushed")
        .repo_digests
        .unwrap_or_default()
        .into_iter()
        .find(|d| d.starts_with(&format!("{target}@")))
        .expect("a repo digest after the push");
    remove_image(docker, &pushed).await;
    digest
}

/// Commits a container of `base` holding `/marker` (content `marker`) into `target:tag`, its
/// command `sleep infinity`; returns the image id.
pub async fn commit_marked_image(
    docker: &Docker,
    base: &str,
    target: &str,
    tag: &str,
    marker: &str,
) -> String {
    let container = docker
        .create_container(
            None::<CreateContainerOptions>,
            ContainerCreateBody {
                image: Some(base.to_string()),
                cmd: Some(vec![
                    "sh".into(),
                    "-c".into(),
                    format!("echo {marker} > /marker"),
                ]),
                ..Default::default()
            },
        )
        .await
        .expect("create image builder container")
        .id;
    docker
        .start_container(&container, None::<StartContainerOptions>)
        .await
        .expect("start builder");
    let _ = docker
        .wait_container(&container, None::<WaitContainerOptions>)
        .collect::<Vec<_>>()
        .await;
    let id = docker
        .commit_container(
            CommitContainerOptionsBuilder::default()
                .container(&container)
                .repo(target)
                .tag(tag)
                .build(),
            ContainerConfig {
                cmd: Some(vec!["sleep".into(), "infinity".into()]),
                ..Default::default()
            },
        )
        .await
        .expect("commit")
        .id;
    let _ = docker
        .remove_container(
            &container,
            Some(RemoveContainerOptionsBuilder::default().force(true).build()),
        )
        .await;
    id
}

/// Removes an image reference from the engine (absent is fine), pruning its layers.
pub async fn remove_image(docker: &Docker, reference: &str) {
    let _ = docker
        .remove_image(
            reference,
            Some(RemoveImageOptionsBuilder::default().force(true).build()),
            None,
        )
        .await;
}

/// A registry of one test's own, on its own port and storage, with the shared htpasswd: it
/// can be stopped and started without disturbing other tests.
pub struct OwnRegistry {
    /// `127.0.0.1:PORT`.
    pub addr: String,
    config: PathBuf,
    log: PathBuf,
    bin: PathBuf,
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl OwnRegistry {
    /// Starts one and waits until it answers.
    pub fn start(shared: &Registry) -> OwnRegistry {
        let dir = tempfile::tempdir().expect("registry dir");
        let port = sandbox_doubles::ports::quiet_port();
        let addr = format!("127.0.0.1:{port}");
        let config = dir.path().join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: info\nstorage:\n  filesystem:\n    rootdirectory: {}\n\
                 http:\n  addr: {addr}\nauth:\n  htpasswd:\n    realm: test\n    path: {}\n",
                dir.path().join("data").display(),
                shared.htpasswd.display()
            ),
        )
        .expect("write registry config");
        let mut own = OwnRegistry {
            addr,
            config,
            log: dir.path().join("registry.log"),
            bin: shared.bin.clone(),
            child: None,
            dir,
        };
        own.resume();
        own
    }

    /// Stops it (SIGKILL: an outage, not a shutdown); its storage stays.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port and storage and waits until it answers.
    pub fn resume(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("registry log");
        let child = Command::new(&self.bin)
            .arg("serve")
            .arg(&self.config)
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .expect("start registry");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(&self.addr).is_err() {
            assert!(
                Instant::now() < deadline,
                "own registry at {} did not listen within 30 s: {}",
                self.addr,
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// This registry as a [`Registry`] (same user and password as the shared one).
    pub fn as_registry(&self, shared: &Registry) -> Registry {
        Registry {
            addr: self.addr.clone(),
            log: self.log.clone(),
            ..shared.clone()
        }
    }

    /// Where its data lives.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for OwnRegistry {
    fn drop(&mut self) {
        self.stop();
    }
}
