//! The contract rules of DESIGN.md, one check each. Rule 11 (template restore is the
//! security boundary) is pinned by `tests/template_restore.rs`, which drives the
//! controller-side restore against hostile archives; it is not a property of a provider.

use std::time::Duration;

use sandbox_operator::provider::{
    CommitRequest, EgressState, ErrorKind, ExecRequest, Resources, StartedAt, VolumeMount,
    VolumeQuery,
};

use super::Fixture;
use super::support::{
    Check, OrFail, create, describe, expect_kind, ids, mentions, random_bytes, running, sh,
    sha256_hex, stop_or_refused, unique_hex, wait_until,
};

/// Rule 1: an enumeration that could not look is `Err`; `[]` only ever means "looked, found
/// none". Same for listing a directory.
pub async fn rule_01_enumerations_fail_when_they_cannot_look(fx: &Fixture) -> Check {
    let down = &fx.unreachable;
    let transient = [ErrorKind::Transient];
    expect_kind(
        down.find(&fx.query()).await,
        &transient,
        "rule 1: find on an unreachable provider",
    )?;
    expect_kind(
        down.inventory(&fx.instance_labels()).await,
        &transient,
        "rule 1: inventory on an unreachable provider",
    )?;
    if fx.expect.volumes {
        let volumes = down
            .volumes()
            .ok_or("unreachable provider lacks volumes()")?;
        let query = VolumeQuery {
            labels: fx.instance_labels(),
            ..Default::default()
        };
        expect_kind(
            volumes.list_volumes(&query).await,
            &transient,
            "rule 1: list_volumes on an unreachable provider",
        )?;
    }
    if fx.expect.templates {
        let templates = down
            .templates()
            .ok_or("unreachable provider lacks templates()")?;
        expect_kind(
            templates.list_templates(None).await,
            &transient,
            "rule 1: list_templates on an unreachable provider",
        )?;
    }

    // A lookup that could not look is not "absent" either.
    let id = format!("sbx-{}", unique_hex());
    expect_kind(
        down.describe(&id).await,
        &transient,
        "rule 1: describe on an unreachable provider",
    )?;
    expect_kind(
        down.destroy(&id).await,
        &transient,
        "rule 1: destroy on an unreachable provider (absent = success only when it looked)",
    )?;

    if let Some(faults) = &fx.faults {
        refused_enumerations_fail(fx, faults.as_ref()).await?;
    }

    // Looked, found none: an empty answer from the live provider.
    let found = fx
        .provider
        .find(&fx.query())
        .await
        .or_fail("rule 1: find")?;
    ensure!(found.is_empty(), "rule 1: a fresh instance finds {found:?}");
    let inventory = fx
        .provider
        .inventory(&fx.instance_labels())
        .await
        .or_fail("rule 1: inventory")?;
    ensure!(
        inventory.sandboxes.is_empty()
            && inventory.volumes.iter().flatten().next().is_none()
            && inventory.templates.iter().flatten().next().is_none(),
        "rule 1: a fresh instance's inventory holds {inventory:?}"
    );
    ensure!(
        inventory.volumes.is_some() == fx.provider.volumes().is_some()
            && inventory.templates.is_some() == fx.provider.templates().is_some(),
        "rule 1: an inventory's parts say None exactly where the capability is absent: {inventory:?}"
    );
    if let Some(volumes) = fx.provider.volumes() {
        let query = VolumeQuery {
            labels: fx.instance_labels(),
            ..Default::default()
        };
        let listed = volumes.list_volumes(&query).await.or_fail("list_volumes")?;
        ensure!(
            listed.is_empty(),
            "rule 1: a fresh instance lists {listed:?}"
        );
    }
    if let Some(templates) = fx.provider.templates() {
        let prefix = format!("absent-{}", unique_hex());
        let listed = templates
            .list_templates(Some(&prefix))
            .await
            .or_fail("list_templates")?;
        ensure!(
            listed.is_empty(),
            "rule 1: templates under {prefix}: {listed:?}"
        );
    }
    if let Some(files) = fx.provider.files() {
        let id = running(fx).await?;
        sh(fx, &id, "mkdir -p /tmp/conf-empty").await?;
        let listed = files
            .list_dir(&id, "/tmp/conf-empty")
            .await
            .or_fail("list_dir")?;
        ensure!(
            listed.is_empty(),
            "rule 1: an empty directory lists {listed:?}"
        );
        expect_kind(
            files.list_dir(&id, "/tmp/conf-absent/dir").await,
            &[ErrorKind::NotFound],
            "rule 1: list_dir of an absent directory",
        )?;
    }
    Ok(())
}

