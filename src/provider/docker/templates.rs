//! Templates on Docker: `docker commit` images tagged `<template_repository>:<template id>`.
//!
//! # Capture
//!
//! `docker commit` captures the container's own filesystem layer and nothing mounted into
//! it — volumes, binds and tmpfs are excluded, and that is exactly where a project's files
//! usually live. So every capture path that lies on a mount (and every mount that lies
//! under a capture path) is copied into the image explicitly:
//!
//! 1. commit the container (paused for a consistent snapshot) to an intermediate image;
//! 2. export each such path with the archive API and rewrite the tar through the one
//!    sanitiser ([`tarsafe`](crate::provider::tarsafe)): owner and group become root,
//!    setuid/setgid/sticky bits are dropped, extended attributes (file capabilities included)
//!    are not carried, writes through the archive's own symlinks are refused, and only files,
//!    directories and links pass;
//! 3. create a helper container from the intermediate image (labelled with the template's
//!    owner, so a crash leaves sweepable wreckage), upload the archives into it, and commit
//!    that; then remove the helper.
//! 4. tag the result with only the env a template may store (see
//!    [`imageconfig`](super::imageconfig)), and remove the untagged commits.
//!
//! Each capture path must exist in the sandbox (`Invalid` otherwise): a template silently
//! missing the project's files would boot and look healthy. The commit itself is taken with
//! the sandbox paused; the copies of mounted paths are read afterwards, live, so a sandbox
//! that keeps writing there should be stopped (or hibernated) before a commit.
//!
//! A commit carries the container's configuration (command, environment) into the image,
//! as Docker always does — env from Secrets included, which a template must never store. So
//! the final tag carries the source image's env plus the Sandbox's plain env only
//! (`CommitRequest::env`), and the files a Secret delivered (`CommitRequest::secret_files`)
//! are emptied first: when the sandbox has one, the helper of step 3 is made (also without
//! mounted paths to copy) and an empty file is uploaded over each before it is committed —
//! through the archive API, so no program of the sandbox's image runs outside the sandbox.
//! A template therefore holds no Secret value, and a sandbox booted from it gets its own
//! env (and its own self-delivered file, written over the empty one).
//!
//! Labels set on the source container (owner, caller labels, its own
//! template and disk labels) would be inherited by every sandbox booted from the template;
//! Docker's commit can only add labels, so those are blanked (set to `""`) on the image.
//!
//! Re-committing an id moves the tag; the previous image is removed when nothing uses it
//! (a sandbox still running from it keeps it alive, and it still counts as a use of the id).
//!
//! # Use
//!
//! A template is in use when any container, in any state, runs its image or was booted from
//! its id (the `sandboxes.dev/template` label). Decided by listing every container, only
//! where it matters: `remove_template` (refused while in use) and `list_templates` (the
//! sweeper's one enumeration). When that listing fails, `in_use` is `true` (rule 4) and
//! removal fails instead of guessing. `get_template` — on every boot from a template —
//! does not list every container (that made N boots cost N full listings); it reports
//! `in_use: true`, "not checked here", which rule 4 allows.
//!
//! # Labels
//!
//! A template image records its id, capture paths, label and base image (the image the
//! captured sandbox was created from; a template of a template inherits its parent's) as
//! labels, so the controller-side templates service can publish it to a shared store and a
//! provider without image commit can boot the base image and restore the capture.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use bollard::models::{
    ContainerConfig, ContainerCreateBody, ContainerInspectResponse, ContainerSummary, HostConfig,
    ImageInspect,
};
use bollard::query_parameters::{
    CommitContainerOptionsBuilder, ContainerArchiveInfoOptionsBuilder,
    CreateContainerOptionsBuilder, DownloadFromContainerOptionsBuilder,
    ListContainersOptionsBuilder, ListImagesOptionsBuilder, RemoveContainerOptionsBuilder,
    RemoveImageOptionsBuilder, UploadToContainerOptionsBuilder,
};
use chrono::{DateTime, Utc};
use futures::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::core::parse_time;
use super::imageconfig::stored_env;
use super::volumes::summary_name;
use super::{
    BASE_IMAGE_LABEL, CAPTURE_PATHS_LABEL, DockerProvider, TEMPLATE_ID_LABEL, TEMPLATE_LABEL_LABEL,
    is_not_found, map_err, status_of,
};
use crate::provider::labels::TEMPLATE;
use crate::provider::{CommitRequest, ProviderError, ProviderResult, Template, Templates};
use crate::provider::{tarsafe, validate};

