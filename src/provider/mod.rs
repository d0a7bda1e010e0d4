//! The provider seam: what the controllers need from a place that runs sandboxes.
//!
//! A core trait every provider implements, plus optional capabilities reached through
//! accessors that return `Option<&dyn Capability>`. The two answers mean different things and
//! must never be collapsed: `None` means "this provider cannot", `Some(cap)` whose call
//! returns `Err` means "it can, and this attempt failed". A provider never stubs a capability
//! it lacks with a no-op or an empty answer — a caller that deletes what an enumeration
//! returns would believe an empty stub.
//!
//! The eleven contract rules of `docs/architecture.md` are written on the methods they
//! govern below.

pub mod docker;
pub mod e2b;
pub mod end_mark;
pub mod error;
pub mod factory;
pub mod fly;
pub mod image;
pub mod image_verify;
pub mod interactive;
pub mod kubernetes;
pub mod labels;
pub mod shellfs;
pub mod sprites;
pub mod stream;
pub mod tarsafe;
pub mod types;
pub mod validate;

use std::collections::BTreeMap;

use async_trait::async_trait;
use futures::stream::BoxStream;

pub use error::{
    ErrorKind, ProviderError, ProviderResult, from_status, parse_retry_after, status_kind,
};
pub use factory::{ProviderConfig, ProviderKind, ProviderSettings, ProviderType, build};
pub use types::*;

/// Core lifecycle every provider offers.
#[async_trait]
pub trait Provider: Send + Sync {
    /// The configured name of this provider instance (as `Sandbox.spec.provider` names it).
    fn name(&self) -> &str;

    /// The provider type as the configuration spells it (`docker`, `fly`, `e2b`, `sprites`,
    /// `kubernetes`), for status and metrics.
    fn kind(&self) -> &'static str;

    /// The ceilings a sandbox whose request sets none gets, as far as they are known before
    /// create (what a namespace's budget counts for a silent spec). `None` in a field: no
    /// ceiling, or one the provider decides outside the request (E2B's template, Sprites'
    /// platform size).
    fn default_resources(&self) -> Resources {
        Resources::default()
    }

    /// Whether the file capability reaches a sandbox only once it runs: a created sandbox
    /// that is not started yet (a gated Pod) runs nothing to write through, so the
    /// self-delivered env goes in right after the start instead of before it.
    fn files_need_running(&self) -> bool {
        false
    }

    /// Whether starting a process in a running sandbox costs a container runtime exec (tens
    /// of milliseconds before the program runs: Docker's exec, the Pod `exec` subresource),
    /// so that the operator keeps one started ahead of need in sandboxes in use (see
    /// `registry::warm`). Needs [`Provider::streaming_exec`] and a POSIX `sh` in the image.
    fn warm_exec(&self) -> bool {
        false
    }

    /// Creates a sandbox WITHOUT starting it, under the request's deterministic name.
    ///
    /// A name that already exists is `Conflict` (the caller observes and adopts instead of
    /// creating a second one). `template` wins over `image`, and a template that does not
    /// exist is `NotFound`/`Invalid` — never a boot from the base image. A field the provider
    /// cannot enforce (`command`, a resource ceiling, an egress allow-list) is an error, not
    /// silently ignored (rule 10).
    async fn create(&self, request: &CreateRequest) -> ProviderResult<SandboxDescriptor>;

    /// Describes one sandbox; `Ok(None)` only when the provider holds nothing under that id.
    ///
    /// `started_at = None` means never started: wreckage of an interrupted create, not
    /// "stopped" (rule 6).
    async fn describe(&self, id: &str) -> ProviderResult<Option<SandboxDescriptor>>;

    /// Finds sandboxes by labels, states and owner.
    ///
    /// Rule 1: returns `Err` when it could not enumerate; an empty list only ever means
    /// "looked, found none". A reconcile loop that read "nothing there" from a failed query
    /// would stop recovering, and a sweeper would delete on a partial picture.
    async fn find(&self, query: &SandboxQuery) -> ProviderResult<Vec<SandboxDescriptor>>;

