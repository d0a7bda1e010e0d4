//! Allow-lists on Docker: placing a sandbox behind the gateway at create, and replacing its
//! list in place (`EgressPolicy`) by rewriting its policy file in the gateway's policy
//! volume through the archive API. The gateway re-reads its policies every second, so a
//! change applies within about a second, on the same container.

use std::sync::Arc;

use async_trait::async_trait;
use bollard::models::{ContainerCreateBody, ContainerInspectResponse};
use bollard::query_parameters::{
    DownloadFromContainerOptionsBuilder, UploadToContainerOptionsBuilder,
};
use bytes::Bytes;
use futures::StreamExt;

use super::Placement;
use super::gateway::{Gateway, POLICY_DIR};
use crate::gateway::allow::check_entry;
use crate::gateway::policy::{PolicyFile, file_name};
use crate::provider::docker::{DockerProvider, is_not_found, map_err};
use crate::provider::{EgressPolicy, ProviderError, ProviderResult};

/// Why a non-empty allow-list cannot be had without a gateway.
pub(crate) const NO_GATEWAY: &str = "Docker cannot filter egress by domain without this \
    provider's egress gateway; configure `egress` in the provider's docker settings, use \
    allowedDomains: [] for no network, or remove spec.egress.allowedDomains";

impl DockerProvider {
    fn gateway(&self) -> ProviderResult<&Arc<Gateway>> {
        self.gateway
            .as_ref()
            .ok_or_else(|| ProviderError::unsupported(NO_GATEWAY))
    }

    /// Puts a sandbox about to be created behind the gateway: checks the list, makes sure the
    /// gateway runs, writes the sandbox's policy, and points the container's network and
    /// resolver at the gateway.
    pub(crate) async fn place_behind_gateway(
        &self,
        body: &mut ContainerCreateBody,
        name: &str,
        allowed: &[String],
    ) -> ProviderResult<()> {
        let gateway = self.gateway()?;
        check_list(allowed)?;
        let host = body.host_config.get_or_insert_with(Default::default);
        if host.port_bindings.as_ref().is_some_and(|p| !p.is_empty()) {
            return Err(ProviderError::invalid(
                "spec.ports cannot be published from a sandbox behind the egress gateway \
                 (spec.egress.allowedDomains): its network has no route to the host; remove \
                 one of them",
            ));
        }
        let docker = self.engine().await?;
        let reach = gateway.ensure(docker).await?;
        self.open_gateway(gateway, &reach).await?;
        self.write_policy(gateway, name, allowed).await?;
        host.network_mode = Some(gateway.network());
        host.dns = Some(vec![reach.ip.to_string()]);
        Ok(())
    }

    /// Writes (replaces) a sandbox's policy file.
    async fn write_policy(
        &self,
        gateway: &Gateway,
        sandbox: &str,
        allowed: &[String],
    ) -> ProviderResult<()> {
        let file = file_name(sandbox).ok_or_else(|| {
            ProviderError::invalid(format!("{sandbox:?} is not a sandbox container name"))
        })?;
        let body = serde_json::to_vec(&PolicyFile {
            allowed: allowed.to_vec(),
        })
        .map_err(|e| ProviderError::invalid(format!("encoding the egress policy: {e}")))?;
        let mut header = tar::Header::new_gnu();
        header.set_size(body.len() as u64);
        header.set_mode(0o644);
        header.set_mtime(chrono::Utc::now().timestamp().max(0) as u64);
        let mut builder = tar::Builder::new(Vec::new());
        builder
            .append_data(&mut header, &file, body.as_slice())
            .and_then(|_| builder.finish())
            .map_err(|e| ProviderError::transient(format!("building the policy archive: {e}")))?;
        let archive = builder
            .into_inner()
            .map_err(|e| ProviderError::transient(format!("building the policy archive: {e}")))?;
        let docker = self.engine().await?;
        let options = UploadToContainerOptionsBuilder::default()
            .path(POLICY_DIR)
            .build();
        docker
            .upload_to_container(
                &gateway.container(),
                Some(options),
                bollard::body_full(Bytes::from(archive)),
            )
            .await
            .map_err(|e| {
                map_err(
                    &format!("writing the egress policy of {sandbox} into the gateway"),
                    e,
                )
            })
    }

