//! Installing the host firewall (see `firewall`) through the engine: a short-lived helper
//! container on the engine's host.
//!
//! Why through the engine rather than from the operator's own process: the rules must be in
//! the network namespace of the engine's host, and the operator is often not there (a pod
//! with the node's Docker socket, a remote engine). The engine always is. The helper is as
//! small as the job allows: network mode `host`; capabilities `NET_ADMIN` and `NET_RAW`
//! (iptables) and `SYS_CHROOT` (to run the host's own iptables) and nothing else;
//! `no-new-privileges`; a read-only root filesystem; the host's `/` mounted read-only at
//! `/host`. It runs one fixed script (`firewall::script`) with the host's `/bin/sh` and
//! `iptables` — the host's binaries, so the rules land in the backend (legacy or nft) that
//! dockerd itself uses — and is removed when it exits. Its image only needs `chroot`
//! (`hardening.firewallImage`, else the provider's `defaultImage`). With neither, the
//! operator runs the script with its own shell, which works only when it is itself root on
//! the engine's host (a development setup); otherwise the create fails closed.
//!
//! The same helper opens the egress gateway to the sandboxes behind it, and only it
//! (`firewall::gateway_rules`, their backstop in `mangle` included) once per gateway network, whatever `hostFirewall` says:
//! without those rules the gateway's isolated network reaches nothing, so a failure refuses
//! the create.
//!
//! Sweep passes run it again, at most every [`RECHECK_EVERY`], to put back rules something
//! else on the host removed (see [`DockerProvider::reassert_firewall`]).

use std::time::{Duration, Instant};

use bollard::models::{ContainerCreateBody, HostConfig, Mount, MountType};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, CreateImageOptionsBuilder, LogsOptionsBuilder,
    RemoveContainerOptionsBuilder, StartContainerOptions, WaitContainerOptions,
};
use futures::StreamExt;

use super::egress::{COMPONENT_LABEL, Gateway, Reach};
use super::{DockerProvider, firewall, hostclose, is_not_found};
use crate::provider::{ProviderError, ProviderResult};

/// [`COMPONENT_LABEL`] value of the helper container.
pub const COMPONENT: &str = "host-firewall";
/// Where the host's root is mounted in the helper.
const HOST_ROOT: &str = "/host";
/// How often sweep passes install the host firewall again, at most (see
/// [`DockerProvider::reassert_firewall`]).
pub const RECHECK_EVERY: Duration = Duration::from_secs(60);

/// The script that lets the sandboxes on `reach`'s network reach `gateway`, and not each
/// other.
fn gateway_script(gateway: &Gateway, reach: &Reach) -> String {
    let rules = firewall::gateway_rules(&reach.bridge, reach.ip, gateway.ports());
    firewall::script(&rules)
}

/// Whether a re-check is due, the rules having been last installed at `last`.
fn recheck_due(last: Option<Instant>, now: Instant) -> bool {
    last.is_none_or(|t| now.saturating_duration_since(t) >= RECHECK_EVERY)
}

impl DockerProvider {
    /// Runs the firewall script on the engine's host; `Err` says why it could not.
    pub(crate) async fn install_firewall(&self) -> Result<(), String> {
        *self.firewall_checked.lock().await = Some(Instant::now());
        let script = self.firewall_script().await?;
        self.run_firewall_script(&script).await
    }

    /// The host firewall's script: the blocked destinations and ports, the wall between
    /// namespace networks, and the host closed to them with its openings.
    async fn firewall_script(&self) -> Result<String, String> {
        let hardening = &self.settings.hardening;
        let mut rules = firewall::rules(
            &hardening.blocked_destinations,
            &hardening.blocked_host_ports,
        );
        rules.extend(firewall::wall_rules());
        let services = hostclose::resolve(&hardening.open_host_services).await?;
        let closed = hostclose::script(&hostclose::opening_rules(&services));
        Ok(format!("{}\n{closed}", firewall::script(&rules)))
    }

