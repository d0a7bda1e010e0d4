//! The Docker factory: the suite against the real local engine.
//!
//! Each fixture has its own operator-instance name; its guard (the harness's `Purge`)
//! removes every container, image and volume carrying that name, and every sandbox it
//! planted, also when a check panicked.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bollard::models::ContainerCreateBody;
use bollard::query_parameters::CreateContainerOptionsBuilder;
use sandbox_operator::provider::docker::{DockerProvider, DockerSettings};
use sandbox_operator::provider::labels::Owner;
use sandbox_operator::provider::{CreateRequest, Resources, RestartPolicy};

use super::fixture::{Expect, Fixture, Planter, Skipped};
use super::support::unique_hex;
use crate::harness::docker::{Purge, TEST_LABEL, base_image, engine, idle, provider};

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
    let provider = provider("docker-conformance").await;
    let base = CreateRequest {
        name: String::new(),
        owner: Owner {
            instance: instance.clone(),
            kind: "Sandbox".into(),
            namespace: String::new(),
            name: String::new(),
            uid: String::new(),
        },
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
    };
    Ok(Fixture {
        provider: Arc::new(provider),
        unreachable: Arc::new(unreachable()),
        planter: Some(Arc::new(DockerPlanter {
            instance: instance.clone(),
        })),
        guard: Some(Box::new(Purge(instance.clone()))),
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
        let docker = engine().await;
        let name = format!("planted-{}", unique_hex());
        let mut all: HashMap<String, String> = labels.clone().into_iter().collect();
        all.insert(TEST_LABEL.into(), self.instance.clone());
        docker
            .create_container(
                Some(CreateContainerOptionsBuilder::default().name(&name).build()),
                ContainerCreateBody {
                    image: Some(base_image()),
                    cmd: Some(idle()),
                    labels: Some(all),
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| format!("planting a container: {e}"))?;
        Ok(name)
    }
}
