//! Provider-neutral domain types: what a controller asks a provider for, and what a provider
//! reports back. Pure data, no Kubernetes and no transport types, so the decide step of a
//! reconcile can be tested without either.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::labels::Owner;

/// What happens when a sandbox's main process exits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RestartPolicy {
    /// Stay down for inspection (the default: right for a dev sandbox).
    #[default]
    Never,
    /// Restart on a non-zero exit.
    OnFailure,
    /// Restart on any exit.
    Always,
}

/// Resource ceilings. Every field is optional: absent means "the provider's default".
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resources {
    /// CPU in millicores.
    pub cpu_millis: Option<u64>,
    /// Memory ceiling in bytes.
    pub memory_bytes: Option<u64>,
    /// Disk ceiling in bytes. Advisory: a provider that cannot enforce it says so in its
    /// docs and reports `disk_enforced = false` in [`AppliedResources`].
    pub disk_bytes: Option<u64>,
    /// Maximum number of processes (bounds fork bombs, which a memory cap does not).
    pub pids: Option<i64>,
}

/// Resources as the provider actually applied them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AppliedResources {
    /// CPU in millicores, when limited.
    pub cpu_millis: Option<u64>,
    /// Memory ceiling in bytes, when limited.
    pub memory_bytes: Option<u64>,
    /// Requested disk in bytes (advisory unless `disk_enforced`).
    pub disk_bytes: Option<u64>,
    /// Whether the provider enforces `disk_bytes`. Never claimed without proof.
    pub disk_enforced: bool,
    /// Process ceiling, when limited.
    pub pids: Option<i64>,
}

/// What an in-place resource change did: the ceilings now in force, and whether the
/// provider restarted the sandbox to apply them (its processes ended and started again from
/// the main command). Providers report what happened, never what they would prefer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResourceChange {
    /// The ceilings read back after the change.
    pub applied: AppliedResources,
    /// `true` when the sandbox was restarted to apply the change.
    pub restarted: bool,
}

/// A port inside the sandbox that must be reachable from the control plane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortRequest {
    /// The port the workload listens on inside the sandbox.
    pub sandbox_port: u16,
    /// `tcp` or `udp`.
    pub protocol: String,
}

/// How a sandbox port is reached from outside. Read back after start: providers assign the
/// outside half dynamically.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct PortMapping {
    /// Port inside the sandbox.
    pub sandbox_port: u16,
    /// `tcp` or `udp`.
    pub protocol: String,
    /// Host or address to connect to.
    pub host: String,
    /// Port on `host` forwarding to `sandbox_port`.
    pub port: u16,
}

/// A provider volume mounted into a sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeMount {
    /// The provider volume's name.
    pub volume_name: String,
    /// Absolute mount path inside the sandbox.
    pub mount_path: String,
    /// Mount read-only.
    pub read_only: bool,
}

