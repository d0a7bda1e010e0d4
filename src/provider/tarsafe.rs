//! Re-writing a tenant-authored tar archive into one that is safe to extract.
//!
//! An archive handed to `BulkFiles::import` is caller- or tenant-authored data. Extracting it
//! verbatim would honour whatever it says: absolute member names, `..` traversal, hard links
//! to files outside the destination, setuid/setgid bits, ownership, file capabilities carried
//! as extended attributes in PAX records, device nodes. This module reads such an archive and
//! writes a NEW one that says only what is safe, so the extractor downstream (Docker's
//! archive endpoint) never sees the hostile fields at all:
//!
//! - member names that are absolute or contain a `..` component are refused (the whole
//!   archive is rejected: a partial import of a hostile archive is not a useful outcome);
//! - hard links whose target is absolute or contains `..` are refused;
//! - symbolic links are kept, but an entry whose path passes THROUGH a symlink created
//!   earlier in the same archive is refused — that is the classic "create `link -> /etc`,
//!   then write `link/passwd`" escape, and it is refused even though Docker extracts inside
//!   the container root, because the archive's author clearly did not mean a plain tree;
//! - device, fifo and PAX-global entries are dropped (and counted);
//! - permission bits are masked to `0o777` for files and directories: setuid, setgid and the
//!   sticky bit never survive;
//! - ownership is never restored: every entry is written with uid = gid = 0 and empty
//!   user/group names;
//! - nothing else from the input header crosses: PAX records (extended attributes such as
//!   `security.capability`, ACLs) are not copied, because the output headers are built from
//!   scratch. Long names and long link targets are re-encoded as GNU long-name entries.
//! - a `.` entry (the destination directory itself) is dropped, because extracting it would
//!   re-mode and re-own the destination.
//!
//! This is the boundary for `import` only. The template restore of a provider without image
//! commit (rule 11) is a separate, stronger boundary: it additionally confines extraction to
//! the manifest's capture paths and asserts the result after extraction, and must not rely on
//! this module alone.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use tar::{Archive, Builder, EntryType, Header};

/// Mode given to directories this module creates itself (the destination prefix).
const PREFIX_DIR_MODE: u32 = 0o755;

/// Why an archive was refused. The message names the offending member, for the user.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TarsafeError(pub String);

/// A sanitised archive and what was changed on the way.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Sanitised {
    /// The re-written archive (uncompressed POSIX/GNU tar).
    pub archive: Vec<u8>,
    /// Entries written (prefix directories included).
    pub entries: usize,
    /// Names of entries that were dropped (devices, fifos, `.`), for a log line.
    pub dropped: Vec<String>,
    /// How many entries had setuid/setgid/sticky bits cleared.
    pub special_bits_cleared: usize,
    /// How many entries carried a non-root owner that was not restored.
    pub ownership_reset: usize,
}

/// Splits a tar member name into its normal components.
///
/// Empty and `.` components are skipped (`./a//b` is `a/b`); an absolute name or a `..`
/// component is refused. `what` names the field for the error message.
fn components<'a>(what: &str, raw: &'a [u8]) -> Result<Vec<&'a [u8]>, TarsafeError> {
    let shown = String::from_utf8_lossy(raw);
    if raw.first() == Some(&b'/') {
        return Err(TarsafeError(format!(
            "archive {what} {shown:?} is absolute; archive members must be relative to the destination"
        )));
    }
    let mut out = Vec::new();
    for part in raw.split(|b| *b == b'/') {
        match part {
            b"" | b"." => {}
            b".." => {
                return Err(TarsafeError(format!(
                    "archive {what} {shown:?} contains a '..' component; it would escape the destination"
                )));
            }
            normal => out.push(normal),
        }
    }
    Ok(out)
}

fn join(parts: &[&[u8]]) -> Vec<u8> {
    parts.join(&b'/')
}

fn as_path(bytes: &[u8]) -> &Path {
    Path::new(OsStr::from_bytes(bytes))
}

/// Refuses a path that goes through a symlink created earlier in this archive.
fn check_not_through_symlink(
    what: &str,
    parts: &[&[u8]],
    symlinks: &HashSet<Vec<u8>>,
) -> Result<(), TarsafeError> {
    for depth in 1..parts.len() {
        let ancestor = join(&parts[..depth]);
        if symlinks.contains(&ancestor) {
            return Err(TarsafeError(format!(
                "archive {what} {:?} passes through {:?}, a symlink created earlier in the same archive; \
                 writing through a symlink is refused",
                String::from_utf8_lossy(&join(parts)),
                String::from_utf8_lossy(&ancestor)
            )));
        }
    }
    Ok(())
}

