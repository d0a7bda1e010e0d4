//! The Docker side of the double: each machine is a real container, each volume a real Docker
//! volume, all labelled with the double's instance id so the double finds (and removes) only
//! its own, and with the running process's pid ([`crate::pid_label`]) so that what a killed
//! test left is found and removed afterwards.
//!
//! Mapping from a machine config: `init.exec` is the whole command line (entrypoint = its
//! first word); otherwise `init.entrypoint`/`init.cmd` replace the image's; `guest.cpus` and
//! `guest.memory_mb` become CPU and memory limits; `restart.policy` becomes Docker's restart
//! policy; every public port of `services` is published on the double's publish host at that
//! exact port (so the Fly Proxy's "a port of the app reaches the machines that serve it" is
//! real); `mounts` bind the machines's Docker volume.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bollard::models::{
    ContainerCreateBody, ContainerUpdateBody, HostConfig, Mount, MountType, PortBinding,
    RestartPolicy, RestartPolicyNameEnum, VolumeCreateRequest,
};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, EventsOptionsBuilder, ListContainersOptionsBuilder,
    ListVolumesOptionsBuilder, RemoveContainerOptionsBuilder, RestartContainerOptionsBuilder,
    StopContainerOptionsBuilder,
};
use futures::{Stream, StreamExt};
use tokio::io::AsyncWriteExt;

use super::wire::ConfigView;
use crate::pid_label::pid_label;

/// Label on every container and volume the doubles create.
pub const DOUBLE_LABEL: &str = "sandboxes.dev.double";
/// Label carrying the double instance's id.
pub const INSTANCE_LABEL: &str = "sandboxes.dev.double.instance";
/// Label carrying the machine id on a container.
pub const MACHINE_LABEL: &str = "sandboxes.dev.double.machine";

/// Seconds Docker waits after SIGTERM before SIGKILL on a stop without a timeout.
const DEFAULT_STOP_SECS: i32 = 5;

/// The Docker engine as the double uses it.
#[derive(Clone)]
pub struct Engine {
    docker: Docker,
    instance: String,
    publish_host: String,
}

/// What an exec produced.
pub struct ExecOutcome {
    pub exit_code: i64,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

impl Engine {
    /// Connects to the local engine and negotiates its API version.
    pub async fn connect(instance: &str, publish_host: &str) -> Result<Engine, String> {
        let docker = Docker::connect_with_defaults()
            .map_err(|e| format!("connecting to Docker: {e}"))?
            .negotiate_version()
            .await
            .map_err(|e| format!("negotiating the Docker API version: {e}"))?;
        Ok(Engine {
            docker,
            instance: instance.to_string(),
            publish_host: publish_host.to_string(),
        })
    }

    fn labels(&self, machine: Option<&str>) -> HashMap<String, String> {
        let mut labels = HashMap::from([
            (DOUBLE_LABEL.to_string(), "fly".to_string()),
            (INSTANCE_LABEL.to_string(), self.instance.clone()),
            pid_label(),
        ]);
        if let Some(id) = machine {
            labels.insert(MACHINE_LABEL.to_string(), id.to_string());
        }
        labels
    }

    /// Whether `image` is on the engine (images are never pulled: no registry is reachable).
    pub async fn has_image(&self, image: &str) -> Result<bool, String> {
        match self.docker.inspect_image(image).await {
            Ok(_) => Ok(true),
            Err(e) if status(&e) == Some(404) => Ok(false),
            Err(e) => Err(format!("inspecting image {image}: {e}")),
        }
    }

    /// Creates (does not start) the container of machine `id` from `config`; `volumes` maps
    /// volume ids to Docker volume names.
    pub async fn create(
        &self,
        name: &str,
        id: &str,
        config: &ConfigView,
        volumes: &BTreeMap<String, String>,
    ) -> Result<(), String> {
        let body = self.create_body(id, config, volumes)?;
        let options = CreateContainerOptionsBuilder::default().name(name).build();
        self.docker
            .create_container(Some(options), body)
            .await
            .map(|_| ())
            .map_err(|e| format!("creating the machine's container: {e}"))
    }