/// Rule 1 on a provider whose service answers every request with a server error: each
/// enumeration is `Err`, and works again once the service heals.
async fn refused_enumerations_fail(fx: &Fixture, faults: &dyn super::Faults) -> Check {
    let p = &fx.provider;
    let volume_query = VolumeQuery {
        labels: fx.instance_labels(),
        ..Default::default()
    };
    faults.fail_all().await;
    let mut outcome = expect_kind(
        p.find(&fx.query()).await,
        &[ErrorKind::Transient],
        "rule 1: find while the service fails",
    );
    if outcome.is_ok() {
        outcome = expect_kind(
            p.inventory(&fx.instance_labels()).await,
            &[ErrorKind::Transient],
            "rule 1: inventory while the service fails",
        );
    }
    if let (Ok(()), Some(volumes)) = (&outcome, p.volumes()) {
        outcome = expect_kind(
            volumes.list_volumes(&volume_query).await,
            &[ErrorKind::Transient],
            "rule 1: list_volumes while the service fails",
        );
    }
    if let (Ok(()), Some(templates)) = (&outcome, p.templates()) {
        outcome = expect_kind(
            templates.list_templates(None).await,
            &[ErrorKind::Transient],
            "rule 1: list_templates while the service fails",
        );
    }
    faults.heal().await;
    outcome?;
    p.find(&fx.query())
        .await
        .or_fail("find once the service healed")?;
    Ok(())
}

/// Rule 2: reading an absent file is an error, never empty bytes; bytes cross unchanged.
pub async fn rule_02_absent_files_are_errors_and_bytes_cross_unchanged(fx: &Fixture) -> Check {
    let Some(files) = fx.provider.files() else {
        ensure!(
            !fx.expect.files,
            "files() is None but the provider declares it"
        );
        return Ok(());
    };
    ensure!(
        fx.expect.files,
        "files() is Some but the provider declares none"
    );
    let id = running(fx).await?;
    expect_kind(
        files.read_file(&id, "/tmp/conf-no/such/file").await,
        &[ErrorKind::NotFound],
        "rule 2: read of an absent file",
    )?;
    let gone = format!("sbx-{}", unique_hex());
    expect_kind(
        files.read_file(&gone, "/etc/hostname").await,
        &[ErrorKind::NotFound],
        "rule 2: read in an absent sandbox",
    )?;
    sh(fx, &id, ": > /tmp/conf-empty-file").await?;
    let empty = files
        .read_file(&id, "/tmp/conf-empty-file")
        .await
        .or_fail("read")?;
    ensure!(empty.is_empty(), "rule 2: an empty file read as {empty:?}");

    let all_bytes: Vec<u8> = (0..=255u8).collect();
    let blob = random_bytes(1 << 20, 0x5eed);
    let text = b"\xEF\xBB\xBFline one\r\nline two\r\n\r\nno newline at end".to_vec();
    for (path, data) in [
        ("/tmp/conf-bytes/all.bin", &all_bytes),
        ("/tmp/conf-bytes/blob.bin", &blob),
        ("/tmp/conf-bytes/crlf-bom.txt", &text),
    ] {
        files
            .write_file(&id, path, data, 0o644)
            .await
            .or_fail(&format!("write {path}"))?;
        let back = files
            .read_file(&id, path)
            .await
            .or_fail(&format!("read {path}"))?;
        ensure!(
            back == *data,
            "rule 2: {path}: {} bytes written, {} different bytes read back",
            data.len(),
            back.len()
        );
        let inside = sh(fx, &id, &format!("sha256sum {path} | cut -d' ' -f1")).await?;
        ensure!(
            inside.trim() == sha256_hex(data),
            "rule 2: {path}: the bytes inside the sandbox differ from those written"
        );
    }
    sh(
        fx,
        &id,
        "printf '\\000\\001\\377\\r\\n' > /tmp/conf-bytes/inside",
    )
    .await?;
    let back = files
        .read_file(&id, "/tmp/conf-bytes/inside")
        .await
        .or_fail("read")?;
    ensure!(
        back == b"\x00\x01\xff\r\n",
        "rule 2: bytes written inside read back as {back:?}"
    );
    Ok(())
}