/// Bytes per chunk when streaming an archive from disk to the engine.
const UPLOAD_CHUNK: usize = 256 * 1024;

/// Whether `path` is `root` or lies below it (both normalised, no trailing `/`).
fn is_under(path: &str, root: &str) -> bool {
    path == root
        || (path.len() > root.len()
            && path.starts_with(root)
            && path.as_bytes()[root.len()] == b'/')
}

fn parent(path: &str) -> &str {
    match path.rfind('/') {
        Some(0) | None => "/",
        Some(i) => &path[..i],
    }
}

/// A tar that writes each of `files` as an empty file (mode 0600): what replaces a
/// self-delivered file's content in a template.
fn blanks(files: &[String]) -> io::Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    for file in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(0);
        header.set_mode(0o600);
        header.set_cksum();
        builder.append_data(&mut header, file.trim_start_matches('/'), io::empty())?;
    }
    builder.into_inner()
}

/// One path to copy into the image through the archive API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Copy {
    /// Absolute path in the sandbox.
    pub path: String,
    /// Directories (relative to `/`, outermost first) that exist only on the mount and so
    /// are missing from the committed layer: created before the copy lands.
    pub scaffold: Vec<String>,
}

/// Which paths a commit misses and must copy: capture paths on a mount, and mounts below a
/// capture path. Nested paths are dropped (their ancestor's copy includes them).
pub(crate) fn copy_plan(capture_paths: &[String], mounts: &[String]) -> Vec<Copy> {
    let mounts: Vec<&str> = mounts
        .iter()
        .map(|m| m.trim_end_matches('/'))
        .filter(|m| !m.is_empty())
        .collect();
    let mut paths = BTreeSet::new();
    for capture in capture_paths {
        let capture = capture.trim_end_matches('/');
        if mounts.iter().any(|m| is_under(capture, m)) {
            paths.insert(capture.to_string());
        }
        for m in &mounts {
            if is_under(m, capture) {
                paths.insert((*m).to_string());
            }
        }
    }
    let outermost: Vec<&String> = paths
        .iter()
        .filter(|p| !paths.iter().any(|o| o != *p && is_under(p, o)))
        .collect();
    outermost
        .into_iter()
        .map(|path| {
            let mount = mounts
                .iter()
                .filter(|m| is_under(path, m))
                .min_by_key(|m| m.len())
                .copied()
                .unwrap_or("/");
            let mut scaffold = Vec::new();
            let mut dir = parent(path);
            while dir.len() > mount.len() && is_under(dir, mount) {
                scaffold.push(dir.trim_start_matches('/').to_string());
                dir = parent(dir);
            }
            scaffold.reverse();
            Copy {
                path: path.clone(),
                scaffold,
            }
        })
        .collect()
}

/// Rewrites the tar exported from `copy.path` (rooted at its last segment) into one rooted at
/// `/` through the one sanitiser ([`tarsafe`]): every member placed under the path's parent,
/// the scaffold directories (those only the mount had) emitted first.
fn sanitise_copy(
    raw: &std::path::Path,
    clean: &std::path::Path,
    copy: &Copy,
) -> Result<tarsafe::Report, tarsafe::TarsafeError> {
    let open = |r: io::Result<std::fs::File>| {
        r.map_err(|e| tarsafe::TarsafeError(format!("temporary capture file: {e}")))
    };
    let input = io::BufReader::new(open(std::fs::File::open(raw))?);
    let output = io::BufWriter::new(open(std::fs::File::create(clean))?);
    let placement = tarsafe::Placement {
        prefix: parent(&copy.path).trim_start_matches('/'),
        create_dirs: copy.scaffold.len(),
    };
    tarsafe::sanitise_into(input, output, placement)
}