/// Everything needed to create one sandbox.
///
/// There is deliberately no field for self-delivered env: values the workload reads for
/// itself must never reach a provider's stored configuration, so they cannot be expressed
/// here at all. The controller delivers them through the file capability after start.
#[derive(Debug, Clone, PartialEq)]
pub struct CreateRequest {
    /// Deterministic external name (derived from the owner's UID). Creating a name that
    /// already exists is a `Conflict`, never a second resource.
    pub name: String,
    /// Who owns it; becomes the owner labels.
    pub owner: Owner,
    /// Base image. Ignored when `template` is set.
    pub image: Option<String>,
    /// Template id to boot from. Takes precedence over `image`; a missing template is an
    /// error, never a fallback to the image.
    pub template: Option<String>,
    /// The main process as argv. A provider that cannot run a caller-supplied main
    /// process must fail rather than keep the image's own command.
    pub command: Option<Vec<String>>,
    /// What happens when the main process exits.
    pub restart_policy: RestartPolicy,
    /// The environment: `spec.env` and the values of `spec.envFrom` Secrets, whose names
    /// `secret_env_keys` lists.
    pub env: BTreeMap<String, String>,
    /// Extra caller labels (additive to the owner labels).
    pub labels: BTreeMap<String, String>,
    /// Resource ceilings.
    pub resources: Resources,
    /// Ports to publish.
    pub ports: Vec<PortRequest>,
    /// Volumes to mount.
    pub volumes: Vec<VolumeMount>,
    /// Outbound allow-list: `None` unrestricted, `Some([])` no network at all.
    pub allowed_domains: Option<Vec<String>>,
    /// Idle policy for providers with a proxy in front of their sandboxes.
    pub idle_action: Option<IdleAction>,
    /// When `image` is fetched from its registry (Kubernetes' semantics). Never applies to a
    /// template: templates are never pulled.
    pub image_pull_policy: ImagePullPolicy,
    /// Registry credentials for pulling `image`, from the owner's pull Secrets. Passed per
    /// call and never kept: a provider uses the one whose registry matches the image
    /// reference (see [`super::image::credential_for`]) for this pull only, and never writes
    /// any of them into the sandbox's configuration, a log or an error message. A provider
    /// that cannot pull with per-call credentials refuses a request that carries some
    /// (rule 10) rather than pulling without them.
    pub registry_credentials: Vec<RegistryCredential>,
    /// The names in `env` whose values came from Secrets (`spec.envFrom`). A provider that
    /// can keep them out of the sandbox's stored configuration does (the Kubernetes provider
    /// moves them into a per-sandbox Secret); one that must store them says in the README
    /// who can read them there.
    pub secret_env_keys: BTreeSet<String>,
}

/// When an image is fetched from its registry: Kubernetes' `imagePullPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ImagePullPolicy {
    /// Resolve the reference at the registry on every create (a moved tag is picked up by
    /// the next create, never by a running sandbox).
    Always,
    /// Use the image when the provider already has it; pull it otherwise (the default).
    #[default]
    IfNotPresent,
    /// Never contact a registry: the image must already be on the provider.
    Never,
}

/// Credentials for one registry, as a `kubernetes.io/dockerconfigjson` Secret holds them.
///
/// `Debug` prints the registry, the user name and the Secret but never the password or
/// token, so a stray `{:?}` of a request cannot leak them.
#[derive(Clone, PartialEq, Eq)]
pub struct RegistryCredential {
    /// The registry key as the Secret writes it (`registry.example.com`,
    /// `https://index.docker.io/v1/`, `*.example.com`, `example.com:5000/team`).
    pub registry: String,
    /// User name (empty with an identity token).
    pub username: String,
    /// Password or access token. Secret.
    pub password: String,
    /// OAuth identity (refresh) token, when the registry uses one instead of a password.
    /// Secret.
    pub identity_token: Option<String>,
    /// The Secret it came from (in the owner's namespace), so a refusal names what to fix.
    pub source: String,
}

impl std::fmt::Debug for RegistryCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryCredential")
            .field("registry", &self.registry)
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .field(
                "identity_token",
                &self.identity_token.as_ref().map(|_| "<redacted>"),
            )
            .field("source", &self.source)
            .finish()
    }
}

/// What a create had to fetch from a registry before it could create the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImagePull {
    /// The reference that was pulled.
    pub reference: String,
    /// The image's size on the provider after the pull, when reported.
    pub size_bytes: Option<u64>,
    /// How long the pull took (shared by every sandbox that waited for it).
    pub duration: Duration,
}

/// What a provider's proxy does with an idle sandbox (Fly's words).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdleAction {
    /// Never park it.
    Off,
    /// Stop it; cold boot on the next request.
    Stop,
    /// Snapshot it; resume from memory on the next request.
    Suspend,
}

/// Coarse lifecycle state of a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SandboxState {
    /// Created but not (yet) started, or restarting.
    Creating,
    /// Running.
    Running,
    /// Suspended with its processes kept (paused / snapshotted).
    Sleeping,
    /// Not running (exited, stopped, dead).
    Stopped,
}