/// Rule 3: `get_template` is `Ok(None)` only when the template is genuinely absent; a
/// lookup that failed is `Err`.
pub async fn rule_03_get_template_is_none_only_when_absent(fx: &Fixture) -> Check {
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
    let absent = format!("ct-{}", unique_hex());
    let got = templates
        .get_template(&absent)
        .await
        .or_fail("get_template")?;
    ensure!(got.is_none(), "rule 3: an absent template reads as {got:?}");
    let down = fx
        .unreachable
        .templates()
        .ok_or("unreachable provider lacks templates()")?;
    expect_kind(
        down.get_template(&absent).await,
        &[ErrorKind::Transient],
        "rule 3: get_template on an unreachable provider",
    )?;

    let source = create(fx, &fx.request()).await?.id;
    let id = format!("ct-{}", unique_hex());
    templates
        .commit(&CommitRequest {
            sandbox_id: source,
            template_id: id.clone(),
            capture_paths: vec![],
            label: None,
            owner: fx.owner("SandboxTemplate"),
            env: Default::default(),
            secret_files: Vec::new(),
        })
        .await
        .or_fail("commit")?;
    let got = templates.get_template(&id).await.or_fail("get_template")?;
    ensure!(
        got.as_ref().is_some_and(|t| t.id == id),
        "rule 3: a committed template reads as {got:?}"
    );
    Ok(())
}

/// Rule 4: attachment counts every sandbox holding a volume, never-started and stopped
/// ones included (unknown reads as attached); template use counts every sandbox booted
/// from it (unknown reads as in use).
pub async fn rule_04_unknown_attachment_and_use_read_as_in_use(fx: &Fixture) -> Check {
    ensure!(
        fx.provider.volumes().is_some() == fx.expect.volumes,
        "volumes() presence differs from the declared set"
    );
    ensure!(
        fx.provider.templates().is_some() == fx.expect.templates,
        "templates() presence differs from the declared set"
    );
    if let Some(volumes) = fx.provider.volumes() {
        let vol = format!("cv{}", &unique_hex()[..12]);
        volumes
            .create_volume(&vol, &fx.owner("SandboxVolume").labels())
            .await
            .or_fail("create_volume")?;
        let mut request = fx.request();
        request.volumes = vec![VolumeMount {
            volume_name: vol.clone(),
            mount_path: "/data".into(),
            read_only: false,
        }];
        let id = create(fx, &request).await?.id;
        let info = volumes.get_volume(&vol).await.or_fail("get_volume")?;
        let info = info.ok_or("rule 4: the volume vanished")?;
        ensure!(
            info.attached && info.attached_to.contains(&id),
            "rule 4: a volume held by a never-started sandbox {id} reads as {info:?}"
        );
        fx.provider.start(&id).await.or_fail("start")?;
        fx.provider.stop(&id).await.or_fail("stop")?;
        let info = volumes.get_volume(&vol).await.or_fail("get_volume")?;
        let info = info.ok_or("rule 4: the volume vanished")?;
        ensure!(
            info.attached && info.attached_to.contains(&id),
            "rule 4: a volume held by a stopped sandbox {id} reads as {info:?}"
        );
        let query = VolumeQuery {
            labels: fx.instance_labels(),
            attached: Some(false),
            ..Default::default()
        };
        let free = volumes.list_volumes(&query).await.or_fail("list_volumes")?;
        ensure!(
            free.iter().all(|v| v.name != vol),
            "rule 4: list_volumes(attached=false) offers a held volume: {free:?}"
        );
    }
    if let Some(templates) = fx.provider.templates() {
        let source = create(fx, &fx.request()).await?.id;
        let tid = format!("ct-{}", unique_hex());
        templates
            .commit(&CommitRequest {
                sandbox_id: source,
                template_id: tid.clone(),
                capture_paths: vec![],
                label: None,
                owner: fx.owner("SandboxTemplate"),
                env: Default::default(),
                secret_files: Vec::new(),
            })
            .await
            .or_fail("commit")?;
        let mut request = fx.request();
        request.template = Some(tid.clone());
        create(fx, &request).await?;
        let got = templates.get_template(&tid).await.or_fail("get_template")?;
        ensure!(
            got.as_ref().is_some_and(|t| t.in_use),
            "rule 4: a template backing a never-started sandbox reads as {got:?}"
        );
        let listed = templates
            .list_templates(Some(&tid))
            .await
            .or_fail("list_templates")?;
        ensure!(
            listed.iter().all(|t| t.in_use) && !listed.is_empty(),
            "rule 4: list_templates says {listed:?}"
        );
    }
    Ok(())
}

