//! A sandbox as a Pod: the Pod a create request becomes, and the descriptor a Pod reads back
//! as. Pure (no API calls), so every mapping is pinned by a unit test.
//!
//! A created-but-not-started sandbox is a Pod held by a scheduling gate: the API server keeps
//! it, the scheduler ignores it, no container runs. `start` removes the gate. A stopped
//! sandbox is the same gated Pod again (the running one is deleted and replaced), marked
//! with [`STOPPED`] and carrying the first start time in [`STARTED_AT`], so the identity, the
//! Service, the pull and env Secrets and the claims survive a stop.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, ContainerStatus, EmptyDirVolumeSource, EnvVar,
    EnvVarSource, LocalObjectReference, PersistentVolumeClaimVolumeSource, Pod, PodSchedulingGate,
    PodSecurityContext, PodSpec, SeccompProfile, SecretKeySelector, SecurityContext, Volume,
    VolumeMount as K8sMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::secrets::env_secret_name;
use super::settings::KubernetesSettings;
use crate::provider::labels::merge_labels;
use crate::provider::{
    CreateRequest, ImagePullPolicy, ProviderError, ProviderResult, RestartPolicy,
    SandboxDescriptor, SandboxState, StartedAt,
};

/// The one container of a sandbox Pod.
pub const CONTAINER: &str = "sandbox";
/// The directory the operator delivers files into (the self-delivered env file), a
/// memory-backed `emptyDir` in every sandbox Pod: it exists from the start, so a delivery
/// (a warm claim's env, on its way to Ready) need not create it first, and whatever is
/// delivered there — Secret values — never lands on the node's disk.
pub const DELIVERY_DIR: &str = "/run/sandboxes.dev";
/// The name of [`DELIVERY_DIR`]'s volume (a sandbox volume of this name is refused).
pub const DELIVERY_VOLUME: &str = "sandboxes-dev-delivery";
/// Its size limit: the env file is a Secret's values at most (1 MiB) and the spec's env.
const DELIVERY_LIMIT: &str = "2Mi";
/// The scheduling gate that holds a created or stopped sandbox.
pub const GATE: &str = "sandboxes.dev/not-started";
/// Marks a gated Pod that stands for a stopped sandbox (not a never-started one).
pub const STOPPED: &str = "sandboxes.dev/stopped";
/// The sandbox's first start time (RFC 3339), carried from Pod to Pod across a stop.
pub const STARTED_AT: &str = "sandboxes.dev/started-at";
/// The sandbox's creation time (RFC 3339): its Pod is replaced on stop, its age is not.
pub const CREATED_AT: &str = "sandboxes.dev/created-at";
/// The advisory disk request in bytes, on Pods made before disk became their
/// ephemeral-storage limit (read back only).
pub const DISK_BYTES: &str = "sandboxes.dev/disk-bytes";

/// The Pod `request` becomes, gated (not started). `pull_secret` names the per-sandbox
/// dockerconfigjson Secret when a credential matched the image.
pub fn build(
    request: &CreateRequest,
    settings: &KubernetesSettings,
    pull_secret: Option<&str>,
    now: DateTime<Utc>,
) -> ProviderResult<Pod> {
    refuse_unenforceable(request)?;
    let image = image_of(request)?;
    let labels = merge_labels(&request.owner, &request.labels).map_err(ProviderError::invalid)?;
    let annotations = BTreeMap::from([(CREATED_AT.to_string(), crate::api::rfc3339(now))]);
    Ok(Pod {
        metadata: ObjectMeta {
            name: Some(request.name.clone()),
            namespace: Some(settings.namespace.clone()),
            labels: Some(labels),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![container(request, image, settings)],
            restart_policy: Some(restart_policy(request.restart_policy).into()),
            runtime_class_name: settings.runtime_class_name.clone(),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            termination_grace_period_seconds: Some(5),
            scheduling_gates: Some(vec![PodSchedulingGate { name: GATE.into() }]),
            image_pull_secrets: pull_secret.map(|name| {
                vec![LocalObjectReference {
                    name: name.to_string(),
                }]
            }),
            security_context: Some(PodSecurityContext {
                seccomp_profile: Some(SeccompProfile {
                    type_: "RuntimeDefault".into(),
                    ..Default::default()
                }),
                run_as_non_root: settings.run_as_user.map(|_| true),
                run_as_user: settings.run_as_user,
                ..Default::default()
            }),
            volumes: volumes(request),
            ..Default::default()
        }),
        status: None,
    })
}

