//! The templates capability: capture a sandbox's filesystem, boot from it, replace it.
//! Absent-versus-failed lookups (rule 3), in-use accounting (rule 4) and idempotent,
//! checked removal (rule 5) are in `rules`; the restore boundary (rule 11) is pinned by
//! `tests/template_restore.rs`.

use sandbox_operator::provider::labels::OWNER_UID;
use sandbox_operator::provider::{CommitRequest, ErrorKind};

use super::Fixture;
use super::support::{Check, OrFail, create, expect_kind, running, running_from, sh, unique_hex};

/// A template id every provider accepts.
pub fn template_id() -> String {
    format!("ct-{}", unique_hex())
}

/// A commit captures the files under its capture paths; a sandbox booted from the template
/// has them and says which template it booted from; re-committing the same id replaces it;
/// capture paths that are absent or not clean are refused.
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
    let source = running(fx).await?;
    sh(
        fx,
        &source,
        "mkdir -p /opt/conf && echo first > /opt/conf/file",
    )
    .await?;
    let id = template_id();
    let owner = fx.owner("SandboxTemplate");
    let commit = |paths: Vec<&str>| CommitRequest {
        sandbox_id: source.clone(),
        template_id: id.clone(),
        capture_paths: paths.into_iter().map(String::from).collect(),
        label: Some("conformance".into()),
        owner: owner.clone(),
    };
    let first = templates
        .commit(&commit(vec!["/opt/conf"]))
        .await
        .or_fail("commit")?;
    ensure!(
        first.id == id
            && !first.reference.is_empty()
            && first.label.as_deref() == Some("conformance")
            && first.labels.get(OWNER_UID) == Some(&owner.uid),
        "the committed template: {first:?}"
    );
    let got = templates.get_template(&id).await.or_fail("get_template")?;
    ensure!(
        got.as_ref().is_some_and(|t| t.reference == first.reference),
        "get_template after commit: {got:?}"
    );
    let listed = templates
        .list_templates(Some(&id))
        .await
        .or_fail("list_templates")?;
    ensure!(
        listed.len() == 1 && listed[0].id == id,
        "list_templates: {listed:?}"
    );

    let mut request = fx.request();
    request.template = Some(id.clone());
    let booted = create(fx, &request).await?;
    ensure!(
        booted.template_ref.as_deref() == Some(id.as_str()),
        "a sandbox booted from {id} reports template_ref {:?}",
        booted.template_ref
    );
    let booted = running_from_existing(fx, &booted.id).await?;
    let content = sh(fx, &booted, "cat /opt/conf/file").await?;
    ensure!(content == "first\n", "the booted sandbox reads {content:?}");

    // Re-committing the same id replaces the capture.
    sh(fx, &source, "echo second > /opt/conf/file").await?;
    let second = templates
        .commit(&commit(vec!["/opt/conf"]))
        .await
        .or_fail("re-commit")?;
    ensure!(
        second.reference != first.reference,
        "a re-commit kept the old capture: {second:?}"
    );
    let listed = templates
        .list_templates(Some(&id))
        .await
        .or_fail("list_templates")?;
    ensure!(
        listed.len() == 1,
        "a re-commit left two templates: {listed:?}"
    );
    let mut request = fx.request();
    request.template = Some(id.clone());
    let rebooted = running_from(fx, &request).await?;
    let content = sh(fx, &rebooted, "cat /opt/conf/file").await?;
    ensure!(
        content == "second\n",
        "a sandbox from the re-commit reads {content:?}"
    );

    // Capture paths are checked before anything is captured.
    let bad = template_id();
    for path in ["/conf/no/such/dir", "/opt/../etc", "relative/path"] {
        let request = CommitRequest {
            template_id: bad.clone(),
            ..commit(vec![path])
        };
        let result = templates.commit(&request).await;
        expect_kind(
            result,
            &[ErrorKind::Invalid],
            &format!("commit of capture path {path:?}"),
        )?;
    }
    let none = templates.get_template(&bad).await.or_fail("get_template")?;
    ensure!(none.is_none(), "a refused commit left {none:?}");
    Ok(())
}

/// Starts an already created sandbox and waits until it runs commands.
async fn running_from_existing(fx: &Fixture, id: &str) -> Result<String, String> {
    fx.provider.start(id).await.or_fail("start")?;
    super::support::wait_until("the sandbox to run commands", fx.patience, || {
        sh(fx, id, "true")
    })
    .await?;
    Ok(id.to_string())
}
