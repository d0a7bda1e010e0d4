//! A sandbox's machine config, built from a [`CreateRequest`]. Pure: everything that can be
//! refused is refused here, before any API call, so an unsupported spec leaves nothing behind.
//!
//! | request | machine config |
//! |---|---|
//! | `command` | `init.exec` (replaces the image's entrypoint and command: it is pid 1's argv) |
//! | `env` | `env` |
//! | owner + caller labels | `metadata` (Fly's only per-machine key/values) |
//! | `resources.cpu` | `guest.cpus` (whole CPUs: 1, 2, 4, 8 or 16, else `Invalid`) |
//! | `resources.memory` | `guest.memory_mb` (a multiple of 256 MiB, else `Invalid`) |
//! | `resources.disk` | advisory, recorded in metadata (Fly does not cap the root filesystem) |
//! | `resources.pids` | `Unsupported` (Fly has no process limit) |
//! | `restart_policy` | `restart.policy`: `no`, `on-failure`, `always` |
//! | `ports` (tcp) | one service per port, on a public port of its own (see `ports`) |
//! | `idle_action` | every service's `autostop` (`off`/`stop`/`suspend`), `autostart` unless off |
//! | `volumes` | `mounts` (one volume per machine, read-write only) |
//! | `allowed_domains` | `Unsupported`: Fly cannot filter egress by domain nor cut a machine off |
//!
//! The root filesystem is persisted across stop/start (`guest.persist_rootfs: always`),
//! because a Stopped sandbox keeps its filesystem; Fly's default would reset it.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::DISK_KEY;
use crate::provider::labels::merge_labels;
use crate::provider::{
    CreateRequest, IdleAction, ImagePullPolicy, ProviderError, ProviderResult, Resources,
    RestartPolicy,
};

/// Fly's memory granule.
const MEMORY_STEP: u64 = 256 * 1024 * 1024;
/// CPU counts Fly offers.
const CPU_COUNTS: [u64; 5] = [1, 2, 4, 8, 16];
/// CPUs when the request names none (Fly's smallest shared machine).
const DEFAULT_CPUS: u64 = 1;
/// Memory when the request names none, in MB.
const DEFAULT_MEMORY_MB: u64 = 256;

/// What a request that sets no ceiling gets: the guest `guest` builds for it.
pub(crate) fn default_resources() -> Resources {
    Resources {
        cpu_millis: Some(DEFAULT_CPUS * 1000),
        memory_bytes: Some(DEFAULT_MEMORY_MB * 1024 * 1024),
        ..Resources::default()
    }
}

/// Refuses what Fly cannot do for this request (rule 10), naming the field to change.
pub(crate) fn refuse_unsupported(request: &CreateRequest) -> ProviderResult<()> {
    // Rule 10 by the compiler: every field of the request is decided here or named where it
    // is honoured, so a new field does not compile until this provider decides about it.
    let CreateRequest {
        // Checked below.
        allowed_domains: _,
        ports: _,
        volumes: _,
        registry_credentials: _,
        image_pull_policy: _,
        template: _,
        resources: _,
        // Honoured by `machine_config` (the machine's config: image, command, env, labels, restart, idle).
        name: _,
        owner: _,
        image: _,
        command: _,
        restart_policy: _,
        env: _,
        labels: _,
        idle_action: _,
        // Secret-derived env stays in the machine's config with the rest (README: who reads it).
        secret_env_keys: _,
    } = request;
    if let Some(domains) = &request.allowed_domains {
        let what = if domains.is_empty() {
            "cut a machine off the network"
        } else {
            "filter outbound traffic by domain"
        };
        return Err(ProviderError::unsupported(format!(
            "Fly Machines cannot {what}, so spec.egress.allowedDomains cannot be enforced; remove \
             spec.egress (unrestricted egress) or use a provider that enforces allow-lists"
        )));
    }
    if let Some(port) = request.ports.iter().find(|p| p.protocol != "tcp") {
        return Err(ProviderError::unsupported(format!(
            "spec.ports: port {} is {}; the Fly provider publishes tcp ports only",
            port.sandbox_port, port.protocol
        )));
    }
    if request.volumes.len() > 1 {
        return Err(ProviderError::unsupported(
            "spec.volumes: a Fly machine mounts at most one volume; keep one",
        ));
    }
    if let Some(v) = request.volumes.iter().find(|v| v.read_only) {
        return Err(ProviderError::unsupported(format!(
            "spec.volumes: {} is read-only; Fly mounts volumes read-write only",
            v.mount_path
        )));
    }
    if !request.registry_credentials.is_empty() {
        return Err(ProviderError::unsupported(
            "spec.imagePullSecrets cannot be passed to Fly Machines per machine: Fly pulls with \
             the organization's registry access; remove spec.imagePullSecrets and give the \
             image's registry access to the Fly organization",
        ));
    }
    if request.image_pull_policy != ImagePullPolicy::IfNotPresent {
        return Err(ProviderError::unsupported(
            "spec.imagePullPolicy: Fly resolves the image when the machine is created and keeps \
             that build; remove the field (IfNotPresent is what Fly does)",
        ));
    }
    if request.template.is_some() {
        return Err(ProviderError::unsupported(
            "Fly Machines has no native templates: the operator restores spec.templateRef through \
             its templates service, which creates the sandbox from the template's base image",
        ));
    }
    guest(&request.resources).map(|_| ())
}

