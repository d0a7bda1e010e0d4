//! Hardened defaults applied to every Docker sandbox, and the profile reported in status.
//!
//! A sandbox runs code nobody reviewed, as root inside its container. What keeps that root
//! away from the host is set here, on every container this provider creates:
//!
//! - `no-new-privileges`: a setuid binary (or file capability) cannot raise privileges
//!   beyond what the process already holds;
//! - every capability dropped except [`MINIMAL_CAPABILITIES`] (why each one stays is said
//!   next to it and in the README's isolation section);
//! - a pids ceiling ([`DEFAULT_PIDS_LIMIT`]) unless the request sets its own, so a fork bomb
//!   exhausts the sandbox, not the host;
//! - never privileged, never a host namespace (network, pid, ipc, uts, user, cgroup), no
//!   devices, no bind mounts: the body is built from scratch and only named volumes are
//!   mounted.
//!
//! Provider settings may relax the capability set or `no-new-privileges` explicitly; the
//! profile actually applied is stored on the container (label [`ISOLATION_LABEL`]) when it is
//! created and reported from there, so status never describes settings changed later.

use std::collections::BTreeSet;

use bollard::models::ContainerCreateBody;
use serde::{Deserialize, Serialize};

use super::DockerProvider;
use crate::provider::{ProviderError, ProviderResult};
use crate::validation::Issues;

/// Label on a container: the isolation profile applied when it was created.
pub const ISOLATION_LABEL: &str = "sandboxes.dev/isolation";

/// Pids ceiling of a sandbox whose request sets none: room for parallel builds (threads
/// count), far below the host's `pid_max`.
pub const DEFAULT_PIDS_LIMIT: i64 = 4096;

/// Capabilities kept by default (of Docker's fourteen), each because ordinary developer
/// tooling running as root inside the sandbox needs it:
///
/// - `CHOWN`, `FOWNER`, `FSETID`, `DAC_OVERRIDE`: package managers and `tar` restore owners
///   and modes of the files they unpack, and root reads files regardless of their mode;
/// - `SETUID`, `SETGID`: `apt-get` drops to its `_apt` user, `su`/`sudo`/`runuser` switch users;
/// - `KILL`: root signals processes of the other users in the sandbox;
/// - `NET_BIND_SERVICE`: servers listen on ports below 1024 (80, 443).
///
/// Dropped: `NET_RAW` (raw sockets: spoofing, ARP/ICMP tricks on the shared bridge; `ping`
/// works through ICMP datagram sockets), `MKNOD` (device nodes), `SETFCAP` and `SETPCAP`
/// (granting capabilities to files and processes), `SYS_CHROOT`, `AUDIT_WRITE`.
pub const MINIMAL_CAPABILITIES: [&str; 8] = [
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "NET_BIND_SERVICE",
    "SETGID",
    "SETUID",
];

/// Every capability name Linux knows (`capability.h`, 0 to 40), in bit order, for
/// validating settings and for reading a capability mask back.
pub const ALL_CAPABILITIES: [&str; 41] = [
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "SETPCAP",
    "LINUX_IMMUTABLE",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_ADMIN",
    "NET_RAW",
    "IPC_LOCK",
    "IPC_OWNER",
    "SYS_MODULE",
    "SYS_RAWIO",
    "SYS_CHROOT",
    "SYS_PTRACE",
    "SYS_PACCT",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_NICE",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "MKNOD",
    "LEASE",
    "AUDIT_WRITE",
    "AUDIT_CONTROL",
    "SETFCAP",
    "MAC_OVERRIDE",
    "MAC_ADMIN",
    "SYSLOG",
    "WAKE_ALARM",
    "BLOCK_SUSPEND",
    "AUDIT_READ",
    "PERFMON",
    "BPF",
    "CHECKPOINT_RESTORE",
];

