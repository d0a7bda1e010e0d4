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
//! 2. export each such path with the archive API, rewriting the tar on the way: owner and
//!    group become root, setuid/setgid bits are dropped, extended attributes (file
//!    capabilities included) are not carried, and only files, directories and links pass;
//! 3. create a never-started helper container from the intermediate image (labelled with
//!    the template's owner, so a crash leaves sweepable wreckage), upload the archives into
//!    it, and commit that as the final tag; then remove the helper.
//!
//! Each capture path must exist in the sandbox (`Invalid` otherwise): a template silently
//! missing the project's files would boot and look healthy. The commit itself is taken with
//! the sandbox paused; the copies of mounted paths are read afterwards, live, so a sandbox
//! that keeps writing there should be stopped (or hibernated) before a commit.
//!
//! A commit carries the container's configuration (command, environment) into the image,
//! as Docker always does. Labels set on the source container (owner, caller labels, its own
//! template and disk labels) would be inherited by every sandbox booted from the template;
//! Docker's commit can only add labels, so those are blanked (set to `""`) on the image.
//!
//! Re-committing an id moves the tag; the previous image is removed when nothing uses it
//! (a sandbox still running from it keeps it alive, and it still counts as a use of the id).
//!
//! # Use
//!
//! A template is in use when any container, in any state, runs its image or was booted from
//! its id (the `sandboxes.dev/template` label). Decided by listing every container; when
//! that listing fails, `in_use` is `true` (rule 4) and removal fails instead of guessing.
//!
//! # Sharing
//!
//! `publish`/`fetch` need a template store (the S3 scheme); none is wired to the Docker
//! provider yet, so both are `Unsupported` with the setting that would enable them.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{self, Read, Write};
use std::path::{Component, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use bollard::models::{
    ContainerConfig, ContainerCreateBody, ContainerSummary, HostConfig, ImageInspect,
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
use super::volumes::summary_name;
use super::{
    CAPTURE_PATHS_LABEL, DockerProvider, TEMPLATE_ID_LABEL, TEMPLATE_LABEL_LABEL, is_not_found,
    map_err, status_of,
};
use crate::provider::labels::TEMPLATE;
use crate::provider::validate;
use crate::provider::{CommitRequest, ProviderError, ProviderResult, Template, Templates};

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

/// Rewrites a tar exported from `copy.path` (rooted at its last segment) into one rooted at
/// `/`: scaffold directories first, then every entry under the path's parent.
///
/// The security rewrite of the module docs happens here: uid/gid 0, mode `& 0o1777` (no
/// setuid/setgid), no extended attributes or PAX records, only regular files, directories,
/// symlinks and hard links; a member that is absolute or contains `..` fails the copy.
/// Returns how many entries were dropped for their type.
pub(crate) fn sanitize_archive(
    input: impl Read,
    output: impl Write,
    copy: &Copy,
) -> io::Result<usize> {
    let prefix = PathBuf::from(parent(&copy.path).trim_start_matches('/'));
    let mut builder = tar::Builder::new(output);
    let now = u64::try_from(Utc::now().timestamp()).unwrap_or(0);
    for dir in &copy.scaffold {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Directory);
        header.set_mode(0o755);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(now);
        header.set_size(0);
        builder.append_data(&mut header, format!("{dir}/"), io::empty())?;
    }
    let mut archive = tar::Archive::new(input);
    let mut dropped = 0;
    for entry in archive.entries()? {
        let mut entry = entry?;
        let member = entry.path()?.into_owned();
        if member
            .components()
            .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "archive member {} is absolute or contains '..'",
                    member.display()
                ),
            ));
        }
        let target = prefix.join(&member);
        let source = entry.header();
        let kind = source.entry_type();
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(kind);
        // A header without a readable mode gets the plain default for its kind.
        let default_mode = if kind == tar::EntryType::Directory {
            0o755
        } else {
            0o644
        };
        header.set_mode(source.mode().unwrap_or(default_mode) & 0o1777);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(source.mtime().unwrap_or(now));
        match kind {
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                header.set_entry_type(tar::EntryType::Regular);
                header.set_size(entry.size());
                builder.append_data(&mut header, &target, &mut entry)?;
            }
            tar::EntryType::Directory => {
                header.set_size(0);
                builder.append_data(&mut header, &target, io::empty())?;
            }
            tar::EntryType::Symlink => {
                let link = entry
                    .link_name()?
                    .map(|l| l.into_owned())
                    .unwrap_or_default();
                header.set_size(0);
                builder.append_link(&mut header, &target, &link)?;
            }
            tar::EntryType::Link => {
                // Hard-link targets are archive members: they move with the prefix, and may
                // not point outside the archive.
                let link = entry
                    .link_name()?
                    .map(|l| l.into_owned())
                    .unwrap_or_default();
                if link
                    .components()
                    .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
                {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("hard link {} points outside the archive", member.display()),
                    ));
                }
                header.set_size(0);
                builder.append_link(&mut header, &target, prefix.join(&link))?;
            }
            _ => dropped += 1,
        }
    }
    builder.into_inner()?.flush()?;
    Ok(dropped)
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
    async fn all_containers(&self) -> ProviderResult<Vec<ContainerSummary>> {
        let docker = self.engine().await?;
        let options = ListContainersOptionsBuilder::default().all(true).build();
        docker
            .list_containers(Some(options))
            .await
            .map_err(|e| map_err("listing sandboxes to decide template use", e))
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
            id: template_id.to_string(),
            reference: image.id.unwrap_or_default(),
            created_at: image.created.as_deref().and_then(parse_time),
            size_bytes: image.size.and_then(|s| u64::try_from(s).ok()),
            label: labels
                .get(TEMPLATE_LABEL_LABEL)
                .filter(|l| !l.is_empty())
                .cloned(),
            labels,
            in_use,
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
        let docker = self.engine().await?;
        let raw = TempFile::new("capture-raw");
        let clean = TempFile::new("capture-clean");

        let mut file = tokio::fs::File::create(&raw.0)
            .await
            .map_err(|e| io_err("creating a temporary file for a capture", e))?;
        let options = DownloadFromContainerOptionsBuilder::default()
            .path(&copy.path)
            .build();
        let mut stream = docker.download_from_container(sandbox, Some(options));
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| {
                map_err(
                    &format!(
                        "exporting capture path {} from sandbox {sandbox}",
                        copy.path
                    ),
                    e,
                )
            })?;
            file.write_all(&chunk)
                .await
                .map_err(|e| io_err("writing a capture to a temporary file", e))?;
        }
        file.flush()
            .await
            .map_err(|e| io_err("writing a capture to a temporary file", e))?;
        drop(file);

        let (raw_path, clean_path, plan) = (raw.0.clone(), clean.0.clone(), copy.clone());
        let dropped = tokio::task::spawn_blocking(move || -> io::Result<usize> {
            let input = io::BufReader::new(std::fs::File::open(raw_path)?);
            let output = io::BufWriter::new(std::fs::File::create(clean_path)?);
            sanitize_archive(input, output, &plan)
        })
        .await
        .map_err(|e| io_err("sanitising a capture archive", e))?
        .map_err(|e| {
            ProviderError::invalid(format!(
                "capture path {} of sandbox {sandbox} cannot be copied into the template: {e}",
                copy.path
            ))
        })?;
        if dropped > 0 {
            tracing::info!(path = %copy.path, dropped, "special files (devices, fifos) left out of a template");
        }

        let file = tokio::fs::File::open(&clean.0)
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
            .map_err(|e| {
                map_err(
                    &format!("copying capture path {} into the template", copy.path),
                    e,
                )
            })?;
        // The temporary files live until here: the upload has read all of `clean`.
        drop((raw, clean));
        Ok(())
    }

    /// Steps 3 of the module docs: helper container from `intermediate`, copies, final
    /// commit. The helper is removed whatever happens.
    async fn commit_with_copies(
        &self,
        request: &CommitRequest,
        intermediate: &str,
        copies: &[Copy],
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
            for copy in copies {
                self.copy_into(&request.sandbox_id, &helper, copy).await?;
            }
            let options = CommitContainerOptionsBuilder::default()
                .container(&helper)
                .repo(&self.settings.template_repository)
                .tag(&request.template_id)
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

#[async_trait]
impl Templates for DockerProvider {
    async fn commit(&self, request: &CommitRequest) -> ProviderResult<Template> {
        let id = &request.template_id;
        validate::resource_name("template", id).map_err(ProviderError::invalid)?;
        let mut capture: Vec<String> = Vec::new();
        for path in &request.capture_paths {
            validate::capture_path(path).map_err(ProviderError::invalid)?;
            capture.push(path.trim_end_matches('/').to_string());
        }
        capture.sort();
        capture.dedup();

        let docker = self.engine().await?;
        let source = self.inspect(&request.sandbox_id).await?.ok_or_else(|| {
            ProviderError::not_found(format!(
                "sandbox {} does not exist, so template {id} cannot be captured from it; fix spec.sandboxRef",
                request.sandbox_id
            ))
        })?;
        for path in &capture {
            let options = ContainerArchiveInfoOptionsBuilder::default()
                .path(path)
                .build();
            match docker
                .get_container_archive_info(&request.sandbox_id, Some(options))
                .await
            {
                Ok(_) => {}
                Err(e) if is_not_found(&e) => {
                    return Err(ProviderError::invalid(format!(
                        "capture path {path} does not exist in sandbox {}; fix spec.capturePaths (a template \
                         without it would boot into an empty workspace)",
                        request.sandbox_id
                    )));
                }
                Err(e) => return Err(map_err(&format!("checking capture path {path}"), e)),
            }
        }
        let mounts: Vec<String> = source
            .mounts
            .clone()
            .unwrap_or_default()
            .into_iter()
            .filter_map(|m| m.destination)
            .collect();
        let copies = copy_plan(&capture, &mounts);
        let previous = self.template_inspect(id).await?.and_then(|i| i.id);

        // Labels: the template's owner and id, and every label the source container carried
        // that its image did not, blanked (see the module docs).
        let mut labels: BTreeMap<String, String> = BTreeMap::new();
        let source_image_labels = match source.image.as_deref() {
            Some(image) => match docker.inspect_image(image).await {
                Ok(i) => i.config.and_then(|c| c.labels).unwrap_or_default(),
                Err(e) if is_not_found(&e) => HashMap::new(),
                Err(e) => return Err(map_err("looking up the sandbox's image", e)),
            },
            None => HashMap::new(),
        };
        for key in source
            .config
            .as_ref()
            .and_then(|c| c.labels.as_ref())
            .into_iter()
            .flatten()
            .map(|(k, _)| k)
            .filter(|k| !source_image_labels.contains_key(*k))
        {
            labels.insert(key.clone(), String::new());
        }
        labels.extend(request.owner.labels());
        labels.insert(TEMPLATE_ID_LABEL.to_string(), id.clone());
        labels.insert(
            CAPTURE_PATHS_LABEL.to_string(),
            serde_json::to_string(&capture).unwrap_or_else(|_| "[]".into()),
        );
        labels.insert(
            TEMPLATE_LABEL_LABEL.to_string(),
            request.label.clone().unwrap_or_default(),
        );
        let config = ContainerConfig {
            labels: Some(labels.into_iter().collect()),
            ..Default::default()
        };

        let comment = request.label.as_deref().unwrap_or("");
        let image_id = if copies.is_empty() {
            let options = CommitContainerOptionsBuilder::default()
                .container(&request.sandbox_id)
                .repo(&self.settings.template_repository)
                .tag(id)
                .comment(comment)
                .pause(true)
                .build();
            docker
                .commit_container(options, config)
                .await
                .map_err(|e| {
                    map_err(
                        &format!("committing sandbox {} as template {id}", request.sandbox_id),
                        e,
                    )
                })?
                .id
        } else {
            let options = CommitContainerOptionsBuilder::default()
                .container(&request.sandbox_id)
                .comment(comment)
                .pause(true)
                .build();
            let intermediate = docker
                .commit_container(options, config.clone())
                .await
                .map_err(|e| {
                    map_err(
                        &format!("committing sandbox {} as template {id}", request.sandbox_id),
                        e,
                    )
                })?
                .id;
            match self
                .commit_with_copies(request, &intermediate, &copies, &config)
                .await
            {
                Ok(image) => image,
                Err(e) => {
                    self.remove_unused_image(&intermediate).await;
                    return Err(e);
                }
            }
        };

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
        let in_use = match self.all_containers().await {
            Ok(containers) => !template_users(
                template_id,
                image.id.as_deref().unwrap_or_default(),
                &containers,
            )
            .is_empty(),
            Err(e) => {
                tracing::warn!(template = template_id, error = %e, "template use unknown; reporting in use");
                true
            }
        };
        Ok(Some(self.template_from_inspect(template_id, image, in_use)))
    }

    async fn list_templates(&self, id_prefix: Option<&str>) -> ProviderResult<Vec<Template>> {
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
        let containers = match self.all_containers().await {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::warn!(error = %e, "template use unknown; reporting every template in use");
                None
            }
        };
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
            let in_use = containers
                .as_deref()
                .is_none_or(|c| !template_users(&id, &image.id, c).is_empty());
            let labels: BTreeMap<String, String> = image.labels.into_iter().collect();
            out.push(Template {
                reference: image.id,
                created_at: DateTime::from_timestamp(image.created, 0),
                size_bytes: u64::try_from(image.size).ok(),
                label: labels
                    .get(TEMPLATE_LABEL_LABEL)
                    .filter(|l| !l.is_empty())
                    .cloned(),
                labels,
                in_use,
                id,
            });
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
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

    async fn publish(&self, template_id: &str) -> ProviderResult<()> {
        let Some((store, limits)) = self.template_store.clone() else {
            return Err(ProviderError::unsupported(format!(
                "no template store is configured for Docker provider {:?}, so template {template_id} cannot be \
                 published; set templateStore on that provider in the operator configuration",
                self.name
            )));
        };
        self.publish_to_store(template_id, &store, limits).await
    }

    async fn fetch(&self, template_id: &str) -> ProviderResult<Option<Template>> {
        let Some((store, limits)) = self.template_store.clone() else {
            return Err(ProviderError::unsupported(format!(
                "no template store is configured for Docker provider {:?}, so template {template_id} cannot be \
                 fetched; set templateStore on that provider in the operator configuration",
                self.name
            )));
        };
        self.fetch_from_store(template_id, &store, limits).await
    }
}

/// Publish and fetch through the shared S3 template store (provider-neutral transfer code in
/// [`crate::templates::transfer`]; the restore there is the security boundary).
impl DockerProvider {
    /// `publish`: a helper container booted from the template image (owned by the
    /// template's owner) archives the capture paths recorded on the image into the store;
    /// the helper is destroyed whatever happens.
    async fn publish_to_store(
        &self,
        template_id: &str,
        store: &std::sync::Arc<crate::templates::store::TemplateStore>,
        limits: crate::templates::transfer::Limits,
    ) -> ProviderResult<()> {
        validate::resource_name("template", template_id).map_err(ProviderError::invalid)?;
        let image = self.template_inspect(template_id).await?.ok_or_else(|| {
            ProviderError::not_found(format!(
                "template {template_id} does not exist on Docker provider {:?}, so it cannot be published; \
                 capture it first",
                self.name
            ))
        })?;
        let labels: BTreeMap<String, String> = image
            .config
            .and_then(|c| c.labels)
            .unwrap_or_default()
            .into_iter()
            .collect();
        let paths: Vec<String> = match labels.get(CAPTURE_PATHS_LABEL) {
            Some(json) => serde_json::from_str(json).map_err(|e| {
                ProviderError::invalid(format!(
                    "template {template_id}: the capture paths recorded on its image are unreadable ({e}); \
                     recapture it"
                ))
            })?,
            None => Vec::new(),
        };
        let owner = crate::provider::labels::Owner::from_labels(&labels).ok_or_else(|| {
            ProviderError::invalid(format!(
                "template {template_id} carries no owner labels, so no helper can be made for publishing \
                 it; recapture it through its SandboxTemplate"
            ))
        })?;
        let label = labels
            .get(TEMPLATE_LABEL_LABEL)
            .filter(|l| !l.is_empty())
            .cloned();
        // Runs to completion even when the caller stops waiting (a provider-call timeout), so
        // the helper container is still destroyed rather than left running.
        let (this, store, id) = (self.clone(), store.clone(), template_id.to_string());
        tokio::spawn(async move {
            crate::templates::transfer::publish_template(
                &this, &store, &id, &paths, label, &owner, limits,
            )
            .await
        })
        .await
        .map_err(|e| {
            ProviderError::transient(format!(
                "publishing template {template_id} was interrupted: {e}"
            ))
        })?
        .map(|_| ())
    }

    /// `fetch`: the store's archive is restored into a fresh container of the provider's
    /// default image and committed as `<template_repository>:<template id>`; a failed or
    /// refused restore destroys that container and commits nothing.
    ///
    /// The trait call names no owner, so the fetched image carries EMPTY owner labels: no
    /// sweeper claims it, and the SandboxTemplate whose id it is removes it by that id. (The
    /// SandboxTemplate controller fetches through [`crate::templates::transfer::fetch_into`]
    /// with its own owner labels instead.)
    async fn fetch_from_store(
        &self,
        template_id: &str,
        store: &std::sync::Arc<crate::templates::store::TemplateStore>,
        limits: crate::templates::transfer::Limits,
    ) -> ProviderResult<Option<Template>> {
        validate::resource_name("template", template_id).map_err(ProviderError::invalid)?;
        let Some(image) = self.settings.default_image.clone() else {
            return Err(ProviderError::invalid(format!(
                "fetching template {template_id} needs an image to restore it into, and Docker provider {:?} \
                 has none; set docker.defaultImage on that provider in the operator configuration (an image \
                 with GNU tar, gzip, find and curl)",
                self.name
            )));
        };
        let unowned = crate::provider::labels::Owner {
            instance: String::new(),
            kind: "SandboxTemplate".into(),
            namespace: String::new(),
            name: String::new(),
            uid: String::new(),
        };
        // Runs to completion even when the caller stops waiting (see publish_to_store).
        let (this, store, id) = (self.clone(), store.clone(), template_id.to_string());
        tokio::spawn(async move {
            crate::templates::transfer::fetch_into(
                &this,
                &store,
                &id,
                &unowned,
                Some(&image),
                limits,
            )
            .await
        })
        .await
        .map_err(|e| {
            ProviderError::transient(format!(
                "fetching template {template_id} was interrupted: {e}"
            ))
        })?
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

    fn entry(
        builder: &mut tar::Builder<Vec<u8>>,
        path: &str,
        kind: tar::EntryType,
        mode: u32,
        data: &[u8],
    ) {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_uid(1000);
        h.set_gid(1000);
        h.set_size(data.len() as u64);
        builder.append_data(&mut h, path, data).unwrap();
    }

    #[test]
    fn sanitised_archives_lose_ownership_and_privilege_bits() {
        let mut b = tar::Builder::new(Vec::new());
        entry(&mut b, "app/", tar::EntryType::Directory, 0o2775, b"");
        entry(
            &mut b,
            "app/run",
            tar::EntryType::Regular,
            0o4755,
            b"#!/bin/sh\n",
        );
        entry(&mut b, "app/tmp/", tar::EntryType::Directory, 0o1777, b"");
        entry(&mut b, "app/fifo", tar::EntryType::Fifo, 0o644, b"");
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        b.append_link(&mut h, "app/link", "/etc/hostname").unwrap();
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Link);
        h.set_size(0);
        b.append_link(&mut h, "app/hard", "app/run").unwrap();
        let raw = b.into_inner().unwrap();

        let copy = Copy {
            path: "/data/deep/app".into(),
            scaffold: s(&["data/deep"]),
        };
        let mut out = Vec::new();
        let dropped = sanitize_archive(&raw[..], &mut out, &copy).unwrap();
        assert_eq!(dropped, 1, "the fifo is left out");

        let mut seen = BTreeMap::new();
        for e in tar::Archive::new(&out[..]).entries().unwrap() {
            let e = e.unwrap();
            let h = e.header();
            assert_eq!(h.uid().unwrap(), 0);
            assert_eq!(h.gid().unwrap(), 0);
            assert_eq!(h.mode().unwrap() & 0o6000, 0, "no setuid/setgid");
            let link = e.link_name().unwrap().map(|l| l.display().to_string());
            seen.insert(
                e.path()
                    .unwrap()
                    .display()
                    .to_string()
                    .trim_end_matches('/')
                    .to_string(),
                (h.mode().unwrap(), link),
            );
        }
        assert_eq!(seen["data/deep"].0, 0o755);
        assert_eq!(seen["data/deep/app"].0, 0o775);
        assert_eq!(seen["data/deep/app/run"].0, 0o755);
        assert_eq!(seen["data/deep/app/tmp"].0, 0o1777, "sticky bit kept");
        assert_eq!(
            seen["data/deep/app/link"].1.as_deref(),
            Some("/etc/hostname")
        );
        assert_eq!(
            seen["data/deep/app/hard"].1.as_deref(),
            Some("data/deep/app/run")
        );
    }

    #[test]
    fn sanitising_refuses_escaping_members() {
        let mut raw = Vec::new();
        {
            // Write a header by hand: the tar builder refuses `..` itself.
            let mut h = tar::Header::new_old();
            h.as_old_mut().name[..9].copy_from_slice(b"../escape");
            h.set_entry_type(tar::EntryType::Regular);
            h.set_mode(0o644);
            h.set_size(0);
            h.set_cksum();
            raw.extend_from_slice(h.as_bytes());
            raw.extend_from_slice(&[0u8; 1024]);
        }
        let copy = Copy {
            path: "/data".into(),
            scaffold: vec![],
        };
        let err = sanitize_archive(&raw[..], Vec::new(), &copy).unwrap_err();
        assert!(err.to_string().contains(".."), "{err}");
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
