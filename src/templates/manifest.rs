//! Pure parts of the S3 template scheme: object keys, the control-plane manifest, restore
//! leases, and the capture/restore shell scripts.
//!
//! A template in the store is three kinds of object under `<prefix>/<template id>/`:
//! `manifest.json` (written by the control plane, last — its existence defines the
//! template), `archive.tar.gz` (uploaded by the capturing sandbox over a presigned PUT), and
//! `leases/<lease id>` (one per in-flight restore, so a second control plane enforcing a
//! retention budget sees it).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::provider::labels::Owner;
use crate::provider::validate;

/// Version of the manifest record.
pub const MANIFEST_SCHEMA: u32 = 1;
/// Single-PUT ceiling of S3 (5 GiB): a larger archive cannot be uploaded in one presigned
/// PUT, so the capture refuses before spending the bandwidth.
pub const MAX_ARCHIVE_BYTES: u64 = 5 * 1024 * 1024 * 1024;
/// SigV4 presigned URLs are valid for at most 7 days.
pub const MAX_PRESIGN_SECS: u64 = 7 * 24 * 3600;
/// Default wall-clock budget of a capture or restore transfer.
pub const DEFAULT_TRANSFER_SECS: u64 = 900;
/// Extra time a lease counts as live beyond the transfer budget (boot + API round trips).
pub const LEASE_GRACE_SECS: u64 = 120;

/// Exit status: the archive exceeds the size ceiling.
pub const EXIT_TOO_LARGE: i64 = 90;
/// Exit status: a setuid/setgid file survived the sweep.
pub const EXIT_SETUID_SURVIVED: i64 = 91;
/// Exit status: `tar` failed (refused a member, could not read or write).
pub const EXIT_TAR_FAILED: i64 = 92;
/// Exit status: the transfer (curl) failed.
pub const EXIT_TRANSFER_FAILED: i64 = 93;
/// Exit status: no temporary file could be made.
pub const EXIT_NO_TEMP: i64 = 94;
/// Exit status: the archive holds a hard link to something outside the capture paths.
pub const EXIT_HARDLINK_ESCAPE: i64 = 95;
/// Exit status: the archive holds a device node.
pub const EXIT_DEVICE_NODE: i64 = 96;
/// Exit status: a member would be written through a symlink that already exists in the
/// restoring sandbox and leads out of the capture paths (or a capture path lies at or below
/// such a symlink).
pub const EXIT_SYMLINK_ESCAPE: i64 = 97;
/// Printed on stderr by the capture when tar saw files change while reading (a warning).
pub const TAR_CHANGED_MARKER: &str = "SBX_TAR_FILES_CHANGED";

/// The control-plane-written record of a template.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    /// Record version.
    pub schema: u32,
    /// The template id.
    pub id: String,
    /// Absolute capture paths. Security-relevant: on restore these become tar's member
    /// selectors, so what may be extracted is control-plane policy, never archive content.
    pub capture_paths: Vec<String>,
    /// When the capture completed (RFC 3339).
    pub created_at: String,
    /// Archive size as observed in the store at capture time.
    pub size_bytes: u64,
    /// Free-form label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// The image the captured sandbox ran, when known: a provider without image commit boots
    /// it before restoring the archive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_image: Option<String>,
    /// The owner labels of the object that captured it, so another object cannot take its
    /// id over unnoticed.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// The tenant the template belongs to: only its namespace may overwrite it, and only it
    /// and [`Manifest::shared_with`] may fetch it. Absent in manifests written before it was
    /// recorded (see [`Manifest::owning_namespace`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<ManifestOwner>,
    /// Other namespaces the owner shares the template with (its SandboxTemplate's
    /// `spec.sharedWith` when the manifest was written): they may fetch and boot from it,
    /// never overwrite it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shared_with: Vec<String>,
}

/// The SandboxTemplate a stored template belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ManifestOwner {
    /// Its namespace: the tenant.
    pub namespace: String,
    /// Its UID.
    pub uid: String,
}

/// What a namespace wants to do with a stored template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Fetch it, or boot a sandbox from it.
    Read,
    /// Capture or publish over it.
    Write,
}

impl Manifest {
    /// Re-validates a manifest read back from the store: the store is shared, so its
    /// content is checked again before it drives a restore.
    pub fn validate(&self) -> Result<(), String> {
        if self.schema != MANIFEST_SCHEMA {
            return Err(format!(
                "manifest schema {} is not supported (want {MANIFEST_SCHEMA})",
                self.schema
            ));
        }
        validate::resource_name("template id", &self.id)?;
        if self.capture_paths.is_empty() {
            return Err("manifest has no capture paths".into());
        }
        for p in &self.capture_paths {
            validate::capture_path(p)?;
        }
        Ok(())
    }