/// The hardening of one Docker provider: the `docker.hardening` block. Absent = the
/// defaults above; every relaxation is a field someone wrote down.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct HardeningSettings {
    /// Sets `no-new-privileges`. `false` lets setuid binaries raise privileges again.
    pub no_new_privileges: bool,
    /// Capabilities kept (all others dropped), names without `CAP_`.
    pub capabilities: Vec<String>,
    /// Pids ceiling of a sandbox whose request sets none; 0 = no ceiling.
    pub default_pids_limit: i64,
    /// Who keeps the cloud metadata endpoint and the engine's API unreachable from
    /// sandboxes (see [`super::firewall`]).
    pub host_firewall: HostFirewall,
    /// Destinations (IP or CIDR) no sandbox may reach, whatever its egress: the cloud
    /// metadata endpoint and its IPv6 twin by default.
    pub blocked_destinations: Vec<String>,
    /// TCP ports of the engine's host no sandbox may reach: Docker's API ports by default.
    pub blocked_host_ports: Vec<u16>,
    /// Image the host-firewall helper runs in (it needs only `chroot`, see `hostguard`);
    /// absent = the provider's `defaultImage`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub firewall_image: Option<String>,
    /// Services of the engine's host (`host:port`, TCP) that sandboxes on namespace networks
    /// may still reach, the host being otherwise closed to them (see `hostclose`). The
    /// operator adds the endpoint of the provider's own template store (`templateStore`)
    /// itself; list here only what else sandboxes must reach on the host.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub open_host_services: Vec<String>,
}

/// Whether the host firewall that blocks [`HardeningSettings::blocked_destinations`],
/// [`HardeningSettings::blocked_host_ports`] and the host itself is installed (through the
/// engine, see `hostguard`, so in every install mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub enum HostFirewall {
    /// Installed before the first sandbox; while it cannot be, sandboxes are not created
    /// (fail closed, retried by the next create).
    #[default]
    Auto,
    /// The same as `auto` (kept so configurations that said it explicitly stay valid).
    Required,
    /// Nobody installs it: an explicit relaxation by the platform team, reported in status.
    Off,
}

impl Default for HardeningSettings {
    fn default() -> Self {
        HardeningSettings {
            no_new_privileges: true,
            capabilities: MINIMAL_CAPABILITIES.iter().map(|c| c.to_string()).collect(),
            default_pids_limit: DEFAULT_PIDS_LIMIT,
            host_firewall: HostFirewall::Auto,
            blocked_destinations: vec!["169.254.169.254/32".into(), "fd00:ec2::254/128".into()],
            blocked_host_ports: vec![2375, 2376],
            firewall_image: None,
            open_host_services: Vec::new(),
        }
    }
}

impl HardeningSettings {
    /// Reports every setting that cannot work, under `at` (e.g. `providers[0].docker.hardening`).
    pub fn validate(&self, at: &str, issues: &mut Issues) {
        for (i, cap) in self.capabilities.iter().enumerate() {
            if capability_bit(cap).is_none() {
                issues.push(
                    format!("{at}.capabilities[{i}]"),
                    format!(
                        "`{cap}` is not a Linux capability; use a name such as `NET_RAW` (without \
                         `CAP_`), or remove it"
                    ),
                );
            }
        }
        if self.default_pids_limit < 0 {
            issues.push(
                format!("{at}.defaultPidsLimit"),
                format!(
                    "must be 0 (no ceiling) or more; remove it for the default {DEFAULT_PIDS_LIMIT}"
                ),
            );
        }
        for (i, dest) in self.blocked_destinations.iter().enumerate() {
            if super::firewall::parse_cidr(dest).is_none() {
                issues.push(
                    format!("{at}.blockedDestinations[{i}]"),
                    format!(
                        "`{dest}` is not an IP address or CIDR; use one such as \
                         `169.254.169.254/32`"
                    ),
                );
            }
        }
        if self.blocked_host_ports.contains(&0) {
            issues.push(
                format!("{at}.blockedHostPorts"),
                "port 0 cannot be blocked; list TCP ports 1-65535",
            );
        }
        self.validate_open_host_services(at, issues);
    }

    fn validate_open_host_services(&self, at: &str, issues: &mut Issues) {
        for (i, service) in self.open_host_services.iter().enumerate() {
            if super::hostclose::parse_service(service).is_none() {
                issues.push(
                    format!("{at}.openHostServices[{i}]"),
                    format!(
                        "`{service}` is not a host:port service; use one such as \
                         `172.17.0.1:9000` or `minio.internal:9000`"
                    ),
                );
            }
        }
    }

    /// Opens the service of a template store's URL endpoint (see
    /// [`HardeningSettings::open_host_services`]); an endpoint that names no host is left out
    /// (the store client refuses it anyway).
    pub fn open_template_store(&mut self, endpoint: &str) {
        if let Some(service) = super::hostclose::service_of_url(endpoint)
            && !self.open_host_services.contains(&service)
        {
            self.open_host_services.push(service);
        }
    }

