//! The Docker side of the E2B double: one real container per sandbox.
//!
//! Every container carries [`LABEL_DOUBLE`] with the double's own random id, so a double only
//! ever finds and removes its own containers, [`LABEL_SANDBOX`] with the sandbox id, and the
//! running process's pid ([`crate::pid_label`]) for removing what a killed test left. No
//! `sandboxes.dev/…` label is ever put on a container: those belong to the operator's Docker
//! provider, whose sweeper must never see these.
//!
//! Pause with memory is `docker pause` (the cgroup freezer keeps every process, as a memory
//! snapshot does); a filesystem-only pause is `docker stop` with no grace period (the VM is
//! discarded and only its disk kept) and its resume is `docker start`, a cold boot.

use std::collections::{BTreeMap, HashMap};
use std::pin::Pin;

use bollard::Docker;
use bollard::exec::{CreateExecOptions, ResizeExecOptions, StartExecOptions, StartExecResults};
use bollard::models::ContainerCreateBody;
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, ListContainersOptionsBuilder, RemoveContainerOptionsBuilder,
    StartContainerOptions, StopContainerOptionsBuilder, UploadToContainerOptionsBuilder,
};
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::io::AsyncWrite;

use crate::pid_label::pid_label;

/// Label on every container of a double: the double's own id.
pub const LABEL_DOUBLE: &str = "e2b-double.instance";
/// Label on every container of a double: the sandbox id it backs.
pub const LABEL_SANDBOX: &str = "e2b-double.sandbox-id";

/// A Docker engine failure, as text (the double turns it into a 5xx).
#[derive(Debug, Clone)]
pub struct EngineError(pub String);

impl std::fmt::Display for EngineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn engine_err(what: &str, e: bollard::errors::Error) -> EngineError {
    EngineError(format!("{what}: {e}"))
}

/// A chunk of a running command's output.
pub enum Output {
    /// Bytes the command wrote to stdout.
    Stdout(Bytes),
    /// Bytes the command wrote to stderr.
    Stderr(Bytes),
}

/// A started command: its exec, its stdin, and its output until it exits.
pub struct Started {
    /// The exec's id, for [`Engine::exit_code`] and [`Engine::resize`].
    pub exec_id: String,
    /// Its stdin, when attached (shutting it down is the process's end of input).
    pub input: Option<Pin<Box<dyn AsyncWrite + Send>>>,
    /// Output frames, in order (with a TTY, all of it is `Stdout`).
    pub output: BoxStream<'static, Result<Output, EngineError>>,
}

/// What an exec is attached to besides its output.
#[derive(Debug, Clone, Copy, Default)]
pub struct Attach {
    /// A stdin the caller writes.
    pub stdin: bool,
    /// A terminal (stdout and stderr become one stream).
    pub tty: bool,
}

/// The engine connection of one double.
#[derive(Clone)]
pub struct Engine {
    docker: Docker,
    double_id: String,
}

impl Engine {
    /// Connects to the environment's Docker engine and negotiates its API version.
    pub async fn connect(double_id: String) -> Result<Self, EngineError> {
        let docker = Docker::connect_with_defaults()
            .map_err(|e| engine_err("connecting to Docker", e))?
            .negotiate_version()
            .await
            .map_err(|e| engine_err("negotiating the Docker API version", e))?;
        Ok(Engine { docker, double_id })
    }

    /// The double's own id (the value of [`LABEL_DOUBLE`] on its containers).
    pub fn double_id(&self) -> &str {
        &self.double_id
    }

    /// The container name backing sandbox `id`.
    pub fn container_name(&self, id: &str) -> String {
        format!("e2b-double-{}-{id}", self.double_id)
    }