    /// Everything carrying all of `labels` — sandboxes, volumes (with their attachment) and
    /// templates (with their use) — for the sweeper's pass.
    ///
    /// Rule 1 holds for the whole: any enumeration that fails fails the inventory. The
    /// default makes the three enumerations one after the other; a provider whose listings
    /// overlap (Docker's volume attachment and template use both come from a listing of
    /// every container) overrides it to list once, so a pass costs about one raw listing.
    async fn inventory(&self, labels: &BTreeMap<String, String>) -> ProviderResult<Inventory> {
        let query = SandboxQuery {
            labels: labels.clone(),
            ..SandboxQuery::default()
        };
        let sandboxes = self
            .find(&query)
            .await
            .map_err(|e| e.context("listing sandboxes (find)"))?;
        let volumes = match self.volumes() {
            Some(v) => {
                let query = VolumeQuery {
                    labels: labels.clone(),
                    ..VolumeQuery::default()
                };
                let listed = v
                    .list_volumes(&query)
                    .await
                    .map_err(|e| e.context("listing volumes (list_volumes)"))?;
                Some(listed)
            }
            None => None,
        };
        let templates = match self.templates() {
            Some(t) => {
                let listed = t
                    .list_templates(None)
                    .await
                    .map_err(|e| e.context("listing templates (list_templates)"))?;
                Some(retain_labelled(listed, labels))
            }
            None => None,
        };
        Ok(Inventory {
            sandboxes,
            volumes,
            templates,
        })
    }

    /// Starts a created or stopped sandbox. Starting a running one is a success.
    async fn start(&self, id: &str) -> ProviderResult<()>;

    /// Stops a sandbox (processes end). Stopping a stopped one is a success.
    async fn stop(&self, id: &str) -> ProviderResult<()>;

    /// Suspends a sandbox the cheapest way the provider has. Use [`Hibernation`] to learn
    /// whether processes survive.
    async fn sleep(&self, id: &str) -> ProviderResult<()>;

    /// Wakes a slept sandbox.
    async fn wake(&self, id: &str) -> ProviderResult<()>;

    /// Destroys a sandbox and its provider-side state (not its named volumes).
    ///
    /// Rule 5: idempotent — destroying something already gone is a success.
    async fn destroy(&self, id: &str) -> ProviderResult<()>;

    /// Runs a command inside a running sandbox, bounded by the request's timeout (a timeout
    /// is `Transient`). A non-zero exit code is returned as data.
    async fn exec(&self, id: &str, request: &ExecRequest) -> ProviderResult<ExecOutput>;

    /// Suspend/resume that reports what happened.
    fn hibernation(&self) -> Option<&dyn Hibernation> {
        None
    }
    /// Named volumes.
    fn volumes(&self) -> Option<&dyn Volumes> {
        None
    }
    /// Native templates: the provider captures a sandbox's filesystem itself (an image
    /// commit) and creates sandboxes from it. A provider without it still gets templates
    /// through the controller-side templates service (the `templates` module), which
    /// captures over `exec` into an S3 store and restores after start; sharing native
    /// templates through that store is the service's work too, never a provider's.
    fn templates(&self) -> Option<&dyn Templates> {
        None
    }
    /// Changing resource ceilings in place.
    fn resources(&self) -> Option<&dyn SetResources> {
        None
    }
    /// Headroom measurement.
    fn capacity(&self) -> Option<&dyn CapacityProbe> {
        None
    }
    /// Exact file I/O.
    fn files(&self) -> Option<&dyn Files> {
        None
    }
    /// Bulk tar transfer of directory trees.
    fn bulk_files(&self) -> Option<&dyn BulkFiles> {
        None
    }
    /// Egress observation.
    fn egress(&self) -> Option<&dyn Egress> {
        None
    }
    /// Replacing an outbound allow-list in place, on the same sandbox id. Without it, a
    /// changed `spec.egress` recreates the sandbox.
    fn egress_policy(&self) -> Option<&dyn EgressPolicy> {
        None
    }
    /// A stream of changes to managed resources, so drift is noticed without polling.
    fn events(&self) -> Option<&dyn ProviderEvents> {
        None
    }
    /// An image cache shared by every namespace (one Docker engine): the controller then
    /// lets a Sandbox boot a cached image only if it could have pulled it itself.
    fn image_cache(&self) -> Option<&dyn ImageCache> {
        None
    }
    /// Interactive processes (stdin, TTY, signals), for the access layer.
    fn streaming_exec(&self) -> Option<&dyn stream::StreamingExec> {
        None
    }
    /// The main process's log, with follow.
    fn logs(&self) -> Option<&dyn stream::Logs> {
        None
    }
    /// TCP connections to a port inside a sandbox.
    fn port_forward(&self) -> Option<&dyn stream::PortForward> {
        None
    }
    /// Labels added to a sandbox that already runs (a claimed warm pool member).
    fn relabel(&self) -> Option<&dyn Relabel> {
        None
    }
}

