//! What changed in a watched directory between two snapshots (pure), as the events envd
//! reports from inotify: an entry that appeared is `CREATE` (and `WRITE` when it already has
//! content, as a create followed by a write would be), one that vanished `REMOVE`, one that
//! vanished while its inode appeared under another name `RENAME` (the old name) then
//! `CREATE` (the new one), new content or a new modification time `WRITE`, new permission
//! bits `CHMOD`. Changes that come and go between two polls are not seen.

use std::collections::{BTreeMap, HashMap};

use super::entry::{Entry, Kind};

/// What happened to an entry (`filesystem.EventType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// It appeared.
    Create,
    /// Its content changed.
    Write,
    /// It vanished.
    Remove,
    /// It moved away under another name.
    Rename,
    /// Its permission bits changed.
    Chmod,
}

impl EventType {
    /// The `filesystem.EventType` name.
    pub fn wire(self) -> &'static str {
        match self {
            EventType::Create => "EVENT_TYPE_CREATE",
            EventType::Write => "EVENT_TYPE_WRITE",
            EventType::Remove => "EVENT_TYPE_REMOVE",
            EventType::Rename => "EVENT_TYPE_RENAME",
            EventType::Chmod => "EVENT_TYPE_CHMOD",
        }
    }
}

/// One event: the entry's path relative to the watched directory, and what happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Relative path (a bare name unless the watch is recursive).
    pub name: String,
    /// What happened.
    pub kind: EventType,
}

impl Event {
    /// The `filesystem.FilesystemEvent` JSON.
    pub fn wire(&self) -> serde_json::Value {
        serde_json::json!({"name": self.name, "type": self.kind.wire()})
    }
}

/// A directory's entries by their path relative to it.
pub type Snapshot = BTreeMap<String, Entry>;

/// The snapshot of `entries` found below `root` (a listing, which leaves out the files
/// writes stage beside their targets: `shell::visible`).
pub fn snapshot(root: &str, entries: Vec<Entry>) -> Snapshot {
    let prefix = format!("{}/", root.trim_end_matches('/'));
    entries
        .into_iter()
        .filter_map(|e| Some((e.path.strip_prefix(&prefix)?.to_string(), e)))
        .collect()
}