    /// The namespace the template belongs to: the owner record, else (manifests written
    /// before it existed) the namespace of the owner labels every such manifest carries.
    /// `None`: written by no SandboxTemplate this operator knows of, so owned by no tenant.
    pub fn owning_namespace(&self) -> Option<String> {
        match &self.owner {
            Some(o) => Some(o.namespace.clone()),
            None => Owner::from_labels(&self.labels).map(|o| o.namespace),
        }
    }

    /// Whether `namespace` may `access` the template: its owner may do anything, a namespace
    /// in `shared_with` may read it, nobody else may do either. A manifest with no owner is
    /// refused to every namespace: who could read it cannot be told, and overwriting it
    /// would take over what someone may be using. The error names the field and the fix.
    pub fn check_access(&self, namespace: &str, access: Access) -> Result<(), String> {
        let id = &self.id;
        let Some(owner) = self.owning_namespace() else {
            return Err(format!(
                "template {id:?} in the template store records no owning namespace (it was not \
                 written by a SandboxTemplate), so no namespace may use or replace it; publish it \
                 again from its SandboxTemplate, or choose another spec.templateId"
            ));
        };
        if owner == namespace {
            return Ok(());
        }
        match access {
            Access::Read if self.shared_with.iter().any(|n| n == namespace) => Ok(()),
            Access::Read => Err(format!(
                "template {id:?} in the template store belongs to namespace {owner:?} and is not \
                 shared with namespace {namespace:?}; its owner can add {namespace:?} to the \
                 SandboxTemplate's spec.sharedWith (it takes effect when the template is next \
                 captured or published), or publish your own under another spec.templateId"
            )),
            Access::Write => Err(format!(
                "template id {id:?} in the template store belongs to namespace {owner:?}; a \
                 namespace never overwrites another's template (spec.sharedWith shares reading \
                 only): choose another spec.templateId"
            )),
        }
    }
}

/// Object keys of one template under a store prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    prefix: String,
    id: String,
}

impl Keys {
    /// Keys for `template_id` under `prefix` (no trailing slash needed).
    pub fn new(prefix: &str, template_id: &str) -> Self {
        Keys {
            prefix: prefix.trim_end_matches('/').to_string(),
            id: template_id.to_string(),
        }
    }
    /// `<prefix>/<id>/`, everything of this template.
    pub fn root(&self) -> String {
        format!("{}/{}/", self.prefix, self.id)
    }
    /// The manifest's key.
    pub fn manifest(&self) -> String {
        format!("{}manifest.json", self.root())
    }
    /// The archive's key.
    pub fn archive(&self) -> String {
        format!("{}archive.tar.gz", self.root())
    }
    /// Prefix of this template's leases.
    pub fn leases(&self) -> String {
        format!("{}leases/", self.root())
    }
    /// One lease's key.
    pub fn lease(&self, lease_id: &str) -> String {
        format!("{}{lease_id}", self.leases())
    }
}

/// Whether any lease still belongs to a live restore. A lease whose timestamp cannot be read
/// counts as live: an unreadable answer resolves to "in use", never to "free".
pub fn has_live_lease(
    lease_times: &[Option<DateTime<Utc>>],
    ttl_secs: u64,
    now: DateTime<Utc>,
) -> bool {
    lease_times.iter().any(|t| match t {
        None => true,
        Some(t) => {
            now.signed_duration_since(*t).num_seconds()
                < i64::try_from(ttl_secs).unwrap_or(i64::MAX)
        }
    })
}

/// Clamps a presign lifetime into `1 ..= 7 days`.
pub fn clamp_presign(secs: u64) -> u64 {
    secs.clamp(1, MAX_PRESIGN_SECS)
}

fn quote(s: &str) -> Result<String, String> {
    if s.contains('\'') {
        return Err("value contains a single quote and cannot be embedded in the script".into());
    }
    Ok(format!("'{s}'"))
}

fn members(paths: &[String]) -> Result<Vec<String>, String> {
    paths
        .iter()
        .map(|p| {
            validate::capture_path(p)?;
            quote(validate::archive_member(p))
        })
        .collect()
}

