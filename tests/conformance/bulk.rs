//! The bulk files capability: directory trees as tar, out and in.

use std::collections::BTreeMap;
use std::io::Read;

use futures::StreamExt;
use sandbox_operator::provider::{BulkFiles, ErrorKind, whole_archive};

use super::Fixture;
use super::support::{Check, OrFail, random_bytes, running, sh};

async fn export_all(bulk: &dyn BulkFiles, id: &str, path: &str) -> Result<Vec<u8>, String> {
    let mut stream = bulk
        .export(id, path)
        .await
        .or_fail(&format!("export {path}"))?;
    let mut out = Vec::new();
    while let Some(chunk) = stream.next().await {
        out.extend_from_slice(&chunk.or_fail("export stream")?);
    }
    Ok(out)
}

/// Member path → content of every regular file (directories map to empty content).
fn tar_listing(archive: &[u8]) -> Result<BTreeMap<String, Vec<u8>>, String> {
    let mut ar = tar::Archive::new(archive);
    let mut out = BTreeMap::new();
    for entry in ar.entries().map_err(|e| format!("not a tar: {e}"))? {
        let mut entry = entry.map_err(|e| format!("bad tar member: {e}"))?;
        let mut data = Vec::new();
        entry.read_to_end(&mut data).map_err(|e| e.to_string())?;
        let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        out.insert(name, data);
    }
    Ok(out)
}

/// A raw tar member with any name (the tar crate refuses to write hostile ones).
fn raw_member(out: &mut Vec<u8>, name: &str, kind: tar::EntryType, mode: u32, data: &[u8]) {
    let mut h = tar::Header::new_old();
    h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_uid(1234);
    h.set_gid(1234);
    h.set_mtime(1_700_000_000);
    h.set_size(data.len() as u64);
    h.set_cksum();
    out.extend_from_slice(h.as_bytes());
    out.extend_from_slice(data);
    out.extend(std::iter::repeat_n(0u8, (512 - data.len() % 512) % 512));
}

fn symlink_member(out: &mut Vec<u8>, name: &str, target: &str) {
    let mut h = tar::Header::new_old();
    h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
    h.as_old_mut().linkname[..target.len()].copy_from_slice(target.as_bytes());
    h.set_entry_type(tar::EntryType::Symlink);
    h.set_mode(0o777);
    h.set_size(0);
    h.set_mtime(1_700_000_000);
    h.set_cksum();
    out.extend_from_slice(h.as_bytes());
}

fn finish(mut out: Vec<u8>) -> Vec<u8> {
    out.extend(std::iter::repeat_n(0u8, 1024));
    out
}

/// Export is rooted at the path's last segment and import of it into `dirname` reproduces
/// the tree byte for byte; an absent path is `NotFound`; import never restores setuid,
/// setgid or ownership, and refuses (whole) archives with `..`, absolute or
/// through-a-symlink members, and uploads that break before their end.
pub async fn capability_bulk_files(fx: &Fixture) -> Check {
    let Some(bulk) = fx.provider.bulk_files() else {
        ensure!(
            !fx.expect.bulk_files,
            "bulk_files() is None but the provider declares it"
        );
        return Ok(());
    };
    ensure!(
        fx.expect.bulk_files,
        "bulk_files() is Some but the provider declares none"
    );
    let id = running(fx).await?;
    let blob = random_bytes(300_000, 7);
    sh(
        fx,
        &id,
        "mkdir -p /tmp/conf-ws/app/src && echo 'fn main() {}' > /tmp/conf-ws/app/src/main.rs",
    )
    .await?;
    bulk.import(&id, "/tmp/conf-ws/app", whole_archive(blob_archive(&blob)?))
        .await
        .or_fail("import")?;

    let archive = export_all(bulk, &id, "/tmp/conf-ws/app").await?;
    let listing = tar_listing(&archive)?;
    ensure!(
        listing
            .keys()
            .all(|k| k == "app" || k == "app/" || k.starts_with("app/")),
        "export is rooted at app/: {:?}",
        listing.keys()
    );
    ensure!(
        listing.get("app/src/main.rs").map(Vec::as_slice) == Some(b"fn main() {}\n".as_slice()),
        "app/src/main.rs in the export: {:?}",
        listing.get("app/src/main.rs")
    );
    ensure!(
        listing.get("app/data.bin") == Some(&blob),
        "app/data.bin changed in the export"
    );

    let other = running(fx).await?;
    bulk.import(&other, "/tmp/conf-ws", whole_archive(archive))
        .await
        .or_fail("import the export")?;
    let sums = sh(
        fx,
        &other,
        "cat /tmp/conf-ws/app/src/main.rs; sha256sum /tmp/conf-ws/app/data.bin | cut -d' ' -f1",
    )
    .await?;
    ensure!(
        sums == format!("fn main() {{}}\n{}\n", super::support::sha256_hex(&blob)),
        "the imported tree differs: {sums:?}"
    );
    for (path, kind) in [
        ("/tmp/conf-ws/none", ErrorKind::NotFound),
        ("/", ErrorKind::Invalid),
    ] {
        match bulk.export(&id, path).await {
            Err(e) if e.is(kind) => {}
            Err(e) => return Err(format!("export of {path:?}: want {kind:?}, got {e}")),
            Ok(_) => return Err(format!("export of {path:?} succeeded")),
        }
    }

    // Mode bits and ownership from a tenant's archive are never honoured.
    let mut a = Vec::new();
    raw_member(&mut a, "bin/", tar::EntryType::Directory, 0o6777, b"");
    raw_member(
        &mut a,
        "bin/escalate",
        tar::EntryType::Regular,
        0o4755,
        b"#!/bin/sh\nid\n",
    );
    raw_member(&mut a, "bin/group", tar::EntryType::Regular, 0o2755, b"g");
    raw_member(&mut a, "dev-node", tar::EntryType::Char, 0o666, b"");
    bulk.import(&id, "/tmp/conf-imported", whole_archive(finish(a)))
        .await
        .or_fail("import")?;
    let modes = sh(
        fx,
        &id,
        &format!(
            "cd /tmp/conf-imported/bin && {}",
            super::files::modes_of(&[".", "escalate", "group"], "%m %U:%G")
        ),
    )
    .await?;
    let lines: Vec<&str> = modes.lines().collect();
    ensure!(
        lines.len() == 3
            && lines
                .iter()
                .all(|l| !l.starts_with('4') && !l.starts_with('2') && !l.starts_with('6'))
            && lines.iter().all(|l| !l.ends_with("1234:1234")),
        "setuid/setgid or ownership survived an import: {modes:?}"
    );
    let node = sh(
        fx,
        &id,
        "test -e /tmp/conf-imported/dev-node && echo present || echo absent",
    )
    .await?;
    ensure!(node == "absent\n", "a device node was imported: {node}");
    hostile_imports_are_refused(fx, bulk, &id).await
}

