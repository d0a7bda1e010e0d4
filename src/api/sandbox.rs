//! `Sandbox`: one isolated code-execution sandbox on a provider.

use std::collections::BTreeMap;

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{
    Condition, LocalObjectRef, PROVIDER_IMMUTABLE_RULE, SecretRef, no_default, no_description,
};
use super::quantity::Quantity;

/// Desired state of a Sandbox: an isolated code-execution sandbox on a provider (a Docker
/// engine, Fly Machines, E2B).
///
/// The operator creates it on the provider, keeps it converged on this spec, and removes it
/// when the Sandbox is deleted.
// Several `printcolumn(...)` entries repeat `type_`, which clippy misreads as a duplicate.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "sandboxes.dev",
    version = "v1alpha1",
    kind = "Sandbox",
    plural = "sandboxes",
    singular = "sandbox",
    shortname = "sbx",
    category = "sandboxes",
    namespaced,
    status = "SandboxStatus",
    derive = "PartialEq",
    doc = "A Sandbox is an isolated code-execution sandbox (a container or micro-VM) that the operator runs on a provider and keeps converged on its spec.",
    printcolumn(
        name = "Provider",
        type_ = "string",
        json_path = ".status.provider",
        description = "Provider the sandbox runs on"
    ),
    printcolumn(
        name = "State",
        type_ = "string",
        json_path = ".spec.state",
        description = "Desired power state (Running when empty)"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status",
        description = "Whether the sandbox is in its desired state"
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].reason",
        description = "Reason of the Ready condition"
    ),
    printcolumn(
        name = "URL",
        type_ = "string",
        json_path = ".status.url",
        description = "Where the first published port is reached"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(validation = Rule::new("has(self.warmPoolRef) == has(oldSelf.warmPoolRef) && (!has(self.warmPoolRef) || self.warmPoolRef.name == oldSelf.warmPoolRef.name)").message("spec.warmPoolRef is immutable: delete and recreate the Sandbox to claim from another pool").field_path(".warmPoolRef"))]