    /// The allow-list the gateway holds for a sandbox (`None`: it holds none).
    pub(crate) async fn held_policy(&self, sandbox: &str) -> ProviderResult<Option<Vec<String>>> {
        let gateway = self.gateway()?;
        let Some(file) = file_name(sandbox) else {
            return Ok(None);
        };
        let docker = self.engine().await?;
        let options = DownloadFromContainerOptionsBuilder::default()
            .path(&format!("{POLICY_DIR}/{file}"))
            .build();
        let mut stream = docker.download_from_container(&gateway.container(), Some(options));
        let mut archive = Vec::new();
        while let Some(chunk) = stream.next().await {
            match chunk {
                Ok(bytes) => archive.extend_from_slice(&bytes),
                Err(e) if is_not_found(&e) => return Ok(None),
                Err(e) => return Err(map_err(&format!("reading the policy of {sandbox}"), e)),
            }
        }
        let mut tar = tar::Archive::new(archive.as_slice());
        let mut entries = tar
            .entries()
            .map_err(|e| ProviderError::transient(format!("reading the policy archive: {e}")))?;
        let Some(Ok(mut entry)) = entries.next() else {
            return Ok(None);
        };
        let mut text = Vec::new();
        std::io::Read::read_to_end(&mut entry, &mut text)
            .map_err(|e| ProviderError::transient(format!("reading the policy archive: {e}")))?;
        let policy: PolicyFile = serde_json::from_slice(&text).map_err(|e| {
            ProviderError::transient(format!(
                "the gateway's policy of {sandbox} is unreadable: {e}"
            ))
        })?;
        Ok(Some(policy.allowed))
    }

    /// Removes a destroyed sandbox's policy (best effort: a policy whose sandbox is gone
    /// matches no address and allows nothing).
    pub(crate) async fn forget_policy(&self, sandbox: &str) {
        let Some(gateway) = self.gateway.as_ref() else {
            return;
        };
        let argv = vec![
            gateway.binary().to_string(),
            "gateway".into(),
            "forget".into(),
            "--policy-dir".into(),
            POLICY_DIR.into(),
            sandbox.into(),
        ];
        if let Err(e) = self.exec_as_root(&gateway.container(), argv).await {
            tracing::warn!(sandbox, error = %e, "could not remove the egress policy of a destroyed sandbox");
        }
    }

    /// Runs a command in a container as root (the policy files belong to root) and waits.
    async fn exec_as_root(&self, container: &str, argv: Vec<String>) -> ProviderResult<()> {
        let docker = self.engine().await?;
        let exec = docker
            .create_exec(
                container,
                bollard::models::ExecConfig {
                    cmd: Some(argv),
                    user: Some("0".into()),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| map_err(&format!("exec in {container}"), e))?;
        if let bollard::exec::StartExecResults::Attached { mut output, .. } = docker
            .start_exec(&exec.id, None)
            .await
            .map_err(|e| map_err(&format!("exec in {container}"), e))?
        {
            while output.next().await.is_some() {}
        }
        let inspected = docker
            .inspect_exec(&exec.id)
            .await
            .map_err(|e| map_err(&format!("exec in {container}"), e))?;
        match inspected.exit_code {
            Some(0) => Ok(()),
            code => Err(ProviderError::transient(format!(
                "exec in {container} exited with {code:?}"
            ))),
        }
    }

    /// Where a container's traffic goes, from what the engine reports.
    pub(crate) fn placement_of(&self, c: &ContainerInspectResponse) -> Placement {
        let mode = c
            .host_config
            .as_ref()
            .and_then(|h| h.network_mode.as_deref())
            .unwrap_or_default();
        match (&self.gateway, mode) {
            (_, "none") => Placement::Cut,
            (Some(g), m) if m == g.network() => Placement::Gateway,
            _ => Placement::Open,
        }
    }
}

/// Checks every entry, naming the first bad one.
fn check_list(allowed: &[String]) -> ProviderResult<()> {
    for (i, entry) in allowed.iter().enumerate() {
        check_entry(entry).map_err(|why| {
            ProviderError::invalid(format!("spec.egress.allowedDomains[{i}]: {why}"))
        })?;
    }
    Ok(())
}

#[async_trait]
impl EgressPolicy for DockerProvider {
    async fn set_allowed_domains(
        &self,
        id: &str,
        allowed: Option<&[String]>,
    ) -> ProviderResult<()> {
        let container = self
            .inspect(id)
            .await?
            .ok_or_else(|| ProviderError::not_found(format!("sandbox {id} does not exist")))?;
        let placed = self.placement_of(&container);
        let wanted = Placement::of(allowed);
        if placed != wanted {
            return Err(ProviderError::conflict(format!(
                "sandbox {id} was created with egress placement {:?} and cannot move to {:?} in \
                 place; a Docker sandbox is recreated when spec.egress.allowedDomains switches \
                 between absent, [] and a list",
                placed.key(),
                wanted.key()
            )));
        }
        match (wanted, allowed) {
            (Placement::Gateway, Some(list)) => {
                check_list(list)?;
                let gateway = self.gateway()?;
                let reach = gateway.ensure(self.engine().await?).await?;
                self.open_gateway(gateway, &reach).await?;
                self.write_policy(gateway, id, list).await
            }
            // Unrestricted stays unrestricted, none stays none: nothing to change.
            _ => Ok(()),
        }
    }

    fn placement(&self, allowed: Option<&[String]>) -> Option<&'static str> {
        Some(Placement::of(allowed).key())
    }
}