    fn create_body(
        &self,
        id: &str,
        config: &ConfigView,
        volumes: &BTreeMap<String, String>,
    ) -> Result<ContainerCreateBody, String> {
        // The runtime environment every Fly machine sees, then the config's own.
        let mut env = vec![format!("FLY_MACHINE_ID={id}")];
        env.extend(config.env.iter().map(|(k, v)| format!("{k}={v}")));
        let init = &config.init;
        let (entrypoint, cmd) = if !init.exec.is_empty() {
            (
                Some(vec![init.exec[0].clone()]),
                Some(init.exec[1..].to_vec()),
            )
        } else {
            (
                (!init.entrypoint.is_empty()).then(|| init.entrypoint.clone()),
                (!init.cmd.is_empty()).then(|| init.cmd.clone()),
            )
        };
        let mut bindings = HashMap::new();
        for service in &config.services {
            let key = format!("{}/{}", service.internal_port, proto(&service.protocol));
            let hosts: Vec<PortBinding> = service
                .ports
                .iter()
                .filter_map(|p| p.port)
                .map(|port| PortBinding {
                    host_ip: Some(self.publish_host.clone()),
                    host_port: Some(port.to_string()),
                })
                .collect();
            bindings.insert(key, Some(hosts));
        }
        let mut mounts = Vec::new();
        for mount in &config.mounts {
            let source = volumes
                .get(&mount.volume)
                .ok_or_else(|| format!("volume {} not found", mount.volume))?;
            mounts.push(Mount {
                target: Some(mount.path.clone()),
                source: Some(source.clone()),
                typ: Some(MountType::VOLUME),
                ..Default::default()
            });
        }
        let guest = config.guest.clone().unwrap_or_default();
        let memory = guest.memory_mb.map(|mb| (mb * 1024 * 1024) as i64);
        let host_config = HostConfig {
            port_bindings: Some(bindings.clone()),
            mounts: Some(mounts),
            nano_cpus: guest.cpus.map(|c| i64::from(c) * 1_000_000_000),
            memory,
            memory_swap: memory,
            restart_policy: Some(restart_policy(config)),
            ..Default::default()
        };
        Ok(ContainerCreateBody {
            image: Some(config.image.clone()),
            hostname: Some(id.to_string()),
            env: Some(env),
            entrypoint,
            cmd,
            labels: Some(self.labels(Some(id))),
            exposed_ports: Some(bindings.keys().cloned().collect()),
            host_config: Some(host_config),
            ..Default::default()
        })
    }

    /// Starts a created or exited container.
    pub async fn start(&self, name: &str) -> Result<(), String> {
        self.docker
            .start_container(name, None)
            .await
            .map_err(|e| format!("starting: {e}"))
    }

    /// Stops a container (SIGTERM, then SIGKILL after `timeout`).
    pub async fn stop(&self, name: &str, timeout: Option<Duration>) -> Result<(), String> {
        let secs = timeout.map_or(DEFAULT_STOP_SECS, |t| t.as_secs() as i32);
        let options = StopContainerOptionsBuilder::default().t(secs).build();
        match self.docker.stop_container(name, Some(options)).await {
            Ok(()) => Ok(()),
            Err(e) if status(&e) == Some(304) => Ok(()),
            Err(e) => Err(format!("stopping: {e}")),
        }
    }

    /// Freezes every process of the container (the double's snapshot).
    pub async fn pause(&self, name: &str) -> Result<(), String> {
        self.docker
            .pause_container(name)
            .await
            .map_err(|e| format!("pausing: {e}"))
    }

    /// Thaws a paused container.
    pub async fn unpause(&self, name: &str) -> Result<(), String> {
        self.docker
            .unpause_container(name)
            .await
            .map_err(|e| format!("unpausing: {e}"))
    }

    /// Restarts the container's main process (a cold boot that keeps its filesystem).
    pub async fn restart(&self, name: &str) -> Result<(), String> {
        let options = RestartContainerOptionsBuilder::default()
            .t(DEFAULT_STOP_SECS)
            .build();
        self.docker
            .restart_container(name, Some(options))
            .await
            .map_err(|e| format!("restarting: {e}"))
    }

    /// Removes a container (forcefully); absent, or already being removed, is fine.
    pub async fn remove(&self, name: &str) -> Result<(), String> {
        let options = RemoveContainerOptionsBuilder::default().force(true).build();
        match self.docker.remove_container(name, Some(options)).await {
            Ok(()) => Ok(()),
            Err(e) if crate::removal::removed_anyway(&e) => Ok(()),
            Err(e) => Err(format!("removing: {e}")),
        }
    }

    /// Changes CPU and memory in place.
    pub async fn update(&self, name: &str, config: &ConfigView) -> Result<(), String> {
        let guest = config.guest.clone().unwrap_or_default();
        let memory = guest.memory_mb.map(|mb| (mb * 1024 * 1024) as i64);
        let body = ContainerUpdateBody {
            nano_cpus: guest.cpus.map(|c| i64::from(c) * 1_000_000_000),
            memory,
            memory_swap: memory,
            ..Default::default()
        };
        self.docker
            .update_container(name, body)
            .await
            .map_err(|e| format!("updating resources: {e}"))
    }

    /// Whether the container is running (`None` when it does not exist), and its state word.
    pub async fn state(&self, name: &str) -> Result<Option<(bool, Option<i64>)>, String> {
        match self.docker.inspect_container(name, None).await {
            Ok(c) => {
                let state = c.state.unwrap_or_default();
                let running = state.running.unwrap_or(false) || state.restarting.unwrap_or(false);
                Ok(Some((running, state.exit_code)))
            }
            Err(e) if status(&e) == Some(404) => Ok(None),
            Err(e) => Err(format!("inspecting: {e}")),
        }
    }