#[x_kube(validation = Rule::new(PROVIDER_IMMUTABLE_RULE).message("spec.provider is immutable: delete and recreate the Sandbox to move it to another provider").field_path(".provider"))]
#[x_kube(validation = Rule::new("!has(self.idleTimeoutSeconds) || (has(self.idleAction) && self.idleAction != 'off')").message("spec.idleTimeoutSeconds needs spec.idleAction: suspend or stop (what to do once idle)").field_path(".idleAction"))]
// No admission rule asks for `image` or `templateRef`: whether a Sandbox needs one depends on
// the TYPE of the provider it names (Fly Sprites boots its own base system and refuses an
// image; Docker, Fly and E2B may have a configured default), which admission cannot know from
// the provider's name. Each provider's `create` refuses a missing image it needs, naming
// spec.image, and the Sandbox stalls with that message.
#[x_kube(validation = Rule::new("!has(self.warmPoolRef) || !has(self.image)").message("spec.image cannot be set with spec.warmPoolRef: a claimed member is already running its pool's spec.template.image; change the pool, or drop warmPoolRef for a cold Sandbox").field_path(".image").reason(Reason::FieldValueForbidden))]
#[x_kube(validation = Rule::new("!has(self.warmPoolRef) || !has(self.templateRef)").message("spec.templateRef cannot be set with spec.warmPoolRef: a claimed member is already running its pool's spec.template.templateRef; change the pool, or drop warmPoolRef for a cold Sandbox").field_path(".templateRef").reason(Reason::FieldValueForbidden))]
#[x_kube(validation = Rule::new("!has(self.warmPoolRef) || !has(self.imagePullPolicy)").message("spec.imagePullPolicy cannot be set with spec.warmPoolRef: a claimed member is already running its pool's spec.template.imagePullPolicy; change the pool, or drop warmPoolRef for a cold Sandbox").field_path(".imagePullPolicy").reason(Reason::FieldValueForbidden))]
#[x_kube(validation = Rule::new("!has(self.warmPoolRef) || !has(self.imagePullSecrets)").message("spec.imagePullSecrets cannot be set with spec.warmPoolRef: a claimed member is already running its pool's spec.template.imagePullSecrets; change the pool, or drop warmPoolRef for a cold Sandbox").field_path(".imagePullSecrets").reason(Reason::FieldValueForbidden))]
#[x_kube(validation = Rule::new("!has(self.warmPoolRef) || !has(self.command)").message("spec.command cannot be set with spec.warmPoolRef: a claimed member is already running its pool's spec.template.command; change the pool, or drop warmPoolRef for a cold Sandbox").field_path(".command").reason(Reason::FieldValueForbidden))]
#[x_kube(validation = Rule::new("!has(self.warmPoolRef) || !has(self.restartPolicy)").message("spec.restartPolicy cannot be set with spec.warmPoolRef: a claimed member is already running its pool's spec.template.restartPolicy; change the pool, or drop warmPoolRef for a cold Sandbox").field_path(".restartPolicy").reason(Reason::FieldValueForbidden))]
#[x_kube(validation = Rule::new("!has(self.warmPoolRef) || !has(self.volumes)").message("spec.volumes cannot be set with spec.warmPoolRef: a claimed member is already running its pool's spec.template.volumes; change the pool, or drop warmPoolRef for a cold Sandbox").field_path(".volumes").reason(Reason::FieldValueForbidden))]
#[x_kube(validation = Rule::new("!has(self.warmPoolRef) || !has(self.resources)").message("spec.resources cannot be set with spec.warmPoolRef: a claimed member is already running its pool's spec.template.resources; change the pool, or drop warmPoolRef for a cold Sandbox").field_path(".resources").reason(Reason::FieldValueForbidden))]
#[x_kube(validation = Rule::new("!has(self.warmPoolRef) || !has(self.ports)").message("spec.ports cannot be set with spec.warmPoolRef: a claimed member is already running its pool's spec.template.ports; change the pool, or drop warmPoolRef for a cold Sandbox").field_path(".ports").reason(Reason::FieldValueForbidden))]
#[x_kube(validation = Rule::new("!has(self.warmPoolRef) || !has(self.egress)").message("spec.egress cannot be set with spec.warmPoolRef: a claimed member is already running its pool's spec.template.egress; change the pool, or drop warmPoolRef for a cold Sandbox").field_path(".egress").reason(Reason::FieldValueForbidden))]
#[x_kube(validation = Rule::new("!has(self.warmPoolRef) || !has(self.idleAction)").message("spec.idleAction cannot be set with spec.warmPoolRef: a claimed member is already running its pool's spec.template.idleAction; change the pool, or drop warmPoolRef for a cold Sandbox").field_path(".idleAction").reason(Reason::FieldValueForbidden))]
#[x_kube(validation = Rule::new("!has(self.warmPoolRef) || !has(self.provider)").message("spec.provider cannot be set with spec.warmPoolRef: a claimed member is already running its pool's spec.template.provider; change the pool, or drop warmPoolRef for a cold Sandbox").field_path(".provider").reason(Reason::FieldValueForbidden))]
#[serde(rename_all = "camelCase")]
pub struct SandboxSpec {
    /// Name of a provider configured in the operator (for example `docker`). The operator's
    /// default provider is used when omitted. Immutable: to move a sandbox to another
    /// provider, delete the Sandbox and create it again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub provider: Option<String>,

    /// Image to boot from (for example `debian:bookworm`). Ignored when `templateRef` is set.
    /// When neither is set the provider's default image boots (Docker `defaultImage`, Fly
    /// `defaultImage`, E2B `template`, `base` when unset); a provider with none stalls the Sandbox naming
    /// `spec.image`. Fly Sprites boots its own base system and refuses `image`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub image: Option<String>,

    /// When `image` is fetched from its registry, as for a Pod. `IfNotPresent` (the default):
    /// only when the provider does not have it, so images built or loaded on the provider
    /// never need a registry. `Always`: the tag is resolved at the registry on every create of
    /// the sandbox; a running sandbox never changes, a recreate picks up a moved tag. `Never`:
    /// only what the provider already has. Under `IfNotPresent` and `Never` a recreate boots
    /// the digest in `status.imageDigest`, even after the tag has moved. Templates are never
    /// pulled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<ImagePullPolicy>,

