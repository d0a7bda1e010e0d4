//! The files capability: exact file I/O through the provider's file API. Absent files and
//! unchanged bytes (rule 2) are checked in `rules`.

use sandbox_operator::provider::{EntryKind, ErrorKind};

use super::Fixture;
use super::support::{Check, OrFail, expect_kind, running, sh};

/// Writes create parents and replace whole files; setuid/setgid are never written;
/// `list_dir` is one level of names with kinds and sizes; deletes remove files and trees
/// and succeed on what is absent.
pub async fn capability_files(fx: &Fixture) -> Check {
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
    let path = "/tmp/conf-new/deeper/file.txt";
    files
        .write_file(&id, path, b"a long first version of the file", 0o640)
        .await
        .or_fail("write with new parents")?;
    files
        .write_file(&id, path, b"short", 0o640)
        .await
        .or_fail("replace")?;
    let back = files.read_file(&id, path).await.or_fail("read")?;
    ensure!(
        back == b"short",
        "replaced, not appended or overlaid: {back:?}"
    );
    let modes = sh(
        fx,
        &id,
        &modes_of(
            &["/tmp/conf-new", "/tmp/conf-new/deeper", path, "/tmp"],
            "%m",
        ),
    )
    .await?;
    ensure!(
        modes == "755\n755\n640\n1777\n",
        "created parents are 755, the file as asked, an existing parent untouched: {modes:?}"
    );
    sh(
        fx,
        &id,
        "mkdir -p /tmp/conf-real && ln -s /tmp/conf-real /tmp/conf-alias",
    )
    .await?;
    files
        .write_file(&id, "/tmp/conf-alias/via-link", b"linked", 0o644)
        .await
        .or_fail("write through a symlinked parent")?;
    let through = sh(fx, &id, "cat /tmp/conf-real/via-link").await?;
    ensure!(
        through == "linked",
        "a write through a symlinked parent: {through:?}"
    );

    files
        .write_file(&id, "/tmp/conf-tool", b"#!/bin/sh\n", 0o4755)
        .await
        .or_fail("write with setuid asked")?;
    files
        .write_file(&id, "/tmp/conf-tool2", b"#!/bin/sh\n", 0o2775)
        .await
        .or_fail("write with setgid asked")?;
    let modes = sh(
        fx,
        &id,
        &modes_of(&["/tmp/conf-tool", "/tmp/conf-tool2"], "%m"),
    )
    .await?;
    ensure!(
        modes == "755\n775\n",
        "setuid/setgid must never be written: {modes:?}"
    );
    sh(
        fx,
        &id,
        "mkdir -p /tmp/conf-dir/inner && echo keep > /tmp/conf-dir/inner/f",
    )
    .await?;
    expect_kind(
        files
            .write_file(&id, "/tmp/conf-dir", b"clobber", 0o644)
            .await,
        &[ErrorKind::Invalid],
        "writing over a directory",
    )?;
    let kept = sh(fx, &id, "cat /tmp/conf-dir/inner/f").await?;
    ensure!(
        kept == "keep\n",
        "a refused write touched the directory: {kept:?}"
    );
    expect_kind(
        files
            .write_file(&id, "/tmp/conf-tool/child", b"x", 0o644)
            .await,
        &[ErrorKind::Invalid],
        "writing below a file",
    )?;
    expect_kind(
        files.write_file(&id, "/", b"x", 0o644).await,
        &[ErrorKind::Invalid],
        "writing /",
    )?;
    expect_kind(
        files.read_file(&id, "/etc").await,
        &[ErrorKind::Invalid],
        "reading a directory",
    )?;
    expect_kind(
        files.read_file(&id, "relative/path").await,
        &[ErrorKind::Invalid],
        "reading a relative path",
    )?;

    files
        .write_file(&id, "/tmp/conf-list/a.txt", b"12345", 0o644)
        .await
        .or_fail("write")?;
    files
        .write_file(&id, "/tmp/conf-list/sub/deep.txt", b"x", 0o644)
        .await
        .or_fail("write")?;
    sh(
        fx,
        &id,
        "ln -s /etc/hostname /tmp/conf-list/link && touch \"/tmp/conf-list/$(printf 'new\\nline\\ttab')\"",
    )
    .await?;
    let listed = files
        .list_dir(&id, "/tmp/conf-list")
        .await
        .or_fail("list_dir")?;
    let mut seen: Vec<(String, EntryKind)> =
        listed.iter().map(|e| (e.name.clone(), e.kind)).collect();
    seen.sort_by(|a, b| a.0.cmp(&b.0));
    ensure!(
        seen == vec![
            ("a.txt".to_string(), EntryKind::File),
            ("link".to_string(), EntryKind::Symlink),
            ("new\nline\ttab".to_string(), EntryKind::File),
            ("sub".to_string(), EntryKind::Directory),
        ],
        "one level, names only, with kinds: {listed:?}"
    );
    let a = listed
        .iter()
        .find(|e| e.name == "a.txt")
        .ok_or("a.txt is missing")?;
    ensure!(a.size == Some(5), "a.txt size: {a:?}");
    let link = listed
        .iter()
        .find(|e| e.name == "link")
        .ok_or("link is missing")?;
    ensure!(
        link.symlink_target.as_deref() == Some("/etc/hostname"),
        "symlink target: {link:?}"
    );
    expect_kind(
        files.list_dir(&id, "/tmp/conf-list/a.txt").await,
        &[ErrorKind::Invalid],
        "list_dir of a file",
    )?;

    let root = files.list_dir(&id, "/").await.or_fail("list_dir /")?;
    ensure!(
        ["etc", "tmp"]
            .iter()
            .all(|n| root.iter().any(|e| e.name == *n))
            && root.iter().all(|e| !e.name.contains('/')),
        "/ lists names (never paths), etc and tmp among them: {root:?}"
    );

    files
        .delete_path(&id, "/tmp/conf-list/a.txt")
        .await
        .or_fail("delete a file")?;
    expect_kind(
        files.read_file(&id, "/tmp/conf-list/a.txt").await,
        &[ErrorKind::NotFound],
        "read of a deleted file",
    )?;
    files
        .delete_path(&id, "/tmp/conf-list")
        .await
        .or_fail("delete a tree")?;
    expect_kind(
        files.list_dir(&id, "/tmp/conf-list").await,
        &[ErrorKind::NotFound],
        "list_dir of a deleted tree",
    )?;
    files
        .delete_path(&id, "/tmp/conf-never-existed")
        .await
        .or_fail("deleting an absent path")?;
    for root in ["/", "//", "/tmp/.."] {
        expect_kind(
            files.delete_path(&id, root).await,
            &[ErrorKind::Invalid],
            &format!("deleting {root:?}"),
        )?;
    }
    let alive = sh(fx, &id, "test -d /etc && echo alive").await?;
    ensure!(
        alive == "alive\n",
        "the sandbox survived the deletes: {alive:?}"
    );
    Ok(())
}

/// A script printing `format` (`find -printf` directives) for each path, one line each.
/// `find` rather than `stat`: coreutils' `stat` uses `statx`, which gVisor's 2022 kernel
/// answers with EINVAL on this kind of host, while `find` uses `fstatat` everywhere.
pub fn modes_of(paths: &[&str], format: &str) -> String {
    paths
        .iter()
        .map(|p| format!("find '{p}' -maxdepth 0 -printf '{format}\\n'"))
        .collect::<Vec<_>>()
        .join(" && ")
}