    /// The capability names kept, normalised (upper case, no `CAP_`, sorted, no repeats).
    pub fn kept_capabilities(&self) -> Vec<String> {
        let set: BTreeSet<String> = self.capabilities.iter().map(|c| normalise(c)).collect();
        set.into_iter().collect()
    }

    /// Whether these settings are weaker than the defaults somewhere.
    pub fn relaxed(&self) -> bool {
        let minimal: BTreeSet<&str> = MINIMAL_CAPABILITIES.into_iter().collect();
        let kept = self.kept_capabilities();
        !self.no_new_privileges
            || kept.iter().any(|c| !minimal.contains(c.as_str()))
            || self.default_pids_limit == 0
            || self.host_firewall == HostFirewall::Off
    }
}

/// `cap_sys_admin`, `CAP_SYS_ADMIN` and `SYS_ADMIN` all mean `SYS_ADMIN`.
fn normalise(cap: &str) -> String {
    let upper = cap.trim().to_ascii_uppercase();
    upper.strip_prefix("CAP_").unwrap_or(&upper).to_string()
}

/// The bit of a capability in `/proc/<pid>/status` masks, `None` for an unknown name.
pub fn capability_bit(cap: &str) -> Option<u32> {
    let name = normalise(cap);
    ALL_CAPABILITIES
        .iter()
        .position(|c| *c == name)
        .and_then(|p| u32::try_from(p).ok())
}

/// The capability names set in a mask as `/proc/<pid>/status` prints it (hex).
pub fn capabilities_in_mask(hex: &str) -> Option<BTreeSet<String>> {
    let mask = u64::from_str_radix(hex.trim(), 16).ok()?;
    Some(
        ALL_CAPABILITIES
            .iter()
            .enumerate()
            .filter(|(bit, _)| mask & (1u64 << bit) != 0)
            .map(|(_, name)| name.to_string())
            .collect(),
    )
}

/// Applies the hardening to a container body built by `create_body`: capabilities,
/// `no-new-privileges`, the default pids ceiling, and the profile label. Everything that
/// would widen the host's exposure is reset, whatever put it there.
pub(crate) fn apply(body: &mut ContainerCreateBody, settings: &HardeningSettings, profile: &str) {
    let host = body.host_config.get_or_insert_with(Default::default);
    host.privileged = Some(false);
    host.cap_drop = Some(vec!["ALL".into()]);
    let kept = settings.kept_capabilities();
    host.cap_add = (!kept.is_empty()).then_some(kept);
    let mut security = host.security_opt.take().unwrap_or_default();
    security.retain(|o| !o.starts_with("no-new-privileges"));
    if settings.no_new_privileges {
        security.push("no-new-privileges:true".into());
    }
    host.security_opt = (!security.is_empty()).then_some(security);
    if host.pids_limit.is_none() && settings.default_pids_limit > 0 {
        host.pids_limit = Some(settings.default_pids_limit);
    }
    // Host namespaces and devices are never requested by this provider; make sure of it.
    host.pid_mode = None;
    host.ipc_mode = None;
    host.uts_mode = None;
    host.userns_mode = None;
    host.cgroupns_mode = None;
    host.devices = None;
    host.binds = None;
    if host.network_mode.as_deref() == Some("host") {
        host.network_mode = None;
    }
    body.labels
        .get_or_insert_with(Default::default)
        .insert(ISOLATION_LABEL.into(), profile.into());
}

/// The one-line profile reported in status: runtime, then each hardening as applied, then
/// who blocks the metadata endpoint and the engine's API.
pub(crate) fn profile(settings: &HardeningSettings, runtime: &str, firewall: &str) -> String {
    let mut parts = vec![format!("runtime={runtime}")];
    parts.push(if settings.relaxed() {
        "relaxed".into()
    } else {
        "hardened".into()
    });
    if settings.no_new_privileges {
        parts.push("no-new-privileges".into());
    }
    let kept = settings.kept_capabilities();
    parts.push(format!(
        "caps={}",
        if kept.is_empty() {
            "none".into()
        } else {
            kept.join(",")
        }
    ));
    if settings.default_pids_limit > 0 {
        parts.push(format!("default-pids={}", settings.default_pids_limit));
    }
    parts.push(format!("host-firewall={firewall}"));
    parts.join(" ")
}