/// Rule 10: what a Pod cannot enforce is refused, naming the field.
fn refuse_unenforceable(request: &CreateRequest) -> ProviderResult<()> {
    // Rule 10 by the compiler: every field of the request is decided here or named where it
    // is honoured, so a new field does not compile until this provider decides about it.
    let CreateRequest {
        // Checked below.
        template: _,
        resources: _,
        allowed_domains: _,
        // Honoured by `build` (the Pod: name, labels, image and pull policy, command, env, ports, volumes, restart, pull Secret; Secret-derived env through the env Secret).
        name: _,
        owner: _,
        image: _,
        command: _,
        restart_policy: _,
        env: _,
        labels: _,
        ports: _,
        volumes: _,
        idle_action: _,
        image_pull_policy: _,
        registry_credentials: _,
        secret_env_keys: _,
    } = request;
    if request.template.is_some() {
        return Err(ProviderError::unsupported(
            "the kubernetes provider has no native templates: the operator's templates service \
             boots spec.image and restores the template into it (configure a templateStore)",
        ));
    }
    if request.resources.pids.is_some() {
        return Err(ProviderError::unsupported(
            "spec.resources.pids: Kubernetes limits processes per node (the kubelet's \
             podPidsLimit), not per Pod; remove it and set podPidsLimit on the nodes",
        ));
    }
    if let Some(v) = request.volumes.iter().find(|v| {
        v.volume_name == DELIVERY_VOLUME
            || v.mount_path.trim_end_matches('/') == DELIVERY_DIR
            || v.mount_path.starts_with(&format!("{DELIVERY_DIR}/"))
    }) {
        return Err(ProviderError::invalid(format!(
            "spec.volumes: volume {:?} at {:?} collides with the operator's own {DELIVERY_DIR} \
             ({DELIVERY_VOLUME}); rename the volume or mount it elsewhere",
            v.volume_name, v.mount_path
        )));
    }
    if request.allowed_domains.is_some() {
        return Err(ProviderError::unsupported(
            "spec.egress.allowedDomains: the kubernetes provider does not enforce egress (a \
             NetworkPolicy cannot name domains and needs a CNI that enforces it); remove \
             spec.egress or use a provider that filters egress",
        ));
    }
    Ok(())
}

fn image_of(request: &CreateRequest) -> ProviderResult<&str> {
    request.image.as_deref().ok_or_else(|| {
        ProviderError::invalid("spec.image is empty; name the image the sandbox Pod runs")
    })
}

fn container(request: &CreateRequest, image: &str, settings: &KubernetesSettings) -> Container {
    Container {
        name: CONTAINER.into(),
        image: Some(image.to_string()),
        image_pull_policy: Some(pull_policy(request.image_pull_policy).into()),
        command: request.command.clone(),
        env: (!request.env.is_empty()).then(|| env(request)),
        ports: (!request.ports.is_empty()).then(|| {
            request
                .ports
                .iter()
                .map(|p| ContainerPort {
                    container_port: i32::from(p.sandbox_port),
                    protocol: Some(p.protocol.to_ascii_uppercase()),
                    ..Default::default()
                })
                .collect()
        }),
        resources: Some(super::resources::requirements(
            &request.resources,
            &settings.default_resources,
        )),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            privileged: Some(false),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                add: None,
            }),
            run_as_non_root: settings.run_as_user.map(|_| true),
            ..Default::default()
        }),
        volume_mounts: Some(mounts(request)),
        ..Default::default()
    }
}