/// The events that lead from `old` to `new`: renames and removals first, then creations,
/// then changes, each in name order.
pub fn diff(old: &Snapshot, new: &Snapshot) -> Vec<Event> {
    let event = |name: &str, kind| Event {
        name: name.to_string(),
        kind,
    };
    let replaced = |name: &String| new.get(name).is_some_and(|n| n.kind != old[name].kind);
    let gone: Vec<&String> = old
        .keys()
        .filter(|k| !new.contains_key(*k) || replaced(k))
        .collect();
    let mut added: Vec<&String> = new
        .keys()
        .filter(|k| !old.contains_key(*k) || replaced(k))
        .collect();
    let mut by_inode: HashMap<u64, &String> = added.iter().map(|k| (new[*k].inode, *k)).collect();
    let mut events = Vec::new();
    for name in gone {
        match by_inode
            .remove(&old[name].inode)
            .filter(|_| !replaced(name))
        {
            Some(to) => {
                events.push(event(name, EventType::Rename));
                events.push(event(to, EventType::Create));
                added.retain(|k| *k != to);
            }
            None => events.push(event(name, EventType::Remove)),
        }
    }
    for name in added {
        events.push(event(name, EventType::Create));
        if new[name].kind == Kind::File && new[name].size > 0 {
            events.push(event(name, EventType::Write));
        }
    }
    for (name, now) in new {
        let Some(was) = old.get(name).filter(|w| w.kind == now.kind) else {
            continue;
        };
        let content = |e: &Entry| (e.size, e.modified, e.inode);
        if now.kind == Kind::File && content(now) != content(was) {
            events.push(event(name, EventType::Write));
        }
        if now.mode != was.mode {
            events.push(event(name, EventType::Chmod));
        }
    }
    events
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(path: &str, kind: Kind, size: u64, inode: u64) -> Entry {
        Entry {
            kind,
            size,
            mode: 0o644,
            permissions: "-rw-r--r--".into(),
            owner: "root".into(),
            group: "root".into(),
            modified: (1, 0),
            inode,
            path: format!("/w/{path}"),
            symlink_target: None,
        }
    }

    fn snap(entries: Vec<Entry>) -> Snapshot {
        snapshot("/w/", entries)
    }

    fn kinds(events: &[Event]) -> Vec<(&str, EventType)> {
        events.iter().map(|e| (e.name.as_str(), e.kind)).collect()
    }

    #[test]
    fn creations_writes_and_removals_are_named_relative_to_the_directory() {
        let old = snap(vec![
            entry("gone", Kind::File, 1, 1),
            entry("same", Kind::File, 1, 2),
        ]);
        let new = snap(vec![
            entry("same", Kind::File, 1, 2),
            entry("empty", Kind::File, 0, 3),
            entry("full", Kind::File, 9, 4),
            entry("sub/deep", Kind::Directory, 0, 5),
        ]);
        use EventType::*;
        assert_eq!(
            kinds(&diff(&old, &new)),
            vec![
                ("gone", Remove),
                ("empty", Create),
                ("full", Create),
                ("full", Write),
                ("sub/deep", Create)
            ]
        );
        assert!(diff(&new, &new).is_empty());
    }

    #[test]
    fn content_and_mode_changes_are_writes_and_chmods() {
        let old = snap(vec![
            entry("a", Kind::File, 1, 1),
            entry("b", Kind::File, 1, 2),
        ]);
        let mut a = entry("a", Kind::File, 1, 1);
        a.modified = (2, 5);
        let mut b = entry("b", Kind::File, 1, 2);
        b.mode = 0o755;
        let events = diff(&old, &snap(vec![a, b]));
        assert_eq!(
            kinds(&events),
            vec![("a", EventType::Write), ("b", EventType::Chmod)]
        );
        assert_eq!(events[0].wire()["type"], "EVENT_TYPE_WRITE");
    }

    #[test]
    fn one_entry_changed_is_its_events() {
        type Case = (&'static str, Entry, Entry, Vec<(&'static str, EventType)>);
        let cases: Vec<Case> = vec![
            (
                "a moved inode is a rename then a create",
                entry("old", Kind::File, 4, 7),
                entry("new", Kind::File, 4, 7),
                vec![("old", EventType::Rename), ("new", EventType::Create)],
            ),
            (
                "a file replaced by a directory is removed then created",
                entry("x", Kind::File, 1, 1),
                entry("x", Kind::Directory, 0, 1),
                vec![("x", EventType::Remove), ("x", EventType::Create)],
            ),
            (
                // A staged write's rename: a new inode of the same size and time is new content.
                "a file renamed over its target is a write of the target",
                entry("w.txt", Kind::File, 3, 1),
                entry("w.txt", Kind::File, 3, 2),
                vec![("w.txt", EventType::Write)],
            ),
        ];
        for (case, old, new, want) in cases {
            let events = diff(&snap(vec![old]), &snap(vec![new]));
            assert_eq!(kinds(&events), want, "{case}");
        }
    }

    #[test]
    fn a_staged_write_is_in_no_listing_and_so_in_no_snapshot() {
        let listed = crate::e2bapi::envd::filesystem::shell::visible(vec![
            entry("w.txt", Kind::File, 3, 1),
            entry(".sbx-write.315", Kind::File, 11, 2),
            entry("sub/.sbx-write.9", Kind::File, 1, 3),
            entry(".sbx-write.notes", Kind::File, 1, 4),
        ]);
        let names: Vec<_> = snap(listed).into_keys().collect();
        assert_eq!(names, vec![".sbx-write.notes", "w.txt"]);
    }

    #[test]
    fn entries_outside_the_root_are_not_in_its_snapshot() {
        let mut stray = entry("a", Kind::File, 1, 1);
        stray.path = "/elsewhere/a".into();
        assert!(snap(vec![stray]).is_empty());
    }
}