/// Whether a sandbox has ever run, as the provider can prove it (contract rule 6).
///
/// Three values, not an `Option`, because "no start time" means two very different things:
/// the provider *knows* the sandbox never ran (wreckage of an interrupted create, which the
/// sweeper reclaims), or the provider's answer simply did not say (a listing that omits
/// history, history the service has already dropped). Confusing the two once destroyed a
/// live sandbox whose listing carried no start events, so the second is a value of its own
/// that reads as "has run" wherever a decision depends on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartedAt {
    /// The provider knows it never ran: nothing in a complete record says it started, and its
    /// state is one a sandbox that never ran is in. Only a provider that can prove this may
    /// report it.
    Never,
    /// It has run; first started at (or, where the provider only knows a later start, no
    /// earlier than) this time.
    At(DateTime<Utc>),
    /// It may have run and the provider cannot tell when, or whether: treated as "has run".
    Unknown,
}

impl StartedAt {
    /// The start time, when known: for call sites that only display it.
    pub fn time(&self) -> Option<DateTime<Utc>> {
        match self {
            StartedAt::At(t) => Some(*t),
            StartedAt::Never | StartedAt::Unknown => None,
        }
    }

    /// Whether it may have run: everything but a proven [`StartedAt::Never`]. Unknown counts
    /// as run ("unknown = in use").
    pub fn has_run(&self) -> bool {
        !matches!(self, StartedAt::Never)
    }

    /// The one rule every provider reads its evidence with. `first_start` is the earliest
    /// start the provider's answer records; `record_complete` says whether that answer holds
    /// the sandbox's whole history, so that the absence of a start proves there was none. A
    /// sandbox that is running or sleeping has run, whatever its history says.
    pub fn from_evidence(
        state: SandboxState,
        first_start: Option<DateTime<Utc>>,
        record_complete: bool,
    ) -> StartedAt {
        match first_start {
            Some(t) => StartedAt::At(t),
            None if matches!(state, SandboxState::Running | SandboxState::Sleeping) => {
                StartedAt::Unknown
            }
            None if record_complete => StartedAt::Never,
            None => StartedAt::Unknown,
        }
    }
}

/// Everything the control plane needs to know about a sandbox without a handle to it.
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxDescriptor {
    /// The provider's id for it (for Docker: the deterministic container name).
    pub id: String,
    /// Coarse state.
    pub state: SandboxState,
    /// Every label the provider holds, caller-supplied ones included.
    pub labels: BTreeMap<String, String>,
    /// Creation time, when the provider reports it.
    pub created_at: Option<DateTime<Utc>>,
    /// Whether and when it first started (contract rule 6): see [`StartedAt`].
    pub started_at: StartedAt,
    /// Exit code of the main process when it has exited.
    pub exit_code: Option<i64>,
    /// The template id it booted from, or `None`.
    pub template_ref: Option<String>,
    /// The image it runs (a template's provider-native ref when booted from one).
    pub image: Option<String>,
    /// Named volumes attached to it.
    pub volumes: Vec<String>,
    /// Reachable port mappings; empty when not running.
    pub ports: Vec<PortMapping>,
    /// Resources as applied.
    pub resources: AppliedResources,
    /// Main process argv as configured, when the provider reports it.
    pub command: Option<Vec<String>>,
    /// Restart policy as configured.
    pub restart_policy: RestartPolicy,
    /// Non-secret env as configured (`KEY` → value).
    pub env: BTreeMap<String, String>,
    /// The exact image it booted: `<repository>@sha256:…` (the registry's manifest digest)
    /// when the image came from a registry, else the provider's own image id. `None` when
    /// booted from a template or when the provider cannot tell.
    pub image_digest: Option<String>,
    /// Only on the descriptor `create` returns, and only when that create used an image
    /// pull: what was fetched and how long it took.
    pub image_pull: Option<ImagePull>,
    /// The isolation profile applied when the sandbox was created (runtime, capabilities,
    /// `no-new-privileges`, host firewall), as the provider recorded it; `None` when the
    /// provider records none.
    pub isolation: Option<String>,
}

#[cfg(test)]
impl SandboxDescriptor {
    /// Tests' starting point: an id and a state, no labels, never started, nothing else
    /// reported (struct update sets what a test is about).
    pub fn bare(id: &str, state: SandboxState) -> Self {
        SandboxDescriptor {
            id: id.into(),
            state,
            labels: BTreeMap::new(),
            created_at: None,
            started_at: StartedAt::Never,
            exit_code: None,
            template_ref: None,
            image: None,
            volumes: vec![],
            ports: vec![],
            resources: AppliedResources::default(),
            command: None,
            restart_policy: RestartPolicy::Never,
            env: BTreeMap::new(),
            image_digest: None,
            image_pull: None,
            isolation: None,
        }
    }
}

