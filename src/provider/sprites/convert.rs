//! Conversions between the seam's types and the Sprites API's: what a create may ask for
//! (and what it must refuse, rule 10), labels as `key=value` strings, a sprite's status as a
//! seam state, and `allowedDomains` as a network policy.

use std::collections::BTreeMap;

use super::wire::{NetworkPolicy, PolicyRule, SpriteConfig, SpriteInfo};
use crate::provider::labels::merge_labels;
use crate::provider::{
    AppliedResources, CreateRequest, IdleAction, PortMapping, ProviderError, ProviderResult,
    RestartPolicy, SandboxDescriptor, SandboxState, StartedAt,
};

/// Label recording the restart policy. A sprite has no main process whose exit the policy
/// could govern (the service brings the whole sprite back on the next request whatever
/// happened), so the policy is recorded and reported, never acted on.
pub const RESTART_LABEL: &str = "sandboxes.dev/restart-policy";

/// The one port a sprite exposes: its URL routes to 8080 inside it.
pub const URL_PORT: u16 = 8080;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// Refuses every field of `request` a sprite cannot honour, naming the field (rule 10), and
/// returns the VM size to ask for.
pub fn check_request(request: &CreateRequest) -> ProviderResult<Option<SpriteConfig>> {
    // Rule 10 by the compiler: every field of the request is decided here or named where it
    // is honoured, so a new field does not compile until this provider decides about it.
    let CreateRequest {
        // Checked below.
        image: _,
        template: _,
        command: _,
        resources: _,
        volumes: _,
        ports: _,
        idle_action: _,
        // Honoured by the create call (name, labels, env, egress policy); no pull on Sprites.
        name: _,
        owner: _,
        restart_policy: _,
        env: _,
        labels: _,
        allowed_domains: _,
        image_pull_policy: _,
        registry_credentials: _,
        secret_env_keys: _,
    } = request;
    let refuse = |field: &str, why: &str| {
        Err(ProviderError::unsupported(format!(
            "sandbox {}: {field} cannot be honoured by Fly Sprites: {why}",
            request.name
        )))
    };
    if request.image.is_some() {
        return refuse(
            "image",
            "every sprite boots the service's own base system; omit it",
        );
    }
    if request.template.is_some() {
        return refuse(
            "template",
            "a checkpoint restores only the sprite it was taken from, so no new sprite boots \
             from it; use a template store",
        );
    }
    if request.command.is_some() {
        return refuse(
            "command",
            "a sprite has no main process to replace; run it with exec",
        );
    }
    if request.resources.pids.is_some() {
        return refuse("pids", "the API has no process-count ceiling");
    }
    if !request.volumes.is_empty() {
        return refuse("volumes", "sprites have no attachable volumes");
    }
    if let Some(p) = request
        .ports
        .iter()
        .find(|p| p.sandbox_port != URL_PORT || p.protocol != "tcp")
    {
        return refuse(
            "ports",
            &format!(
                "only {URL_PORT}/tcp is reachable (through the sprite URL), not {}/{}",
                p.sandbox_port, p.protocol
            ),
        );
    }
    if matches!(
        request.idle_action,
        Some(IdleAction::Off | IdleAction::Stop)
    ) {
        return refuse(
            "idleAction",
            "an idle sprite is always suspended by the service (only `suspend` is true)",
        );
    }
    vm_size(request)
}

/// Ceilings as the API's units: whole CPUs, MiB, GiB; anything finer is refused.
fn vm_size(request: &CreateRequest) -> ProviderResult<Option<SpriteConfig>> {
    let r = &request.resources;
    let whole = |field: &str, value: Option<u64>, unit: u64, what: &str| match value {
        Some(v) if v == 0 || v % unit != 0 => Err(ProviderError::invalid(format!(
            "sandbox {}: {field} must be a whole number of {what} on Fly Sprites",
            request.name
        ))),
        other => Ok(other.map(|v| v / unit)),
    };
    let config = SpriteConfig {
        cpus: whole("cpu", r.cpu_millis, 1000, "CPUs (1000m)")?,
        ram_mb: whole("memory", r.memory_bytes, MIB, "MiB")?,
        storage_gb: whole("disk", r.disk_bytes, GIB, "GiB")?,
    };
    Ok((config != SpriteConfig::default()).then_some(config))
}

/// The owner labels and the caller's, as the API's label strings (`key=value`).
pub fn labels(request: &CreateRequest) -> ProviderResult<Vec<String>> {
    let merged = merge_labels(&request.owner, &request.labels).map_err(|why| {
        ProviderError::invalid(format!("sandbox {}: labels: {why}", request.name))
    })?;
    let restart = match request.restart_policy {
        RestartPolicy::Never => "Never",
        RestartPolicy::OnFailure => "OnFailure",
        RestartPolicy::Always => "Always",
    };
    Ok(merged
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .chain([format!("{RESTART_LABEL}={restart}")])
        .collect())
}

/// Label strings back into a map (strings without `=` are someone else's and kept as keys
/// with an empty value).
fn parse_labels(labels: &[String]) -> BTreeMap<String, String> {
    labels
        .iter()
        .map(|l| match l.split_once('=') {
            Some((k, v)) => (k.to_string(), v.to_string()),
            None => (l.clone(), String::new()),
        })
        .collect()
}

fn restart_policy(labels: &BTreeMap<String, String>) -> RestartPolicy {
    match labels.get(RESTART_LABEL).map(String::as_str) {
        Some("OnFailure") => RestartPolicy::OnFailure,
        Some("Always") => RestartPolicy::Always,
        _ => RestartPolicy::Never,
    }
}