/// The container's env: plain values inline, Secret-derived ones by reference to the
/// sandbox's env Secret (see `secrets`), so the Pod spec never holds a Secret's value.
fn env(request: &CreateRequest) -> Vec<EnvVar> {
    let secret = env_secret_name(&request.name);
    request
        .env
        .iter()
        .map(
            |(name, value)| match request.secret_env_keys.contains(name) {
                true => EnvVar {
                    name: name.clone(),
                    value: None,
                    value_from: Some(EnvVarSource {
                        secret_key_ref: Some(SecretKeySelector {
                            name: secret.clone(),
                            key: name.clone(),
                            optional: None,
                        }),
                        ..Default::default()
                    }),
                },
                false => EnvVar {
                    name: name.clone(),
                    value: Some(value.clone()),
                    value_from: None,
                },
            },
        )
        .collect()
}

/// The container's mounts: [`DELIVERY_DIR`], then the sandbox's volumes.
fn mounts(request: &CreateRequest) -> Vec<K8sMount> {
    let delivery = K8sMount {
        name: DELIVERY_VOLUME.into(),
        mount_path: DELIVERY_DIR.into(),
        ..Default::default()
    };
    let volumes = request.volumes.iter().map(|v| K8sMount {
        name: v.volume_name.clone(),
        mount_path: v.mount_path.clone(),
        read_only: Some(v.read_only),
        ..Default::default()
    });
    std::iter::once(delivery).chain(volumes).collect()
}

/// The Pod's volumes: [`DELIVERY_DIR`]'s, then a claim of each sandbox volume.
fn volumes(request: &CreateRequest) -> Option<Vec<Volume>> {
    let delivery = Volume {
        name: DELIVERY_VOLUME.into(),
        empty_dir: Some(EmptyDirVolumeSource {
            medium: Some("Memory".into()),
            size_limit: Some(Quantity(DELIVERY_LIMIT.into())),
        }),
        ..Default::default()
    };
    let claims = request.volumes.iter().map(|v| Volume {
        name: v.volume_name.clone(),
        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
            claim_name: v.volume_name.clone(),
            read_only: Some(v.read_only),
        }),
        ..Default::default()
    });
    Some(std::iter::once(delivery).chain(claims).collect())
}

fn restart_policy(policy: RestartPolicy) -> &'static str {
    match policy {
        RestartPolicy::Never => "Never",
        RestartPolicy::OnFailure => "OnFailure",
        RestartPolicy::Always => "Always",
    }
}

fn pull_policy(policy: ImagePullPolicy) -> &'static str {
    match policy {
        ImagePullPolicy::Always => "Always",
        ImagePullPolicy::IfNotPresent => "IfNotPresent",
        ImagePullPolicy::Never => "Never",
    }
}

/// The Pod that replaces `pod` on stop, start after an exit, or restart: the same name,
/// labels, annotations and spec, unbound from its node, gated when `gated`, with the
/// sandbox's history (first start, stopped) written into its annotations.
pub fn successor(pod: &Pod, gated: bool, stopped: bool) -> Pod {
    let mut annotations = pod.metadata.annotations.clone().unwrap_or_default();
    if let Some(started) = started_at(pod) {
        annotations.insert(STARTED_AT.into(), crate::api::rfc3339(started));
    }
    if !annotations.contains_key(CREATED_AT)
        && let Some(created) = pod
            .metadata
            .creation_timestamp
            .as_ref()
            .and_then(chrono_time)
    {
        annotations.insert(CREATED_AT.into(), crate::api::rfc3339(created));
    }
    if stopped {
        annotations.insert(STOPPED.into(), "true".into());
    } else {
        annotations.remove(STOPPED);
    }
    let mut spec = pod.spec.clone().unwrap_or_default();
    spec.node_name = None;
    spec.scheduling_gates = gated.then(|| vec![PodSchedulingGate { name: GATE.into() }]);
    Pod {
        metadata: ObjectMeta {
            name: pod.metadata.name.clone(),
            namespace: pod.metadata.namespace.clone(),
            labels: pod.metadata.labels.clone(),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    }
}

/// Whether the Pod is still held by a scheduling gate (never scheduled by us).
pub fn gated(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.as_ref())
        .is_some_and(|g| !g.is_empty())
}

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// A Kubernetes time as chrono's (whole seconds are all the API carries).
pub fn chrono_time(
    t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) -> Option<DateTime<Utc>> {
    DateTime::<Utc>::from_timestamp(t.0.as_second(), 0)
}