/// Adding labels to a running sandbox without restarting it. Absent where the provider
/// fixes them at create (Docker labels, E2B metadata).
#[async_trait]
pub trait Relabel: Send + Sync {
    /// Adds (or overwrites) `labels` on sandbox `id`; the other labels stay.
    async fn add_labels(&self, id: &str, labels: &BTreeMap<String, String>) -> ProviderResult<()>;
}

/// The templates carrying every one of `labels` (a template listing has no label
/// narrowing of its own).
pub fn retain_labelled(
    templates: Vec<Template>,
    labels: &BTreeMap<String, String>,
) -> Vec<Template> {
    templates
        .into_iter()
        .filter(|t| labels.iter().all(|(k, v)| t.labels.get(k) == Some(v)))
        .collect()
}

/// Suspend and resume, reporting whether the process tree survived.
#[async_trait]
pub trait Hibernation: Send + Sync {
    /// Suspends the sandbox with the highest-fidelity mechanism available, falling back
    /// rather than failing.
    ///
    /// Rule 7: the outcome reports what happened (`processes_preserved`), never what was
    /// attempted.
    async fn hibernate(&self, id: &str) -> ProviderResult<HibernationOutcome>;

    /// Resumes a suspended sandbox and reports whether its processes came back
    /// (`processes_preserved = false`: running but empty, relaunch what you need). Rule 7.
    async fn resume(&self, id: &str) -> ProviderResult<HibernationOutcome>;
}

/// Named volumes that outlive sandboxes.
#[async_trait]
pub trait Volumes: Send + Sync {
    /// Creates a volume with the given labels. Creating an existing volume with our owner
    /// labels is a success (idempotent); one owned by someone else is `Conflict`.
    async fn create_volume(
        &self,
        name: &str,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> ProviderResult<VolumeInfo>;

    /// Removes a volume. Absent = success (rule 5). An attached volume is refused with
    /// `Conflict` naming the sandboxes that hold it.
    async fn remove_volume(&self, name: &str) -> ProviderResult<()>;

    /// Describes one volume; `Ok(None)` only when it genuinely does not exist.
    ///
    /// Rule 4: attachment that cannot be determined reads as attached.
    async fn get_volume(&self, name: &str) -> ProviderResult<Option<VolumeInfo>>;

    /// Lists volumes.
    ///
    /// Rule 1: `Err` when it cannot enumerate — never `[]`. Rule 4: `attached` counts every
    /// sandbox, stopped ones included, and is `true` when it cannot be determined.
    async fn list_volumes(&self, query: &VolumeQuery) -> ProviderResult<Vec<VolumeInfo>>;
}

/// Native templates: filesystems captured from sandboxes by the provider itself (an image
/// commit) that later sandboxes are created from (`CreateRequest::template`).
#[async_trait]
pub trait Templates: Send + Sync {
    /// Captures a sandbox's filesystem (including `capture_paths`, which may live on storage
    /// the native capture excludes) under the caller's id, replacing an earlier capture, with
    /// the request's owner labels. The template it returns (and every later lookup) reports
    /// its `capture_paths` and `base_image`: what publishing it to a shared store needs.
    async fn commit(&self, request: &CommitRequest) -> ProviderResult<Template>;