/// `config.guest` for `resources` (defaults for what is absent). Rule 10: a ceiling Fly
/// cannot apply exactly is refused, never rounded.
pub(crate) fn guest(resources: &Resources) -> ProviderResult<Value> {
    if resources.pids.is_some() {
        return Err(ProviderError::unsupported(
            "spec.resources.pids: Fly Machines cannot limit the number of processes; remove it",
        ));
    }
    let cpus = match resources.cpu_millis {
        None => DEFAULT_CPUS,
        Some(m) if m % 1000 == 0 && CPU_COUNTS.contains(&(m / 1000)) => m / 1000,
        Some(m) => {
            return Err(ProviderError::invalid(format!(
                "spec.resources.cpu: {m}m is not a Fly CPU count; Fly gives whole CPUs: use 1, 2, \
                 4, 8 or 16"
            )));
        }
    };
    let memory_mb = match resources.memory_bytes {
        None => DEFAULT_MEMORY_MB,
        Some(b) if b > 0 && b % MEMORY_STEP == 0 => b / (1024 * 1024),
        Some(b) => {
            return Err(ProviderError::invalid(format!(
                "spec.resources.memory: {b} bytes is not a multiple of 256Mi; Fly sizes memory in \
                 256 MB steps: use e.g. 256Mi, 512Mi or 1Gi"
            )));
        }
    };
    Ok(json!({
        "cpu_kind": "shared",
        "cpus": cpus,
        "memory_mb": memory_mb,
        "persist_rootfs": "always",
    }))
}

/// The full machine config. `image` is resolved by the caller; `mounts` are ready
/// `config.mounts` entries; `public_ports` maps each sandbox port to its public port.
pub(crate) fn machine_config(
    request: &CreateRequest,
    image: &str,
    mounts: Vec<Value>,
    public_ports: &BTreeMap<u16, u16>,
) -> ProviderResult<Value> {
    let mut metadata =
        merge_labels(&request.owner, &request.labels).map_err(ProviderError::invalid)?;
    if let Some(disk) = request.resources.disk_bytes {
        metadata.insert(DISK_KEY.into(), disk.to_string());
    }
    let mut config = json!({
        "image": image,
        "env": request.env,
        "guest": guest(&request.resources)?,
        "metadata": metadata,
        "restart": { "policy": restart_policy(request.restart_policy) },
        "services": services(request, public_ports)?,
        "mounts": mounts,
    });
    if let Some(argv) = &request.command {
        if argv.is_empty() {
            return Err(ProviderError::invalid(
                "spec.command is empty; give the program to run, or omit it for the image's own",
            ));
        }
        config["init"] = json!({ "exec": argv });
    }
    Ok(config)
}

fn services(request: &CreateRequest, public_ports: &BTreeMap<u16, u16>) -> ProviderResult<Value> {
    let (autostop, autostart) = match request.idle_action.unwrap_or(IdleAction::Off) {
        IdleAction::Off => ("off", false),
        IdleAction::Stop => ("stop", true),
        IdleAction::Suspend => ("suspend", true),
    };
    let mut services = Vec::new();
    for port in &request.ports {
        let public = public_ports.get(&port.sandbox_port).ok_or_else(|| {
            ProviderError::transient(format!(
                "no public port was reserved for sandbox port {}",
                port.sandbox_port
            ))
        })?;
        services.push(json!({
            "protocol": "tcp",
            "internal_port": port.sandbox_port,
            "ports": [{ "port": public }],
            "autostop": autostop,
            "autostart": autostart,
        }));
    }
    Ok(Value::Array(services))
}

fn restart_policy(policy: RestartPolicy) -> &'static str {
    match policy {
        RestartPolicy::Never => "no",
        RestartPolicy::OnFailure => "on-failure",
        RestartPolicy::Always => "always",
    }
}