fn parse_time(text: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(text)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

fn container_status(pod: &Pod) -> Option<&ContainerStatus> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == CONTAINER)
}

/// The first time the sandbox's container ran, in this Pod or (from the annotation) an
/// earlier one. `None` (rule 6): never scheduled, or scheduled but its container never
/// started (an image that cannot be pulled, a Pod no node can take).
pub fn started_at(pod: &Pod) -> Option<DateTime<Utc>> {
    if let Some(earlier) = annotation(pod, STARTED_AT).and_then(parse_time) {
        return Some(earlier);
    }
    let status = container_status(pod)?;
    let terminated_start = |s: &Option<k8s_openapi::api::core::v1::ContainerState>| {
        s.as_ref()
            .and_then(|s| s.terminated.as_ref())
            .and_then(|t| t.started_at.as_ref())
            .and_then(chrono_time)
    };
    // A container that ran before this state (restarted, or ran and exited) started then.
    terminated_start(&status.last_state)
        .or_else(|| {
            status
                .state
                .as_ref()
                .and_then(|s| s.running.as_ref())
                .and_then(|r| r.started_at.as_ref())
                .and_then(chrono_time)
        })
        .or_else(|| terminated_start(&status.state))
}

/// Whether the Pod says everything about the sandbox's starts, so that finding none proves
/// it never ran (rule 6): a gated Pod, or one no node has taken yet, runs nothing and carries
/// the earlier Pods' first start in [`STARTED_AT`] (see [`successor`]); a Pod bound to a node
/// only once the kubelet reports its container. A bound Pod without that report cannot tell.
pub fn record_complete(pod: &Pod) -> bool {
    let unbound = pod.spec.as_ref().is_none_or(|s| s.node_name.is_none());
    gated(pod) || unbound || container_status(pod).is_some()
}

/// The first start to record in [`STARTED_AT`] on this Pod: its container's, when it has
/// started and the annotation does not hold one yet.
pub fn first_start_to_record(pod: &Pod) -> Option<DateTime<Utc>> {
    if annotation(pod, STARTED_AT).is_some() {
        return None;
    }
    started_at(pod)
}

/// Whether this Pod's own container has started (now or before, in this Pod).
pub fn started_at_here(pod: &Pod) -> bool {
    let Some(status) = container_status(pod) else {
        return false;
    };
    let ran = |s: &Option<k8s_openapi::api::core::v1::ContainerState>| {
        s.as_ref()
            .is_some_and(|s| s.running.is_some() || s.terminated.is_some())
    };
    ran(&status.state) || ran(&status.last_state)
}

/// Why a Pod has not started yet, for an error message: the scheduler's or the kubelet's
/// own words.
pub fn pending_reason(pod: &Pod) -> String {
    let waiting = container_status(pod)
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.waiting.as_ref());
    if let Some(w) = waiting {
        return format!(
            "{} ({})",
            w.reason.as_deref().unwrap_or("waiting"),
            w.message.as_deref().unwrap_or("no message")
        );
    }
    let unscheduled = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| {
            c.iter()
                .find(|c| c.type_ == "PodScheduled" && c.status == "False")
        });
    match unscheduled {
        Some(c) => format!(
            "not scheduled: {} ({})",
            c.reason.as_deref().unwrap_or("Unschedulable"),
            c.message.as_deref().unwrap_or("no message")
        ),
        None => "Pending".into(),
    }
}