    /// Secrets (in this namespace) of type `kubernetes.io/dockerconfigjson` with registry
    /// credentials for `image` — the same Secrets Pods use (`kubectl create secret
    /// docker-registry`). The credential whose registry matches the image's is used (Docker
    /// Hub's names count as one registry; the most specific match wins). The credentials are
    /// handed to the provider for the pull only: never stored in its configuration, never in
    /// logs, Events or status. A registry that refuses them stalls the Sandbox with a
    /// condition naming the Secret to fix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.all(s, self.exists_one(t, t.name == s.name))").message("spec.imagePullSecrets: a Secret is listed twice; list each Secret once"))]
    #[schemars(length(max = 16))]
    pub image_pull_secrets: Option<Vec<LocalObjectRef>>,

    /// SandboxTemplate (in this namespace) to boot from. Takes precedence over `image`. A
    /// template that does not exist, or is not ready, is an error reported in the Ready
    /// condition; the operator never silently falls back to `image`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_ref: Option<LocalObjectRef>,

    /// The main process as an argv list (no shell: wrap in `["sh", "-c", "..."]` for one).
    /// When omitted the image's own command runs. A provider that cannot run a chosen main
    /// process reports an error instead of ignoring it. At least one item when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub command: Option<Vec<String>>,

    /// What happens when the main process exits: `Never` (stay stopped for inspection),
    /// `OnFailure` (restart on a non-zero exit) or `Always`. `Never` when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_policy: Option<RestartPolicy>,

    /// Environment variables set in the sandbox. They are stored in the provider's
    /// configuration, so never put secrets here: use `envFrom` or `selfDeliveredEnv`.
    /// Names are unique.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    #[schemars(length(max = 256))]
    pub env: Option<Vec<EnvVar>>,

    /// Secrets (in this namespace) whose keys become environment variables. Like `env`, the
    /// values end up in the provider's configuration; use `selfDeliveredEnv` for values the
    /// provider must never store. Keys that are not valid variable names are skipped with an
    /// event. A later entry wins over an earlier one; `env` wins over both.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub env_from: Option<Vec<EnvFromSource>>,

    /// A Secret (in this namespace) whose keys and values the operator writes INTO the
    /// running sandbox as the file `/run/sandboxes.dev/env` (mode 0600), one `KEY='value'`
    /// line per key in POSIX single-quote shell quoting, so `set -a; . /run/sandboxes.dev/env`
    /// loads them. The values are never stored in the provider's configuration (they do not
    /// appear in `docker inspect` or a machine config); only a hash of the delivered content
    /// is recorded in status. Re-delivered when the Secret changes and after every restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub self_delivered_env: Option<SecretRef>,

    /// SandboxVolumes (in this namespace) to mount. Each needs its own `mountPath`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.all(v, self.exists_one(w, w.mountPath == v.mountPath))").message("spec.volumes: two volumes use the same mountPath; give each volume its own mountPath"))]
    #[schemars(length(max = 32))]
    pub volumes: Option<Vec<VolumeMountSpec>>,

    /// Resource ceilings. Each one is optional; an omitted one is the provider's default. A
    /// ceiling the provider cannot enforce is reported as an error, except `disk` (advisory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourcesSpec>,

    /// Ports inside the sandbox to make reachable. The operator publishes each and reports
    /// where it is reached in `status.ports` and `status.url`. Each port/protocol pair and
    /// each name may appear only once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.all(p, self.exists_one(q, q.port == p.port && (has(q.protocol) ? q.protocol : 'TCP') == (has(p.protocol) ? p.protocol : 'TCP')))").message("spec.ports: the same port and protocol are listed twice; list each port once"))]
    #[x_kube(validation = Rule::new("self.all(p, !has(p.name) || self.exists_one(q, has(q.name) && q.name == p.name))").message("spec.ports: two ports have the same name; port names must be unique"))]
    #[schemars(length(max = 64))]
    pub ports: Option<Vec<PortSpec>>,

    /// Outbound network policy. Omitted: unrestricted outbound access.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<EgressSpec>,

    /// Desired power state: `Running`, `Sleeping` (suspended, processes kept where the
    /// provider can; see `status.lastHibernation`) or `Stopped` (processes end, filesystem
    /// kept). `Running` when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<DesiredState>,