/// The seam's restart policy for a config's `restart.policy`.
pub(crate) fn restart_policy_of(policy: Option<&str>) -> RestartPolicy {
    match policy {
        Some("always") => RestartPolicy::Always,
        Some("on-failure") => RestartPolicy::OnFailure,
        _ => RestartPolicy::Never,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::labels::Owner;
    use crate::provider::{PortRequest, VolumeMount};

    #[test]
    fn the_reported_default_is_the_guest_a_silent_request_gets() {
        let d = default_resources();
        let g = guest(&Resources::default()).unwrap();
        assert_eq!(d.cpu_millis, g["cpus"].as_u64().map(|c| c * 1000));
        assert_eq!(d.memory_bytes, g["memory_mb"].as_u64().map(|m| m << 20));
    }

    fn request() -> CreateRequest {
        CreateRequest {
            name: "sbx-1".into(),
            owner: Owner {
                instance: "ops".into(),
                kind: "Sandbox".into(),
                namespace: "team".into(),
                name: "web".into(),
                uid: "1".into(),
            },
            image: Some("img".into()),
            template: None,
            command: Some(vec!["sleep".into(), "infinity".into()]),
            restart_policy: RestartPolicy::OnFailure,
            image_pull_policy: ImagePullPolicy::IfNotPresent,
            registry_credentials: Vec::new(),
            secret_env_keys: Default::default(),
            env: BTreeMap::from([("A".into(), "1".into())]),
            labels: BTreeMap::from([("team".into(), "a".into())]),
            resources: Resources {
                cpu_millis: Some(2000),
                memory_bytes: Some(512 * 1024 * 1024),
                disk_bytes: Some(1 << 30),
                pids: None,
            },
            ports: vec![PortRequest {
                sandbox_port: 8080,
                protocol: "tcp".into(),
            }],
            volumes: vec![],
            allowed_domains: None,
            idle_action: Some(IdleAction::Suspend),
        }
    }

    #[test]
    fn every_field_lands_where_fly_reads_it() {
        let config = machine_config(
            &request(),
            "img",
            vec![json!({"volume": "vol_1", "path": "/data"})],
            &BTreeMap::from([(8080, 10_001)]),
        )
        .unwrap();
        assert_eq!(config["init"]["exec"], json!(["sleep", "infinity"]));
        assert_eq!(config["env"]["A"], "1");
        assert_eq!(config["guest"]["cpus"], 2);
        assert_eq!(config["guest"]["memory_mb"], 512);
        assert_eq!(config["guest"]["persist_rootfs"], "always");
        assert_eq!(config["metadata"]["team"], "a");
        assert_eq!(config["metadata"]["sandboxes.dev/owner-uid"], "1");
        assert_eq!(config["metadata"][DISK_KEY], (1u64 << 30).to_string());
        assert_eq!(config["restart"]["policy"], "on-failure");
        let service = &config["services"][0];
        assert_eq!(service["internal_port"], 8080);
        assert_eq!(service["ports"][0]["port"], 10_001);
        assert_eq!(service["autostop"], "suspend");
        assert_eq!(service["autostart"], true);
        assert_eq!(config["mounts"][0]["volume"], "vol_1");
    }

    #[test]
    fn what_fly_cannot_enforce_is_refused_naming_the_field() {
        type Change = Box<dyn Fn(&mut CreateRequest)>;
        let cases: Vec<(Change, &str)> = vec![
            (
                Box::new(|r| r.allowed_domains = Some(vec!["a.com".into()])),
                "spec.egress.allowedDomains",
            ),
            (
                Box::new(|r| r.allowed_domains = Some(vec![])),
                "spec.egress.allowedDomains",
            ),
            (
                Box::new(|r| r.resources.pids = Some(64)),
                "spec.resources.pids",
            ),
            (
                Box::new(|r| r.resources.cpu_millis = Some(500)),
                "spec.resources.cpu",
            ),
            (
                Box::new(|r| r.resources.memory_bytes = Some(300 * 1024 * 1024)),
                "spec.resources.memory",
            ),
            (
                Box::new(|r| r.ports[0].protocol = "udp".into()),
                "spec.ports",
            ),
            (
                Box::new(|r| {
                    r.volumes = vec![
                        VolumeMount {
                            volume_name: "a".into(),
                            mount_path: "/a".into(),
                            read_only: false,
                        };
                        2
                    ]
                }),
                "spec.volumes",
            ),
            (Box::new(|r| r.template = Some("t".into())), "templateRef"),
        ];
        for (change, field) in cases {
            let mut r = request();
            change(&mut r);
            let err = refuse_unsupported(&r).unwrap_err();
            assert!(err.message().contains(field), "{field}: {err}");
        }
        assert!(refuse_unsupported(&request()).is_ok());
    }

    #[test]
    fn no_idle_action_means_no_proxy_wakeups() {
        let mut r = request();
        r.idle_action = None;
        let config = machine_config(&r, "img", vec![], &BTreeMap::from([(8080, 1)])).unwrap();
        assert_eq!(config["services"][0]["autostop"], "off");
        assert_eq!(config["services"][0]["autostart"], false);
    }
}