/// Narrowing for `find`. Every field is something the caller set itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SandboxQuery {
    /// Labels that must all be present with these values.
    pub labels: BTreeMap<String, String>,
    /// Only these states; `None` means every state.
    pub states: Option<Vec<SandboxState>>,
    /// Only sandboxes of this owner (`<namespace>.<name>`), the "project".
    pub owner: Option<String>,
}

/// What a hibernate or resume actually did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HibernationOutcome {
    /// Whether the process tree from before the call runs after it. `false` means the
    /// caller must relaunch anything it had started.
    pub processes_preserved: bool,
    /// The mechanism used (free-form, for humans; branch on `processes_preserved`).
    pub mechanism: String,
    /// Detail, especially when the preferred mechanism was unavailable.
    pub detail: Option<String>,
}

/// A command to run inside a sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecRequest {
    /// argv; nothing re-parses it.
    pub argv: Vec<String>,
    /// Working directory.
    pub cwd: Option<String>,
    /// Extra environment for this command only.
    pub env: BTreeMap<String, String>,
    /// Wall-clock bound. Every exec has one.
    pub timeout: Duration,
}

impl ExecRequest {
    /// `sh -c script` with a timeout.
    pub fn shell(script: impl Into<String>, timeout: Duration) -> Self {
        ExecRequest {
            argv: vec!["sh".into(), "-c".into(), script.into()],
            cwd: None,
            env: BTreeMap::new(),
            timeout,
        }
    }
}

/// Result of an exec. A non-zero exit code is data, not an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutput {
    /// Raw stdout bytes (not a binary channel: use the file capability for bytes).
    pub stdout: Vec<u8>,
    /// Raw stderr bytes.
    pub stderr: Vec<u8>,
    /// Exit code of the command.
    pub exit_code: i64,
}

/// A provider volume and what the provider observes about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeInfo {
    /// Volume name.
    pub name: String,
    /// Whether any sandbox (running or stopped) has it attached.
    ///
    /// Contract rule 4: a provider that cannot determine attachment reports `true`.
    pub attached: bool,
    /// The sandboxes it is attached to, when known.
    pub attached_to: Vec<String>,
    /// Labels on the volume.
    pub labels: BTreeMap<String, String>,
    /// Creation time, when reported.
    pub created_at: Option<DateTime<Utc>>,
    /// Size on disk, when reported.
    pub size_bytes: Option<u64>,
}

/// Narrowing for `list_volumes`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VolumeQuery {
    /// Only volumes whose name starts with this.
    pub name_prefix: Option<String>,
    /// Labels that must all match.
    pub labels: BTreeMap<String, String>,
    /// `Some(false)` unattached only, `Some(true)` attached only.
    pub attached: Option<bool>,
}

/// Everything a provider holds under some labels, as the sweeper reads it (see
/// [`super::Provider::inventory`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Inventory {
    /// Sandboxes carrying every label.
    pub sandboxes: Vec<SandboxDescriptor>,
    /// Volumes carrying every label; `None` when the provider has no [`super::Volumes`].
    pub volumes: Option<Vec<VolumeInfo>>,
    /// Templates carrying every label; `None` when the provider has no [`super::Templates`].
    pub templates: Option<Vec<Template>>,
}

/// A filesystem captured from a sandbox, which later sandboxes can boot from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    /// The caller's identifier, exactly as committed.
    pub id: String,
    /// Provider-native reference (image id, `s3://…`). Opaque: show it, never parse it.
    pub reference: String,
    /// When it was captured.
    pub created_at: Option<DateTime<Utc>>,
    /// Size on the provider's storage, when reported.
    pub size_bytes: Option<u64>,
    /// Free-form label recorded at capture time.
    pub label: Option<String>,
    /// Labels on the template (owner labels included).
    pub labels: BTreeMap<String, String>,
    /// The absolute paths it was captured with: what publishing it archives.
    pub capture_paths: Vec<String>,
    /// The image the captured sandbox ran, when known: what a provider without image commit
    /// boots before restoring the captured paths into it.
    pub base_image: Option<String>,
    /// Whether at least one sandbox is backed by it.
    ///
    /// Contract rule 4: a provider that cannot determine it reports `true`.
    pub in_use: bool,
}

