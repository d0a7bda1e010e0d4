//! Between the seam's types and E2B's (pure, table-tested).
//!
//! E2B keeps one string map per sandbox, `metadata`, set at create and never changed. It
//! holds the owner labels and every caller label (the adoption and sweep keys), plus three
//! keys of this provider's own, which are read back into their descriptor fields and not
//! reported as labels: the external name, the restart policy and the requested ports.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::api::{Detail, Listed};
use super::settings::{E2bSettings, OnTimeout};
use crate::provider::labels::{TEMPLATE, merge_labels};
use crate::provider::{
    AppliedResources, CreateRequest, IdleAction, ImagePullPolicy, PortMapping, ProviderError,
    ProviderResult, Resources, RestartPolicy, SandboxDescriptor, SandboxState, StartedAt,
};

/// Metadata key: the request's deterministic external name.
pub const NAME_KEY: &str = "sandboxes.dev/e2b-name";
/// Metadata key: the restart policy (`Never|OnFailure|Always`).
pub const RESTART_KEY: &str = "sandboxes.dev/e2b-restart-policy";
/// Metadata key: requested ports, `8080,9000`.
pub const PORTS_KEY: &str = "sandboxes.dev/e2b-ports";
/// The CIDR that, denied, cuts a sandbox off everything its allow-list does not name
/// (allowed entries take precedence over denied ones).
pub const DENY_ALL: &str = "0.0.0.0/0";

const INTERNAL: [&str; 3] = [NAME_KEY, RESTART_KEY, PORTS_KEY];

/// Refuses what E2B cannot enforce (rule 10), naming the field and the fix.
pub fn check_enforceable(request: &CreateRequest) -> ProviderResult<()> {
    // Rule 10 by the compiler: every field of the request is decided here or named where it
    // is honoured, so a new field does not compile until this provider decides about it.
    let CreateRequest {
        // Checked below.
        command: _,
        resources: _,
        volumes: _,
        template: _,
        registry_credentials: _,
        image_pull_policy: _,
        ports: _,
        idle_action: _,
        // Honoured by `create_body` (template = image, metadata, env, network, restart).
        name: _,
        owner: _,
        image: _,
        restart_policy: _,
        env: _,
        labels: _,
        allowed_domains: _,
        // Secret-derived env goes to E2B with the rest of `env`.
        secret_env_keys: _,
    } = request;
    let refuse = |msg: String| Err(ProviderError::unsupported(msg));
    if request.command.is_some() {
        return refuse(
            "spec.command cannot be enforced on E2B: a sandbox runs its template's start \
             command; remove spec.command, or build an E2B template whose start command is it"
                .into(),
        );
    }
    refuse_resources(&request.resources)?;
    if !request.volumes.is_empty() {
        return refuse(
            "spec.volumes are not supported on E2B (its volumes carry no labels, so this \
             operator could not tell its own from anyone else's); remove spec.volumes"
                .into(),
        );
    }
    if request.template.is_some() {
        return refuse(
            "this E2B provider boots no SandboxTemplate natively; the controller restores \
             templates over exec and files"
                .into(),
        );
    }
    if !request.registry_credentials.is_empty() {
        return refuse(
            "spec.imagePullSecrets cannot be used on E2B: spec.image names an E2B template, \
             which E2B builds and stores itself; remove spec.imagePullSecrets"
                .into(),
        );
    }
    if request.image_pull_policy == ImagePullPolicy::Always {
        return refuse(
            "spec.imagePullPolicy: Always cannot be enforced on E2B: a sandbox boots the \
             template's current build, with no pull to repeat; remove it or use IfNotPresent"
                .into(),
        );
    }
    if let Some(port) = request.ports.iter().find(|p| p.protocol != "tcp") {
        return refuse(format!(
            "spec.ports: {}/{} — E2B serves TCP ports only (https://<port>-<id>.<domain>)",
            port.sandbox_port, port.protocol
        ));
    }
    if matches!(
        request.idle_action,
        Some(IdleAction::Stop | IdleAction::Suspend)
    ) {
        return refuse(
            "spec.idleAction cannot be enforced on E2B: it pauses at a timeout, not when idle; \
             remove spec.idleAction or set it to off"
                .into(),
        );
    }
    Ok(())
}