    /// What happens to an idle sandbox: `off` (keep it running), `stop` (stop it; cold start
    /// on the next request) or `suspend` (suspend it, processes kept where the provider can;
    /// resumed on the next request). With `idleTimeoutSeconds` the operator decides idleness
    /// on every provider that can stop or suspend, and wakes the sandbox on the next exec,
    /// attach, port-forward, files or E2B API request. Without it, only a provider with a
    /// request proxy in front of its sandboxes (Fly Machines) acts on its own idea of idle;
    /// the others reject `stop` and `suspend` in the Ready condition. Write `"off"` in quotes:
    /// unquoted, YAML 1.1 readers such as kubectl read it as the boolean false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_action: Option<IdleAction>,

    /// Seconds without exec, attach, port-forward, files or E2B API traffic through the
    /// operator after which `idleAction` applies (see `status.lastIdle`). Needs `idleAction`
    /// `stop` or `suspend`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub idle_timeout_seconds: Option<i64>,

    /// When the sandbox ends by itself, and how. Omitted: it lives until deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifetime: Option<Lifetime>,

    /// Extra labels put on the provider's resources (containers, machines), next to the
    /// operator's own `sandboxes.dev/*` labels. Keys starting with `sandboxes.dev/` are
    /// reserved and rejected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.all(k, !k.startsWith('sandboxes.dev/'))").message("spec.labels: keys starting with sandboxes.dev/ are reserved for the operator; rename the label").reason(Reason::FieldValueForbidden))]
    #[schemars(extend("maxProperties" = 64))]
    pub labels: Option<BTreeMap<String, String>>,

    /// A SandboxWarmPool (in this namespace) to take a running member from instead of
    /// creating a sandbox: the pool's `spec.template` is the shape, and this Sandbox sets
    /// only what a running member takes without a restart — `env`, `envFrom` and
    /// `selfDeliveredEnv` (written into it as the file `/run/sandboxes.dev/env`, as
    /// `selfDeliveredEnv` is), `labels`, `lifetime` and `state`. Fields that need a new
    /// sandbox (image, command, resources, ports, volumes, …) are refused at admission. With
    /// no Ready member the Sandbox is created from the pool's template (`status.claim:
    /// cold`). Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm_pool_ref: Option<LocalObjectRef>,
}

/// What happens when a sandbox's main process exits.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, Default, JsonSchema)]
#[schemars(transform = no_description)]
pub enum RestartPolicy {
    /// Stay stopped for inspection (the default).
    #[default]
    Never,
    /// Restart after a non-zero exit.
    OnFailure,
    /// Restart after any exit.
    Always,
}

/// When an image is fetched from its registry (Kubernetes' `imagePullPolicy`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, Default, JsonSchema)]
#[schemars(transform = no_description)]
pub enum ImagePullPolicy {
    /// Resolve the tag at the registry on every create.
    Always,
    /// Pull only when the provider does not have the image (the default).
    #[default]
    IfNotPresent,
    /// Never pull: the image must be on the provider.
    Never,
}

/// One environment variable.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct EnvVar {
    /// Variable name: letters, digits and `_`, not starting with a digit. Unique in `env`.
    #[schemars(
        length(min = 1, max = 256),
        regex(pattern = r"^[A-Za-z_][A-Za-z0-9_]*$")
    )]
    pub name: String,
    /// Value (empty when omitted). Stored in the provider's configuration: not for secrets.
    #[serde(default)]
    #[schemars(length(max = 32768), transform = no_default)]
    pub value: String,
}

/// Environment variables taken from a Secret.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EnvFromSource {
    /// The Secret (in this namespace) whose keys become variables. A missing Secret keeps
    /// the sandbox from starting and is reported in the Ready condition.
    pub secret_ref: SecretRef,
    /// Prepended to every key of the Secret to form the variable name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 128),
        regex(pattern = r"^[A-Za-z_][A-Za-z0-9_]*$")
    )]
    pub prefix: Option<String>,
}