/// Rule 5: destroy and template/volume removal are idempotent (absent = success); removal of
/// an in-use template is refused, decided by checking.
pub async fn rule_05_destroy_and_removal_are_idempotent(fx: &Fixture) -> Check {
    let p = &fx.provider;
    let request = fx.request();
    let id = create(fx, &request).await?.id;
    p.start(&id).await.or_fail("start")?;
    p.destroy(&id).await.or_fail("rule 5: destroy")?;
    let after = p.describe(&id).await.or_fail("describe")?;
    ensure!(
        after.is_none(),
        "rule 5: destroyed sandbox still described: {after:?}"
    );
    let found = p
        .find(&fx.owner_query(&request.owner))
        .await
        .or_fail("find")?;
    ensure!(
        found.is_empty(),
        "rule 5: destroyed sandbox still found: {found:?}"
    );
    p.destroy(&id)
        .await
        .or_fail("rule 5: destroying it again")?;
    p.destroy(&format!("sbx-{}", unique_hex()))
        .await
        .or_fail("rule 5: destroying an id that never existed")?;

    if let Some(volumes) = p.volumes() {
        let vol = format!("cv{}", &unique_hex()[..12]);
        volumes
            .remove_volume(&vol)
            .await
            .or_fail("rule 5: removing an absent volume")?;
    }
    let Some(templates) = p.templates() else {
        return Ok(());
    };
    let absent = format!("ct-{}", unique_hex());
    templates
        .remove_template(&absent)
        .await
        .or_fail("rule 5: removing an absent template")?;
    let source = create(fx, &fx.request()).await?.id;
    let tid = format!("ct-{}", unique_hex());
    templates
        .commit(&CommitRequest {
            sandbox_id: source,
            template_id: tid.clone(),
            capture_paths: vec![],
            label: None,
            owner: fx.owner("SandboxTemplate"),
            env: Default::default(),
            secret_files: Vec::new(),
        })
        .await
        .or_fail("commit")?;
    let mut request = fx.request();
    request.template = Some(tid.clone());
    let user = create(fx, &request).await?.id;
    let refused = templates.remove_template(&tid).await;
    expect_kind(
        refused.clone(),
        &[ErrorKind::Conflict],
        "rule 5: removing an in-use template",
    )?;
    if let Err(e) = refused {
        ensure!(
            e.message().contains(&user),
            "rule 5: the refusal does not name the sandbox {user} that holds it: {e}"
        );
    }
    let still = templates.get_template(&tid).await.or_fail("get_template")?;
    ensure!(
        still.is_some(),
        "rule 5: a refused removal removed the template"
    );
    p.destroy(&user).await.or_fail("destroy")?;
    templates
        .remove_template(&tid)
        .await
        .or_fail("remove_template")?;
    templates
        .remove_template(&tid)
        .await
        .or_fail("rule 5: removing it again")?;
    let gone = templates.get_template(&tid).await.or_fail("get_template")?;
    ensure!(
        gone.is_none(),
        "rule 5: removed template still there: {gone:?}"
    );
    Ok(())
}

