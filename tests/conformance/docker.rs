//! The Docker factory: the suite against the real local engine.
//!
//! Each fixture has its own operator-instance name; dropping its guard removes every
//! container, image and volume carrying that name (and every sandbox it planted), also when
//! a check panicked.

use std::collections::{BTreeMap, HashMap};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bollard::models::ContainerCreateBody;
use bollard::query_parameters::CreateContainerOptionsBuilder;
use sandbox_operator::provider::docker::{DockerProvider, DockerSettings};
use sandbox_operator::provider::labels::MANAGED_BY;
use sandbox_operator::provider::{CreateRequest, Resources, RestartPolicy};

use super::fixture::{Expect, Fixture, Planter, Skipped};
use super::support::unique_hex;

/// The base image the suite boots, unless `SANDBOX_BASE_IMAGE` names another.
pub const DEFAULT_BASE_IMAGE: &str = "sandbox-operator/base:bookworm";

/// A label (outside our reserved prefix) on every planted container, for cleanup only.
pub const PLANTED_BY: &str = "conformance.sandboxes.test/planted-by";

/// A main process that idles and exits promptly on SIGTERM (a bare `sleep infinity` as
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

/// What the Docker provider offers: every capability; command, CPU, memory and pids are
/// enforced; no network at all is enforced (network mode `none`); a domain allow-list is
/// refused (Docker cannot filter by domain).
pub fn expect() -> Expect {
    Expect {
        command: true,
        cpu: true,
        memory: true,
        pids: true,
        domain_egress: false,
        no_egress: true,
        ..Expect::all_capabilities()
    }
}

/// The suite's view of the local engine. Docker is not opt-in: an engine that does not
/// answer fails the test (run `tests/setup/docker.sh`), it never skips it.
pub async fn fixture() -> Result<Fixture, Skipped> {
    let instance = format!("conf-{}", unique_hex());
    let provider = DockerProvider::connect_negotiated(
        "docker-conformance",
        DockerSettings {
            default_image: Some(base_image()),
            ..Default::default()
        },
    )
    .await
    .expect("the Docker engine answers (run tests/setup/docker.sh)");
    let base = CreateRequest {
        name: String::new(),
        owner: sandbox_operator::provider::labels::Owner {
            instance: instance.clone(),
            kind: "Sandbox".into(),
            namespace: String::new(),
            name: String::new(),
            uid: String::new(),
        },
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
    };
    Ok(Fixture {
        provider: Arc::new(provider),
        unreachable: Arc::new(unreachable()),
        planter: Some(Arc::new(DockerPlanter {
            instance: instance.clone(),
        })),
        guard: Some(Box::new(Cleanup {
            instance: instance.clone(),
        })),
        faults: None,
        instance,
        base,
        expect: expect(),
        patience: Duration::from_secs(30),
    })
}

/// A Docker provider whose endpoint is a TCP port nobody listens on.
pub fn unreachable() -> DockerProvider {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free local port");
    DockerProvider::connect(
        "docker-unreachable",
        DockerSettings {
            endpoint: Some(format!("tcp://127.0.0.1:{port}")),
            ..Default::default()
        },
    )
    .expect("a client for a closed port is built without contacting it")
}

/// Plants containers with bollard, behind the provider's back.
struct DockerPlanter {
    instance: String,
}

#[async_trait]
impl Planter for DockerPlanter {
    async fn plant(&self, labels: &BTreeMap<String, String>) -> Result<String, String> {
        let docker = bollard::Docker::connect_with_defaults()
            .map_err(|e| e.to_string())?
            .negotiate_version()
            .await
            .map_err(|e| e.to_string())?;
        let name = format!("planted-{}", unique_hex());
        let mut all: HashMap<String, String> = labels.clone().into_iter().collect();
        all.insert(PLANTED_BY.into(), self.instance.clone());
        docker
            .create_container(
                Some(CreateContainerOptionsBuilder::default().name(&name).build()),
                ContainerCreateBody {
                    image: Some(base_image()),
                    cmd: Some(IDLE.iter().map(|s| s.to_string()).collect()),
                    labels: Some(all),
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| format!("planting a container: {e}"))?;
        Ok(name)
    }
}

/// Removes everything of one fixture when dropped: containers (with anonymous volumes)
/// labelled with its instance or planted by it, then template images, then volumes. Uses
/// the docker CLI because drop cannot await and must work while a panic unwinds.
pub struct Cleanup {
    /// The fixture's instance name.
    pub instance: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let ours = format!("label={MANAGED_BY}={}", self.instance);
        let planted = format!("label={PLANTED_BY}={}", self.instance);
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
        let remove = |base: &[&str], mut ids: Vec<String>| {
            ids.sort();
            ids.dedup();
            if !ids.is_empty() {
                let _ = Command::new("docker").args(base).args(&ids).output();
            }
        };
        let mut containers = list(&["ps", "-aq", "--no-trunc", "--filter", &ours]);
        containers.extend(list(&["ps", "-aq", "--no-trunc", "--filter", &planted]));
        remove(&["rm", "-f", "-v"], containers);
        remove(
            &["rmi", "-f"],
            list(&["images", "-aq", "--no-trunc", "--filter", &ours]),
        );
        remove(
            &["volume", "rm", "-f"],
            list(&["volume", "ls", "-q", "--filter", &ours]),
        );
    }
}