/// The seam's state of a sprite. `running` is Running; `warm` (suspended with its processes
/// frozen) is Sleeping; `cold` (stopped, processes gone) is Stopped, or Creating when the
/// sprite has never run (rule 6).
pub fn state(info: &SpriteInfo) -> SandboxState {
    match info.status.as_str() {
        "running" => SandboxState::Running,
        "warm" => SandboxState::Sleeping,
        "cold" if info.last_running_at.is_some() => SandboxState::Stopped,
        _ => SandboxState::Creating,
    }
}

/// Where a [`SpriteInfo`] came from, which decides what its missing fields prove (rule 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// `GET /v1/sprites/{name}`: the sprite's own record, where an absent `last_running_at`
    /// means it never ran.
    Record,
    /// An entry of the listing, which need not carry every field: an absent
    /// `last_running_at` proves nothing.
    Listing,
}

/// A sprite as the seam describes it. The id is the sprite's name: every API path is keyed
/// by it.
pub fn descriptor(info: &SpriteInfo, answer: Answer) -> SandboxDescriptor {
    let state = state(info);
    let config = info.config.clone().unwrap_or_default();
    let labels = parse_labels(info.labels.as_deref().unwrap_or_default());
    SandboxDescriptor {
        id: info.name.clone(),
        state,
        restart_policy: restart_policy(&labels),
        labels,
        created_at: info.created_at,
        started_at: StartedAt::from_evidence(state, info.last_running_at, answer == Answer::Record),
        exit_code: None,
        template_ref: None,
        image: None,
        image_digest: None,
        image_pull: None,
        isolation: None,
        volumes: Vec::new(),
        ports: match state {
            SandboxState::Running | SandboxState::Sleeping => url_port(info.url.as_deref()),
            _ => Vec::new(),
        },
        resources: AppliedResources {
            cpu_millis: config.cpus.map(|c| c * 1000),
            memory_bytes: config.ram_mb.map(|m| m * MIB),
            disk_bytes: config.storage_gb.map(|g| g * GIB),
            disk_enforced: false,
            pids: None,
        },
        command: None,
        env: info.environment.clone().unwrap_or_default(),
    }
}

/// The sprite URL as the mapping of port 8080.
fn url_port(url: Option<&str>) -> Vec<PortMapping> {
    let Some(parsed) = url
        .filter(|u| !u.is_empty())
        .and_then(|u| url::Url::parse(u).ok())
    else {
        return Vec::new();
    };
    match (parsed.host_str(), parsed.port_or_known_default()) {
        (Some(host), Some(port)) => vec![PortMapping {
            sandbox_port: URL_PORT,
            protocol: "tcp".into(),
            host: host.to_string(),
            port,
        }],
        _ => Vec::new(),
    }
}

/// `allowedDomains` as a network policy: `None` is no rule at all (unrestricted); a list
/// allows each domain and denies everything else; `[]` denies everything.
pub fn policy(allowed: Option<&[String]>) -> NetworkPolicy {
    let Some(domains) = allowed else {
        return NetworkPolicy::default();
    };
    let mut rules: Vec<PolicyRule> = domains
        .iter()
        .map(|d| PolicyRule {
            domain: d.clone(),
            action: "allow".into(),
        })
        .collect();
    rules.push(PolicyRule {
        domain: "*".into(),
        action: "deny".into(),
    });
    NetworkPolicy { rules }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(status: &str, ran: bool) -> SpriteInfo {
        SpriteInfo {
            name: "sbx-1".into(),
            status: status.into(),
            config: None,
            environment: None,
            created_at: None,
            url: Some("https://sbx-1.sprites.app".into()),
            labels: Some(vec!["a=b".into(), "c=d=e".into(), "bare".into()]),
            last_running_at: ran.then(chrono::Utc::now),
        }
    }

    #[test]
    fn only_the_record_proves_a_sprite_never_ran() {
        let never = info("cold", false);
        assert_eq!(
            descriptor(&never, Answer::Record).started_at,
            StartedAt::Never
        );
        assert_eq!(
            descriptor(&never, Answer::Listing).started_at,
            StartedAt::Unknown
        );
        for status in ["running", "warm"] {
            let d = descriptor(&info(status, false), Answer::Record);
            assert_eq!(d.started_at, StartedAt::Unknown, "{status} has run");
        }
    }

    #[test]
    fn status_maps_to_what_the_sprite_really_is() {
        assert_eq!(state(&info("running", true)), SandboxState::Running);
        assert_eq!(state(&info("warm", true)), SandboxState::Sleeping);
        assert_eq!(state(&info("cold", true)), SandboxState::Stopped);
        assert_eq!(state(&info("cold", false)), SandboxState::Creating);
    }

    #[test]
    fn labels_and_url_come_back() {
        let d = descriptor(&info("running", true), Answer::Record);
        assert_eq!(d.labels["a"], "b");
        assert_eq!(d.labels["c"], "d=e");
        assert_eq!(d.labels["bare"], "");
        assert_eq!(d.ports[0].host, "sbx-1.sprites.app");
        assert_eq!(d.ports[0].port, 443);
        assert!(
            descriptor(&info("cold", true), Answer::Record)
                .ports
                .is_empty()
        );
    }

    #[test]
    fn allowed_domains_become_allow_rules_then_deny_all() {
        assert!(policy(None).rules.is_empty());
        let none = policy(Some(&[]));
        assert_eq!(none.rules.len(), 1);
        assert_eq!(
            (none.rules[0].domain.as_str(), none.rules[0].action.as_str()),
            ("*", "deny")
        );
        let some = policy(Some(&["example.com".to_string()]));
        assert_eq!(some.rules[0].domain, "example.com");
        assert_eq!(some.rules[0].action, "allow");
        assert_eq!(some.rules[1].action, "deny");
    }
}