/// An archive holding `data` as `data.bin`.
fn blob_archive(data: &[u8]) -> Result<Vec<u8>, String> {
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(data.len() as u64);
    h.set_mode(0o600);
    h.set_cksum();
    b.append_data(&mut h, "data.bin", data)
        .map_err(|e| e.to_string())?;
    b.into_inner().map_err(|e| e.to_string())
}

async fn hostile_imports_are_refused(fx: &Fixture, bulk: &dyn BulkFiles, id: &str) -> Check {
    for (hostile, lands) in [
        ("../conf-escape", "/tmp/conf-escape"),
        ("/conf-abs", "/conf-abs"),
    ] {
        let mut a = Vec::new();
        raw_member(&mut a, "fine.txt", tar::EntryType::Regular, 0o644, b"fine");
        raw_member(&mut a, hostile, tar::EntryType::Regular, 0o644, b"evil");
        let result = bulk
            .import(id, "/tmp/conf-target", whole_archive(finish(a)))
            .await;
        ensure!(
            matches!(&result, Err(e) if e.is(ErrorKind::Invalid)),
            "import of a {hostile:?} member: {result:?}"
        );
        let landed = sh(
            fx,
            id,
            &format!("ls {lands} /tmp/conf-target/fine.txt 2>/dev/null | wc -l"),
        )
        .await?;
        ensure!(
            landed.trim() == "0",
            "a refused archive landed files ({hostile:?}): {landed}"
        );
    }
    let mut a = Vec::new();
    symlink_member(&mut a, "etc-link", "/etc");
    raw_member(
        &mut a,
        "etc-link/conf-evil.conf",
        tar::EntryType::Regular,
        0o644,
        b"evil",
    );
    let result = bulk
        .import(id, "/tmp/conf-target2", whole_archive(finish(a)))
        .await;
    ensure!(
        matches!(&result, Err(e) if e.is(ErrorKind::Invalid)),
        "import writing through a symlink: {result:?}"
    );
    let landed = sh(
        fx,
        id,
        "test -e /etc/conf-evil.conf && echo present || echo absent",
    )
    .await?;
    ensure!(
        landed == "absent\n",
        "a write through a symlink escaped: {landed}"
    );
    broken_imports_write_nothing(fx, bulk, id).await
}

/// An upload that breaks after whole, harmless members (the stream's `Err` item) is refused
/// and writes none of them: the archive is checked as it arrives, but written only whole.
async fn broken_imports_write_nothing(fx: &Fixture, bulk: &dyn BulkFiles, id: &str) -> Check {
    let mut a = Vec::new();
    raw_member(
        &mut a,
        "first.txt",
        tar::EntryType::Regular,
        0o644,
        b"first",
    );
    raw_member(
        &mut a,
        "second.txt",
        tar::EntryType::Regular,
        0o644,
        &[7; 4096],
    );
    let pieces = vec![
        Ok(bytes::Bytes::from(a)),
        Err(std::io::Error::other("the client went away")),
    ];
    let result = bulk
        .import(
            id,
            "/tmp/conf-broken",
            futures::stream::iter(pieces).boxed(),
        )
        .await;
    ensure!(result.is_err(), "import of a broken upload: {result:?}");
    let landed = sh(
        fx,
        id,
        "ls /tmp/conf-broken/first.txt /tmp/conf-broken/second.txt 2>/dev/null | wc -l",
    )
    .await?;
    ensure!(
        landed.trim() == "0",
        "a broken upload landed files: {landed}"
    );
    Ok(())
}