/// Rule 6: `started_at = Never` means never started (wreckage of an interrupted create), and
/// nothing else: a stopped sandbox keeps its start time.
pub async fn rule_06_started_at_none_means_never_started(fx: &Fixture) -> Check {
    let p = &fx.provider;
    let request = fx.request();
    let created = create(fx, &request).await?;
    let id = created.id.clone();
    ensure!(
        created.started_at == StartedAt::Never,
        "rule 6: create must not start the sandbox, and the provider knows it: {created:?}"
    );
    ensure!(
        created.state == sandbox_operator::provider::SandboxState::Creating,
        "rule 6: a created, never-started sandbox is Creating, got {:?}",
        created.state
    );
    let found = p
        .find(&fx.owner_query(&request.owner))
        .await
        .or_fail("find")?;
    ensure!(
        found.len() == 1 && found[0].started_at.time().is_none(),
        "rule 6: find must not claim a start for the never-started sandbox: {found:?}"
    );
    p.start(&id).await.or_fail("start")?;
    let started = describe(fx, &id).await?;
    ensure!(
        started.started_at.has_run(),
        "rule 6: a started sandbox reads as never started: {started:?}"
    );
    if let (Some(created), Some(began)) = (started.created_at, started.started_at.time()) {
        ensure!(
            began >= created,
            "rule 6: started before it was created: {started:?}"
        );
    }
    if !stop_or_refused(fx, &id).await? {
        return Ok(());
    }
    let stopped = describe(fx, &id).await?;
    ensure!(
        stopped.state == sandbox_operator::provider::SandboxState::Stopped
            && stopped.started_at.has_run(),
        "rule 6: a stopped sandbox is not never-started: {stopped:?}"
    );
    let found = p
        .find(&fx.owner_query(&request.owner))
        .await
        .or_fail("find")?;
    ensure!(
        found.len() == 1 && found[0].started_at.has_run(),
        "rule 6: find must agree with describe on a stopped sandbox: {found:?}"
    );
    Ok(())
}

/// The identity of a background process the suite starts inside a sandbox: its start time
/// and command line, or `None` when it no longer runs. Compared before and after a
/// hibernation to learn what really happened.
pub async fn process_identity(fx: &Fixture, id: &str, pid: &str) -> Result<Option<String>, String> {
    // A process that ends between the test and the reads is one that no longer runs: the
    // reads' errors are dropped, and what they printed decides.
    let script = format!(
        "if [ -r /proc/{pid}/stat ]; then cut -d' ' -f22 /proc/{pid}/stat; \
         tr '\\0' ' ' < /proc/{pid}/cmdline; fi 2>/dev/null; true"
    );
    let out = sh(fx, id, &script).await?;
    Ok((!out.trim().is_empty() && out.contains("conf-ticker")).then_some(out))
}

/// Starts a ticker process in the background (as a workload would) and returns its pid.
pub async fn start_ticker(fx: &Fixture, id: &str) -> Result<String, String> {
    let script = "nohup sh -c 'while :; do date +%s%N > /tmp/conf-tick; sleep 0.2; done' \
                  conf-ticker > /dev/null 2>&1 & echo $!";
    let pid = sh(fx, id, script).await?.trim().to_string();
    ensure!(
        pid.parse::<u32>().is_ok(),
        "no pid from the ticker: {pid:?}"
    );
    wait_until("the ticker to run", fx.patience, || async {
        process_identity(fx, id, &pid)
            .await?
            .ok_or_else(|| "not running yet".to_string())
    })
    .await?;
    Ok(pid)
}

/// Rule 7: hibernate and resume report what happened (`processes_preserved`), not what was
/// attempted: the claim is checked against whether a workload process really survived.
pub async fn rule_07_hibernation_reports_what_happened(fx: &Fixture) -> Check {
    let Some(hib) = fx.provider.hibernation() else {
        ensure!(
            !fx.expect.hibernation,
            "hibernation() is None but the provider declares it"
        );
        return Ok(());
    };
    ensure!(
        fx.expect.hibernation,
        "hibernation() is Some but the provider declares none"
    );
    let id = running(fx).await?;
    let pid = start_ticker(fx, &id).await?;
    let before = process_identity(fx, &id, &pid).await?;

    let slept = hib.hibernate(&id).await.or_fail("hibernate")?;
    let woke = hib.resume(&id).await.or_fail("resume")?;
    wait_until(
        "the sandbox to run commands after resume",
        fx.patience,
        || sh(fx, &id, "true"),
    )
    .await?;
    let after = process_identity(fx, &id, &pid).await?;
    let survived = after.is_some() && after == before;
    ensure!(
        woke.processes_preserved == survived,
        "rule 7: resume claims processes_preserved = {} but the workload {} ({slept:?}, {woke:?})",
        woke.processes_preserved,
        if survived { "survived" } else { "is gone" }
    );
    ensure!(
        slept.processes_preserved || !woke.processes_preserved,
        "rule 7: hibernate said the processes were lost, resume says they came back: \
         {slept:?}, {woke:?}"
    );

    // A stopped sandbox has nothing to preserve, whatever the mechanism would do.
    fx.provider.stop(&id).await.or_fail("stop")?;
    let slept = hib
        .hibernate(&id)
        .await
        .or_fail("hibernate a stopped sandbox")?;
    ensure!(
        !slept.processes_preserved,
        "rule 7: hibernating a stopped sandbox claims its processes were preserved: {slept:?}"
    );
    let woke = hib.resume(&id).await.or_fail("resume")?;
    ensure!(
        !woke.processes_preserved,
        "rule 7: resuming a stopped sandbox claims its processes were preserved: {woke:?}"
    );
    wait_until("the resumed sandbox to run commands", fx.patience, || {
        sh(fx, &id, "true")
    })
    .await?;
    Ok(())
}

