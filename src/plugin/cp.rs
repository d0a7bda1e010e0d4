//! `cp`: a file or a tree, with its modes, into or out of a Sandbox over the `files`
//! subresource (GET: a tar of a path rooted at its last segment; PUT: a tar extracted at a
//! directory).
//!
//! The destination names the copy, as with `cp -r`: `cp dir ns/sbx:/tmp/x` makes `/tmp/x` a
//! copy of `dir`, and a destination that ends in `/` (or, locally, is an existing directory)
//! receives the copy under the source's own name. What comes out of a sandbox is tenant data:
//! it passes the project's one tar sanitiser ([`crate::provider::tarsafe`]) and must stay
//! under the one top-level name asked for before anything is written locally.

use std::path::{Path, PathBuf};

use http::Request;
use http_body_util::BodyExt;
use kube::client::Body;

use super::api::Subresource;
use super::cli::CpArgs;
use super::connect::{At, Target, send, send_streaming};
use super::errors::PluginError;
use super::pack::packed_body;
use crate::provider::tarsafe;

/// One side of a `cp`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// A local path.
    Local(PathBuf),
    /// `[NS/]NAME:PATH` in a Sandbox.
    Remote {
        /// The namespace, when given (else `-n` / the context's).
        ns: Option<String>,
        /// The Sandbox.
        name: String,
        /// The absolute path inside it.
        path: String,
    },
}

/// Reads one `cp` operand: `[NS/]NAME:PATH` is remote; anything starting with `/`, `.` or `~`,
/// or without a `:` after a valid name, is a local path (so `./a:b` stays local).
pub fn parse_location(s: &str) -> Result<Location, PluginError> {
    let local = || Ok(Location::Local(PathBuf::from(s)));
    if s.starts_with(['/', '.', '~']) {
        return local();
    }
    let Some((object, path)) = s.split_once(':') else {
        return local();
    };
    let (ns, name) = match object.split_once('/') {
        Some((ns, name)) => (Some(ns), name),
        None => (None, object),
    };
    if !ns.is_none_or(is_dns_name) || !is_dns_name(name) {
        return local();
    }
    if !path.starts_with('/') {
        return Err(PluginError::Usage(format!(
            "{s:?}: the path in the Sandbox must be absolute (e.g. {object}:/tmp/{path})"
        )));
    }
    Ok(Location::Remote {
        ns: ns.map(str::to_string),
        name: name.to_string(),
        path: path.to_string(),
    })
}

fn is_dns_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

/// A remote path split into the directory a tar is extracted at (or read from) and the
/// name of its one top-level member; `/` itself has no such name.
pub fn split_remote(path: &str) -> Result<(String, String), PluginError> {
    let trimmed = path.trim_end_matches('/');
    let (dir, base) = trimmed.rsplit_once('/').unwrap_or(("", trimmed));
    if base.is_empty() || base == "." || base == ".." {
        return Err(PluginError::Usage(format!(
            "{path:?}: name a file or directory below / in the Sandbox"
        )));
    }
    let dir = if dir.is_empty() { "/" } else { dir };
    Ok((dir.to_string(), base.to_string()))
}

/// The remote path an upload of `local` to `path` creates (a trailing `/` means "into").
pub fn upload_destination(local: &Path, path: &str) -> Result<String, PluginError> {
    if !path.ends_with('/') {
        return Ok(path.to_string());
    }
    let base = local_name(local)?;
    Ok(format!("{path}{base}"))
}

fn local_name(local: &Path) -> Result<String, PluginError> {
    let canonical = std::fs::canonicalize(local)
        .map_err(|e| PluginError::local(format!("reading {}", local.display()), e))?;
    canonical
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| PluginError::Usage(format!("{}: name a file or directory", local.display())))
}

/// `cp`: decides the direction and copies.
pub async fn cp(target: &Target, args: &CpArgs) -> Result<i32, PluginError> {
    match (parse_location(&args.src)?, parse_location(&args.dst)?) {
        (Location::Local(local), Location::Remote { ns, name, path }) => {
            let ns = ns.unwrap_or_else(|| target.namespace.clone());
            upload(target, &ns, &name, &local, &path).await?;
        }
        (Location::Remote { ns, name, path }, Location::Local(local)) => {
            let ns = ns.unwrap_or_else(|| target.namespace.clone());
            download(target, &ns, &name, &path, &local).await?;
        }
        _ => {
            return Err(PluginError::Usage(
                "one side of cp must be local and the other [NS/]NAME:/PATH in a Sandbox".into(),
            ));
        }
    }
    Ok(0)
}