/// A start that cannot succeed without a change: an image the node must not pull or that
/// is misnamed, a container the runtime refuses. Pull failures and an unschedulable Pod
/// are left to the deadline: they may clear by themselves (a registry back, a node added).
pub fn start_failure(pod: &Pod) -> Option<ProviderError> {
    let waiting = container_status(pod)?.state.as_ref()?.waiting.as_ref()?;
    let reason = waiting.reason.as_deref()?;
    let message = waiting.message.as_deref().unwrap_or("");
    let name = pod.metadata.name.as_deref().unwrap_or("");
    match reason {
        "ErrImageNeverPull"
        | "InvalidImageName"
        | "CreateContainerConfigError"
        | "CreateContainerError"
        | "RunContainerError" => Some(ProviderError::invalid(format!(
            "sandbox {name} cannot start: {reason} ({message}); fix spec.image or \
             spec.imagePullPolicy"
        ))),
        _ => None,
    }
}

/// The coarse state of a sandbox Pod.
pub fn state(pod: &Pod) -> SandboxState {
    if pod.metadata.deletion_timestamp.is_some() {
        return SandboxState::Stopped;
    }
    if gated(pod) {
        return if annotation(pod, STOPPED).is_some() {
            SandboxState::Stopped
        } else {
            SandboxState::Creating
        };
    }
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    match phase {
        Some("Succeeded" | "Failed") => SandboxState::Stopped,
        Some("Running")
            if container_status(pod)
                .and_then(|c| c.state.as_ref())
                .is_some_and(|s| s.running.is_some()) =>
        {
            SandboxState::Running
        }
        _ => SandboxState::Creating,
    }
}

fn exit_code(pod: &Pod) -> Option<i64> {
    let status = container_status(pod)?;
    let code = |s: &Option<k8s_openapi::api::core::v1::ContainerState>| {
        s.as_ref()
            .and_then(|s| s.terminated.as_ref())
            .map(|t| i64::from(t.exit_code))
    };
    code(&status.state).or_else(|| code(&status.last_state))
}

/// The isolation a Pod really has, read from its stored spec (not from the settings that
/// asked for it), in the words the Docker provider uses: runtime, privilege escalation,
/// capabilities, seccomp and user.
fn isolation(pod: &Pod) -> String {
    let spec = pod.spec.as_ref();
    let container = spec.and_then(|s| s.containers.iter().find(|c| c.name == CONTAINER));
    let sc = container.and_then(|c| c.security_context.as_ref());
    let psc = spec.and_then(|s| s.security_context.as_ref());
    let runtime = spec
        .and_then(|s| s.runtime_class_name.as_deref())
        .unwrap_or("default");
    let mut parts = vec![format!("runtime={runtime}")];
    if sc.and_then(|c| c.allow_privilege_escalation) == Some(false) {
        parts.push("no-new-privileges".into());
    }
    let dropped_all = sc
        .and_then(|c| c.capabilities.as_ref())
        .and_then(|c| c.drop.as_ref())
        .is_some_and(|d| d.iter().any(|c| c == "ALL"));
    let added = sc
        .and_then(|c| c.capabilities.as_ref())
        .and_then(|c| c.add.clone())
        .unwrap_or_default();
    parts.push(match (dropped_all, added.is_empty()) {
        (true, true) => "caps=none".into(),
        (true, false) => format!("caps={}", added.join(",")),
        (false, _) => "caps=runtime-default".into(),
    });
    let seccomp = sc
        .and_then(|c| c.seccomp_profile.as_ref())
        .or_else(|| psc.and_then(|p| p.seccomp_profile.as_ref()))
        .map_or("unconfined", |p| p.type_.as_str());
    parts.push(format!("seccomp={seccomp}"));
    let non_root = sc
        .and_then(|c| c.run_as_non_root)
        .or_else(|| psc.and_then(|p| p.run_as_non_root));
    parts.push(
        if non_root == Some(true) {
            "non-root"
        } else {
            "root-allowed"
        }
        .into(),
    );
    parts.join(" ")
}