/// A SandboxVolume mounted into the sandbox.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeMountSpec {
    /// The SandboxVolume to mount (in this namespace). A missing volume keeps the sandbox
    /// from starting and is reported in the Ready condition.
    pub volume_ref: LocalObjectRef,
    /// Absolute path inside the sandbox to mount it at, e.g. `/data`. No `..` segments, no
    /// whitespace, `:` or `,`; not `/` itself. Unique within `volumes`.
    #[schemars(length(min = 2, max = 1024), regex(pattern = r"^/[^:,\s]*$"))]
    #[x_kube(validation = Rule::new("self.startsWith('/')").message("spec.volumes[].mountPath must be an absolute path: start it with /, e.g. /data"))]
    #[x_kube(validation = Rule::new("!self.contains('/../') && !self.endsWith('/..') && self != '/'").message("spec.volumes[].mountPath must be a directory below / without '..' segments, e.g. /data"))]
    pub mount_path: String,
    /// Mount read-only. `false` when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only: Option<bool>,
}

/// Resource ceilings of a sandbox.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
pub struct ResourcesSpec {
    /// CPU ceiling in cores, e.g. `500m` (half a core), `1` or `2.5`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Quantity>,
    /// Memory ceiling, e.g. `256Mi`, `1Gi` or `512M`. The sandbox's processes are killed
    /// when they exceed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Quantity>,
    /// Disk size, e.g. `10Gi`. Advisory: whether the provider enforces it depends on the
    /// provider (see its documentation); `status.resources.diskEnforced` says whether it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<Quantity>,
    /// Maximum number of processes and threads in the sandbox (bounds fork bombs, which a
    /// memory ceiling does not). At least 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub pids: Option<i64>,
}

/// A port inside the sandbox to make reachable.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
pub struct PortSpec {
    /// Optional name (an IANA service name: up to 15 lowercase letters, digits and `-`, with
    /// at least one letter), e.g. `http`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 15),
        regex(pattern = r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
    )]
    #[x_kube(validation = Rule::new("self.matches('[a-z]') && !self.contains('--')").message("port name must contain a letter and no '--' (an IANA service name such as http)"))]
    pub name: Option<String>,
    /// The port the workload listens on inside the sandbox, 1-65535.
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    /// `TCP` or `UDP`. `TCP` when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<Protocol>,
}

/// Transport protocol of a port.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, Default, JsonSchema)]
#[schemars(transform = no_description)]
pub enum Protocol {
    /// TCP (the default).
    #[default]
    TCP,
    /// UDP.
    UDP,
}

/// Outbound network policy of a sandbox.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct EgressSpec {
    /// Domains the sandbox may connect to: lowercase host names such as `pypi.org`, or
    /// `*.` wildcards such as `*.githubusercontent.com` (subdomains only). Omitted:
    /// unrestricted. An empty list: no outbound network at all. A provider that cannot
    /// enforce an allow-list reports an error rather than leaving the network open;
    /// `status.egress` reports what was actually observed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = 256),
        inner(
            length(min = 1, max = 253),
            regex(
                pattern = r"^(\*\.)?([a-z0-9]([-a-z0-9]*[a-z0-9])?\.)*[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
            )
        )
    )]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub allowed_domains: Option<Vec<String>>,
}

/// Desired power state of a sandbox.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, Default, JsonSchema)]
#[schemars(transform = no_description)]
pub enum DesiredState {
    /// Running (the default).
    #[default]
    Running,
    /// Suspended: processes kept where the provider can (see `status.lastHibernation`).
    Sleeping,
    /// Stopped: processes end, the filesystem is kept.
    Stopped,
}

/// What a provider's request proxy does with an idle sandbox.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[schemars(transform = no_description)]
#[serde(rename_all = "lowercase")]
pub enum IdleAction {
    /// Keep it running.
    Off,
    /// Stop it; cold start on the next request.
    Stop,
    /// Snapshot it; resume from memory on the next request.
    Suspend,
}