fn io_err(context: &str, e: std::io::Error) -> TarsafeError {
    TarsafeError(format!(
        "{context}: {e}; send an uncompressed POSIX tar archive"
    ))
}

/// A fresh header of the given type, owned by root, with only the fields we choose.
fn fresh_header(kind: EntryType, mode: u32, mtime: u64, size: u64) -> Header {
    let mut h = Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(mtime);
    h.set_size(size);
    h
}

/// Re-writes `input` into a safe archive, every member placed under `prefix`.
///
/// `prefix` is a relative directory path (`""` for none) whose components are emitted first as
/// directory entries (mode `0o755`, root-owned) and prepended to every member name and hard
/// link target. Callers use it to extract below directories that do not exist yet while
/// uploading at an ancestor that does.
pub fn sanitise(input: &[u8], prefix: &str) -> Result<Sanitised, TarsafeError> {
    let prefix_parts = components("destination prefix", prefix.as_bytes())?;
    let mut out = Builder::new(Vec::new());
    let mut result = Sanitised::default();
    let mut symlinks: HashSet<Vec<u8>> = HashSet::new();

    for depth in 1..=prefix_parts.len() {
        let mut h = fresh_header(EntryType::Directory, PREFIX_DIR_MODE, 0, 0);
        out.append_data(
            &mut h,
            as_path(&join(&prefix_parts[..depth])),
            std::io::empty(),
        )
        .map_err(|e| io_err("writing a prefix directory", e))?;
        result.entries += 1;
    }

    let mut archive = Archive::new(input);
    let entries = archive
        .entries()
        .map_err(|e| io_err("reading the archive", e))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| io_err("reading an archive entry", e))?;
        let raw_name = entry.path_bytes().into_owned();
        let shown = String::from_utf8_lossy(&raw_name).into_owned();
        let kind = entry.header().entry_type();

        if kind == EntryType::XGlobalHeader {
            result.dropped.push(format!("{shown} (pax global header)"));
            continue;
        }
        // PAX sparse files would be written out as their raw sparse map: refuse rather than
        // corrupt. (GNU old-style sparse entries are expanded by the reader.)
        if let Some(pax) = entry
            .pax_extensions()
            .map_err(|e| io_err("reading pax records", e))?
        {
            for record in pax {
                let record = record.map_err(|e| io_err("reading a pax record", e))?;
                if record.key_bytes().starts_with(b"GNU.sparse.") {
                    return Err(TarsafeError(format!(
                        "archive member {shown:?} uses the PAX sparse format, which is not supported; \
                         archive it without --sparse"
                    )));
                }
            }
        }

        let name_parts = components("member", &raw_name)?;
        if name_parts.is_empty() {
            result
                .dropped
                .push(format!("{shown} (the destination itself)"));
            continue;
        }
        check_not_through_symlink("member", &name_parts, &symlinks)?;
        let mut full: Vec<&[u8]> = prefix_parts.clone();
        full.extend(name_parts.iter().copied());
        let name = join(&full);
        let rel_name = join(&name_parts);

        let header = entry.header();
        let raw_mode = header
            .mode()
            .map_err(|e| io_err(&format!("reading the mode of {shown:?}"), e))?;
        let mtime = header.mtime().unwrap_or(0);
        let uid = header.uid().unwrap_or(0);
        let gid = header.gid().unwrap_or(0);
        let mode = raw_mode & 0o777;
        if raw_mode & 0o7000 != 0 {
            result.special_bits_cleared += 1;
        }
        if uid != 0 || gid != 0 {
            result.ownership_reset += 1;
        }

        match kind {
            EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => {
                let mut data = Vec::new();
                entry
                    .read_to_end(&mut data)
                    .map_err(|e| io_err(&format!("reading the content of {shown:?}"), e))?;
                let mut h = fresh_header(EntryType::Regular, mode, mtime, data.len() as u64);
                out.append_data(&mut h, as_path(&name), data.as_slice())
                    .map_err(|e| io_err(&format!("writing {shown:?}"), e))?;
                symlinks.remove(&rel_name);
            }
            EntryType::Directory => {
                let mut h = fresh_header(EntryType::Directory, mode, mtime, 0);
                out.append_data(&mut h, as_path(&name), std::io::empty())
                    .map_err(|e| io_err(&format!("writing {shown:?}"), e))?;
                symlinks.remove(&rel_name);
            }
            EntryType::Symlink => {
                let target = entry
                    .link_name_bytes()
                    .map(|t| t.into_owned())
                    .ok_or_else(|| {
                        TarsafeError(format!("archive symlink {shown:?} has no target"))
                    })?;
                if target.is_empty() || target.contains(&0) {
                    return Err(TarsafeError(format!(
                        "archive symlink {shown:?} has an empty or invalid target"
                    )));
                }
                let mut h = fresh_header(EntryType::Symlink, 0o777, mtime, 0);
                out.append_link(&mut h, as_path(&name), as_path(&target))
                    .map_err(|e| io_err(&format!("writing {shown:?}"), e))?;
                symlinks.insert(rel_name);
            }
            EntryType::Link => {
                let target = entry
                    .link_name_bytes()
                    .map(|t| t.into_owned())
                    .ok_or_else(|| {
                        TarsafeError(format!("archive hard link {shown:?} has no target"))
                    })?;
                let target_parts = components("hard link target", &target)?;
                if target_parts.is_empty() {
                    return Err(TarsafeError(format!(
                        "archive hard link {shown:?} points at the destination directory itself"
                    )));
                }
                check_not_through_symlink("hard link target", &target_parts, &symlinks)?;
                let mut full_target: Vec<&[u8]> = prefix_parts.clone();
                full_target.extend(target_parts.iter().copied());
                let mut h = fresh_header(EntryType::Link, mode, mtime, 0);
                out.append_link(&mut h, as_path(&name), as_path(&join(&full_target)))
                    .map_err(|e| io_err(&format!("writing {shown:?}"), e))?;
                symlinks.remove(&rel_name);
            }
            EntryType::Char | EntryType::Block | EntryType::Fifo => {
                result.dropped.push(format!("{shown} (device or fifo)"));
                continue;
            }
            other => {
                return Err(TarsafeError(format!(
                    "archive member {shown:?} has unsupported entry type {other:?}; \
                     only files, directories, symlinks and hard links are imported"
                )));
            }
        }
        result.entries += 1;
    }

    result.archive = out
        .into_inner()
        .map_err(|e| io_err("finishing the archive", e))?;
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes a raw header with an arbitrary (possibly hostile) name, bypassing the tar
    /// crate's own refusal to write `..` or absolute names.
    fn raw_entry(
        out: &mut Vec<u8>,
        name: &[u8],
        kind: EntryType,
        link: &[u8],
        mode: u32,
        data: &[u8],
    ) {
        let mut h = Header::new_old();
        {
            let old = h.as_old_mut();
            old.name[..name.len()].copy_from_slice(name);
            old.linkname[..link.len()].copy_from_slice(link);
        }
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_uid(1234);
        h.set_gid(1234);
        h.set_mtime(1_700_000_000);
        h.set_size(data.len() as u64);
        h.set_cksum();
        out.extend_from_slice(h.as_bytes());
        out.extend_from_slice(data);
        let pad = (512 - data.len() % 512) % 512;
        out.extend(std::iter::repeat_n(0u8, pad));
    }

    fn finish(mut out: Vec<u8>) -> Vec<u8> {
        out.extend(std::iter::repeat_n(0u8, 1024));
        out
    }

    struct Seen {
        name: String,
        kind: EntryType,
        mode: u32,
        uid: u64,
        gid: u64,
        link: Option<String>,
        data: Vec<u8>,
        pax: bool,
    }

    fn read_back(archive: &[u8]) -> Vec<Seen> {
        let mut ar = Archive::new(archive);
        ar.entries()
            .unwrap()
            .map(|e| {
                let mut e = e.unwrap();
                let pax = e.pax_extensions().unwrap().is_some();
                let h = e.header().clone();
                let mut data = Vec::new();
                e.read_to_end(&mut data).unwrap();
                Seen {
                    name: String::from_utf8(e.path_bytes().into_owned()).unwrap(),
                    kind: h.entry_type(),
                    mode: h.mode().unwrap(),
                    uid: h.uid().unwrap(),
                    gid: h.gid().unwrap(),
                    link: e
                        .link_name_bytes()
                        .map(|l| String::from_utf8(l.into_owned()).unwrap()),
                    data,
                    pax,
                }
            })
            .collect()
    }

    #[test]
    fn parent_traversal_is_refused() {
        let mut a = Vec::new();
        raw_entry(&mut a, b"ok.txt", EntryType::Regular, b"", 0o644, b"fine");
        raw_entry(&mut a, b"../x", EntryType::Regular, b"", 0o644, b"evil");
        let err = sanitise(&finish(a), "").unwrap_err();
        assert!(err.0.contains("'..'"), "{err}");
        let mut a = Vec::new();
        raw_entry(
            &mut a,
            b"a/b/../../../x",
            EntryType::Regular,
            b"",
            0o644,
            b"evil",
        );
        assert!(sanitise(&finish(a), "").is_err());
    }

    #[test]
    fn absolute_names_are_refused() {
        let mut a = Vec::new();
        raw_entry(&mut a, b"/etc/x", EntryType::Regular, b"", 0o644, b"evil");
        let err = sanitise(&finish(a), "").unwrap_err();
        assert!(err.0.contains("absolute"), "{err}");
    }

    #[test]
    fn hard_links_out_of_the_archive_are_refused() {
        for target in [&b"/etc/shadow"[..], b"../../etc/shadow", b"a/../../x"] {
            let mut a = Vec::new();
            raw_entry(&mut a, b"shadow", EntryType::Link, target, 0o644, b"");
            let err = sanitise(&finish(a), "").unwrap_err();
            assert!(err.0.contains("hard link target"), "{err}");
        }
    }

    #[test]
    fn hard_links_inside_the_archive_are_kept_and_prefixed() {
        let mut a = Vec::new();
        raw_entry(&mut a, b"app/f", EntryType::Regular, b"", 0o644, b"x");
        raw_entry(&mut a, b"app/g", EntryType::Link, b"app/f", 0o644, b"");
        let out = sanitise(&finish(a), "dest").unwrap();
        let seen = read_back(&out.archive);
        let g = seen.iter().find(|s| s.name == "dest/app/g").unwrap();
        assert_eq!(g.kind, EntryType::Link);
        assert_eq!(g.link.as_deref(), Some("dest/app/f"));
    }

    #[test]
    fn setuid_setgid_sticky_and_ownership_never_survive() {
        let mut a = Vec::new();
        raw_entry(
            &mut a,
            b"bin/su",
            EntryType::Regular,
            b"",
            0o4755,
            b"#!/bin/sh\n",
        );
        raw_entry(&mut a, b"bin/sg", EntryType::Regular, b"", 0o2711, b"x");
        raw_entry(&mut a, b"shared/", EntryType::Directory, b"", 0o3777, b"");
        let out = sanitise(&finish(a), "").unwrap();
        assert_eq!(out.special_bits_cleared, 3);
        assert_eq!(out.ownership_reset, 3);
        let seen = read_back(&out.archive);
        assert_eq!(seen.len(), 3);
        for s in &seen {
            assert_eq!(
                s.mode & 0o7000,
                0,
                "{} kept special bits: {:o}",
                s.name,
                s.mode
            );
            assert_eq!((s.uid, s.gid), (0, 0), "{} kept its owner", s.name);
        }
        assert_eq!(seen[0].mode, 0o755);
        assert_eq!(seen[0].data, b"#!/bin/sh\n");
        assert_eq!(seen[1].mode, 0o711);
        assert_eq!(seen[2].mode, 0o777);
    }

    #[test]
    fn writing_through_a_symlink_from_the_same_archive_is_refused() {
        let mut a = Vec::new();
        raw_entry(&mut a, b"link", EntryType::Symlink, b"/etc", 0o777, b"");
        raw_entry(
            &mut a,
            b"link/passwd",
            EntryType::Regular,
            b"",
            0o644,
            b"root::0:0::/:/bin/sh\n",
        );
        let err = sanitise(&finish(a), "").unwrap_err();
        assert!(err.0.contains("symlink"), "{err}");

        // The same through a deeper path and through a hard link's target.
        let mut a = Vec::new();
        raw_entry(&mut a, b"d/l", EntryType::Symlink, b"../../..", 0o777, b"");
        raw_entry(&mut a, b"d/l/x/y", EntryType::Regular, b"", 0o644, b"");
        assert!(sanitise(&finish(a), "").is_err());
        let mut a = Vec::new();
        raw_entry(&mut a, b"l", EntryType::Symlink, b"/etc", 0o777, b"");
        raw_entry(&mut a, b"h", EntryType::Link, b"l/shadow", 0o644, b"");
        assert!(sanitise(&finish(a), "").is_err());
    }

    #[test]
    fn plain_symlinks_are_kept_and_a_replaced_symlink_no_longer_blocks() {
        let mut a = Vec::new();
        raw_entry(
            &mut a,
            b"current",
            EntryType::Symlink,
            b"releases/v1",
            0o777,
            b"",
        );
        raw_entry(
            &mut a,
            b"abs",
            EntryType::Symlink,
            b"/usr/bin/env",
            0o777,
            b"",
        );
        raw_entry(&mut a, b"current", EntryType::Directory, b"", 0o755, b"");
        raw_entry(
            &mut a,
            b"current/file",
            EntryType::Regular,
            b"",
            0o644,
            b"ok",
        );
        let seen = read_back(&sanitise(&finish(a), "").unwrap().archive);
        assert_eq!(seen[0].link.as_deref(), Some("releases/v1"));
        assert_eq!(seen[1].link.as_deref(), Some("/usr/bin/env"));
        assert_eq!(seen[3].name, "current/file");
    }

    #[test]
    fn devices_fifos_and_the_dot_entry_are_dropped() {
        let mut a = Vec::new();
        raw_entry(&mut a, b"./", EntryType::Directory, b"", 0o700, b"");
        raw_entry(&mut a, b"./dev/sda", EntryType::Block, b"", 0o666, b"");
        raw_entry(&mut a, b"./dev/null", EntryType::Char, b"", 0o666, b"");
        raw_entry(&mut a, b"./pipe", EntryType::Fifo, b"", 0o666, b"");
        raw_entry(&mut a, b"./keep.txt", EntryType::Regular, b"", 0o600, b"k");
        let out = sanitise(&finish(a), "").unwrap();
        assert_eq!(out.dropped.len(), 4, "{:?}", out.dropped);
        let seen = read_back(&out.archive);
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].name, "keep.txt");
        assert_eq!(seen[0].mode, 0o600);
    }

    #[test]
    fn pax_records_such_as_file_capabilities_are_not_carried() {
        let mut b = Builder::new(Vec::new());
        b.append_pax_extensions([
            (
                "SCHILY.xattr.security.capability",
                &b"\x01\x00\x00\x02\xff\xff\xff\xff"[..],
            ),
            ("path", &b"very/long/name/from/pax.bin"[..]),
        ])
        .unwrap();
        let mut h = Header::new_ustar();
        h.set_path("short").unwrap();
        h.set_mode(0o755);
        h.set_size(3);
        h.set_cksum();
        b.append(&h, &b"abc"[..]).unwrap();
        let out = sanitise(&b.into_inner().unwrap(), "").unwrap();
        let seen = read_back(&out.archive);
        assert_eq!(seen.len(), 1);
        assert_eq!(
            seen[0].name, "very/long/name/from/pax.bin",
            "pax path is honoured"
        );
        assert!(!seen[0].pax, "pax records must not be copied");
        assert_eq!(seen[0].data, b"abc");
    }

    #[test]
    fn long_names_and_targets_survive_and_prefix_dirs_come_first() {
        let long = format!("{}/file.txt", "d".repeat(150));
        let target = format!("/{}", "t".repeat(200));
        let mut b = Builder::new(Vec::new());
        let mut h = Header::new_gnu();
        h.set_size(2);
        h.set_mode(0o644);
        b.append_data(&mut h, &long, &b"hi"[..]).unwrap();
        let mut h = Header::new_gnu();
        h.set_entry_type(EntryType::Symlink);
        h.set_size(0);
        h.set_mode(0o777);
        b.append_link(&mut h, "ln", &target).unwrap();
        let out = sanitise(&b.into_inner().unwrap(), "a/b").unwrap();
        let seen = read_back(&out.archive);
        let names: Vec<&str> = seen.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names[..2], ["a", "a/b"]);
        assert_eq!(seen[0].kind, EntryType::Directory);
        assert_eq!(seen[0].mode, 0o755);
        assert_eq!(names[2], format!("a/b/{long}"));
        assert_eq!(seen[3].link.as_deref(), Some(target.as_str()));
        assert_eq!(out.entries, 4);
    }

    #[test]
    fn garbage_is_an_error_not_an_empty_import() {
        assert!(sanitise(&[7u8; 700], "").is_err());
        assert!(sanitise(b"x", "../up").is_err());
    }
}