/// E2B has no per-sandbox ceilings: CPU, memory and disk come with the template.
fn refuse_resources(r: &Resources) -> ProviderResult<()> {
    let refuse = |msg: String| Err(ProviderError::unsupported(msg));
    let asked: Vec<&str> = [
        (r.cpu_millis.is_some(), "spec.resources.cpu"),
        (r.memory_bytes.is_some(), "spec.resources.memory"),
        (r.disk_bytes.is_some(), "spec.resources.disk"),
        (r.pids.is_some(), "spec.resources.pids"),
    ]
    .into_iter()
    .filter_map(|(set, field)| set.then_some(field))
    .collect();
    if !asked.is_empty() {
        return refuse(format!(
            "{} cannot be enforced on E2B: CPU, memory and disk are properties of the E2B \
             template and there is no process ceiling; remove them and choose (or build) a \
             template of the size you need",
            asked.join(", ")
        ));
    }
    Ok(())
}

/// The `network` of a create or update for an allow-list: `None` unrestricted (no rules),
/// `[]` nothing, else only the named destinations.
pub fn network(allowed: Option<&[String]>) -> Value {
    match allowed {
        None => json!({}),
        Some([]) => json!({ "denyOut": [DENY_ALL] }),
        Some(domains) => json!({ "allowOut": domains, "denyOut": [DENY_ALL] }),
    }
}

/// The allow-list a stored network policy means, when it is one this provider could have
/// written.
pub fn allowed_domains(network: Option<&super::api::Network>) -> Option<Vec<String>> {
    let network = network?;
    let denies_all = network
        .deny_out
        .as_deref()
        .is_some_and(|d| d.iter().any(|c| c == DENY_ALL));
    denies_all.then(|| network.allow_out.clone().unwrap_or_default())
}

fn restart_name(policy: RestartPolicy) -> &'static str {
    match policy {
        RestartPolicy::Never => "Never",
        RestartPolicy::OnFailure => "OnFailure",
        RestartPolicy::Always => "Always",
    }
}

/// The `POST /sandboxes` body for `request`.
pub fn create_body(request: &CreateRequest, settings: &E2bSettings) -> ProviderResult<Value> {
    check_enforceable(request)?;
    let mut metadata =
        merge_labels(&request.owner, &request.labels).map_err(ProviderError::invalid)?;
    metadata.insert(NAME_KEY.into(), request.name.clone());
    metadata.insert(
        RESTART_KEY.into(),
        restart_name(request.restart_policy).into(),
    );
    if !request.ports.is_empty() {
        let ports: Vec<String> = request
            .ports
            .iter()
            .map(|p| p.sandbox_port.to_string())
            .collect();
        metadata.insert(PORTS_KEY.into(), ports.join(","));
    }
    let template = request
        .image
        .as_deref()
        .unwrap_or_else(|| settings.default_template());
    let mut body = json!({
        "templateID": template,
        "timeout": settings.timeout_secs,
        "autoPause": settings.on_timeout == OnTimeout::Pause,
        "secure": true,
        "metadata": metadata,
        "envVars": request.env,
    });
    if request.allowed_domains.is_some() {
        body["network"] = network(request.allowed_domains.as_deref());
    }
    Ok(body)
}

/// Whether a paused sandbox was paused without its memory (a stop), as far as this process
/// knows; see the module docs of `lifecycle`.
pub type StoppedHint = bool;

fn state(listed: &Listed, stopped: StoppedHint) -> SandboxState {
    match listed.state.as_str() {
        "running" => SandboxState::Running,
        "paused" if stopped => SandboxState::Stopped,
        "paused" => SandboxState::Sleeping,
        // A state this provider does not know is reported as not running: it is never
        // mistaken for a working sandbox, and the controller's wake brings it back.
        _ => SandboxState::Stopped,
    }
}

fn ports(
    metadata: &BTreeMap<String, String>,
    id: &str,
    domain: &str,
    running: bool,
) -> Vec<PortMapping> {
    if !running {
        return Vec::new();
    }
    let mut ports: Vec<PortMapping> = metadata
        .get(PORTS_KEY)
        .into_iter()
        .flat_map(|p| p.split(','))
        .filter_map(|p| p.parse::<u16>().ok())
        .map(|port| PortMapping {
            sandbox_port: port,
            protocol: "tcp".into(),
            host: format!("{port}-{id}.{domain}"),
            port: 443,
        })
        .collect();
    ports.sort();
    ports
}