    /// Looks one template up.
    ///
    /// Rule 3: `Ok(None)` only when it is genuinely absent; a lookup that failed is `Err`,
    /// or a transient failure silently becomes a cold rebuild (or, worse, a plain-image boot).
    async fn get_template(&self, template_id: &str) -> ProviderResult<Option<Template>>;

    /// Lists templates whose id starts with `id_prefix`.
    ///
    /// Rule 1: `Err` when it cannot enumerate. Rule 4: `in_use` is `true` when unknown.
    async fn list_templates(&self, id_prefix: Option<&str>) -> ProviderResult<Vec<Template>>;

    /// Removes a template.
    ///
    /// Rule 5: absent = success; a template that still backs a sandbox is refused with
    /// `Conflict`, decided by CHECKING every sandbox, never by trusting the caller.
    async fn remove_template(&self, template_id: &str) -> ProviderResult<()>;
}

/// Changing a running sandbox's ceilings.
#[async_trait]
pub trait SetResources: Send + Sync {
    /// Changes only the fields present. A ceiling the provider cannot change in place is
    /// `Unsupported` (rule 10): an unenforced limit the caller believes in is worse than a
    /// visible failure. The result says whether the sandbox was restarted to apply it, as it
    /// happened: a provider that reboots to resize reports `restarted: true`.
    async fn set_resources(
        &self,
        id: &str,
        resources: &Resources,
    ) -> ProviderResult<ResourceChange>;
}

/// Headroom measurement.
#[async_trait]
pub trait CapacityProbe: Send + Sync {
    /// Measures free disk, inodes and memory.
    ///
    /// Rule 8: a field that could not be measured is absent, never zero.
    async fn capacity(&self) -> ProviderResult<Capacity>;
}

/// Exact file I/O through the provider's file API (not exec stdout).
#[async_trait]
pub trait Files: Send + Sync {
    /// Reads a file's exact bytes.
    ///
    /// Rule 2: an absent file is `NotFound`, never empty bytes; bytes cross unchanged.
    async fn read_file(&self, id: &str, path: &str) -> ProviderResult<Vec<u8>>;

    /// Creates or replaces a whole file (never appends), creating parent directories.
    /// `mode` is masked: setuid/setgid are never written.
    async fn write_file(&self, id: &str, path: &str, data: &[u8], mode: u32) -> ProviderResult<()>;

    /// Lists one directory level.
    ///
    /// Rule 1/2: an absent directory is `NotFound`; `[]` means "exists and is empty".
    async fn list_dir(&self, id: &str, path: &str) -> ProviderResult<Vec<DirEntry>>;

    /// Deletes a file or directory tree. Absent = success.
    async fn delete_path(&self, id: &str, path: &str) -> ProviderResult<()>;
}

/// Bulk transfer of directory trees as tar.
#[async_trait]
pub trait BulkFiles: Send + Sync {
    /// Streams `path` out as a POSIX tar rooted at its LAST SEGMENT
    /// (`/workspace/app` → `app/…`). An absent path is `NotFound`.
    async fn export(
        &self,
        id: &str,
        path: &str,
    ) -> ProviderResult<BoxStream<'static, ProviderResult<bytes::Bytes>>>;

