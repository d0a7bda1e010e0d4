//! Directory entries from `find -printf` output in [`LISTING_FORMAT`](super::scripts::LISTING_FORMAT).

use super::scripts::is_staging_name;
use crate::provider::{DirEntry, EntryKind};

/// The entries of a listing; `None` when the output is not whole records (cut short, or not
/// GNU `find`'s), so a caller never takes a partial listing for the directory. A file a
/// write is staging beside its target is left out: its name is no caller's
/// ([`is_staging_name`]).
pub fn entries(raw: &[u8]) -> Option<Vec<DirEntry>> {
    let fields: Vec<&[u8]> = raw.split(|b| *b == 0).collect();
    // Every record ends in NUL, which leaves one empty field after the last.
    let (last, fields) = fields.split_last()?;
    if !last.is_empty() || fields.len() % 4 != 0 {
        return None;
    }
    let listed = fields.chunks(4).map(entry);
    Some(listed.filter(|e| !is_staging_name(&e.name)).collect())
}

/// One record: type letter, size, name, link target.
fn entry(record: &[&[u8]]) -> DirEntry {
    let kind = match record[0] {
        b"f" => EntryKind::File,
        b"d" => EntryKind::Directory,
        b"l" => EntryKind::Symlink,
        _ => EntryKind::Other,
    };
    let text = |f: &[u8]| String::from_utf8_lossy(f).into_owned();
    DirEntry {
        name: text(record[2]),
        kind,
        size: (kind == EntryKind::File)
            .then(|| std::str::from_utf8(record[1]).ok()?.parse().ok())
            .flatten(),
        symlink_target: (kind == EntryKind::Symlink).then(|| text(record[3])),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listing_output_becomes_entries() {
        let raw = b"f\x003\x00a.txt\x00\x00d\x004096\x00dir\x00\x00l\x004\x00ln\x00a.txt\x00";
        let e = entries(raw).unwrap();
        assert_eq!(e.len(), 3);
        assert_eq!((e[0].kind, e[0].size), (EntryKind::File, Some(3)));
        assert_eq!(e[0].name, "a.txt");
        assert_eq!((e[1].kind, e[1].size), (EntryKind::Directory, None));
        assert_eq!(e[2].symlink_target.as_deref(), Some("a.txt"));
        assert_eq!(entries(b"").unwrap(), vec![]);
    }

    #[test]
    fn a_write_staging_beside_its_target_is_not_listed() {
        let raw =
            b"f\x003\x00a.txt\x00\x00f\x003\x00.sbx-write.42\x00\x00f\x001\x00.sbx-write.x\x00\x00";
        let names: Vec<_> = entries(raw).unwrap().into_iter().map(|e| e.name).collect();
        assert_eq!(names, vec!["a.txt", ".sbx-write.x"]);
    }

    #[test]
    fn a_cut_listing_is_refused_not_shortened() {
        assert!(entries(b"f\x003\x00a.txt\x00\x00d\x004096").is_none());
        assert!(entries(b"f\x003\x00a.txt\x00").is_none());
    }
}