/// What a Pod reads back as; `ports` are filled in by the caller (they need the Service).
pub fn descriptor(pod: &Pod) -> SandboxDescriptor {
    let spec = pod.spec.as_ref();
    let container = spec.and_then(|s| s.containers.iter().find(|c| c.name == CONTAINER));
    let state = state(pod);
    SandboxDescriptor {
        isolation: Some(isolation(pod)),
        id: pod.metadata.name.clone().unwrap_or_default(),
        state,
        labels: pod.metadata.labels.clone().unwrap_or_default(),
        created_at: annotation(pod, CREATED_AT)
            .and_then(parse_time)
            .or_else(|| {
                pod.metadata
                    .creation_timestamp
                    .as_ref()
                    .and_then(chrono_time)
            }),
        started_at: StartedAt::from_evidence(state, started_at(pod), record_complete(pod)),
        exit_code: (state == SandboxState::Stopped)
            .then(|| exit_code(pod))
            .flatten(),
        template_ref: None,
        image: container.and_then(|c| c.image.clone()),
        volumes: spec
            .and_then(|s| s.volumes.as_ref())
            .map(|v| {
                v.iter()
                    .filter_map(|v| v.persistent_volume_claim.as_ref())
                    .map(|c| c.claim_name.clone())
                    .collect()
            })
            .unwrap_or_default(),
        ports: Vec::new(),
        resources: super::resources::applied(
            container,
            annotation(pod, DISK_BYTES).and_then(|d| d.parse().ok()),
        ),
        command: container.and_then(|c| c.command.clone()),
        restart_policy: match spec.and_then(|s| s.restart_policy.as_deref()) {
            Some("OnFailure") => RestartPolicy::OnFailure,
            Some("Always") => RestartPolicy::Always,
            _ => RestartPolicy::Never,
        },
        env: container
            .and_then(|c| c.env.as_ref())
            .map(|env| {
                env.iter()
                    .filter_map(|e| Some((e.name.clone(), e.value.clone()?)))
                    .collect()
            })
            .unwrap_or_default(),
        image_digest: container_status(pod)
            .map(|c| c.image_id.clone())
            .filter(|id| !id.is_empty()),
        image_pull: None,
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::provider::labels::{OWNER_UID, Owner};
    use crate::provider::{PortRequest, Resources};
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateRunning, ContainerStateTerminated, PodStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    /// A request for the provider's unit tests.
    pub(in crate::provider::kubernetes) fn request() -> CreateRequest {
        CreateRequest {
            name: "sbx-1".into(),
            owner: Owner {
                instance: "ops".into(),
                kind: "Sandbox".into(),
                namespace: "team".into(),
                name: "web".into(),
                uid: "1".into(),
            },
            image: Some("base:1".into()),
            template: None,
            command: Some(vec!["sleep".into(), "infinity".into()]),
            restart_policy: RestartPolicy::OnFailure,
            env: BTreeMap::from([("A".into(), "b".into())]),
            labels: BTreeMap::new(),
            resources: Resources {
                cpu_millis: Some(500),
                memory_bytes: Some(64 << 20),
                disk_bytes: Some(1 << 30),
                pids: None,
            },
            ports: vec![PortRequest {
                sandbox_port: 8080,
                protocol: "tcp".into(),
            }],
            volumes: Vec::new(),
            allowed_domains: None,
            idle_action: None,
            image_pull_policy: ImagePullPolicy::Never,
            registry_credentials: Vec::new(),
            secret_env_keys: Default::default(),
        }
    }

    fn settings() -> KubernetesSettings {
        KubernetesSettings {
            runtime_class_name: Some("gvisor".into()),
            run_as_user: Some(1000),
            ..Default::default()
        }
    }

    #[test]
    fn every_pod_has_a_memory_backed_delivery_dir_before_its_volumes() {
        let mut req = request();
        req.volumes = vec![crate::provider::VolumeMount {
            volume_name: "data".into(),
            mount_path: "/data".into(),
            read_only: false,
        }];
        let pod = build(&req, &settings(), None, Utc::now()).unwrap();
        let spec = pod.spec.as_ref().unwrap();
        let volumes = spec.volumes.as_ref().unwrap();
        let names: Vec<_> = volumes.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(names, [DELIVERY_VOLUME, "data"]);
        let empty = volumes[0].empty_dir.as_ref().unwrap();
        assert_eq!(empty.medium.as_deref(), Some("Memory"));
        assert!(empty.size_limit.is_some());
        let mounts = spec.containers[0].volume_mounts.as_ref().unwrap();
        let paths: Vec<_> = mounts.iter().map(|m| m.mount_path.as_str()).collect();
        assert_eq!(paths, [DELIVERY_DIR, "/data"]);
        // Only claims are the sandbox's volumes, as the descriptor reports them.
        assert_eq!(descriptor(&pod).volumes.len(), 1);
        for (name, path) in [
            (DELIVERY_VOLUME, "/x"),
            ("y", DELIVERY_DIR),
            ("z", "/run/sandboxes.dev/a"),
        ] {
            req.volumes[0].volume_name = name.into();
            req.volumes[0].mount_path = path.into();
            let err = build(&req, &settings(), None, Utc::now()).unwrap_err();
            assert!(err.message().contains("spec.volumes"), "{err}");
        }
    }

    #[test]
    fn a_request_becomes_a_gated_hardened_pod() {
        let pod = build(&request(), &settings(), Some("sbx-1-pull"), Utc::now()).unwrap();
        let spec = pod.spec.as_ref().unwrap();
        assert!(gated(&pod));
        assert_eq!(spec.runtime_class_name.as_deref(), Some("gvisor"));
        assert_eq!(spec.automount_service_account_token, Some(false));
        assert_eq!(
            spec.image_pull_secrets.as_ref().unwrap()[0].name,
            "sbx-1-pull"
        );
        let psc = spec.security_context.as_ref().unwrap();
        assert_eq!(
            psc.seccomp_profile.as_ref().unwrap().type_,
            "RuntimeDefault"
        );
        assert_eq!(psc.run_as_user, Some(1000));
        let c = &spec.containers[0];
        let sc = c.security_context.as_ref().unwrap();
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(
            sc.capabilities.as_ref().unwrap().drop,
            Some(vec!["ALL".into()])
        );
        assert_eq!(c.image_pull_policy.as_deref(), Some("Never"));
        let limits = c.resources.as_ref().unwrap().limits.as_ref().unwrap();
        assert_eq!(limits["cpu"].0, "500m");
        assert_eq!(
            c.ports.as_ref().unwrap()[0].protocol.as_deref(),
            Some("TCP")
        );
        let labels = pod.metadata.labels.as_ref().unwrap();
        assert_eq!(labels.get(OWNER_UID).map(String::as_str), Some("1"));

        let d = descriptor(&pod);
        assert_eq!(d.state, SandboxState::Creating);
        assert_eq!(d.started_at, StartedAt::Never, "a gated Pod never started");
        assert_eq!(d.resources.cpu_millis, Some(500));
        assert_eq!(d.resources.memory_bytes, Some(64 << 20));
        assert_eq!(d.resources.disk_bytes, Some(1 << 30));
        assert!(!d.resources.disk_enforced);
        assert_eq!(d.restart_policy, RestartPolicy::OnFailure);
        assert_eq!(d.env.get("A").map(String::as_str), Some("b"));
    }

    #[test]
    fn secret_derived_env_is_a_reference_and_never_a_value_in_the_pod() {
        let mut r = request();
        r.env.insert("TOKEN".into(), "s3cret".into());
        r.secret_env_keys = ["TOKEN".to_string()].into();
        let pod = build(&r, &settings(), None, Utc::now()).unwrap();
        assert!(!serde_json::to_string(&pod).unwrap().contains("s3cret"));
        let env = pod.spec.unwrap().containers[0].env.clone().unwrap();
        let token = env.iter().find(|e| e.name == "TOKEN").unwrap();
        let by_ref = token.value_from.as_ref().unwrap().secret_key_ref.as_ref();
        assert_eq!(
            by_ref.map(|r| (r.name.as_str(), r.key.as_str())),
            Some(("sbx-1-env", "TOKEN"))
        );
        let plain = env.iter().find(|e| e.name == "A").unwrap();
        assert_eq!(plain.value.as_deref(), Some("b"));
    }

    #[test]
    fn unenforceable_fields_are_refused_naming_them() {
        let mut r = request();
        r.resources.pids = Some(10);
        let e = build(&r, &settings(), None, Utc::now()).unwrap_err();
        assert!(e.message().contains("spec.resources.pids"), "{e}");
        let mut r = request();
        r.allowed_domains = Some(vec![]);
        let e = build(&r, &settings(), None, Utc::now()).unwrap_err();
        assert!(e.message().contains("spec.egress"), "{e}");
    }

    #[test]
    fn an_unbound_pod_proves_it_never_ran_and_a_bound_one_without_a_report_cannot() {
        let mut pod = build(&request(), &settings(), None, Utc::now()).unwrap();
        pod.spec.as_mut().unwrap().scheduling_gates = None;
        assert_eq!(
            descriptor(&pod).started_at,
            StartedAt::Never,
            "no node took it"
        );
        pod.spec.as_mut().unwrap().node_name = Some("node-1".into());
        assert_eq!(
            descriptor(&pod).started_at,
            StartedAt::Unknown,
            "bound, and the kubelet has not reported its container"
        );
    }

    fn with_status(mut pod: Pod, phase: &str, state: ContainerState) -> Pod {
        pod.spec.as_mut().unwrap().scheduling_gates = None;
        pod.status = Some(PodStatus {
            phase: Some(phase.into()),
            container_statuses: Some(vec![ContainerStatus {
                name: CONTAINER.into(),
                state: Some(state),
                image_id: "docker.io/library/base@sha256:abc".into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        pod
    }

    #[test]
    fn states_and_start_times_follow_the_pod() {
        let gated_pod = build(&request(), &settings(), None, Utc::now()).unwrap();
        let pending = with_status(gated_pod.clone(), "Pending", ContainerState::default());
        assert_eq!(state(&pending), SandboxState::Creating);
        assert_eq!(started_at(&pending), None, "scheduled, never started");
        let t = DateTime::<Utc>::from_timestamp(Utc::now().timestamp(), 0).unwrap();
        let running = with_status(
            gated_pod.clone(),
            "Running",
            ContainerState {
                running: Some(ContainerStateRunning {
                    started_at: Some(Time(
                        k8s_openapi::jiff::Timestamp::from_second(t.timestamp()).unwrap(),
                    )),
                }),
                ..Default::default()
            },
        );
        assert_eq!(state(&running), SandboxState::Running);
        assert_eq!(started_at(&running), Some(t));
        assert!(descriptor(&running).image_digest.is_some());
        let exited = with_status(
            gated_pod,
            "Failed",
            ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: 3,
                    started_at: Some(Time(
                        k8s_openapi::jiff::Timestamp::from_second(t.timestamp()).unwrap(),
                    )),
                    ..Default::default()
                }),
                ..Default::default()
            },
        );
        let d = descriptor(&exited);
        assert_eq!((d.state, d.exit_code), (SandboxState::Stopped, Some(3)));
        let stopped = successor(&running, true, true);
        assert!(gated(&stopped));
        assert_eq!(state(&stopped), SandboxState::Stopped);
        assert_eq!(
            started_at(&stopped).map(|s| s.timestamp()),
            Some(t.timestamp()),
            "a stopped sandbox keeps its first start"
        );
        let restarted = successor(&stopped, false, false);
        assert!(!gated(&restarted));
        assert_ne!(state(&restarted), SandboxState::Stopped);
    }
}