/// Packs `local` under the remote destination's name and PUTs it at its directory, sending
/// the archive while it is packed.
async fn upload(
    target: &Target,
    ns: &str,
    name: &str,
    local: &Path,
    path: &str,
) -> Result<(), PluginError> {
    let destination = upload_destination(local, path)?;
    let (dir, base) = split_remote(&destination)?;
    let at = At {
        ns,
        name,
        sub: Subresource::Files,
    };
    let (body, packing) = packed_body(local.to_path_buf(), base);
    let request = Request::put(at.url(&[("path", dir)]))
        .header(http::header::CONTENT_TYPE, "application/x-tar")
        .body(body)
        .map_err(|e| PluginError::Usage(format!("building the request: {e}")))?;
    let sent = send_streaming(target, at, request).await;
    let packed = packing
        .await
        .map_err(|e| PluginError::Transport(format!("packing: {e}")))?;
    match (sent, packed) {
        // The request stopped reading: its answer says why.
        (Err(refused), Err(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(refused),
        // A local failure explains a broken upload better than the answer to it does.
        (_, Err(e)) => Err(PluginError::local(
            format!("packing {}", local.display()),
            e,
        )),
        (sent, Ok(())) => sent,
    }
}

/// GETs the remote path's tar and extracts it as `local`.
async fn download(
    target: &Target,
    ns: &str,
    name: &str,
    path: &str,
    local: &Path,
) -> Result<(), PluginError> {
    let (_, root) = split_remote(path)?;
    let at = At {
        ns,
        name,
        sub: Subresource::Files,
    };
    let remote = path.trim_end_matches('/').to_string();
    let request = Request::get(at.url(&[("path", remote)]))
        .body(Body::from(Vec::new()))
        .map_err(|e| PluginError::Usage(format!("building the request: {e}")))?;
    let response = send(target, at, request).await?;
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| PluginError::Transport(format!("the download broke: {e}")))?
        .to_bytes();
    let local = local.to_path_buf();
    tokio::task::spawn_blocking(move || unpack(&body, &root, &local))
        .await
        .map_err(|e| PluginError::Transport(format!("unpacking: {e}")))?
}

/// Where a download of `root` lands for the operand `local`: inside it when it is an
/// existing directory or ends in `/`, else `local` itself.
pub fn download_destination(local: &Path, root: &str) -> PathBuf {
    let into = local.as_os_str().to_string_lossy().ends_with('/') || local.is_dir();
    if into {
        local.join(root)
    } else {
        local.to_path_buf()
    }
}

/// Sanitises `archive`, checks that everything in it is under `root`, and extracts it so that
/// `root` becomes [`download_destination`].
pub fn unpack(archive: &[u8], root: &str, local: &Path) -> Result<(), PluginError> {
    let safe = tarsafe::sanitise(archive, "")
        .map_err(|e| PluginError::Remote(format!("refusing the Sandbox's archive: {e}")))?;
    if !safe.report.dropped.is_empty() {
        eprintln!("skipped (not copied): {}", safe.report.dropped.join(", "));
    }
    only_under(&safe.archive, root)?;
    let destination = download_destination(local, root);
    let parent = match destination.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if destination.file_name().is_some_and(|n| n == root) {
        return extract(&safe.archive, &parent);
    }
    let staging = parent.join(format!(".kubectl-sandbox-cp-{}", fastrand::u64(..)));
    std::fs::create_dir(&staging)
        .map_err(|e| PluginError::local(format!("creating {}", staging.display()), e))?;
    let placed = extract(&safe.archive, &staging).and_then(|()| {
        std::fs::rename(staging.join(root), &destination)
            .map_err(|e| PluginError::local(format!("writing {}", destination.display()), e))
    });
    let _ = std::fs::remove_dir_all(&staging);
    placed
}

/// Refuses an archive with any member outside `root/` (a sandbox answering with more than it
/// was asked for).
fn only_under(archive: &[u8], root: &str) -> Result<(), PluginError> {
    let bad =
        |e: std::io::Error| PluginError::Remote(format!("reading the Sandbox's archive: {e}"));
    let mut reader = tar::Archive::new(archive);
    for entry in reader.entries().map_err(bad)? {
        let entry = entry.map_err(bad)?;
        let path = entry.path().map_err(bad)?.into_owned();
        if path
            .components()
            .next()
            .is_none_or(|c| c.as_os_str() != root)
        {
            return Err(PluginError::Remote(format!(
                "refusing the Sandbox's archive: {} is not under {root}/",
                path.display()
            )));
        }
    }
    Ok(())
}

/// Extracts a sanitised archive into `dir`, modes and mtimes kept (ownership never).
fn extract(archive: &[u8], dir: &Path) -> Result<(), PluginError> {
    let mut reader = tar::Archive::new(archive);
    reader.set_preserve_permissions(true);
    reader.set_preserve_mtime(true);
    reader
        .unpack(dir)
        .map_err(|e| PluginError::local(format!("extracting into {}", dir.display()), e))
}

#[cfg(test)]
mod tests {
    use super::super::pack::pack;
    use super::*;

    fn remote(ns: Option<&str>, name: &str, path: &str) -> Location {
        Location::Remote {
            ns: ns.map(str::to_string),
            name: name.into(),
            path: path.into(),
        }
    }

    #[test]
    fn operands_are_remote_only_with_a_valid_name_and_a_colon() {
        let p = |s| parse_location(s).unwrap();
        assert_eq!(
            p("team-a/demo:/tmp/x"),
            remote(Some("team-a"), "demo", "/tmp/x")
        );
        assert_eq!(p("demo:/tmp/x"), remote(None, "demo", "/tmp/x"));
        assert_eq!(p("./a:b"), Location::Local("./a:b".into()));
        assert_eq!(p("/abs/path"), Location::Local("/abs/path".into()));
        assert_eq!(p("file.txt"), Location::Local("file.txt".into()));
        assert_eq!(p("C Drive:/x"), Location::Local("C Drive:/x".into()));
        assert!(parse_location("demo:tmp/x").is_err());
    }

    #[test]
    fn remote_paths_split_into_directory_and_top_level_name() {
        assert_eq!(split_remote("/tmp/x").unwrap(), ("/tmp".into(), "x".into()));
        assert_eq!(
            split_remote("/tmp/x/").unwrap(),
            ("/tmp".into(), "x".into())
        );
        assert_eq!(split_remote("/x").unwrap(), ("/".into(), "x".into()));
        assert!(split_remote("/").is_err());
        assert!(split_remote("/tmp/..").is_err());
    }

    fn mode(p: &Path) -> u32 {
        use std::os::unix::fs::PermissionsExt;
        std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
    }

    fn chmod(p: &Path, m: u32) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    }

    #[test]
    fn a_packed_tree_unpacks_under_a_new_name_with_its_modes() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        std::fs::create_dir_all(src.join("sub")).unwrap();
        std::fs::write(src.join("run.sh"), b"#!/bin/sh\n").unwrap();
        std::fs::write(src.join("sub/secret"), b"s").unwrap();
        std::os::unix::fs::symlink("run.sh", src.join("link")).unwrap();
        chmod(&src.join("run.sh"), 0o755);
        chmod(&src.join("sub/secret"), 0o600);
        chmod(&src.join("sub"), 0o750);
        let archive = pack(&src, "tree").unwrap();
        let out = dir.path().join("copy");
        unpack(&archive, "tree", &out).unwrap();
        assert_eq!(mode(&out.join("run.sh")), 0o755);
        assert_eq!(mode(&out.join("sub/secret")), 0o600);
        assert_eq!(mode(&out.join("sub")), 0o750);
        assert_eq!(
            std::fs::read_link(out.join("link")).unwrap(),
            Path::new("run.sh")
        );
        // Into an existing directory: under the source's own name, merged.
        unpack(&archive, "tree", dir.path()).unwrap();
        assert_eq!(
            std::fs::read(dir.path().join("tree/sub/secret")).unwrap(),
            b"s"
        );
    }

    #[test]
    fn a_sandbox_archive_with_more_than_was_asked_or_setuid_bits_is_tamed() {
        let dir = tempfile::tempdir().unwrap();
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(1);
        h.set_mode(0o4755);
        b.append_data(&mut h, "tree/suid", &b"x"[..]).unwrap();
        let suid = b.into_inner().unwrap();
        unpack(&suid, "tree", &dir.path().join("t")).unwrap();
        assert_eq!(mode(&dir.path().join("t/suid")), 0o755);
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(1);
        h.set_mode(0o644);
        b.append_data(&mut h, "other/file", &b"x"[..]).unwrap();
        let e = unpack(&b.into_inner().unwrap(), "tree", &dir.path().join("u")).unwrap_err();
        assert!(
            e.to_string().contains("other/file is not under tree/"),
            "{e}"
        );
        assert!(!dir.path().join("other").exists() && !dir.path().join("u").exists());
    }

    #[test]
    fn a_trailing_slash_copies_into() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("data.bin");
        std::fs::write(&f, b"x").unwrap();
        assert_eq!(upload_destination(&f, "/tmp/").unwrap(), "/tmp/data.bin");
        assert_eq!(upload_destination(&f, "/tmp/y").unwrap(), "/tmp/y");
        assert_eq!(download_destination(dir.path(), "x"), dir.path().join("x"));
        let new = dir.path().join("new");
        assert_eq!(download_destination(&new, "x"), new);
    }
}
