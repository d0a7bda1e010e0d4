//! The double's state: sprites (each a container), checkpoints (each a committed image),
//! network policies, the accepted token, counters and fault switches.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use bollard::Docker;
use bollard::models::{ContainerCreateBody, ContainerStateStatusEnum, HostConfig, PortBinding};
use bollard::query_parameters::{
    CommitContainerOptionsBuilder, CreateContainerOptionsBuilder, InspectContainerOptions,
    ListContainersOptionsBuilder, RemoveContainerOptionsBuilder, RemoveImageOptionsBuilder,
    StartContainerOptions, StopContainerOptionsBuilder,
};
use chrono::{DateTime, Utc};

use super::SpritesOptions;
use super::TAG_LABEL;
use super::session::Session;
use super::wire::{Checkpoint, NetworkPolicy, SpriteConfig, SpriteInfo, UrlSettings};
use crate::pid_label::pid_label;

/// How a sprite is parked (what the service does by itself to an idle sprite).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Park {
    /// Suspended with its processes frozen; they resume on the next request.
    Warm,
    /// Stopped; the next request boots it with no processes from before.
    Cold,
}

/// Fault switches, read on every request.
#[derive(Debug, Default)]
pub struct Faults {
    /// Answer this many following requests with 429, a `Retry-After` header and a body with
    /// `retry_after_seconds`.
    pub rate_limit_next: AtomicU32,
    /// The `retry_after_seconds` of those 429s.
    pub retry_after_seconds: AtomicU64,
    /// Answer every request with 503 while set.
    pub fail_all: AtomicBool,
    /// Close this many following exec WebSockets into the named sprite after the output,
    /// before the exit frame (named, so that a test's fault never takes another test's
    /// exec: the suite's checks share the double).
    pub drop_exec_before_exit: std::sync::Mutex<Option<(String, u32)>>,
    /// Answer `GET …/policy/network` with 500 while set.
    pub fail_policy_reads: AtomicBool,
    /// What listings carry of `created_at` and `last_running_at` (see [`crate::History`]).
    pub history: crate::HistoryMode,
    /// Leave `signal` out of the exec upgrade's `X-Sprite-Capabilities` header while set (a
    /// service without WebSocket signals: clients use the kill endpoint instead).
    pub no_ws_signals: AtomicBool,
}

impl Faults {
    /// The next `n` requests are rate limited with `retry_after_seconds = secs`.
    pub fn rate_limit(&self, n: u32, secs: u64) {
        self.retry_after_seconds.store(secs, Ordering::SeqCst);
        self.rate_limit_next.store(n, Ordering::SeqCst);
    }

    /// Every request fails with 503 until `set_fail_all(false)`.
    pub fn set_fail_all(&self, on: bool) {
        self.fail_all.store(on, Ordering::SeqCst);
    }

    /// The next `n` exec WebSockets into `sprite` close before their exit frame.
    pub fn drop_exec(&self, sprite: &str, n: u32) {
        *self.drop_exec_before_exit.lock().expect("faults lock") = Some((sprite.to_string(), n));
    }

    /// Takes one dropped exit of `sprite`'s execs, if any is left.
    pub(crate) fn take_dropped_exit(&self, sprite: &str) -> bool {
        let mut fault = self.drop_exec_before_exit.lock().expect("faults lock");
        match fault.as_mut() {
            Some((name, n)) if name == sprite && *n > 0 => {
                *n -= 1;
                true
            }
            _ => false,
        }
    }

    /// From now on, listings carry `history`: `created_at` and `last_running_at` left out
    /// of every entry, or of those older than [`crate::RECENT`] (a `GET` keeps them).
    pub fn set_history(&self, history: crate::History) {
        self.history.set(history);
    }

    /// Every read of a network policy fails with 500 until `fail_policy_reads(false)`.
    pub fn fail_policy_reads(&self, on: bool) {
        self.fail_policy_reads.store(on, Ordering::SeqCst);
    }