    /// A sweep pass's repair of the host firewall: [`reassert_firewall`](Self::reassert_firewall)
    /// at most every [`RECHECK_EVERY`] (each costs a helper container), failures logged and
    /// retried by a later pass.
    pub(crate) async fn recheck_firewall(&self) {
        {
            let mut last = self.firewall_checked.lock().await;
            let now = Instant::now();
            if !recheck_due(*last, now) {
                return;
            }
            *last = Some(now);
        }
        if let Err(e) = self.reassert_firewall().await {
            tracing::warn!(provider = %self.name, error = %e, "host firewall not re-checked; a later pass retries");
        }
    }

    /// Installs again what this provider installed of the host firewall and the egress
    /// gateway's opening, adding only what is missing; nothing when it installed nothing.
    ///
    /// Why: the rules are only ever added, and whatever on the host saves the filter table and
    /// restores it later drops those added in between (kube-router's NetworkPolicy firewall
    /// does, on every Pod change). Rules installed once can go missing with nobody deleting
    /// them: an opening (a sandbox then cannot reach the template store) or the gateway's
    /// (sandboxes behind it reach nothing). The wall between namespaces does not depend on this:
    /// see `firewall::wall_rules`.
    pub async fn reassert_firewall(&self) -> Result<(), String> {
        let mut scripts = Vec::new();
        if self.firewall.initialized() {
            scripts.push(self.firewall_script().await?);
        }
        if let Some(gateway) = &self.gateway
            && let Some(reach) = gateway.opened.lock().await.clone()
        {
            scripts.push(gateway_script(gateway, &reach));
        }
        match scripts.is_empty() {
            true => Ok(()),
            false => self.run_firewall_script(&scripts.join("\n")).await,
        }
    }

    /// Lets sandboxes on the gateway's network reach the gateway (once per network and
    /// address; see `egress::isolation`).
    pub(crate) async fn open_gateway(
        &self,
        gateway: &Gateway,
        reach: &Reach,
    ) -> ProviderResult<()> {
        let mut opened = gateway.opened.lock().await;
        if opened.as_ref() == Some(reach) {
            return Ok(());
        }
        self.run_firewall_script(&gateway_script(gateway, reach))
            .await
            .map_err(|e| {
                ProviderError::unsupported(format!(
                    "cannot open the egress gateway to the sandboxes behind it ({e}); fix the \
                     engine's host (the operator runs a helper container there with --network \
                     host and NET_ADMIN) or set docker.hardening.firewallImage to an image with \
                     chroot"
                ))
            })?;
        *opened = Some(reach.clone());
        Ok(())
    }

    /// Runs a firewall script in the helper container (or, without a helper image, here).
    async fn run_firewall_script(&self, script: &str) -> Result<(), String> {
        let hardening = &self.settings.hardening;
        let image = hardening.firewall_image.as_ref();
        let Some(image) = image.or(self.settings.default_image.as_ref()) else {
            return run_here(script).await;
        };
        self.ensure_helper_image(image).await?;
        let name = format!("sandbox-firewall-{}-{:08x}", self.name, fastrand::u32(..));
        let outcome = self.run_helper(&name, helper_body(image, script)).await;
        let docker = self.engine().await.map_err(|e| e.to_string())?;
        let remove = RemoveContainerOptionsBuilder::default().force(true).build();
        if let Err(e) = docker.remove_container(&name, Some(remove)).await
            && !is_not_found(&e)
        {
            tracing::warn!(container = %name, error = %e, "could not remove the firewall helper");
        }
        outcome
    }

    /// Pulls the helper's image when the engine lacks it.
    async fn ensure_helper_image(&self, image: &str) -> Result<(), String> {
        let docker = self.engine().await.map_err(|e| e.to_string())?;
        match docker.inspect_image(image).await {
            Ok(_) => return Ok(()),
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(format!("looking up image {image}: {e}")),
        }
        let options = CreateImageOptionsBuilder::default()
            .from_image(image)
            .build();
        let mut pull = docker.create_image(Some(options), None, None);
        while let Some(step) = pull.next().await {
            step.map_err(|e| format!("pulling the firewall helper image {image}: {e}"))?;
        }
        Ok(())
    }

