//! The volumes capability: named volumes that outlive sandboxes. Attachment (rule 4) and
//! idempotent removal (rule 5) are checked in `rules`.

use sandbox_operator::provider::labels::OWNER_UID;
use sandbox_operator::provider::{ErrorKind, VolumeInfo, VolumeMount, VolumeQuery};

use super::Fixture;
use super::support::{Check, OrFail, expect_kind, running_from, sh, unique_hex};

/// A volume name every provider accepts: lowercase letters and digits, 14 characters.
pub fn volume_name() -> String {
    format!("cv{}", &unique_hex()[..12])
}

fn mount(volume: &str) -> VolumeMount {
    VolumeMount {
        volume_name: volume.to_string(),
        mount_path: "/data".into(),
        read_only: false,
    }
}

fn names(listed: Vec<VolumeInfo>) -> Vec<String> {
    let mut names: Vec<String> = listed.into_iter().map(|v| v.name).collect();
    names.sort();
    names
}

/// Creation is idempotent for the owner and `Conflict` for anyone else; data written by one
/// sandbox is read by the next; a held volume cannot be removed (the refusal names the
/// holder); a missing volume is never silently created by a mount; listing filters by
/// prefix, labels and attachment.
pub async fn capability_volumes(fx: &Fixture) -> Check {
    let Some(volumes) = fx.provider.volumes() else {
        ensure!(
            !fx.expect.volumes,
            "volumes() is None but the provider declares it"
        );
        return Ok(());
    };
    ensure!(
        fx.expect.volumes,
        "volumes() is Some but the provider declares none"
    );
    let base = volume_name();
    let (vol, spare) = (format!("{base}a"), format!("{base}b"));
    let owner = fx.owner("SandboxVolume");
    let made = volumes
        .create_volume(&vol, &owner.labels())
        .await
        .or_fail("create_volume")?;
    ensure!(made.name == vol && !made.attached, "a new volume: {made:?}");
    let again = volumes
        .create_volume(&vol, &owner.labels())
        .await
        .or_fail("creating it again for the same owner")?;
    if !fx.expect.unlabelled_volumes {
        ensure!(
            again.labels.get(OWNER_UID) == Some(&owner.uid),
            "labels: {:?}",
            again.labels
        );
        expect_kind(
            volumes
                .create_volume(&vol, &fx.owner("SandboxVolume").labels())
                .await,
            &[ErrorKind::Conflict],
            "creating it for another owner",
        )?;
    }
    let absent = volumes
        .get_volume(&volume_name())
        .await
        .or_fail("get_volume")?;
    ensure!(absent.is_none(), "an absent volume reads as {absent:?}");

    // Data outlives the sandbox that wrote it.
    let mut request = fx.request();
    request.volumes = vec![mount(&vol)];
    let writer = running_from(fx, &request).await?;
    sh(fx, &writer, "echo kept > /data/conf-file").await?;
    fx.provider.stop(&writer).await.or_fail("stop")?;
    let refused = volumes.remove_volume(&vol).await;
    expect_kind(
        refused.clone(),
        &[ErrorKind::Conflict],
        "removing a held volume",
    )?;
    if let Err(e) = refused {
        ensure!(
            e.message().contains(&writer),
            "the refusal does not name {writer}: {e}"
        );
    }
    fx.provider.destroy(&writer).await.or_fail("destroy")?;
    let info = volumes.get_volume(&vol).await.or_fail("get_volume")?;
    ensure!(
        info.as_ref().is_some_and(|v| !v.attached),
        "destroy keeps a named volume, detached: {info:?}"
    );
    let mut request = fx.request();
    request.volumes = vec![mount(&vol)];
    let reader = running_from(fx, &request).await?;
    let kept = sh(fx, &reader, "cat /data/conf-file").await?;
    ensure!(kept == "kept\n", "the next sandbox reads {kept:?}");

    // Listing.
    let mut labels = fx.owner("SandboxVolume").labels();
    labels.insert("tier".into(), "spare".into());
    volumes
        .create_volume(&spare, &labels)
        .await
        .or_fail("create_volume")?;
    let query = |attached| VolumeQuery {
        name_prefix: Some(base.clone()),
        labels: if fx.expect.unlabelled_volumes {
            Default::default()
        } else {
            fx.instance_labels()
        },
        attached,
    };
    let both = names(
        volumes
            .list_volumes(&query(None))
            .await
            .or_fail("list_volumes")?,
    );
    ensure!(
        both == vec![vol.clone(), spare.clone()],
        "by prefix: {both:?}"
    );
    let held = volumes
        .list_volumes(&query(Some(true)))
        .await
        .or_fail("list_volumes")?;
    ensure!(
        held.len() == 1 && held[0].name == vol && held[0].attached_to == vec![reader.clone()],
        "attached only: {held:?}"
    );
    let free = names(
        volumes
            .list_volumes(&query(Some(false)))
            .await
            .or_fail("list_volumes")?,
    );
    ensure!(free == vec![spare.clone()], "unattached only: {free:?}");
    if !fx.expect.unlabelled_volumes {
        let mut by_label = fx.instance_labels();
        by_label.insert("tier".into(), "spare".into());
        let query = VolumeQuery {
            labels: by_label,
            ..Default::default()
        };
        let got = names(volumes.list_volumes(&query).await.or_fail("list_volumes")?);
        ensure!(got == vec![spare.clone()], "by label: {got:?}");
    }

    // A mount of a volume that does not exist creates neither sandbox nor volume.
    let missing = volume_name();
    let mut request = fx.request();
    request.volumes = vec![mount(&missing)];
    let result = fx.provider.create(&request).await;
    expect_kind(
        result,
        &[ErrorKind::NotFound, ErrorKind::Invalid],
        "mounting an absent volume",
    )?;
    let made = volumes.get_volume(&missing).await.or_fail("get_volume")?;
    ensure!(
        made.is_none(),
        "mounting an absent volume created it: {made:?}"
    );
    let left = fx
        .provider
        .find(&fx.owner_query(&request.owner))
        .await
        .or_fail("find")?;
    ensure!(left.is_empty(), "a refused create left {left:?}");

    fx.provider.destroy(&reader).await.or_fail("destroy")?;
    volumes.remove_volume(&vol).await.or_fail("remove_volume")?;
    let gone = volumes.get_volume(&vol).await.or_fail("get_volume")?;
    ensure!(gone.is_none(), "a removed volume reads as {gone:?}");
    Ok(())
}
