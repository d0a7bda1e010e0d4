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
use sandbox_operator::provider::docker::{DockerProvider, DockerSettings, EgressGatewaySettings};
use sandbox_operator::provider::labels::Owner;
use sandbox_operator::provider::{CreateRequest, Resources, RestartPolicy};

use super::fixture::{Expect, Fixture, Planter, Skipped};
use super::support::unique_hex;
use crate::harness::docker::{Purge, TEST_LABEL, base_image, engine, idle};

/// What the Docker provider with an egress gateway offers: every capability; command, CPU,
/// memory and pids are enforced; no network at all is enforced (network mode `none`); a
/// domain allow-list is enforced by the gateway and replaced in place within a placement.
pub fn expect() -> Expect {
    Expect {
        command: true,
        cpu: true,
        memory: true,
        pids: true,
        domain_egress: true,
        no_egress: true,
        egress_policy: true,
        ..Expect::all_capabilities()
    }
}

/// The suite's view of the local engine. Docker is not opt-in: an engine that does not
/// answer fails the test (run `tests/setup/docker.sh`), it never skips it.
pub async fn fixture() -> Result<Fixture, Skipped> {
    let instance = format!("conf-{}", unique_hex());
    // The gateway runs the operator binary built for this test, mounted into the base
    // image; its upstream is the gateway container's own resolver (the suite only checks
    // what the seam promises, not reachability: `tests/docker_egress.rs` does that).
    let gateway = format!("conf-gw-{}", unique_hex());
    let provider = DockerProvider::connect_negotiated(
        "docker-conformance",
        DockerSettings {
            default_image: Some(base_image()),
            egress: Some(EgressGatewaySettings {
                host_binary: Some(env!("CARGO_BIN_EXE_sandbox-operator").to_string()),
                name: Some(gateway.clone()),
                ..EgressGatewaySettings::with_image(base_image())
            }),
            ..Default::default()
        },
    )
    .await
    .expect("the Docker engine answers (run tests/setup/docker.sh)");
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
        image_pull_policy: Default::default(),
        registry_credentials: Vec::new(),
        secret_env_keys: Default::default(),
    };
    Ok(Fixture {
        provider: Arc::new(provider),
        unreachable: Arc::new(unreachable()),
        planter: Some(Arc::new(DockerPlanter {
            instance: instance.clone(),
        })),
        // Sandboxes first (they hold the gateway's network), then the gateway.
        guard: Some(Box::new((Purge(instance.clone()), GatewayGuard(gateway)))),
        faults: None,
        instance,
        base,
        expect: expect(),
        patience: Duration::from_secs(30),
        history: None,
    })
}

/// A Docker provider whose endpoint is a TCP port nobody listens on, configured like the
/// suite's provider.
pub fn unreachable() -> DockerProvider {
    let port = sandbox_doubles::ports::quiet_port();
    DockerProvider::connect(
        "docker-unreachable",
        DockerSettings {
            endpoint: Some(format!("tcp://127.0.0.1:{port}")),
            // The same capabilities as the reachable provider (nothing is contacted).
            egress: Some(EgressGatewaySettings::with_image(base_image())),
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

/// Removes a fixture's egress gateway: container, internal network and policy volume (they
/// carry no instance label, so `Purge` leaves them).
struct GatewayGuard(String);

impl Drop for GatewayGuard {
    fn drop(&mut self) {
        let docker = |args: &[&str]| {
            std::process::Command::new("docker")
                .args(args)
                .output()
                .map(|o| o.status.success())
                .unwrap_or(false)
        };
        docker(&["rm", "-f", &self.0]);
        let network = format!("{}-net", self.0);
        // The engine may still be detaching the sandboxes' endpoints: a few tries.
        for _ in 0..10 {
            if docker(&["network", "rm", &network]) || !docker(&["network", "inspect", &network]) {
                break;
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        docker(&["volume", "rm", "-f", &format!("{}-policy", self.0)]);
    }
}