    /// Runs `argv` in the container, feeding `stdin`, and collects its output.
    pub async fn exec(
        &self,
        name: &str,
        argv: Vec<String>,
        stdin: Option<String>,
    ) -> Result<ExecOutcome, String> {
        let options = CreateExecOptions::<String> {
            attach_stdin: Some(stdin.is_some()),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            cmd: Some(argv),
            ..Default::default()
        };
        let created = self
            .docker
            .create_exec(name, options)
            .await
            .map_err(|e| format!("creating exec: {e}"))?;
        let started = self
            .docker
            .start_exec(&created.id, Some(StartExecOptions::default()))
            .await
            .map_err(|e| format!("starting exec: {e}"))?;
        let mut out = ExecOutcome {
            exit_code: -1,
            stdout: Vec::new(),
            stderr: Vec::new(),
        };
        if let StartExecResults::Attached {
            mut output,
            mut input,
        } = started
        {
            let feed = async move {
                if let Some(text) = stdin {
                    let _ = input.write_all(text.as_bytes()).await;
                }
                let _ = input.shutdown().await;
            };
            let read = async {
                while let Some(frame) = output.next().await {
                    match frame.map_err(|e| format!("reading exec output: {e}"))? {
                        LogOutput::StdErr { message } => out.stderr.extend_from_slice(&message),
                        LogOutput::StdOut { message } | LogOutput::Console { message } => {
                            out.stdout.extend_from_slice(&message)
                        }
                        LogOutput::StdIn { .. } => {}
                    }
                }
                Ok::<(), String>(())
            };
            let ((), read) = tokio::join!(feed, read);
            read?;
        }
        loop {
            let inspected = self
                .docker
                .inspect_exec(&created.id)
                .await
                .map_err(|e| format!("inspecting exec: {e}"))?;
            if inspected.running != Some(true)
                && let Some(code) = inspected.exit_code
            {
                out.exit_code = code;
                return Ok(out);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Creates a labelled Docker volume.
    pub async fn create_volume(&self, name: &str) -> Result<(), String> {
        let request = VolumeCreateRequest {
            name: Some(name.to_string()),
            labels: Some(self.labels(None)),
            ..Default::default()
        };
        self.docker
            .create_volume(request)
            .await
            .map(|_| ())
            .map_err(|e| format!("creating volume {name}: {e}"))
    }

    /// Removes a Docker volume; absent is fine.
    pub async fn remove_volume(&self, name: &str) -> Result<(), String> {
        match self
            .docker
            .remove_volume(name, None::<bollard::query_parameters::RemoveVolumeOptions>)
            .await
        {
            Ok(()) => Ok(()),
            Err(e) if status(&e) == Some(404) => Ok(()),
            Err(e) => Err(format!("removing volume {name}: {e}")),
        }
    }

    /// `die` events of this double's containers, as machine ids.
    pub fn exits(&self) -> impl Stream<Item = String> + Send + 'static {
        let filters = HashMap::from([
            ("type".to_string(), vec!["container".to_string()]),
            ("event".to_string(), vec!["die".to_string()]),
            (
                "label".to_string(),
                vec![format!("{INSTANCE_LABEL}={}", self.instance)],
            ),
        ]);
        let options = EventsOptionsBuilder::default().filters(&filters).build();
        self.docker
            .events(Some(options))
            .filter_map(|event| async move {
                let event = event.ok()?;
                let attributes = event.actor?.attributes?;
                attributes.get(MACHINE_LABEL).cloned()
            })
    }

    /// Removes every container and volume this double instance created.
    pub async fn cleanup(&self) {
        let label = format!("{INSTANCE_LABEL}={}", self.instance);
        let filters = HashMap::from([("label".to_string(), vec![label.clone()])]);
        let options = ListContainersOptionsBuilder::default()
            .all(true)
            .filters(&filters)
            .build();
        if let Ok(containers) = self.docker.list_containers(Some(options)).await {
            for c in containers {
                if let Some(id) = c.id {
                    let _ = self.remove(&id).await;
                }
            }
        }
        let options = ListVolumesOptionsBuilder::default()
            .filters(&filters)
            .build();
        if let Ok(list) = self.docker.list_volumes(Some(options)).await {
            for v in list.volumes.unwrap_or_default() {
                let _ = self.remove_volume(&v.name).await;
            }
        }
    }
}

fn restart_policy(config: &ConfigView) -> RestartPolicy {
    let restart = config.restart.clone().unwrap_or_default();
    let (name, retries) = match restart.policy.as_str() {
        "always" => (RestartPolicyNameEnum::ALWAYS, None),
        "on-failure" => (
            RestartPolicyNameEnum::ON_FAILURE,
            restart.max_retries.or(Some(3)),
        ),
        _ => (RestartPolicyNameEnum::NO, None),
    };
    RestartPolicy {
        name: Some(name),
        maximum_retry_count: retries,
    }
}

fn proto(protocol: &str) -> &str {
    if protocol == "udp" { "udp" } else { "tcp" }
}

/// The HTTP status of an engine error response.
pub fn status(err: &bollard::errors::Error) -> Option<u16> {
    match err {
        bollard::errors::Error::DockerResponseServerError { status_code, .. } => Some(*status_code),
        _ => None,
    }
}