    /// Creates, starts and waits for the helper; a failure carries its output.
    async fn run_helper(&self, name: &str, body: ContainerCreateBody) -> Result<(), String> {
        let docker = self.engine().await.map_err(|e| e.to_string())?;
        let options = CreateContainerOptionsBuilder::default().name(name).build();
        docker
            .create_container(Some(options), body)
            .await
            .map_err(|e| format!("creating the firewall helper: {e}"))?;
        docker
            .start_container(name, None::<StartContainerOptions>)
            .await
            .map_err(|e| format!("starting the firewall helper: {e}"))?;
        let mut wait = docker.wait_container(name, None::<WaitContainerOptions>);
        let mut failed = None;
        while let Some(step) = wait.next().await {
            if let Err(e) = step {
                failed = Some(e.to_string());
            }
        }
        let Some(failed) = failed else {
            return Ok(());
        };
        let options = LogsOptionsBuilder::default()
            .stdout(true)
            .stderr(true)
            .build();
        let output: Vec<String> = docker
            .logs(name, Some(options))
            .filter_map(|l| async move { l.ok().map(|l| l.to_string()) })
            .collect()
            .await;
        Err(format!(
            "the firewall helper failed ({failed}): {}",
            output.concat().trim()
        ))
    }
}

/// Runs the script with this process's shell: for an operator without a helper image, which
/// then must itself be on the engine's host as root (a failure says so).
async fn run_here(script: &str) -> Result<(), String> {
    let output = tokio::process::Command::new("sh")
        .args(["-c", script])
        .output()
        .await
        .map_err(|e| format!("cannot run sh: {e}"))?;
    if output.status.success() {
        return Ok(());
    }
    Err(format!(
        "no helper image (hardening.firewallImage or defaultImage) and this process cannot \
         install the rules itself: {}",
        String::from_utf8_lossy(&output.stderr).trim()
    ))
}

/// The helper container: host network, three capabilities, the host's root read-only.
fn helper_body(image: &str, script: &str) -> ContainerCreateBody {
    ContainerCreateBody {
        image: Some(image.to_string()),
        entrypoint: Some(vec!["chroot".into()]),
        cmd: Some(vec![
            HOST_ROOT.into(),
            "/bin/sh".into(),
            "-c".into(),
            script.into(),
        ]),
        user: Some("0".into()),
        labels: Some(
            [(COMPONENT_LABEL.to_string(), COMPONENT.to_string())]
                .into_iter()
                .collect(),
        ),
        network_disabled: Some(false),
        host_config: Some(HostConfig {
            network_mode: Some("host".into()),
            cap_drop: Some(vec!["ALL".into()]),
            cap_add: Some(vec![
                "NET_ADMIN".into(),
                "NET_RAW".into(),
                "SYS_CHROOT".into(),
            ]),
            security_opt: Some(vec!["no-new-privileges:true".into()]),
            readonly_rootfs: Some(true),
            mounts: Some(vec![Mount {
                target: Some(HOST_ROOT.into()),
                source: Some("/".into()),
                typ: Some(MountType::BIND),
                read_only: Some(true),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recheck_is_due_once_a_minute_after_the_last_install() {
        let now = Instant::now();
        assert!(recheck_due(None, now));
        assert!(!recheck_due(Some(now), now));
        assert!(!recheck_due(Some(now), now + RECHECK_EVERY / 2));
        assert!(recheck_due(Some(now), now + RECHECK_EVERY));
    }

    #[test]
    fn the_helper_gets_the_host_network_three_capabilities_and_a_read_only_host() {
        let body = helper_body("busybox", "set -e");
        let host = body.host_config.unwrap();
        assert_eq!(host.network_mode.as_deref(), Some("host"));
        assert_eq!(host.cap_drop, Some(vec!["ALL".to_string()]));
        assert_eq!(host.cap_add.unwrap().len(), 3);
        assert_eq!(host.privileged, None);
        let mount = &host.mounts.unwrap()[0];
        assert_eq!(mount.read_only, Some(true));
        assert_eq!(body.cmd.unwrap()[..3], ["/host", "/bin/sh", "-c"]);
    }
}