/// Rule 8: a headroom field that could not be measured is absent, never zero; a probe that
/// could not look at all is `Err`.
pub async fn rule_08_unmeasured_capacity_is_absent_never_zero(fx: &Fixture) -> Check {
    let Some(probe) = fx.provider.capacity() else {
        ensure!(
            !fx.expect.capacity,
            "capacity() is None but the provider declares it"
        );
        return Ok(());
    };
    ensure!(
        fx.expect.capacity,
        "capacity() is Some but the provider declares none"
    );
    let c = probe.capacity().await.or_fail("capacity")?;
    for (field, value) in [
        ("disk_bytes", c.disk_bytes),
        ("inodes", c.inodes),
        ("memory_bytes", c.memory_bytes),
    ] {
        ensure!(
            value != Some(0),
            "rule 8: {field} is Some(0); an unmeasured field is None: {c:?}"
        );
    }
    ensure!(
        !c.detail.trim().is_empty(),
        "rule 8: no detail says what was measured: {c:?}"
    );
    let down = fx
        .unreachable
        .capacity()
        .ok_or("unreachable provider lacks capacity()")?;
    expect_kind(
        down.capacity().await,
        &[ErrorKind::Transient],
        "rule 8: capacity of an unreachable provider",
    )
}

/// Rule 9: the egress verdict is an observation, never the requested configuration.
pub async fn rule_09_egress_verdict_is_an_observation(fx: &Fixture) -> Check {
    let Some(egress) = fx.provider.egress() else {
        ensure!(
            !fx.expect.egress,
            "egress() is None but the provider declares it"
        );
        return Ok(());
    };
    ensure!(
        fx.expect.egress,
        "egress() is Some but the provider declares none"
    );
    // Unrestricted: whatever is observed, it is never "filtered".
    let open = running(fx).await?;
    let v = egress
        .egress_verdict(&open)
        .await
        .or_fail("egress_verdict")?;
    ensure!(
        v.state != EgressState::Filtered,
        "rule 9: an unrestricted sandbox reads as filtered: {v:?}"
    );
    // Never started: there is nothing to observe, so the requested cut-off is not a verdict.
    let mut request = fx.request();
    if fx.expect.no_egress {
        request.allowed_domains = Some(vec![]);
    }
    let idle = create(fx, &request).await?.id;
    match egress.egress_verdict(&idle).await {
        Ok(v) => ensure!(
            v.state == EgressState::Inconclusive,
            "rule 9: a never-started sandbox cannot be observed, yet reads as {v:?}"
        ),
        Err(e) => ensure!(
            !e.is(ErrorKind::NotFound),
            "rule 9: a never-started sandbox is not absent: {e}"
        ),
    }
    if fx.expect.no_egress {
        fx.provider.start(&idle).await.or_fail("start")?;
        wait_until("the sandbox to run commands", fx.patience, || {
            sh(fx, &idle, "true")
        })
        .await?;
        let v = egress
            .egress_verdict(&idle)
            .await
            .or_fail("egress_verdict")?;
        ensure!(
            v.state == EgressState::Filtered,
            "rule 9: a running sandbox with no egress allowed reads as {v:?}"
        );
    }
    Ok(())
}

/// One field of rule 10, set on a fresh request.
struct Probe {
    field: &'static str,
    enforced: bool,
    set: fn(&mut sandbox_operator::provider::CreateRequest),
}