    /// While `on`, exec upgrades do not advertise WebSocket signals.
    pub fn set_no_ws_signals(&self, on: bool) {
        self.no_ws_signals.store(on, Ordering::SeqCst);
    }

    /// Takes one unit of a counted fault, if any is left.
    pub(crate) fn take(counter: &AtomicU32) -> bool {
        counter
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }
}

/// One sprite.
#[derive(Debug, Clone)]
pub struct Sprite {
    pub id: String,
    pub name: String,
    pub container: String,
    pub config: SpriteConfig,
    pub environment: BTreeMap<String, String>,
    pub labels: Vec<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub last_running_at: Option<DateTime<Utc>>,
    pub url_auth: String,
    pub policy: NetworkPolicy,
    /// Checkpoints with the image each was committed to.
    pub checkpoints: Vec<(Checkpoint, String)>,
    /// The image the container runs (the base image, or a restored checkpoint's).
    pub image: String,
}

/// Everything the double holds.
pub struct State {
    pub docker: Docker,
    pub opts: SpritesOptions,
    pub token: Mutex<String>,
    pub sprites: tokio::sync::Mutex<BTreeMap<String, Sprite>>,
    pub faults: Faults,
    pub requests: AtomicU64,
    /// Every request answered, in order: `(method, path)`.
    pub log: Mutex<Vec<(String, String)>>,
    pub creates: AtomicU64,
    pub deletes: AtomicU64,
    /// Running exec sessions by `session_id`.
    pub sessions: Mutex<HashMap<u64, Session>>,
    /// The last `session_id` handed out.
    pub last_session: AtomicU64,
}

/// A failure of the double's own engine calls, reported as a 500.
pub type EngineResult<T> = Result<T, String>;

impl State {
    pub fn new(docker: Docker, opts: SpritesOptions) -> Self {
        State {
            docker,
            token: Mutex::new(opts.token.clone()),
            opts,
            sprites: tokio::sync::Mutex::new(BTreeMap::new()),
            faults: Faults::default(),
            requests: AtomicU64::new(0),
            log: Mutex::new(Vec::new()),
            creates: AtomicU64::new(0),
            deletes: AtomicU64::new(0),
            sessions: Mutex::new(HashMap::new()),
            last_session: AtomicU64::new(1000),
        }
    }

    /// Registers a running session; returns its `session_id`.
    pub fn add_session(&self, session: Session) -> u64 {
        let id = self.last_session.fetch_add(1, Ordering::SeqCst) + 1;
        self.sessions
            .lock()
            .expect("sessions lock")
            .insert(id, session);
        id
    }

    /// The running session `id`.
    pub fn session(&self, id: u64) -> Option<Session> {
        self.sessions
            .lock()
            .expect("sessions lock")
            .get(&id)
            .cloned()
    }

    /// Forgets session `id` (its process ended).
    pub fn end_session(&self, id: u64) {
        self.sessions.lock().expect("sessions lock").remove(&id);
    }

    /// The container name of sprite `name`.
    pub fn container_name(&self, name: &str) -> String {
        format!("{}-{name}", self.opts.tag)
    }

    /// Creates (does not start) the container of `sprite` from `sprite.image`, with its
    /// environment, memory/CPU limits and port 8080 published on loopback (the sprite URL).
    pub async fn create_container(&self, sprite: &Sprite) -> EngineResult<()> {
        let env: Vec<String> = sprite
            .environment
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let ports: HashMap<String, Option<Vec<PortBinding>>> = HashMap::from([(
            "8080/tcp".to_string(),
            Some(vec![PortBinding {
                host_ip: Some("127.0.0.1".into()),
                host_port: Some("0".into()),
            }]),
        )]);
        let host = HostConfig {
            memory: sprite.config.ram_mb.map(|mb| (mb as i64) << 20),
            nano_cpus: sprite.config.cpus.map(|c| c as i64 * 1_000_000_000),
            port_bindings: Some(ports),
            init: Some(true),
            ..Default::default()
        };
        let body = ContainerCreateBody {
            image: Some(sprite.image.clone()),
            cmd: Some(vec!["sleep".into(), "infinity".into()]),
            env: Some(env),
            labels: Some(HashMap::from([
                (TAG_LABEL.to_string(), self.opts.tag.clone()),
                pid_label(),
            ])),
            exposed_ports: Some(vec!["8080/tcp".to_string()]),
            host_config: Some(host),
            ..Default::default()
        };
        let options = CreateContainerOptionsBuilder::default()
            .name(&sprite.container)
            .build();
        self.docker
            .create_container(Some(options), body)
            .await
            .map(|_| ())
            .map_err(|e| format!("creating container {}: {e}", sprite.container))
    }