/// When a sandbox ends by itself.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, KubeSchema)]
#[x_kube(validation = Rule::new("!(has(self.shutdownAt) && has(self.ttlSeconds))").message("spec.lifetime: set either shutdownAt or ttlSeconds, not both").reason(Reason::FieldValueForbidden))]
#[serde(rename_all = "camelCase")]
pub struct Lifetime {
    /// Absolute time (RFC 3339, e.g. `2030-01-01T00:00:00Z`) at which `action` happens.
    /// Mutually exclusive with `ttlSeconds`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("format" = "date-time"))]
    pub shutdown_at: Option<String>,
    /// Seconds after the Sandbox's `metadata.creationTimestamp` at which `action` happens.
    /// At least 1. Mutually exclusive with `shutdownAt`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub ttl_seconds: Option<i64>,
    /// What happens then: `Stop` (stop the sandbox, keep it and the object), `Delete`
    /// (delete the Sandbox object, which removes the sandbox) or `Sleep` (suspend it, as
    /// `state: Sleeping` does, until the lifetime is moved later). `Stop` when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<LifetimeAction>,
}

/// What happens when a sandbox's lifetime ends.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, Default, JsonSchema)]
#[schemars(transform = no_description)]
pub enum LifetimeAction {
    /// Stop the sandbox; the object and the filesystem stay (the default).
    #[default]
    Stop,
    /// Delete the Sandbox object, which removes the sandbox from the provider.
    Delete,
    /// Suspend the sandbox (processes kept where the provider can), as `state: Sleeping`
    /// does; a later `shutdownAt` wakes it. The E2B-compatible API's `autoPause`.
    Sleep,
}

/// Observed state of a Sandbox, written by the operator only.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxStatus {
    /// The `metadata.generation` this status was computed from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready` (the sandbox is in its desired state), `Reconciling` (the operator is working
    /// on it) and `Stalled` (it cannot progress until the spec changes), with CamelCase
    /// reasons and messages that say what to fix.
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    #[serde(default)]
    #[schemars(transform = no_default)]
    pub conditions: Vec<Condition>,
    /// One-word summary for humans (`Pending`, `Running`, `Sleeping`, `Stopped`, `Failed`,
    /// `Deleting`). Automation should read the conditions instead.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// The provider the sandbox runs on (the resolved default when `spec.provider` is empty).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// Name of the sandbox at the provider, derived from this object's UID and recorded
    /// before the provider is first called.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub external_name: Option<String>,
    /// The provider's id of the sandbox.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandbox_id: Option<String>,
    /// When the provider created the sandbox (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_at: Option<String>,
    /// When the sandbox was last started (RFC 3339); empty if it has never started.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    /// Where each published port is reached. Empty when the sandbox is not running.
    #[x_kube(merge_strategy = ListMerge::Map(vec!["sandboxPort".into(), "protocol".into()]))]
    #[serde(default)]
    #[schemars(transform = no_default)]
    pub ports: Vec<PortStatus>,
    /// URL of the first published TCP port (`http://host:port`), when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// What the last suspend or resume actually did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_hibernation: Option<HibernationStatus>,
    /// Observed outbound network restriction (an observation, not the requested policy).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub egress: Option<EgressStatus>,
    /// Resource ceilings as the provider applied them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resources: Option<AppliedResourcesStatus>,
    /// What the last in-place change of `spec.resources` did, and in particular whether the
    /// provider restarted the sandbox to apply it (Fly Machines reboots a running machine;
    /// Docker changes the limits of the running container).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_resource_change: Option<ResourceChangeStatus>,
    /// The image the sandbox was created from, as `spec.image` named it; empty when it booted
    /// from a template.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The exact image the sandbox booted: `<repository>@sha256:<digest>` when it came from a
    /// registry, else the provider's image id (`sha256:…`) of an image built or loaded on the
    /// provider. Under `imagePullPolicy` `IfNotPresent` or `Never` a recreate boots this same
    /// registry digest while `spec.image` is unchanged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_digest: Option<String>,
    /// The isolation profile the provider applied when it created the sandbox (runtime, capabilities, no-new-privileges, host firewall).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub isolation: Option<String>,
    /// The SandboxTemplate the sandbox actually booted from, when it booted from one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub template_ref: Option<String>,
    /// The provider id of the sandbox the template's files were restored into, on a provider
    /// that restores templates after start (no native image commit). A sandbox there is
    /// never reported Ready before its restore completed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub template_restored_into: Option<String>,
    /// The `resourceVersion` of the Secret named by `spec.selfDeliveredEnv` whose values were
    /// last delivered into the sandbox, to notice changes. Never the content itself.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub self_delivered_env_hash: Option<String>,
    /// The outbound allow-list the provider last applied to this sandbox, for providers that
    /// replace it in place (absent elsewhere): `unrestricted: true`, or `allowedDomains` (empty
    /// = no egress). Compared with `spec.egress` to converge without a recreate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_applied: Option<AppliedEgress>,
    /// How a Sandbox with `spec.warmPoolRef` was served: `warm` (it took a running member of
    /// the pool, whose id is `sandboxId`) or `cold` (the pool had none Ready: created from
    /// the pool's template).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["warm", "cold"]))]
    pub claim: Option<String>,
    /// When and why the operator last parked the sandbox for idleness (`spec.idleAction`
    /// after `spec.idleTimeoutSeconds`); the next access request wakes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_idle: Option<IdleStatus>,
}

