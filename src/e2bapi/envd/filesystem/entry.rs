//! Entries as envd describes them (`filesystem.EntryInfo`), read from one `find -printf` run
//! in [`FORMAT`] and parsed here (pure), so a stat, a listing and a watcher's snapshot are
//! the same record.

use chrono::{DateTime, SecondsFormat};
use serde_json::{Value, json};

/// What `find -printf` writes per entry: type, size, permission bits (octal), permissions
/// (`-rw-r--r--`), owner, group, modification time (seconds.fraction), inode, path, link
/// target — each NUL-terminated, so every name is exact.
pub const FORMAT: &str = r"%y\0%s\0%m\0%M\0%u\0%g\0%T@\0%i\0%p\0%l\0";
/// Fields per record of [`FORMAT`].
const FIELDS: usize = 10;

/// What an entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A regular file.
    File,
    /// A directory.
    Directory,
    /// A symbolic link.
    Symlink,
    /// A device, fifo or socket: envd has no type for it.
    Other,
}

impl Kind {
    fn parse(letter: &[u8]) -> Kind {
        match letter {
            b"f" => Kind::File,
            b"d" => Kind::Directory,
            b"l" => Kind::Symlink,
            _ => Kind::Other,
        }
    }

    /// The `filesystem.FileType` name.
    pub fn wire(self) -> &'static str {
        match self {
            Kind::File => "FILE_TYPE_FILE",
            Kind::Directory => "FILE_TYPE_DIRECTORY",
            Kind::Symlink => "FILE_TYPE_SYMLINK",
            Kind::Other => "FILE_TYPE_UNSPECIFIED",
        }
    }
}

/// One entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// What it is.
    pub kind: Kind,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits (`0o777` at most).
    pub mode: u32,
    /// `ls -l`'s permission string.
    pub permissions: String,
    /// Owner's name (or uid when it has none).
    pub owner: String,
    /// Group's name (or gid).
    pub group: String,
    /// Modification time: seconds and nanoseconds since the epoch.
    pub modified: (i64, u32),
    /// Inode number, which a rename keeps.
    pub inode: u64,
    /// Absolute path.
    pub path: String,
    /// A symbolic link's target.
    pub symlink_target: Option<String>,
}

impl Entry {
    /// The last segment of the path (`/` for the root).
    pub fn name(&self) -> &str {
        match self.path.rsplit_once('/') {
            Some((_, "")) | None => &self.path,
            Some((_, name)) => name,
        }
    }

    /// The `filesystem.EntryInfo` JSON (int64 as a string, as proto3 JSON writes it).
    pub fn wire(&self) -> Value {
        let (secs, nanos) = self.modified;
        let time = DateTime::from_timestamp(secs, nanos)
            .unwrap_or_default()
            .to_rfc3339_opts(SecondsFormat::AutoSi, true);
        let mut info = json!({
            "name": self.name(), "type": self.kind.wire(), "path": self.path,
            "size": self.size.to_string(), "mode": self.mode, "permissions": self.permissions,
            "owner": self.owner, "group": self.group, "modifiedTime": time,
        });
        if let Some(target) = &self.symlink_target {
            info["symlinkTarget"] = json!(target);
            info["isSymlink"] = json!(true);
        }
        info
    }
}

/// The entries of `find -printf FORMAT` output; `None` when it is not whole records (cut
/// short, or not GNU `find`'s), so a partial answer is never taken for the whole.
pub fn parse(raw: &[u8]) -> Option<Vec<Entry>> {
    let fields: Vec<&[u8]> = raw.split(|b| *b == 0).collect();
    // Every record ends in NUL, which leaves one empty field after the last.
    let (last, fields) = fields.split_last()?;
    if !last.is_empty() || fields.len() % FIELDS != 0 {
        return None;
    }
    fields.chunks(FIELDS).map(record).collect()
}

fn record(f: &[&[u8]]) -> Option<Entry> {
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let number = |b: &[u8]| std::str::from_utf8(b).ok()?.parse::<u64>().ok();
    let kind = Kind::parse(f[0]);
    Some(Entry {
        kind,
        size: number(f[1])?,
        mode: u32::from_str_radix(std::str::from_utf8(f[2]).ok()?, 8).ok()? & 0o777,
        permissions: text(f[3]),
        owner: text(f[4]),
        group: text(f[5]),
        modified: time(std::str::from_utf8(f[6]).ok()?)?,
        inode: number(f[7])?,
        path: text(f[8]),
        symlink_target: (kind == Kind::Symlink).then(|| text(f[9])),
    })
}

/// `find`'s `%T@` (`1700000000.1234567890`) as seconds and nanoseconds.
fn time(text: &str) -> Option<(i64, u32)> {
    let (secs, fraction) = text.split_once('.').unwrap_or((text, "0"));
    let digits: String = fraction
        .chars()
        .chain(std::iter::repeat('0'))
        .take(9)
        .collect();
    Some((secs.parse().ok()?, digits.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &[u8] = b"f\x005\x00644\x00-rw-r--r--\x00root\x00root\x001700000000.1234567890\x0042\x00/tmp/a.txt\x00\x00";
    const LINK: &[u8] =
        b"l\x001\x00777\x00lrwxrwxrwx\x00user\x00user\x001700000001\x007\x00/tmp/ln\x00a.txt\x00";

    #[test]
    fn a_record_becomes_an_entry() {
        let e = &parse(FILE).unwrap()[0];
        assert_eq!(
            (e.kind, e.size, e.mode, e.inode),
            (Kind::File, 5, 0o644, 42)
        );
        assert_eq!((e.name(), e.path.as_str()), ("a.txt", "/tmp/a.txt"));
        assert_eq!(e.modified, (1_700_000_000, 123_456_789));
        assert_eq!(e.symlink_target, None);
        let wire = e.wire();
        assert_eq!(wire["type"], "FILE_TYPE_FILE");
        assert_eq!(wire["size"], "5");
        assert_eq!(wire["mode"], 420);
        assert_eq!(wire["permissions"], "-rw-r--r--");
        assert_eq!(wire["modifiedTime"], "2023-11-14T22:13:20.123456789Z");
        assert!(wire.get("symlinkTarget").is_none());
    }

    #[test]
    fn links_carry_their_target_and_records_follow_each_other() {
        let both = [FILE, LINK].concat();
        let entries = parse(&both).unwrap();
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[1].symlink_target.as_deref(), Some("a.txt"));
        assert_eq!(entries[1].modified, (1_700_000_001, 0));
        assert_eq!(entries[1].wire()["isSymlink"], true);
        assert_eq!(parse(b"").unwrap(), vec![]);
    }

    #[test]
    fn a_cut_or_foreign_listing_is_refused_not_shortened() {
        assert!(parse(&FILE[..FILE.len() - 1]).is_none());
        assert!(parse(&[FILE, b"f\x005\x00"].concat()).is_none());
        let bad_mode = b"f\x005\x00x\x00-\x00r\x00r\x001\x001\x00/a\x00\x00";
        assert!(parse(bad_mode).is_none());
    }

    #[test]
    fn the_root_is_named_by_itself() {
        let mut e = parse(FILE).unwrap().remove(0);
        e.path = "/".into();
        assert_eq!(e.name(), "/");
    }
}
