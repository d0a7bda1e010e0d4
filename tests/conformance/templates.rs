//! The templates capability: capture a sandbox's filesystem, boot from it, replace it.
//! Absent-versus-failed lookups (rule 3), in-use accounting (rule 4) and idempotent,
//! checked removal (rule 5) are in `rules`; the restore boundary (rule 11) is pinned by
//! `tests/template_restore.rs`.

use sandbox_operator::provider::labels::OWNER_UID;
use sandbox_operator::provider::{CommitRequest, ErrorKind, Templates, VolumeMount};

use super::Fixture;
use super::support::{
    Check, OrFail, create, expect_kind, running_from, sh, unique_hex, wait_until,
};
use super::volumes::volume_name;

/// A template id every provider accepts.
pub fn template_id() -> String {
    format!("ct-{}", unique_hex())
}

/// What the source sandbox holds: a file on its root filesystem, and — when the provider
/// has volumes — files on a mounted volume, only some of them under a capture path.
const SOURCE_FILES: &str = "mkdir -p /opt/conf && echo first > /opt/conf/file";
const VOLUME_FILES: &str = "mkdir -p /data/project/sub && echo on-volume > /data/project/sub/file \
                            && echo not-captured > /data/elsewhere";

/// A commit captures the files under its capture paths, also those on a mounted volume
/// that the native capture would miss; a sandbox booted from the template has exactly those
/// and says which template it booted from; re-committing the same id (from a stopped
/// sandbox, too) replaces it; capture paths that are absent or not clean are refused.
pub async fn capability_templates(fx: &Fixture) -> Check {
    let Some(templates) = fx.provider.templates() else {
        ensure!(
            !fx.expect.templates,
            "templates() is None but the provider declares it"
        );
        return Ok(());
    };
    ensure!(
        fx.expect.templates,
        "templates() is Some but the provider declares none"
    );
    let mut request = fx.request();
    let mut paths = vec!["/opt/conf".to_string()];
    if let Some(volumes) = fx.provider.volumes() {
        let vol = volume_name();
        let owner = fx.owner("SandboxVolume");
        volumes
            .create_volume(&vol, &owner.labels())
            .await
            .or_fail("create_volume")?;
        request.volumes = vec![VolumeMount {
            volume_name: vol,
            mount_path: "/data".into(),
            read_only: false,
        }];
        paths.push("/data/project".into());
    }
    let source = running_from(fx, &request).await?;
    sh(fx, &source, SOURCE_FILES).await?;
    if !request.volumes.is_empty() {
        sh(fx, &source, VOLUME_FILES).await?;
    }
    let commit = CommitRequest {
        sandbox_id: source.clone(),
        template_id: template_id(),
        capture_paths: paths,
        label: Some("conformance".into()),
        owner: fx.owner("SandboxTemplate"),
        env: Default::default(),
        secret_files: Vec::new(),
    };
    let first = committed(templates, &commit).await?;
    boots_with(
        fx,
        &commit.template_id,
        "first\n",
        !request.volumes.is_empty(),
    )
    .await?;

    // Re-committing the same id replaces the capture, also from a stopped sandbox.
    sh(fx, &source, "echo second > /opt/conf/file").await?;
    fx.provider.stop(&source).await.or_fail("stop")?;
    let second = committed(templates, &commit).await?;
    ensure!(
        second.reference != first.reference,
        "a re-commit kept the old capture: {second:?}"
    );
    ensure!(
        second.in_use,
        "the sandbox booted from the first capture still uses this id: {second:?}"
    );
    boots_with(
        fx,
        &commit.template_id,
        "second\n",
        !request.volumes.is_empty(),
    )
    .await?;
    refuses_bad_capture_paths(templates, &commit).await
}

/// Commits `commit` and checks what the provider reports for it.
async fn committed(
    templates: &dyn Templates,
    commit: &CommitRequest,
) -> Result<sandbox_operator::provider::Template, String> {
    let id = &commit.template_id;
    let t = templates.commit(commit).await.or_fail("commit")?;
    ensure!(
        t.id == *id
            && !t.reference.is_empty()
            && t.label.as_deref() == Some("conformance")
            && t.labels.get(OWNER_UID) == Some(&commit.owner.uid),
        "the committed template: {t:?}"
    );
    let got = templates.get_template(id).await.or_fail("get_template")?;
    ensure!(
        got.as_ref().is_some_and(|g| g.reference == t.reference),
        "get_template after commit: {got:?}"
    );
    let listed = templates
        .list_templates(Some(id))
        .await
        .or_fail("list_templates")?;
    ensure!(
        listed.len() == 1 && listed[0].reference == t.reference,
        "list_templates after commit (one per id): {listed:?}"
    );
    Ok(t)
}

/// Boots a sandbox (without any volume) from template `id` and checks the captured files.
async fn boots_with(fx: &Fixture, id: &str, rootfs: &str, from_volume: bool) -> Check {
    let mut request = fx.request();
    request.template = Some(id.to_string());
    let booted = create(fx, &request).await?;
    ensure!(
        booted.template_ref.as_deref() == Some(id),
        "a sandbox booted from {id} reports template_ref {:?}",
        booted.template_ref
    );
    let booted = booted.id;
    fx.provider.start(&booted).await.or_fail("start")?;
    wait_until("the sandbox to run commands", fx.patience, || {
        sh(fx, &booted, "true")
    })
    .await?;
    let content = sh(fx, &booted, "cat /opt/conf/file").await?;
    ensure!(content == rootfs, "the booted sandbox reads {content:?}");
    if from_volume {
        let script = "cat /data/project/sub/file; test -e /data/elsewhere && echo leaked || true";
        let content = sh(fx, &booted, script).await?;
        ensure!(
            content == "on-volume\n",
            "a captured volume path must be in the template, nothing else from the volume: \
             {content:?}"
        );
    }
    Ok(())
}

/// Capture paths are checked before anything is captured.
async fn refuses_bad_capture_paths(templates: &dyn Templates, commit: &CommitRequest) -> Check {
    let bad = template_id();
    for path in ["/conf/no/such/dir", "/opt/../etc", "relative/path"] {
        let request = CommitRequest {
            template_id: bad.clone(),
            capture_paths: vec![path.to_string()],
            ..commit.clone()
        };
        let result = templates.commit(&request).await;
        expect_kind(
            result.clone(),
            &[ErrorKind::Invalid],
            &format!("commit of capture path {path:?}"),
        )?;
        if let Err(e) = result {
            ensure!(
                e.message().contains(path),
                "the refusal does not name the capture path {path:?}: {e}"
            );
        }
    }
    let none = templates.get_template(&bad).await.or_fail("get_template")?;
    ensure!(none.is_none(), "a refused commit left {none:?}");
    Ok(())
}