/// What the operator did to an idle sandbox.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IdleStatus {
    /// When (RFC 3339).
    pub time: String,
    /// `suspend` or `stop`.
    pub action: IdleAction,
    /// Why: the last traffic it saw, and what idleness can see on this provider.
    pub reason: String,
}

/// An allow-list as the provider applied it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AppliedEgress {
    /// No restriction was applied.
    pub unrestricted: bool,
    /// The names outbound traffic is limited to (empty with `unrestricted: false` = none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_domains: Vec<String>,
}

impl AppliedEgress {
    /// The record of `allowed` (`None` = unrestricted).
    pub fn of(allowed: Option<&[String]>) -> Self {
        AppliedEgress {
            unrestricted: allowed.is_none(),
            allowed_domains: allowed.map(<[String]>::to_vec).unwrap_or_default(),
        }
    }
}

/// Where a sandbox port is reached.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PortStatus {
    /// The port's name from the spec, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The port inside the sandbox.
    pub sandbox_port: i32,
    /// `TCP` or `UDP`.
    pub protocol: String,
    /// Host name or address to connect to.
    pub host: String,
    /// Port on `host` that forwards to `sandboxPort`.
    pub host_port: i32,
}

/// What a suspend or resume actually did.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HibernationStatus {
    /// Whether the processes from before the suspend kept running after the resume. When
    /// `false` the workload restarted and anything started by hand must be started again.
    pub processes_preserved: bool,
    /// Mechanism the provider used (e.g. `pause`, `snapshot`, `stop`), for humans.
    pub mechanism: String,
    /// Detail, especially when the preferred mechanism was unavailable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// When it happened (RFC 3339).
    pub time: String,
    /// `true` for a suspend, `false` for a resume; absent in records of older versions.
    /// Times have whole seconds, as have a Pod's start times, so a suspend in the second
    /// its sandbox started cannot be told from a start after it by time alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspended: Option<bool>,
}

/// What an in-place change of resource ceilings did.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResourceChangeStatus {
    /// Whether the provider restarted the sandbox to apply the change. When `true` its
    /// processes ended and started again from the main command; anything started by hand
    /// must be started again.
    pub restarted: bool,
    /// When it happened (RFC 3339).
    pub time: String,
}

/// An observed egress verdict.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EgressStatus {
    /// `filtered` (observed restricted), `open` (observed unrestricted) or `inconclusive`
    /// (the check could not run; never to be read as filtered).
    #[schemars(extend("enum" = ["filtered", "open", "inconclusive"]))]
    pub state: String,
    /// What was checked, and how.
    pub detail: String,
    /// What to do when the verdict is not what the spec asks for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remediation: Option<String>,
}

/// Resource ceilings as the provider applied them.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AppliedResourcesStatus {
    /// Applied CPU ceiling (e.g. `500m`), when limited.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<String>,
    /// Applied memory ceiling (e.g. `256Mi`), when limited.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<String>,
    /// Requested disk size, when set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk: Option<String>,
    /// Whether the provider enforces `disk`. Only `true` when proven.
    #[serde(default)]
    #[schemars(transform = no_default)]
    pub disk_enforced: bool,
    /// Applied process ceiling, when limited.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pids: Option<i64>,
}