    /// Creates and starts the container of sandbox `id`.
    pub async fn create(
        &self,
        id: &str,
        image: &str,
        env: &BTreeMap<String, String>,
    ) -> Result<String, EngineError> {
        let name = self.container_name(id);
        let labels = HashMap::from([
            (LABEL_DOUBLE.to_string(), self.double_id.clone()),
            (LABEL_SANDBOX.to_string(), id.to_string()),
            pid_label(),
        ]);
        let body = ContainerCreateBody {
            image: Some(image.to_string()),
            env: Some(env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
            labels: Some(labels),
            ..Default::default()
        };
        let options = CreateContainerOptionsBuilder::default().name(&name).build();
        self.docker
            .create_container(Some(options), body)
            .await
            .map_err(|e| engine_err(&format!("creating container from {image}"), e))?;
        if let Err(e) = self.start(&name).await {
            let _ = self.remove(&name).await;
            return Err(e);
        }
        Ok(name)
    }

    /// Starts a created or stopped container.
    pub async fn start(&self, name: &str) -> Result<(), EngineError> {
        self.docker
            .start_container(name, None::<StartContainerOptions>)
            .await
            .map_err(|e| engine_err("starting container", e))
    }

    /// Freezes every process (a memory snapshot).
    pub async fn pause(&self, name: &str) -> Result<(), EngineError> {
        self.docker
            .pause_container(name)
            .await
            .map_err(|e| engine_err("pausing container", e))
    }

    /// Thaws a frozen container.
    pub async fn unpause(&self, name: &str) -> Result<(), EngineError> {
        self.docker
            .unpause_container(name)
            .await
            .map_err(|e| engine_err("unpausing container", e))
    }

    /// Stops a container at once (its processes end, its filesystem stays).
    pub async fn stop(&self, name: &str) -> Result<(), EngineError> {
        let options = StopContainerOptionsBuilder::default().t(0).build();
        self.docker
            .stop_container(name, Some(options))
            .await
            .map_err(|e| engine_err("stopping container", e))
    }

    /// Removes a container (absent, or already being removed, is fine).
    pub async fn remove(&self, name: &str) -> Result<(), EngineError> {
        let options = RemoveContainerOptionsBuilder::default()
            .force(true)
            .v(true)
            .build();
        match self.docker.remove_container(name, Some(options)).await {
            Ok(()) => Ok(()),
            Err(e) if crate::removal::removed_anyway(&e) => Ok(()),
            Err(e) => Err(engine_err("removing container", e)),
        }
    }

    /// Removes every container this double created.
    pub async fn remove_all(&self) -> Result<usize, EngineError> {
        let filters = HashMap::from([(
            "label".to_string(),
            vec![format!("{LABEL_DOUBLE}={}", self.double_id)],
        )]);
        let options = ListContainersOptionsBuilder::default()
            .all(true)
            .filters(&filters)
            .build();
        let listed = self
            .docker
            .list_containers(Some(options))
            .await
            .map_err(|e| engine_err("listing containers", e))?;
        let mut removed = 0;
        for container in listed {
            if let Some(id) = container.id {
                self.remove(&id).await?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Starts `argv` in the container as `user`, attached as `attach` says, and returns its
    /// streams.
    pub async fn exec(
        &self,
        name: &str,
        user: &str,
        argv: Vec<String>,
        env: &BTreeMap<String, String>,
        cwd: Option<String>,
        attach: Attach,
    ) -> Result<Started, EngineError> {
        let env: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let options = CreateExecOptions::<String> {
            attach_stdin: Some(attach.stdin),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            tty: Some(attach.tty),
            env: (!env.is_empty()).then_some(env),
            cmd: Some(argv),
            working_dir: cwd,
            user: Some(user.to_string()),
            ..Default::default()
        };
        let created = self
            .docker
            .create_exec(name, options)
            .await
            .map_err(|e| engine_err("creating exec", e))?;
        let started = self
            .docker
            .start_exec(
                &created.id,
                Some(StartExecOptions {
                    detach: false,
                    tty: attach.tty,
                    output_capacity: Some(64 * 1024),
                }),
            )
            .await
            .map_err(|e| engine_err("starting exec", e))?;
        let StartExecResults::Attached { output, input } = started else {
            return Err(EngineError("the engine started the exec detached".into()));
        };
        let input = attach.stdin.then_some(input);
        let output = output
            .filter_map(|frame| async move {
                use bollard::container::LogOutput;
                match frame {
                    Ok(LogOutput::StdOut { message } | LogOutput::Console { message }) => {
                        Some(Ok(Output::Stdout(message)))
                    }
                    Ok(LogOutput::StdErr { message }) => Some(Ok(Output::Stderr(message))),
                    Ok(LogOutput::StdIn { .. }) => None,
                    Err(e) => Some(Err(engine_err("reading exec output", e))),
                }
            })
            .boxed();
        Ok(Started {
            exec_id: created.id,
            input,
            output,
        })
    }

    /// Resizes the terminal of a running exec.
    pub async fn resize(&self, exec_id: &str, cols: u16, rows: u16) -> Result<(), EngineError> {
        let options = ResizeExecOptions {
            height: rows,
            width: cols,
        };
        self.docker
            .resize_exec(exec_id, options)
            .await
            .map_err(|e| engine_err("resizing an exec's terminal", e))
    }

    /// The exit code of a finished exec, waiting briefly for the engine to record it.
    pub async fn exit_code(&self, exec_id: &str) -> Result<i64, EngineError> {
        for _ in 0..500 {
            let inspected = self
                .docker
                .inspect_exec(exec_id)
                .await
                .map_err(|e| engine_err("inspecting exec", e))?;
            if inspected.running != Some(true)
                && let Some(code) = inspected.exit_code
            {
                return Ok(code);
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        Err(EngineError(
            "the engine never recorded the exit code".into(),
        ))
    }

    /// Runs a helper command to completion: (exit code, stdout, stderr).
    pub async fn run(
        &self,
        name: &str,
        user: &str,
        argv: Vec<String>,
    ) -> Result<(i64, Vec<u8>, Vec<u8>), EngineError> {
        let attach = Attach::default();
        let mut started = self
            .exec(name, user, argv, &BTreeMap::new(), None, attach)
            .await?;
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        while let Some(frame) = started.output.next().await {
            match frame? {
                Output::Stdout(b) => stdout.extend_from_slice(&b),
                Output::Stderr(b) => stderr.extend_from_slice(&b),
            }
        }
        Ok((self.exit_code(&started.exec_id).await?, stdout, stderr))
    }

    /// Extracts a one-file tar archive into directory `parent` of the container.
    pub async fn upload_file(
        &self,
        name: &str,
        parent: &str,
        file_name: &str,
        data: &[u8],
        mode: u32,
        owner: (u64, u64),
    ) -> Result<(), EngineError> {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(mode);
        header.set_uid(owner.0);
        header.set_gid(owner.1);
        header.set_mtime(chrono::Utc::now().timestamp().max(0) as u64);
        header.set_entry_type(tar::EntryType::Regular);
        let mut builder = tar::Builder::new(Vec::new());
        builder
            .append_data(&mut header, file_name, data)
            .map_err(|e| EngineError(format!("building the upload archive: {e}")))?;
        let archive = builder
            .into_inner()
            .map_err(|e| EngineError(format!("building the upload archive: {e}")))?;
        let options = UploadToContainerOptionsBuilder::default()
            .path(parent)
            .build();
        self.docker
            .upload_to_container(
                name,
                Some(options),
                bollard::body_full(Bytes::from(archive)),
            )
            .await
            .map_err(|e| engine_err("uploading a file", e))
    }
}