    /// The engine's state of a container (`None` when it is gone).
    pub async fn container_state(
        &self,
        container: &str,
    ) -> EngineResult<Option<ContainerStateStatusEnum>> {
        match self
            .docker
            .inspect_container(container, None::<InspectContainerOptions>)
            .await
        {
            Ok(c) => Ok(c.state.and_then(|s| s.status)),
            Err(e) if is_404(&e) => Ok(None),
            Err(e) => Err(format!("inspecting {container}: {e}")),
        }
    }

    /// The API's `status` of a sprite, read from its container.
    pub async fn status(&self, sprite: &Sprite) -> EngineResult<&'static str> {
        Ok(match self.container_state(&sprite.container).await? {
            Some(ContainerStateStatusEnum::RUNNING) => "running",
            Some(ContainerStateStatusEnum::PAUSED) => "warm",
            _ => "cold",
        })
    }

    /// Wakes a sprite as any request that needs it does: a warm one resumes with its
    /// processes, a cold one boots fresh. Records `last_running_at`. `Ok(None)`: no sprite.
    pub async fn wake(&self, name: &str) -> EngineResult<Option<String>> {
        let container = {
            let mut sprites = self.sprites.lock().await;
            let Some(sprite) = sprites.get_mut(name) else {
                return Ok(None);
            };
            sprite.last_running_at = Some(Utc::now());
            sprite.container.clone()
        };
        match self.container_state(&container).await? {
            Some(ContainerStateStatusEnum::RUNNING) => {}
            Some(ContainerStateStatusEnum::PAUSED) => self
                .docker
                .unpause_container(&container)
                .await
                .map_err(|e| format!("unpausing {container}: {e}"))?,
            Some(_) => self
                .docker
                .start_container(&container, None::<StartContainerOptions>)
                .await
                .map_err(|e| format!("starting {container}: {e}"))?,
            None => {
                return Err(format!(
                    "the container {container} of sprite {name} is gone"
                ));
            }
        }
        Ok(Some(container))
    }

    /// Parks a sprite (see [`Park`]).
    pub async fn park(&self, name: &str, park: Park) -> Result<(), String> {
        let container = {
            let sprites = self.sprites.lock().await;
            let sprite = sprites.get(name).ok_or(format!("no sprite {name}"))?;
            sprite.container.clone()
        };
        let state = self.container_state(&container).await?;
        match (park, state) {
            (Park::Warm, Some(ContainerStateStatusEnum::RUNNING)) => self
                .docker
                .pause_container(&container)
                .await
                .map_err(|e| e.to_string()),
            (Park::Cold, Some(ContainerStateStatusEnum::PAUSED)) => {
                self.docker
                    .unpause_container(&container)
                    .await
                    .map_err(|e| e.to_string())?;
                self.stop(&container).await
            }
            (Park::Cold, Some(ContainerStateStatusEnum::RUNNING)) => self.stop(&container).await,
            (_, other) => Err(format!("sprite {name} cannot be parked from {other:?}")),
        }
    }

    async fn stop(&self, container: &str) -> Result<(), String> {
        let options = StopContainerOptionsBuilder::default().t(1).build();
        self.docker
            .stop_container(container, Some(options))
            .await
            .map_err(|e| e.to_string())
    }

    /// Removes a container (absent, or already being removed, = done).
    pub async fn remove_container(&self, container: &str) -> EngineResult<()> {
        let options = RemoveContainerOptionsBuilder::default()
            .force(true)
            .v(true)
            .build();
        match self.docker.remove_container(container, Some(options)).await {
            Ok(()) => Ok(()),
            Err(e) if crate::removal::removed_anyway(&e) => Ok(()),
            Err(e) => Err(format!("removing {container}: {e}")),
        }
    }

    /// Commits a sprite's container into a checkpoint image; returns the image reference.
    pub async fn commit(&self, container: &str, checkpoint: &str) -> EngineResult<String> {
        let repo = format!("{}-checkpoints", self.opts.tag);
        let tag = format!("{container}-{checkpoint}").to_lowercase();
        let options = CommitContainerOptionsBuilder::default()
            .container(container)
            .repo(&repo)
            .tag(&tag)
            .pause(true)
            .build();
        self.docker
            .commit_container(options, bollard::models::ContainerConfig::default())
            .await
            .map(|_| format!("{repo}:{tag}"))
            .map_err(|e| format!("committing {container}: {e}"))
    }

    /// Removes a checkpoint image (best effort: an image still in use stays).
    pub async fn remove_image(&self, image: &str) {
        let options = RemoveImageOptionsBuilder::default().force(true).build();
        let _ = self.docker.remove_image(image, Some(options), None).await;
    }

    /// The host port the sprite URL (port 8080) is published on, once the container runs.
    pub async fn url_port(&self, container: &str) -> Option<u16> {
        let c = self
            .docker
            .inspect_container(container, None::<InspectContainerOptions>)
            .await
            .ok()?;
        let ports = c.network_settings?.ports?;
        let binding = ports.get("8080/tcp")?.as_ref()?.first()?.clone();
        binding.host_port?.parse().ok()
    }

    /// The API view of a sprite.
    pub async fn info(&self, sprite: &Sprite) -> EngineResult<SpriteInfo> {
        let status = self.status(sprite).await?;
        let port = match status {
            "cold" => None,
            _ => self.url_port(&sprite.container).await,
        };
        Ok(SpriteInfo {
            id: sprite.id.clone(),
            name: sprite.name.clone(),
            organization: "double".into(),
            status: status.into(),
            config: sprite.config.clone(),
            environment: sprite.environment.clone(),
            created_at: sprite.created_at,
            updated_at: sprite.updated_at,
            url: match port {
                Some(p) => format!("http://127.0.0.1:{p}"),
                None => String::new(),
            },
            url_settings: UrlSettings {
                auth: Some(sprite.url_auth.clone()),
            },
            labels: sprite.labels.clone(),
            last_running_at: sprite.last_running_at,
        })
    }

    /// Removes every container and checkpoint image this double made.
    pub async fn remove_everything(&self) {
        let filters = HashMap::from([(
            "label".to_string(),
            vec![format!("{TAG_LABEL}={}", self.opts.tag)],
        )]);
        let options = ListContainersOptionsBuilder::default()
            .all(true)
            .filters(&filters)
            .build();
        if let Ok(list) = self.docker.list_containers(Some(options)).await {
            for c in list {
                if let Some(id) = c.id {
                    let _ = self.remove_container(&id).await;
                }
            }
        }
        let images: Vec<String> = self
            .sprites
            .lock()
            .await
            .values()
            .flat_map(|s| s.checkpoints.iter().map(|(_, image)| image.clone()))
            .collect();
        for image in images {
            self.remove_image(&image).await;
        }
    }
}

/// Whether an engine error is a 404.
pub fn is_404(e: &bollard::errors::Error) -> bool {
    matches!(
        e,
        bollard::errors::Error::DockerResponseServerError {
            status_code: 404,
            ..
        }
    )
}