impl DockerProvider {
    /// The profile every sandbox created now gets, installing the host firewall first (once
    /// per provider). A failure refuses the create and is retried by the next one: the rules
    /// fail closed, and only `hostFirewall: off` runs sandboxes without them.
    pub(crate) async fn isolation_profile(&self) -> ProviderResult<String> {
        let hardening = &self.settings.hardening;
        let firewall = match hardening.host_firewall {
            HostFirewall::Off => "off",
            HostFirewall::Auto | HostFirewall::Required => {
                *self
                    .firewall
                    .get_or_try_init(|| async {
                        self.install_firewall().await.map(|()| "iptables").map_err(|e| {
                            ProviderError::unsupported(format!(
                                "cannot install the host firewall that keeps sandboxes away from the \
                                 host, the metadata endpoint and the engine's API ({e}); fix the \
                                 engine's host (the operator runs a helper container there with \
                                 --network host and NET_ADMIN), set docker.hardening.firewallImage \
                                 to an image with chroot, or set docker.hardening.hostFirewall: off \
                                 to accept the risk"
                            ))
                        })
                    })
                    .await?
            }
        };
        Ok(profile(hardening, self.runtime_name(), firewall))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bollard::models::HostConfig;

    #[test]
    fn defaults_keep_the_minimal_set_and_are_not_relaxed() {
        let s = HardeningSettings::default();
        assert!(!s.relaxed());
        assert_eq!(s.kept_capabilities().len(), MINIMAL_CAPABILITIES.len());
        let p = profile(&s, "runc", "iptables");
        assert!(p.starts_with("runtime=runc hardened no-new-privileges caps=CHOWN,"));
        assert!(p.ends_with("default-pids=4096 host-firewall=iptables"));
    }

    #[test]
    fn apply_drops_everything_else_and_resets_host_exposure() {
        let mut body = ContainerCreateBody {
            host_config: Some(HostConfig {
                privileged: Some(true),
                pid_mode: Some("host".into()),
                network_mode: Some("host".into()),
                pids_limit: Some(7),
                ..Default::default()
            }),
            ..Default::default()
        };
        apply(&mut body, &HardeningSettings::default(), "p");
        let host = body.host_config.unwrap();
        assert_eq!(host.privileged, Some(false));
        assert_eq!(host.cap_drop, Some(vec!["ALL".to_string()]));
        assert_eq!(host.cap_add.unwrap().len(), 8);
        assert_eq!(
            host.security_opt,
            Some(vec!["no-new-privileges:true".to_string()])
        );
        assert_eq!(host.pids_limit, Some(7), "the request's own ceiling wins");
        assert_eq!(host.pid_mode, None);
        assert_eq!(host.network_mode, None);
        assert_eq!(body.labels.unwrap()[ISOLATION_LABEL], "p");

        let mut body = ContainerCreateBody::default();
        let relaxed = HardeningSettings {
            no_new_privileges: false,
            capabilities: vec!["cap_net_raw".into()],
            ..Default::default()
        };
        assert!(relaxed.relaxed());
        apply(&mut body, &relaxed, "p");
        let host = body.host_config.unwrap();
        assert_eq!(host.cap_add, Some(vec!["NET_RAW".to_string()]));
        assert_eq!(host.security_opt, None);
        assert_eq!(host.pids_limit, Some(DEFAULT_PIDS_LIMIT));
    }

    #[test]
    fn masks_read_back_by_name() {
        assert_eq!(capability_bit("NET_RAW"), Some(13));
        assert_eq!(capability_bit("cap_checkpoint_restore"), Some(40));
        assert_eq!(capability_bit("NOPE"), None);
        // Docker's default set.
        let set = capabilities_in_mask("00000000a80425fb").unwrap();
        assert!(set.contains("NET_RAW") && set.contains("MKNOD") && set.contains("SETFCAP"));
        assert_eq!(set.len(), 14);
    }

    #[test]
    fn validation_names_each_bad_field() {
        let bad = HardeningSettings {
            capabilities: vec!["CHOWN".into(), "FLY".into()],
            default_pids_limit: -1,
            blocked_destinations: vec!["metadata".into()],
            blocked_host_ports: vec![0],
            ..Default::default()
        };
        let mut issues = Issues::default();
        bad.validate("p.hardening", &mut issues);
        let paths: Vec<&str> = issues.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(
            paths,
            [
                "p.hardening.capabilities[1]",
                "p.hardening.defaultPidsLimit",
                "p.hardening.blockedDestinations[0]",
                "p.hardening.blockedHostPorts"
            ]
        );
    }
}