    /// Extracts a tar archive at `path` (the inverse of export is `import(dirname(p))`).
    ///
    /// Never restores ownership or setuid/setgid bits: an archive is tenant-authored data,
    /// and honouring its mode bits turns a captured workspace into a privilege escalation.
    /// The archive is a stream so that it can be checked while it is still arriving (an
    /// upload); a refused or broken archive (an `Err` item) still writes nothing.
    async fn import(&self, id: &str, path: &str, archive: ArchiveStream) -> ProviderResult<()>;
}

/// A tar archive as it arrives, in pieces. An `Err` item ends it: the import that reads it
/// fails and writes nothing.
pub type ArchiveStream = BoxStream<'static, std::io::Result<bytes::Bytes>>;

/// An archive already held whole, as an [`ArchiveStream`] of one piece.
pub fn whole_archive(archive: impl Into<bytes::Bytes>) -> ArchiveStream {
    let archive = archive.into();
    Box::pin(futures::stream::once(async move { Ok(archive) }))
}

/// Egress observation.
#[async_trait]
pub trait Egress: Send + Sync {
    /// Observes whether egress is restricted.
    ///
    /// Rule 9: an observation (`Filtered|Open|Inconclusive`), never the requested config;
    /// `Inconclusive` when the check could not run, never conflated with `Filtered`.
    async fn egress_verdict(&self, id: &str) -> ProviderResult<EgressVerdict>;
}

/// An outbound allow-list enforced by the provider and replaceable while the sandbox lives.
#[async_trait]
pub trait EgressPolicy: Send + Sync {
    /// Replaces the sandbox's allow-list: `None` unrestricted, `Some([])` no egress at all,
    /// otherwise only the listed names (`*.x` = subdomains of `x`). The sandbox keeps its id.
    ///
    /// A resumed sandbox may come back with the policy it was snapshotted with, so the
    /// controller calls this again after every resume: resume replaces the egress policy.
    async fn set_allowed_domains(&self, id: &str, allowed: Option<&[String]>)
    -> ProviderResult<()>;

    /// What of an allow-list is fixed when the sandbox is created: two lists with different
    /// placements cannot replace each other in place, so the controller recreates the sandbox
    /// when the placement changes (Docker: unrestricted, no network and behind the gateway
    /// are different networks). `None`: every change applies in place.
    fn placement(&self, _allowed: Option<&[String]>) -> Option<&'static str> {
        None
    }
}

/// A change the operator itself makes to a sandbox, for which a provider with an event stream
/// reports events of its own (see [`factory::ProviderKind::echo_words`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Change {
    /// Created (not started).
    Create,
    /// Started.
    Start,
    /// Stopped.
    Stop,
    /// Destroyed.
    Destroy,
    /// Hibernated.
    Hibernate,
    /// Resumed.
    Resume,
    /// Resource ceilings changed in place.
    SetResources,
}

/// A stream of changes to the resources this operator instance manages.
pub trait ProviderEvents: Send + Sync {
    /// Subscribes to changes of resources labelled with `instance`. The stream ends or
    /// yields `Err` when the connection drops; the caller resubscribes with backoff.
    fn subscribe(&self, instance: &str) -> BoxStream<'static, ProviderResult<ProviderEvent>>;
}

/// A provider's image cache, shared by every namespace it serves. A cached image carries no
/// record of who pulled it or with which credential, so the controller decides from these
/// facts whether a Sandbox may boot it (see `controller::sandbox::images`).
#[async_trait]
pub trait ImageCache: Send + Sync {
    /// The repository holding the provider's own template images: never bootable through
    /// `spec.image`, only through `spec.templateRef`.
    fn template_repository(&self) -> &str;
    /// What the cache holds for `image` (a reference or an image id, as the provider resolves
    /// it at create), `None` when it holds nothing.
    async fn cached(&self, image: &str) -> ProviderResult<Option<CachedImage>>;
}

/// One cached image, as far as deciding who may boot it goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedImage {
    /// It is one of the provider's template images (tagged into its template repository).
    pub template: bool,
    /// `repository@sha256:…` when a registry served it under the named repository (the
    /// digest a create would boot), `None` for an image no registry is known to serve
    /// (built or loaded on the engine, or named by its image id).
    pub registry_digest: Option<String>,
}