/// The in-sandbox capture: archive the capture paths (relative to `/`) into a temp FILE,
/// refuse an oversized archive, then upload with one presigned PUT. The files of `excluded`
/// (the self-delivered env file: its content came from a Secret) are never archived, even
/// under a capture path (literal names, anchored at `/`).
///
/// Written to a file first, never piped into curl: a pipeline reports only the last
/// command's status (a failed tar would upload a truncated archive and "succeed"), and a
/// piped upload has no Content-Length, so curl goes chunked, which a presigned PUT rejects.
pub fn capture_script(
    paths: &[String],
    excluded: &[String],
    put_url: &str,
    max_bytes: u64,
) -> Result<String, String> {
    let excludes: Vec<String> = members(excluded)?
        .iter()
        .map(|m| format!("--exclude={m} "))
        .collect();
    let excludes = excludes.concat();
    let members = members(paths)?.join(" ");
    let url = quote(put_url)?;
    Ok(format!(
        r#"set -u
tmp=$(mktemp /tmp/sbx-capture-XXXXXX.tar.gz) || exit {EXIT_NO_TEMP}
trap 'rm -f "$tmp"' EXIT
tar -czf "$tmp" --anchored --no-wildcards {excludes}-C / -- {members}
rc=$?
if [ "$rc" -eq 1 ]; then echo {TAR_CHANGED_MARKER} >&2; elif [ "$rc" -ne 0 ]; then exit {EXIT_TAR_FAILED}; fi
size=$(wc -c < "$tmp")
if [ "$size" -gt {max_bytes} ]; then echo "archive is $size bytes, over {max_bytes}" >&2; exit {EXIT_TOO_LARGE}; fi
curl --fail-with-body -sS -X PUT -T "$tmp" {url} || exit {EXIT_TRANSFER_FAILED}
"#
    ))
}