/// A file in the system temp directory, removed when dropped.
struct TempFile(PathBuf);

impl TempFile {
    fn new(what: &str) -> TempFile {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let nanos = Utc::now().timestamp_nanos_opt().unwrap_or(0);
        TempFile(std::env::temp_dir().join(format!(
            "sandbox-operator-{what}-{}-{nanos}-{n}.tar",
            std::process::id()
        )))
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn io_err(what: &str, e: impl std::fmt::Display) -> ProviderError {
    ProviderError::transient(format!("{what}: {e}"))
}

/// A template as its image's labels describe it (reference, time and size left for the
/// caller). Capture paths that cannot be read come back empty: publishing such a template
/// then fails, naming what to do, rather than archiving nothing.
fn from_labels(id: String, labels: BTreeMap<String, String>, in_use: bool) -> Template {
    let text = |key: &str| labels.get(key).filter(|v| !v.is_empty()).cloned();
    let capture_paths = labels
        .get(CAPTURE_PATHS_LABEL)
        .and_then(|json| serde_json::from_str(json).ok())
        .unwrap_or_default();
    Template {
        id,
        reference: String::new(),
        created_at: None,
        size_bytes: None,
        label: text(TEMPLATE_LABEL_LABEL),
        base_image: text(BASE_IMAGE_LABEL),
        capture_paths,
        labels,
        in_use,
    }
}

/// Containers (by name) backed by a template: running its image, or booted from its id.
fn template_users(
    template_id: &str,
    image_id: &str,
    containers: &[ContainerSummary],
) -> Vec<String> {
    let mut users: Vec<String> = containers
        .iter()
        .filter(|c| {
            c.image_id.as_deref() == Some(image_id)
                || c.labels
                    .as_ref()
                    .and_then(|l| l.get(TEMPLATE))
                    .is_some_and(|t| t == template_id)
        })
        .map(summary_name)
        .collect();
    users.sort();
    users
}

impl DockerProvider {
    /// Every container in every state.
    pub(super) async fn all_containers(&self) -> ProviderResult<Vec<ContainerSummary>> {
        let docker = self.engine().await?;
        let options = ListContainersOptionsBuilder::default().all(true).build();
        docker
            .list_containers(Some(options))
            .await
            .map_err(|e| map_err("listing every container", e))
    }

    /// The templates (ids starting with `id_prefix`), with their use read from
    /// `containers` — every container in every state, listed by the caller; `None` when that
    /// listing failed, and then every template reads as in use (rule 4).
    pub(super) async fn templates_used_by(
        &self,
        id_prefix: Option<&str>,
        containers: Option<&[ContainerSummary]>,
    ) -> ProviderResult<Vec<Template>> {
        let docker = self.engine().await?;
        let filters = HashMap::from([
            ("label".to_string(), vec![TEMPLATE_ID_LABEL.to_string()]),
            ("dangling".to_string(), vec!["false".to_string()]),
        ]);
        let options = ListImagesOptionsBuilder::default()
            .filters(&filters)
            .build();
        let images = docker
            .list_images(Some(options))
            .await
            .map_err(|e| map_err("listing templates", e))?;
        let mut out = Vec::new();
        for image in images {
            let Some(id) = image.labels.get(TEMPLATE_ID_LABEL).cloned() else {
                continue;
            };
            // A superseded capture keeps its label but lost the tag: it is not the template.
            if !image.repo_tags.contains(&self.template_image(&id)) {
                continue;
            }
            if id_prefix.is_some_and(|p| !id.starts_with(p)) {
                continue;
            }
            let in_use = containers.is_none_or(|c| !template_users(&id, &image.id, c).is_empty());
            let labels: BTreeMap<String, String> = image.labels.into_iter().collect();
            out.push(Template {
                reference: image.id,
                created_at: DateTime::from_timestamp(image.created, 0),
                size_bytes: u64::try_from(image.size).ok(),
                ..from_labels(id, labels, in_use)
            });
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    /// The image behind a template id, `None` when the tag does not exist.
    async fn template_inspect(&self, template_id: &str) -> ProviderResult<Option<ImageInspect>> {
        let docker = self.engine().await?;
        match docker
            .inspect_image(&self.template_image(template_id))
            .await
        {
            Ok(image) => Ok(Some(image)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(map_err(&format!("looking up template {template_id}"), e)),
        }
    }

    fn template_from_inspect(
        &self,
        template_id: &str,
        image: ImageInspect,
        in_use: bool,
    ) -> Template {
        let labels: BTreeMap<String, String> = image
            .config
            .and_then(|c| c.labels)
            .unwrap_or_default()
            .into_iter()
            .collect();
        Template {
            reference: image.id.unwrap_or_default(),
            created_at: image.created.as_deref().and_then(parse_time),
            size_bytes: image.size.and_then(|s| u64::try_from(s).ok()),
            ..from_labels(template_id.to_string(), labels, in_use)
        }
    }

    /// Removes an image nothing uses any more; failures are only logged (an image still in
    /// use, or the parent of another, stays).
    async fn remove_unused_image(&self, image_id: &str) {
        let Ok(docker) = self.engine().await else {
            return;
        };
        let options = RemoveImageOptionsBuilder::default().force(false).build();
        if let Err(e) = docker.remove_image(image_id, Some(options), None).await {
            tracing::debug!(image = image_id, error = %e, "superseded template image kept");
        }
    }

    /// Exports `copy.path` from the sandbox, sanitises it, and uploads it into `helper`.
    async fn copy_into(&self, sandbox: &str, helper: &str, copy: &Copy) -> ProviderResult<()> {
        let raw = TempFile::new("capture-raw");
        let clean = TempFile::new("capture-clean");
        self.download_to(sandbox, &copy.path, &raw).await?;
        let (raw_path, clean_path, plan) = (raw.0.clone(), clean.0.clone(), copy.clone());
        let report = tokio::task::spawn_blocking(move || {
            sanitise_copy(&raw_path, &clean_path, &plan)
        })
        .await
        .map_err(|e| io_err("sanitising a capture archive", e))?
        .map_err(|e| {
            ProviderError::invalid(format!(
                "capture path {} of sandbox {sandbox} cannot be copied into the template: {e}",
                copy.path
            ))
        })?;
        if !report.dropped.is_empty() {
            tracing::info!(path = %copy.path, dropped = ?report.dropped, "special files (devices, fifos) left out of a template");
        }
        // Both temporary files are removed when this returns, after the upload read `clean`.
        let what = format!("copying capture path {} into the template", copy.path);
        self.upload_from(helper, &clean, &what).await
    }

    /// Streams the archive of `path` in `sandbox` into the file `to`.
    async fn download_to(&self, sandbox: &str, path: &str, to: &TempFile) -> ProviderResult<()> {
        let docker = self.engine().await?;
        let write_err = |e| io_err("writing a capture to a temporary file", e);
        let mut file = tokio::fs::File::create(&to.0)
            .await
            .map_err(|e| io_err("creating a temporary file for a capture", e))?;
        let options = DownloadFromContainerOptionsBuilder::default()
            .path(path)
            .build();
        let mut stream = docker.download_from_container(sandbox, Some(options));
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| {
                map_err(
                    &format!("exporting capture path {path} from sandbox {sandbox}"),
                    e,
                )
            })?;
            file.write_all(&chunk).await.map_err(write_err)?;
        }
        file.flush().await.map_err(write_err)
    }

    /// Streams the tar file `from` into `helper`, extracted at `/`.
    async fn upload_from(&self, helper: &str, from: &TempFile, what: &str) -> ProviderResult<()> {
        let docker = self.engine().await?;
        let file = tokio::fs::File::open(&from.0)
            .await
            .map_err(|e| io_err("reading a sanitised capture", e))?;
        let body = futures::stream::unfold(Some(file), |state| async move {
            let mut file = state?;
            let mut buf = vec![0u8; UPLOAD_CHUNK];
            match file.read(&mut buf).await {
                Ok(0) => None,
                Ok(n) => {
                    buf.truncate(n);
                    Some((Ok(bytes::Bytes::from(buf)), Some(file)))
                }
                Err(e) => Some((Err(e), None)),
            }
        });
        let options = UploadToContainerOptionsBuilder::default().path("/").build();
        docker
            .upload_to_container(helper, Some(options), bollard::body_try_stream(body))
            .await
            .map_err(|e| map_err(what, e))
    }

    /// Step 3 of the module docs: helper container from `intermediate`, the secret files
    /// in `remove` emptied, copies, commit (untagged). The helper is removed whatever happens.
    async fn commit_with_copies(
        &self,
        request: &CommitRequest,
        intermediate: &str,
        (copies, remove): (&[Copy], &[String]),
        config: &ContainerConfig,
    ) -> ProviderResult<String> {
        let docker = self.engine().await?;
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let helper = format!(
            "tmpl-capture-{}-{}-{}",
            &request.template_id[..request.template_id.len().min(80)],
            Utc::now().timestamp_nanos_opt().unwrap_or(0),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let body = ContainerCreateBody {
            image: Some(intermediate.to_string()),
            labels: Some(request.owner.labels().into_iter().collect()),
            host_config: Some(HostConfig {
                network_mode: Some("none".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let options = CreateContainerOptionsBuilder::default()
            .name(&helper)
            .build();
        docker
            .create_container(Some(options), body)
            .await
            .map_err(|e| map_err("creating the template capture helper", e))?;

        let result = async {
            self.blank_in(&helper, remove).await?;
            for copy in copies {
                self.copy_into(&request.sandbox_id, &helper, copy).await?;
            }
            let options = CommitContainerOptionsBuilder::default()
                .container(&helper)
                .comment(request.label.as_deref().unwrap_or(""))
                .pause(false)
                .build();
            docker
                .commit_container(options, config.clone())
                .await
                .map(|r| r.id)
                .map_err(|e| map_err(&format!("committing template {}", request.template_id), e))
        }
        .await;

        let options = RemoveContainerOptionsBuilder::default()
            .force(true)
            .v(true)
            .build();
        if let Err(e) = docker.remove_container(&helper, Some(options)).await {
            tracing::warn!(helper = %helper, error = %e, "template capture helper left behind");
        }
        result
    }
}

/// Capture paths validated, without trailing slashes, sorted and deduplicated.
fn normalised_paths(paths: &[String]) -> ProviderResult<Vec<String>> {
    let mut capture = Vec::new();
    for path in paths {
        validate::capture_path(path).map_err(ProviderError::invalid)?;
        capture.push(path.trim_end_matches('/').to_string());
    }
    capture.sort();
    capture.dedup();
    Ok(capture)
}

/// The steps of a native capture (see the module docs).
impl DockerProvider {
    /// Each capture path must exist in the sandbox: a template silently missing the
    /// project's files would boot and look healthy.
    async fn check_paths_exist(&self, sandbox: &str, paths: &[String]) -> ProviderResult<()> {
        for path in paths {
            if !self.exists(sandbox, path).await? {
                return Err(ProviderError::invalid(format!(
                    "capture path {path} does not exist in sandbox {sandbox}; fix spec.capturePaths \
                     (a template without it would boot into an empty workspace)"
                )));
            }
        }
        Ok(())
    }

    /// Whether `path` exists in the sandbox (the archive API's stat).
    async fn exists(&self, sandbox: &str, path: &str) -> ProviderResult<bool> {
        let docker = self.engine().await?;
        let options = ContainerArchiveInfoOptionsBuilder::default()
            .path(path)
            .build();
        match docker
            .get_container_archive_info(sandbox, Some(options))
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if is_not_found(&e) => Ok(false),
            Err(e) => Err(map_err(
                &format!("looking for {path} in sandbox {sandbox}"),
                e,
            )),
        }
    }

    /// The committed image's labels: the template's owner, id, capture paths, label and base
    /// image, and every label the source container carried that its image did not, blanked
    /// (see the module docs).
    async fn template_config(
        &self,
        request: &CommitRequest,
        source: &ContainerInspectResponse,
        capture: &[String],
    ) -> ProviderResult<ContainerConfig> {
        let docker = self.engine().await?;
        let image_labels = match source.image.as_deref() {
            Some(image) => match docker.inspect_image(image).await {
                Ok(i) => i.config.and_then(|c| c.labels).unwrap_or_default(),
                Err(e) if is_not_found(&e) => HashMap::new(),
                Err(e) => return Err(map_err("looking up the sandbox's image", e)),
            },
            None => HashMap::new(),
        };
        let source_config = source.config.as_ref();
        let mut labels: BTreeMap<String, String> = source_config
            .and_then(|c| c.labels.as_ref())
            .into_iter()
            .flatten()
            .filter(|(k, _)| !image_labels.contains_key(*k))
            .map(|(k, _)| (k.clone(), String::new()))
            .collect();
        labels.extend(request.owner.labels());
        labels.insert(TEMPLATE_ID_LABEL.into(), request.template_id.clone());
        let paths = serde_json::to_string(capture).unwrap_or_else(|_| "[]".into());
        labels.insert(CAPTURE_PATHS_LABEL.into(), paths);
        let label = request.label.clone().unwrap_or_default();
        labels.insert(TEMPLATE_LABEL_LABEL.into(), label);
        // A template of a template keeps the first one's base image.
        let base = image_labels
            .get(BASE_IMAGE_LABEL)
            .filter(|b| !b.is_empty())
            .cloned()
            .or_else(|| source_config.and_then(|c| c.image.clone()));
        labels.insert(BASE_IMAGE_LABEL.into(), base.unwrap_or_default());
        Ok(ContainerConfig {
            labels: Some(labels.into_iter().collect()),
            ..Default::default()
        })
    }

    /// Commits the sandbox (paused) untagged; when secret files must go or paths on mounts
    /// must be copied in, commits a helper made from that; then tags the result with only
    /// the env a template stores ([`stored_env`]). The untagged commits are removed
    /// whatever happens. Returns the tagged image's id.
    async fn commit_image(
        &self,
        request: &CommitRequest,
        (copies, remove): (&[Copy], &[String]),
        config: ContainerConfig,
        env: &[String],
    ) -> ProviderResult<String> {
        let docker = self.engine().await?;
        let (sandbox, id) = (&request.sandbox_id, &request.template_id);
        let options = CommitContainerOptionsBuilder::default()
            .container(sandbox)
            .comment(request.label.as_deref().unwrap_or(""))
            .pause(true);
        let committed = docker
            .commit_container(options.build(), config.clone())
            .await
            .map_err(|e| map_err(&format!("committing sandbox {sandbox} as template {id}"), e))?
            .id;
        let mut untagged = vec![committed.clone()];
        let result = async {
            let last = if copies.is_empty() && remove.is_empty() {
                committed.clone()
            } else {
                let helper = (copies, remove);
                let last = self
                    .commit_with_copies(request, &committed, helper, &config)
                    .await?;
                untagged.insert(0, last.clone());
                last
            };
            self.tag_with_env(&last, &self.template_image(id), env)
                .await
        }
        .await;
        for image in untagged.iter().filter(|i| result.as_ref().ok() != Some(*i)) {
            self.remove_unused_image(image).await;
        }
        result
    }

    /// Empties the self-delivered `files` in the never-started `helper`, through the
    /// archive API: no program of the sandbox's image runs for it.
    async fn blank_in(&self, helper: &str, files: &[String]) -> ProviderResult<()> {
        if files.is_empty() {
            return Ok(());
        }
        let docker = self.engine().await?;
        let what = "emptying the self-delivered files of the template";
        let archive = blanks(files).map_err(|e| io_err(what, e))?;
        let options = UploadToContainerOptionsBuilder::default().path("/").build();
        docker
            .upload_to_container(helper, Some(options), bollard::body_full(archive.into()))
            .await
            .map_err(|e| map_err(what, e))
    }

    /// The env of the image the sandbox `source` was made from (none when it is gone).
    async fn image_env(&self, source: &ContainerInspectResponse) -> ProviderResult<Vec<String>> {
        let Some(image) = source.image.as_deref() else {
            return Ok(Vec::new());
        };
        let docker = self.engine().await?;
        match docker.inspect_image(image).await {
            Ok(i) => Ok(i.config.and_then(|c| c.env).unwrap_or_default()),
            Err(e) if is_not_found(&e) => Ok(Vec::new()),
            Err(e) => Err(map_err("looking up the sandbox's image", e)),
        }
    }

    /// Which of `files` exist in the sandbox: those a capture must empty.
    async fn present(&self, sandbox: &str, files: &[String]) -> ProviderResult<Vec<String>> {
        let mut present = Vec::new();
        for path in files {
            if self.exists(sandbox, path).await? {
                present.push(path.clone());
            }
        }
        Ok(present)
    }
}

#[async_trait]
impl Templates for DockerProvider {
    async fn commit(&self, request: &CommitRequest) -> ProviderResult<Template> {
        let id = &request.template_id;
        validate::resource_name("template", id).map_err(ProviderError::invalid)?;
        let capture = normalised_paths(&request.capture_paths)?;
        let source = self.inspect(&request.sandbox_id).await?.ok_or_else(|| {
            ProviderError::not_found(format!(
                "sandbox {} does not exist, so template {id} cannot be captured from it; fix spec.sandboxRef",
                request.sandbox_id
            ))
        })?;
        self.check_paths_exist(&request.sandbox_id, &capture)
            .await?;
        let mounts: Vec<String> = source
            .mounts
            .clone()
            .unwrap_or_default()
            .into_iter()
            .filter_map(|m| m.destination)
            .collect();
        let copies = copy_plan(&capture, &mounts);
        let remove = self
            .present(&request.sandbox_id, &request.secret_files)
            .await?;
        let env = stored_env(&self.image_env(&source).await?, &request.env);
        let previous = self.template_inspect(id).await?.and_then(|i| i.id);
        let config = self.template_config(request, &source, &capture).await?;
        let image_id = self
            .commit_image(request, (&copies, &remove), config, &env)
            .await?;
        if let Some(old) = previous.filter(|old| *old != image_id) {
            self.remove_unused_image(&old).await;
        }
        self.get_template(id).await?.ok_or_else(|| {
            ProviderError::transient(format!(
                "template {id} was committed but disappeared before it could be read back"
            ))
        })
    }

    async fn get_template(&self, template_id: &str) -> ProviderResult<Option<Template>> {
        validate::resource_name("template", template_id).map_err(ProviderError::invalid)?;
        let Some(image) = self.template_inspect(template_id).await? else {
            return Ok(None);
        };
        // Not checked here (see the module docs): unknown reads as in use (rule 4).
        let in_use = true;
        Ok(Some(self.template_from_inspect(template_id, image, in_use)))
    }

    async fn list_templates(&self, id_prefix: Option<&str>) -> ProviderResult<Vec<Template>> {
        let containers = match self.all_containers().await {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::warn!(error = %e, "template use unknown; reporting every template in use");
                None
            }
        };
        self.templates_used_by(id_prefix, containers.as_deref())
            .await
    }

    /// Removes the tag after checking every container; superseded captures of the same id
    /// that nothing uses any more go with it.
    async fn remove_template(&self, template_id: &str) -> ProviderResult<()> {
        validate::resource_name("template", template_id).map_err(ProviderError::invalid)?;
        let Some(image) = self.template_inspect(template_id).await? else {
            return Ok(());
        };
        let containers = self.all_containers().await?;
        let image_id = image.id.unwrap_or_default();
        let users = template_users(template_id, &image_id, &containers);
        if !users.is_empty() {
            return Err(ProviderError::conflict(format!(
                "template {template_id} still backs {}; destroy those sandboxes (stopped ones count) before \
                 removing it",
                users.join(", ")
            )));
        }
        let docker = self.engine().await?;
        let options = RemoveImageOptionsBuilder::default().force(false).build();
        match docker
            .remove_image(&self.template_image(template_id), Some(options), None)
            .await
        {
            Ok(_) => {}
            Err(e) if is_not_found(&e) => {}
            Err(e) if status_of(&e) == Some(409) => {
                return Err(ProviderError::conflict(format!(
                    "template {template_id} cannot be removed: {e}"
                )));
            }
            Err(e) => return Err(map_err(&format!("removing template {template_id}"), e)),
        }

        let filters = HashMap::from([
            (
                "label".to_string(),
                vec![format!("{TEMPLATE_ID_LABEL}={template_id}")],
            ),
            ("dangling".to_string(), vec!["true".to_string()]),
        ]);
        let options = ListImagesOptionsBuilder::default()
            .filters(&filters)
            .build();
        if let Ok(stale) = docker.list_images(Some(options)).await {
            for old in stale {
                if template_users(template_id, &old.id, &containers).is_empty() {
                    self.remove_unused_image(&old.id).await;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn copy_plan_finds_what_commit_misses() {
        // Capture path on a volume, capture path on the rootfs, mount below a capture path.
        let plan = copy_plan(
            &s(&["/data/app", "/etc/conf", "/workspace"]),
            &s(&["/data", "/workspace/cache", "/other"]),
        );
        assert_eq!(
            plan,
            vec![
                Copy {
                    path: "/data/app".into(),
                    scaffold: vec![]
                },
                Copy {
                    path: "/workspace/cache".into(),
                    scaffold: vec![]
                },
            ]
        );
        // Deep path on a volume: the directories between the mount and it are scaffolded.
        let plan = copy_plan(&s(&["/data/a/b/c"]), &s(&["/data"]));
        assert_eq!(plan[0].scaffold, s(&["data/a", "data/a/b"]));
        // A mount equal to a capture path; nested copies collapse; prefix is not a parent.
        let plan = copy_plan(
            &s(&["/data", "/data/x"]),
            &s(&["/data", "/data/x/y", "/database"]),
        );
        assert_eq!(plan.len(), 1);
        assert_eq!(plan[0].path, "/data");
        assert!(copy_plan(&s(&["/dat"]), &s(&["/data"])).is_empty());
    }

    #[test]
    fn template_users_match_image_or_label() {
        let c = |name: &str, image: &str, template: Option<&str>| ContainerSummary {
            names: Some(vec![format!("/{name}")]),
            image_id: Some(image.into()),
            labels: Some(
                template
                    .map(|t| HashMap::from([(TEMPLATE.to_string(), t.to_string())]))
                    .unwrap_or_default(),
            ),
            ..Default::default()
        };
        let containers = vec![
            c("a", "sha256:1", None),
            c("b", "sha256:old", Some("t")),
            c("c", "sha256:2", Some("other")),
        ];
        assert_eq!(template_users("t", "sha256:1", &containers), s(&["a", "b"]));
        assert!(template_users("x", "sha256:9", &containers).is_empty());
    }
}