/// Rule 10: a field the provider cannot enforce is refused (naming the field) and leaves
/// nothing behind; a field it accepts is stored as asked.
pub async fn rule_10_unenforceable_fields_are_refused(fx: &Fixture) -> Check {
    let e = &fx.expect;
    let probes = [
        Probe {
            field: "command",
            enforced: e.command,
            set: |r| {
                r.command = Some(
                    [
                        "sh",
                        "-c",
                        "trap 'exit 0' TERM; echo ran > /tmp/conf-cmd; while :; do sleep 0.1; done",
                    ]
                    .iter()
                    .map(|s| s.to_string())
                    .collect(),
                )
            },
        },
        Probe {
            field: "cpu",
            enforced: e.cpu,
            set: |r| r.resources.cpu_millis = Some(500),
        },
        Probe {
            field: "memory",
            enforced: e.memory,
            set: |r| r.resources.memory_bytes = Some(256 << 20),
        },
        Probe {
            field: "pids",
            enforced: e.pids,
            set: |r| r.resources.pids = Some(128),
        },
        Probe {
            field: "egress",
            enforced: e.domain_egress,
            set: |r| r.allowed_domains = Some(vec!["example.com".into()]),
        },
        Probe {
            field: "egress",
            enforced: e.no_egress,
            set: |r| r.allowed_domains = Some(vec![]),
        },
    ];
    for probe in probes {
        let mut request = fx.request();
        (probe.set)(&mut request);
        let result = fx.provider.create(&request).await;
        if probe.enforced {
            let d = result.or_fail(&format!("rule 10: create with {} set", probe.field))?;
            accepted_as_asked(fx, &request, &d, probe.field).await?;
            continue;
        }
        expect_kind(
            result.clone(),
            &[ErrorKind::Unsupported, ErrorKind::Invalid],
            &format!("rule 10: create with an unenforceable {}", probe.field),
        )?;
        if let Err(err) = result {
            ensure!(
                mentions(err.message(), probe.field),
                "rule 10: the refusal does not name the field {}: {err}",
                probe.field
            );
        }
        let left = fx
            .provider
            .find(&fx.owner_query(&request.owner))
            .await
            .or_fail("find")?;
        ensure!(left.is_empty(), "rule 10: a refused create left {left:?}");
    }
    // Disk is advisory: refused, or stored with an honest `disk_enforced`.
    let mut request = fx.request();
    request.resources = Resources {
        disk_bytes: Some(1 << 30),
        ..Default::default()
    };
    match fx.provider.create(&request).await {
        Ok(d) => ensure!(
            d.resources.disk_bytes == Some(1 << 30),
            "rule 10: an accepted disk request is not reported: {:?}",
            d.resources
        ),
        Err(err) => ensure!(
            (err.is(ErrorKind::Unsupported) || err.is(ErrorKind::Invalid))
                && mentions(err.message(), "disk"),
            "rule 10: a refused disk request must be Unsupported/Invalid naming disk: {err}"
        ),
    }
    Ok(())
}

/// What an accepted rule-10 field must look like afterwards.
async fn accepted_as_asked(
    fx: &Fixture,
    request: &sandbox_operator::provider::CreateRequest,
    d: &sandbox_operator::provider::SandboxDescriptor,
    field: &str,
) -> Check {
    let (asked, got) = (&request.resources, &d.resources);
    match field {
        "command" => {
            ensure!(
                d.command == request.command,
                "rule 10: command stored as {:?}, asked {:?}",
                d.command,
                request.command
            );
            fx.provider.start(&d.id).await.or_fail("start")?;
            wait_until("the requested main process to run", fx.patience, || async {
                let out = fx
                    .provider
                    .exec(
                        &d.id,
                        &ExecRequest::shell("cat /tmp/conf-cmd", Duration::from_secs(10)),
                    )
                    .await
                    .map_err(|e| e.to_string())?;
                (String::from_utf8_lossy(&out.stdout) == "ran\n")
                    .then_some(())
                    .ok_or_else(|| format!("{out:?}"))
            })
            .await
        }
        "cpu" => {
            ensure!(
                got.cpu_millis == asked.cpu_millis,
                "rule 10: cpu stored as {got:?}"
            );
            Ok(())
        }
        "memory" => {
            ensure!(
                got.memory_bytes == asked.memory_bytes,
                "rule 10: memory stored as {got:?}"
            );
            Ok(())
        }
        "pids" => {
            ensure!(got.pids == asked.pids, "rule 10: pids stored as {got:?}");
            Ok(())
        }
        _ => {
            let found = fx
                .provider
                .find(&fx.owner_query(&request.owner))
                .await
                .or_fail("find")?;
            ensure!(
                ids(&found) == vec![d.id.clone()],
                "rule 10: an accepted {field} create is not found as {}: {found:?}",
                d.id
            );
            Ok(())
        }
    }
}