/// The in-sandbox restore — the security boundary.
///
/// 1. Download to a FILE (a failed download is never "extracted" as a truncated stream).
/// 2. Refuse device nodes and hard links that point outside the capture paths (a hard link
///    to e.g. `etc/shadow` would otherwise put a file outside the tree into the template).
/// 3. Refuse writing through a symlink that ALREADY EXISTS in the restoring sandbox (one the
///    base image ships) and leads out of the capture paths: GNU tar guards against symlinks
///    it extracted itself, but follows existing ones, so a member `opt/x/evil` below a
///    base-image symlink `/opt/x -> /etc` would land in `/etc`. A capture path that lies at
///    or below a symlink is refused for the same reason.
/// 4. Extract ONLY the manifest's capture paths as member selectors (`--no-wildcards`: a
///    selector is a literal name), with `--no-same-owner --no-same-permissions`. GNU tar
///    strips a leading `/`, refuses members containing `..`, and will not write through a
///    symlink it extracted (it holds a placeholder file until the end); any refusal is a
///    non-zero exit that fails the restore.
/// 5. Strip setuid/setgid from everything extracted, then ASSERT none survived.
pub fn restore_script(paths: &[String], get_url: &str) -> Result<String, String> {
    let members = members(paths)?;
    let selectors = members.join(" ");
    let url = quote(get_url)?;
    let abs: Vec<String> = paths
        .iter()
        .map(|p| quote(&format!("/{}", validate::archive_member(p))))
        .collect::<Result<_, _>>()?;
    let abs = abs.join(" ");
    let allowed = |absolute: bool| {
        paths
            .iter()
            .map(|p| {
                let m = validate::archive_member(p);
                let m = if absolute {
                    format!("/{m}")
                } else {
                    m.to_string()
                };
                format!("{m}|{m}/*")
            })
            .collect::<Vec<_>>()
            .join("|")
    };
    let (allowed_rel, allowed_abs) = (allowed(false), allowed(true));
    Ok(format!(
        r#"set -u
tmp=$(mktemp /tmp/sbx-restore-XXXXXX.tar.gz) || exit {EXIT_NO_TEMP}
list=$(mktemp /tmp/sbx-restore-XXXXXX.list) || exit {EXIT_NO_TEMP}
links=$(mktemp /tmp/sbx-restore-XXXXXX.links) || exit {EXIT_NO_TEMP}
trap 'rm -f "$tmp" "$list" "$links"' EXIT
curl --fail-with-body -sS -o "$tmp" {url} || exit {EXIT_TRANSFER_FAILED}
tar -tvzf "$tmp" > "$list" || exit {EXIT_TAR_FAILED}
if grep -q '^[bc]' "$list"; then echo "archive contains a device node" >&2; exit {EXIT_DEVICE_NODE}; fi
sed -n 's/^h.* link to //p' "$list" | while IFS= read -r target; do
  target=${{target#/}}
  case "$target" in {allowed_rel}) ;; *) echo "hard link to $target leaves the capture paths" >&2; exit {EXIT_HARDLINK_ESCAPE};; esac
done || exit {EXIT_HARDLINK_ESCAPE}
for p in {abs}; do
  d=$p
  while [ -n "$d" ]; do
    if [ -L "$d" ]; then echo "capture path $p lies at or below the symlink $d of the restoring sandbox" >&2; exit {EXIT_SYMLINK_ESCAPE}; fi
    d=${{d%/*}}
  done
  [ -d "$p" ] || continue
  find "$p" -xdev -type l | while IFS= read -r l; do
    t=$(readlink -f -- "$l") || t=/
    case "$t" in {allowed_abs}) ;; *) printf '%s\n' "${{l#/}}";; esac
  done >> "$links" || exit {EXIT_SYMLINK_ESCAPE}
done
if [ -s "$links" ]; then
  tar -tzf "$tmp" | awk 'NR == FNR {{ bad[$0] = 1; next }}
    {{ name = $0; sub(/^(\.?\/)+/, "", name); n = split(name, part, "/"); pre = ""
       for (i = 1; i < n; i++) {{ pre = (i == 1 ? part[i] : pre "/" part[i])
         if (pre in bad) {{ print "member " $0 " would be written through the existing symlink /" pre > "/dev/stderr"; exit 1 }} }} }}' "$links" - || exit {EXIT_SYMLINK_ESCAPE}
fi
tar -xzf "$tmp" -C / --no-same-owner --no-same-permissions --no-wildcards -- {selectors} || exit {EXIT_TAR_FAILED}
for p in {abs}; do
  [ -e "$p" ] || continue
  find "$p" -xdev -perm /6000 -exec chmod a-s {{}} + || exit {EXIT_SETUID_SURVIVED}
  if [ -n "$(find "$p" -xdev -perm /6000 -print -quit)" ]; then echo "setuid/setgid survived under $p" >&2; exit {EXIT_SETUID_SURVIVED}; fi
done
"#
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_capture_never_archives_a_self_delivered_file() {
        let paths = vec!["/run/sandboxes.dev".to_string(), "/workspace".to_string()];
        let excluded = vec!["/run/sandboxes.dev/env".to_string()];
        let script = capture_script(&paths, &excluded, "http://s/put", 10).expect("script");
        assert!(
            script.contains(
                "tar -czf \"$tmp\" --anchored --no-wildcards --exclude='run/sandboxes.dev/env' -C / -- 'run/sandboxes.dev' 'workspace'"
            ),
            "{script}"
        );
        let plain = capture_script(&paths, &[], "http://s/put", 10).expect("script");
        assert!(!plain.contains("--exclude"), "{plain}");
    }

    #[test]
    fn keys_are_under_the_template_root() {
        let k = Keys::new("tpl/", "node-20");
        assert_eq!(k.manifest(), "tpl/node-20/manifest.json");
        assert_eq!(k.archive(), "tpl/node-20/archive.tar.gz");
        assert_eq!(k.lease("abc"), "tpl/node-20/leases/abc");
    }

    #[test]
    fn unreadable_lease_times_are_live_and_old_ones_expire() {
        let now = DateTime::parse_from_rfc3339("2026-01-01T01:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let old = Some(now - chrono::Duration::seconds(2000));
        let fresh = Some(now - chrono::Duration::seconds(10));
        assert!(!has_live_lease(&[old], 1020, now));
        assert!(has_live_lease(&[old, fresh], 1020, now));
        assert!(has_live_lease(&[None], 1020, now));
        assert!(!has_live_lease(&[], 1020, now));
    }

    #[test]
    fn presign_is_clamped_to_seven_days() {
        assert_eq!(clamp_presign(0), 1);
        assert_eq!(clamp_presign(30 * 24 * 3600), MAX_PRESIGN_SECS);
    }

    #[test]
    fn scripts_select_members_and_refuse_bad_input() {
        let s = restore_script(&["/workspace/app".into()], "http://s3/x?sig=1&b=2").unwrap();
        assert!(s.contains("-- 'workspace/app'"));
        assert!(s.contains("--no-same-owner --no-same-permissions"));
        assert!(s.contains("curl --fail-with-body -sS -o \"$tmp\" 'http://s3/x?sig=1&b=2'"));
        assert!(restore_script(&["/a;b".into()], "u").is_err());
        assert!(capture_script(&["/a".into()], &[], "http://x/'oops'", 10).is_err());
        let c = capture_script(
            &["/workspace/app/".into(), "/opt/x".into()],
            &[],
            "http://u",
            10,
        )
        .unwrap();
        assert!(c.contains("-- 'workspace/app' 'opt/x'"));
        assert!(c.contains("-T \"$tmp\""), "uploads a file, not a pipe");
    }

    #[test]
    fn restore_guards_every_escape_route() {
        let s = restore_script(&["/workspace/app".into(), "/opt/venv".into()], "http://u").unwrap();
        // Literal member selectors, nothing else extracted.
        assert!(
            s.contains("--no-wildcards -- 'workspace/app' 'opt/venv' || exit 92"),
            "{s}"
        );
        // Hard links may only point into the capture paths (archive-relative names).
        assert!(
            s.contains("case \"$target\" in workspace/app|workspace/app/*|opt/venv|opt/venv/*)"),
            "{s}"
        );
        // Existing symlinks are judged by where they resolve (absolute names).
        assert!(
            s.contains("case \"$t\" in /workspace/app|/workspace/app/*|/opt/venv|/opt/venv/*)"),
            "{s}"
        );
        assert!(s.contains(&format!("exit {EXIT_SYMLINK_ESCAPE}")));
        // The setuid/setgid sweep is followed by an assertion.
        assert!(s.contains("-perm /6000 -exec chmod a-s"));
        assert!(s.contains(&format!(
            "survived under $p\" >&2; exit {EXIT_SETUID_SURVIVED}"
        )));
        // Downloaded to a file, never piped into tar.
        assert!(s.contains("curl --fail-with-body -sS -o \"$tmp\""));
        assert!(!s.contains("| tar -x"));
    }

    #[test]
    fn scripts_are_valid_posix_shell() {
        let scripts = [
            restore_script(&["/workspace/app".into()], "http://u/x?a=1&b=2").unwrap(),
            capture_script(
                &["/workspace/app".into()],
                &["/run/sandboxes.dev/env".into()],
                "http://u/x?a=1&b=2",
                10,
            )
            .unwrap(),
        ];
        for script in scripts {
            let out = std::process::Command::new("sh")
                .args(["-n", "-c", &script])
                .output()
                .expect("sh");
            assert!(
                out.status.success(),
                "{}\n{script}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    fn owned(owner: Option<&str>, labels: Option<&str>, shared: &[&str]) -> Manifest {
        let labels = labels.map_or_else(BTreeMap::new, |ns| {
            Owner {
                instance: "op".into(),
                kind: "SandboxTemplate".into(),
                namespace: ns.into(),
                name: "t".into(),
                uid: "u-1".into(),
            }
            .labels()
        });
        Manifest {
            schema: 1,
            id: "t1".into(),
            capture_paths: vec!["/w".into()],
            created_at: "x".into(),
            size_bytes: 1,
            label: None,
            base_image: None,
            labels,
            owner: owner.map(|ns| ManifestOwner {
                namespace: ns.into(),
                uid: "u-1".into(),
            }),
            shared_with: shared.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn only_the_owner_writes_and_only_owner_and_shared_read() {
        use Access::{Read, Write};
        let table: &[(Manifest, &str, Access, bool)] = &[
            (owned(Some("a"), None, &[]), "a", Read, true),
            (owned(Some("a"), None, &[]), "a", Write, true),
            (owned(Some("a"), None, &[]), "b", Read, false),
            (owned(Some("a"), None, &[]), "b", Write, false),
            (owned(Some("a"), None, &["b"]), "b", Read, true),
            (owned(Some("a"), None, &["b"]), "b", Write, false),
            (owned(Some("a"), None, &["b"]), "c", Read, false),
            // The record wins over labels; labels stand in for manifests without it.
            (owned(Some("a"), Some("b"), &[]), "b", Write, false),
            (owned(None, Some("a"), &[]), "a", Write, true),
            (owned(None, Some("a"), &[]), "b", Read, false),
            // Owned by no tenant: refused to everyone.
            (owned(None, None, &[]), "a", Read, false),
            (owned(None, None, &["a"]), "a", Read, false),
            (owned(None, None, &[]), "a", Write, false),
        ];
        for (m, ns, access, ok) in table {
            let got = m.check_access(ns, *access);
            assert_eq!(got.is_ok(), *ok, "{ns} {access:?} {m:?}: {got:?}");
        }
        let read = owned(Some("a"), None, &[])
            .check_access("b", Read)
            .unwrap_err();
        assert!(
            read.contains("spec.sharedWith") && read.contains("\"a\""),
            "{read}"
        );
        let write = owned(Some("a"), None, &["b"])
            .check_access("b", Write)
            .unwrap_err();
        assert!(write.contains("spec.templateId"), "{write}");
    }

    #[test]
    fn manifests_are_revalidated() {
        let mut m = owned(None, None, &[]);
        assert!(m.validate().is_ok());
        m.capture_paths.push("/w/../etc".into());
        assert!(m.validate().is_err());
    }
}
