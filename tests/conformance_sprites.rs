//! The provider conformance suite (`tests/conformance/`) against the Fly Sprites provider and
//! the Sprites double (`tests/doubles/src/sprites/`), where every sprite is a real local
//! container of the base image.
//!
//! Needs a running engine and the base image (`tests/setup/docker.sh`,
//! `tests/setup/base-image.sh`; `SANDBOX_BASE_IMAGE` overrides the tag).

#[macro_use]
mod conformance;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use conformance::{Expect, Faults, Fixture, Planter, Skipped};
use sandbox_doubles::sprites::{self, SpritesDouble, SpritesOptions, TAG_LABEL};
use sandbox_operator::provider::labels::Owner;
use sandbox_operator::provider::sprites::SpritesProvider;
use sandbox_operator::provider::{CreateRequest, Resources, RestartPolicy};

conformance_suite!(fixture);

/// What the Sprites provider offers against the double: exact files; a memory ceiling
/// (whole MiB); a domain allow-list and "no egress" (stored as the sprite's network policy,
/// which the real service enforces; the double only stores it); no command (a sprite has no
/// main process), no fractional CPU (the suite asks for 500m; whole CPUs are accepted), no
/// pids; and the service parks sprites by itself, so stop and sleep are refused.
fn expect() -> Expect {
    Expect {
        files: true,
        memory: true,
        domain_egress: true,
        no_egress: true,
        parks_itself: true,
        ..Expect::default()
    }
}

fn base_image() -> String {
    std::env::var("SANDBOX_BASE_IMAGE")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "sandbox-operator/base:bookworm".to_string())
}

/// One double per test, with a provider at it and one at a closed port.
async fn fixture() -> Result<Fixture, Skipped> {
    let instance = format!("conf-{:016x}", fastrand::u64(..));
    let double = sprites::spawn(SpritesOptions::new(base_image())).await;
    let provider = SpritesProvider::new(
        "sprites-conformance",
        &double.base_url,
        double.token.clone(),
    )
    .expect("a provider at the double");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    let unreachable = SpritesProvider::new(
        "sprites-unreachable",
        &format!("http://127.0.0.1:{port}"),
        "t".into(),
    )
    .expect("a provider at a closed port");
    let base = CreateRequest {
        name: String::new(),
        owner: Owner {
            instance: instance.clone(),
            kind: "Sandbox".into(),
            namespace: String::new(),
            name: String::new(),
            uid: String::new(),
        },
        image: None,
        template: None,
        command: None,
        restart_policy: RestartPolicy::Never,
        env: BTreeMap::new(),
        labels: BTreeMap::new(),
        resources: Resources::default(),
        ports: vec![],
        volumes: vec![],
        allowed_domains: None,
        idle_action: None,
    };
    let double = Arc::new(Guard(Some(double)));
    Ok(Fixture {
        provider: Arc::new(provider),
        unreachable: Arc::new(unreachable),
        planter: Some(double.clone()),
        faults: Some(double.clone()),
        guard: Some(Box::new(double)),
        instance,
        base,
        expect: expect(),
        patience: Duration::from_secs(30),
    })
}

/// Holds the double; on drop removes every container it made (a panicking check included).
struct Guard(Option<SpritesDouble>);

impl Guard {
    fn double(&self) -> &SpritesDouble {
        self.0.as_ref().expect("the double runs")
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let Some(double) = self.0.take() else { return };
        let tag = double.tag().to_string();
        drop(double);
        let listed = std::process::Command::new("docker")
            .args(["ps", "-aq", "--filter", &format!("label={TAG_LABEL}={tag}")])
            .output();
        if let Ok(out) = listed {
            let ids: Vec<String> = String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .map(String::from)
                .collect();
            if !ids.is_empty() {
                let _ = std::process::Command::new("docker")
                    .args(["rm", "-f", "-v"])
                    .args(&ids)
                    .output();
            }
        }
    }
}

/// Plants a sprite straight at the double (as a create whose status write was lost would
/// leave it), with `labels` as the API's `key=value` strings.
#[async_trait]
impl Planter for Guard {
    async fn plant(&self, labels: &BTreeMap<String, String>) -> Result<String, String> {
        let d = self.double();
        let name = format!("planted-{:012x}", fastrand::u64(..) >> 16);
        let body = serde_json::json!({
            "name": name,
            "labels": labels.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>(),
        });
        let response = reqwest::Client::new()
            .post(format!("{}/v1/sprites", d.base_url))
            .bearer_auth(&d.token)
            .json(&body)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        if !response.status().is_success() {
            return Err(format!("planting {name}: HTTP {}", response.status()));
        }
        Ok(name)
    }
}

#[async_trait]
impl Faults for Guard {
    async fn fail_all(&self) {
        self.double().faults().set_fail_all(true);
    }
    async fn heal(&self) {
        self.double().faults().set_fail_all(false);
    }
}