/// What to capture into a template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitRequest {
    /// The sandbox whose filesystem is captured.
    pub sandbox_id: String,
    /// The caller's id for the template; re-committing the same id replaces it.
    pub template_id: String,
    /// Absolute paths that must end up in the template (validated: absolute, no `..`,
    /// no shell metacharacters).
    pub capture_paths: Vec<String>,
    /// Free-form label.
    pub label: Option<String>,
    /// The owning SandboxTemplate, for the owner labels.
    pub owner: Owner,
    /// The only env a capture may store besides its image's own: the captured Sandbox's
    /// plain `spec.env`. Values from Secrets (`envFrom`, `selfDeliveredEnv`) are never in it,
    /// so no capture stores them; a sandbox booted from the template gets its own env as
    /// usual.
    pub env: BTreeMap<String, String>,
    /// Absolute paths of files whose content came from Secrets (the self-delivered env
    /// file): left out of whatever a capture stores (image, archive).
    pub secret_files: Vec<String>,
}

/// One directory entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// Entry name (one segment, never a path).
    pub name: String,
    /// What it is.
    pub kind: EntryKind,
    /// Size in bytes, for files.
    pub size: Option<u64>,
    /// Target, for symlinks.
    pub symlink_target: Option<String>,
}

/// Kind of a directory entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// Regular file.
    File,
    /// Directory.
    Directory,
    /// Symbolic link.
    Symlink,
    /// Anything else (device, fifo, socket).
    Other,
}

/// What the provider can still fit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Capacity {
    /// The provider's own verdict, when it has one; `None` = no opinion.
    pub admits: Option<bool>,
    /// What was measured and what could not be, and why.
    pub detail: String,
    /// Free bytes on the storage backing new sandboxes.
    ///
    /// Contract rule 8: absent when unmeasured, never zero.
    pub disk_bytes: Option<u64>,
    /// Free inodes on that storage (absent when unmeasured).
    pub inodes: Option<u64>,
    /// Memory available without swapping (absent when unmeasured).
    pub memory_bytes: Option<u64>,
}

/// Whether egress restriction is observed to hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EgressState {
    /// Observed restricted.
    Filtered,
    /// Observed unrestricted.
    Open,
    /// The check could not run. Never to be read as `Filtered`.
    Inconclusive,
}

/// An egress observation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressVerdict {
    /// What was observed.
    pub state: EgressState,
    /// Which mechanism was checked, for operators.
    pub detail: String,
    /// What to do when the verdict is not `Filtered`.
    pub remediation: Option<String>,
}

/// A change at the provider that may concern an object: the owner labels of the resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderEvent {
    /// The owning object, read from the resource's labels.
    pub owner: Owner,
    /// What happened (provider's own word: `die`, `destroy`, `pause`, …).
    pub action: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_only_from_a_complete_record_of_a_sandbox_that_is_not_running() {
        use SandboxState as S;
        let t = Utc::now();
        for state in [S::Creating, S::Running, S::Sleeping, S::Stopped] {
            for complete in [true, false] {
                assert_eq!(
                    StartedAt::from_evidence(state, Some(t), complete),
                    StartedAt::At(t)
                );
            }
            let absent = StartedAt::from_evidence(state, None, false);
            assert_eq!(absent, StartedAt::Unknown, "{state:?}: incomplete record");
            assert!(absent.has_run() && absent.time().is_none());
        }
        for state in [S::Running, S::Sleeping] {
            assert_eq!(
                StartedAt::from_evidence(state, None, true),
                StartedAt::Unknown,
                "{state:?} has run whatever its history says"
            );
        }
        for state in [S::Creating, S::Stopped] {
            assert_eq!(
                StartedAt::from_evidence(state, None, true),
                StartedAt::Never
            );
        }
        assert!(!StartedAt::Never.has_run());
        assert_eq!(StartedAt::At(t).time(), Some(t));
    }
}