const MIB: u64 = 1024 * 1024;

/// The seam's descriptor of a listed sandbox.
pub fn descriptor(listed: &Listed, domain: &str, stopped: StoppedHint) -> SandboxDescriptor {
    let mut labels = listed.metadata.clone().unwrap_or_default();
    let internal: BTreeMap<String, String> = INTERNAL
        .iter()
        .filter_map(|k| labels.remove_entry(*k))
        .collect();
    let restart_policy = match internal.get(RESTART_KEY).map(String::as_str) {
        Some("OnFailure") => RestartPolicy::OnFailure,
        Some("Always") => RestartPolicy::Always,
        _ => RestartPolicy::Never,
    };
    let state = state(listed, stopped);
    let positive = |v: Option<i64>| v.and_then(|v| u64::try_from(v).ok()).filter(|v| *v > 0);
    SandboxDescriptor {
        id: listed.sandbox_id.clone(),
        state,
        template_ref: labels.get(TEMPLATE).cloned(),
        labels,
        created_at: listed.started_at,
        // E2B starts a sandbox as it creates it: every sandbox it lists has run (rule 6),
        // so no answer is a complete record of a sandbox that never ran.
        started_at: StartedAt::from_evidence(state, listed.started_at, false),
        exit_code: None,
        image_digest: None,
        image_pull: None,
        isolation: None,
        image: Some(
            listed
                .alias
                .clone()
                .unwrap_or_else(|| listed.template_id.clone()),
        ),
        volumes: Vec::new(),
        ports: ports(
            &internal,
            &listed.sandbox_id,
            domain,
            state == SandboxState::Running,
        ),
        resources: AppliedResources {
            cpu_millis: positive(listed.cpu_count).map(|c| c * 1000),
            memory_bytes: positive(listed.memory_mb).map(|m| m * MIB),
            disk_bytes: positive(listed.disk_size_mb).map(|d| d * MIB),
            // A VM's disk is a fixed-size block device: E2B enforces the size it reports.
            disk_enforced: positive(listed.disk_size_mb).is_some(),
            pids: None,
        },
        command: None,
        restart_policy,
        // E2B does not return a sandbox's environment.
        env: BTreeMap::new(),
    }
}

/// The seam's descriptor of a sandbox read in detail.
pub fn detail_descriptor(
    detail: &Detail,
    default_domain: &str,
    stopped: StoppedHint,
) -> SandboxDescriptor {
    let domain = detail.domain.as_deref().unwrap_or(default_domain);
    descriptor(&detail.listed, domain, stopped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::labels::{OWNER_UID, Owner, SPEC_HASH};
    use crate::provider::{PortRequest, Resources};

    fn request() -> CreateRequest {
        CreateRequest {
            name: "sbx-1".into(),
            owner: Owner {
                instance: "ops".into(),
                kind: "Sandbox".into(),
                namespace: "ns".into(),
                name: "a".into(),
                uid: "u-1".into(),
            },
            image: None,
            template: None,
            command: None,
            restart_policy: RestartPolicy::OnFailure,
            env: BTreeMap::from([("A".into(), "1".into())]),
            labels: BTreeMap::from([(SPEC_HASH.into(), "h".into()), ("team".into(), "x".into())]),
            resources: Resources::default(),
            ports: vec![PortRequest {
                sandbox_port: 8080,
                protocol: "tcp".into(),
            }],
            volumes: vec![],
            allowed_domains: Some(vec!["example.com".into()]),
            idle_action: None,
            image_pull_policy: ImagePullPolicy::IfNotPresent,
            registry_credentials: Vec::new(),
            secret_env_keys: Default::default(),
        }
    }

    #[test]
    fn create_carries_labels_env_timeout_and_the_allow_list() {
        let body = create_body(&request(), &E2bSettings::default()).unwrap();
        assert_eq!(body["templateID"], "base");
        assert_eq!(body["timeout"], 300);
        assert_eq!(body["autoPause"], true);
        assert_eq!(body["secure"], true);
        assert_eq!(body["envVars"]["A"], "1");
        assert_eq!(body["metadata"][OWNER_UID], "u-1");
        assert_eq!(body["metadata"]["team"], "x");
        assert_eq!(body["metadata"][NAME_KEY], "sbx-1");
        assert_eq!(body["metadata"][PORTS_KEY], "8080");
        assert_eq!(
            body["network"],
            json!({"allowOut": ["example.com"], "denyOut": ["0.0.0.0/0"]})
        );
        let mut open = request();
        open.allowed_domains = None;
        assert!(
            create_body(&open, &E2bSettings::default())
                .unwrap()
                .get("network")
                .is_none()
        );
        assert_eq!(network(Some(&[])), json!({"denyOut": ["0.0.0.0/0"]}));
    }

    #[test]
    fn what_e2b_cannot_enforce_is_refused_naming_the_field() {
        type Change = Box<dyn Fn(&mut CreateRequest)>;
        let cases: Vec<(Change, &str)> = vec![
            (
                Box::new(|r| r.command = Some(vec!["x".into()])),
                "spec.command",
            ),
            (
                Box::new(|r| r.resources.memory_bytes = Some(1)),
                "spec.resources",
            ),
            (
                Box::new(|r| r.template = Some("t".into())),
                "SandboxTemplate",
            ),
            (
                Box::new(|r| r.ports[0].protocol = "udp".into()),
                "spec.ports",
            ),
            (
                Box::new(|r| r.idle_action = Some(IdleAction::Suspend)),
                "spec.idleAction",
            ),
        ];
        for (change, field) in cases {
            let mut r = request();
            change(&mut r);
            let err = create_body(&r, &E2bSettings::default()).unwrap_err();
            assert!(err.is(crate::provider::ErrorKind::Unsupported));
            assert!(err.message().contains(field), "{field}: {err}");
        }
    }

    fn listed(state: &str) -> Listed {
        let metadata =
            create_body(&request(), &E2bSettings::default()).unwrap()["metadata"].clone();
        serde_json::from_value(json!({
            "sandboxID": "sb1", "templateID": "base", "startedAt": "2026-01-01T00:00:00Z",
            "endAt": "2026-01-01T00:05:00Z", "cpuCount": 2, "memoryMB": 512, "diskSizeMB": 1024,
            "metadata": metadata, "state": state,
        }))
        .unwrap()
    }

    #[test]
    fn descriptors_read_labels_back_and_keep_internal_keys_out() {
        let d = descriptor(&listed("running"), "e2b.dev", false);
        assert_eq!(d.id, "sb1");
        assert_eq!(d.state, SandboxState::Running);
        assert_eq!(d.labels.get("team").map(String::as_str), Some("x"));
        assert_eq!(d.labels.get(SPEC_HASH).map(String::as_str), Some("h"));
        assert!(INTERNAL.iter().all(|k| !d.labels.contains_key(*k)));
        assert_eq!(d.restart_policy, RestartPolicy::OnFailure);
        assert!(
            d.started_at.time().is_some(),
            "E2B sandboxes have always started"
        );
        assert_eq!(d.ports[0].host, "8080-sb1.e2b.dev");
        assert_eq!(d.resources.memory_bytes, Some(512 * MIB));
        assert_eq!(d.resources.cpu_millis, Some(2000));
        let paused = descriptor(&listed("paused"), "e2b.dev", false);
        assert_eq!(paused.state, SandboxState::Sleeping);
        assert!(paused.ports.is_empty());
        assert_eq!(
            descriptor(&listed("paused"), "e2b.dev", true).state,
            SandboxState::Stopped
        );
    }

    #[test]
    fn only_a_deny_all_policy_reads_as_an_allow_list() {
        let n = |allow: Option<Vec<&str>>, deny: Option<Vec<&str>>| super::super::api::Network {
            allow_out: allow.map(|a| a.into_iter().map(String::from).collect()),
            deny_out: deny.map(|d| d.into_iter().map(String::from).collect()),
        };
        assert_eq!(allowed_domains(None), None);
        assert_eq!(allowed_domains(Some(&n(None, None))), None);
        assert_eq!(
            allowed_domains(Some(&n(None, Some(vec![DENY_ALL])))),
            Some(vec![])
        );
        assert_eq!(
            allowed_domains(Some(&n(Some(vec!["a.com"]), Some(vec![DENY_ALL])))),
            Some(vec!["a.com".to_string()])
        );
    }
}
