//! Pure checks on strings that cross into shell commands, object keys and provider names.
//!
//! The CRD schema enforces the same shapes at admission (see `api`); these run again at the
//! provider boundary because a provider must not trust that every caller went through the
//! API server.

use super::{ProviderError, ProviderResult};

/// Characters allowed in a capture path segment: no shell metacharacters, no whitespace.
fn is_plain_path_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '/' | '.' | '_' | '-' | '+' | '@' | ',' | '=')
}

/// Checks a path that becomes both a `sh -c` argument and a `tar` member selector.
///
/// Absolute, no `..` segment, no empty or `.` segment, plain characters only, and not `/`
/// itself.
pub fn capture_path(path: &str) -> Result<(), String> {
    if !path.starts_with('/') {
        return Err(format!(
            "capture path {path:?} must be absolute (start with '/')"
        ));
    }
    if path == "/" {
        return Err(
            "capture path \"/\" would capture the whole filesystem; name a directory".into(),
        );
    }
    if let Some(bad) = path.chars().find(|c| !is_plain_path_char(*c)) {
        return Err(format!(
            "capture path {path:?} contains {bad:?}; only letters, digits and / . _ - + @ , = are allowed"
        ));
    }
    for segment in path.trim_end_matches('/').split('/').skip(1) {
        match segment {
            "" => {
                return Err(format!(
                    "capture path {path:?} contains an empty segment (//)"
                ));
            }
            "." | ".." => {
                return Err(format!(
                    "capture path {path:?} contains a {segment:?} segment; give a normalised absolute path"
                ));
            }
            _ => {}
        }
    }
    Ok(())
}

/// Checks a name used verbatim as an object-key segment and a Docker name segment
/// (template ids, volume names): lowercase alphanumerics, `-`, `_`, `.`, starting with an
/// alphanumeric, at most 128 characters.
pub fn resource_name(what: &str, name: &str) -> Result<(), String> {
    let ok_start = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    let ok_chars = name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '_' | '.'));
    if name.is_empty() || name.len() > 128 || !ok_start || !ok_chars || name.contains("..") {
        return Err(format!(
            "{what} {name:?} must be 1-128 characters of a-z, 0-9, '-', '_' or '.', start with a letter or digit, and not contain '..'"
        ));
    }
    Ok(())
}

/// Relative member name for an absolute capture path: `/workspace/app/` → `workspace/app`.
pub fn archive_member(path: &str) -> &str {
    path.trim_matches('/')
}

/// Normalises an absolute sandbox path: `/a//b/` → `/a/b`. Refuses relative paths, NUL, and
/// `.`/`..` components (a path that means something other than what it says is a bug or an
/// attack, and `rm -rf` is downstream of this).
pub fn sandbox_path(what: &str, path: &str) -> ProviderResult<String> {
    if !path.starts_with('/') {
        return Err(ProviderError::invalid(format!(
            "{what} {path:?} must be an absolute path inside the sandbox (start with '/')"
        )));
    }
    if path.contains('\0') {
        return Err(ProviderError::invalid(format!(
            "{what} {path:?} contains a NUL byte"
        )));
    }
    let mut parts = Vec::new();
    for part in path.split('/') {
        match part {
            "" => {}
            "." | ".." => {
                return Err(ProviderError::invalid(format!(
                    "{what} {path:?} contains a {part:?} component; give a normalised absolute path"
                )));
            }
            p => parts.push(p),
        }
    }
    Ok(format!("/{}", parts.join("/")))
}

/// `(parent, last segment)` of a normalised path other than `/`.
pub fn split_parent(path: &str) -> (&str, &str) {
    match path.rfind('/') {
        Some(0) | None => ("/", path.trim_start_matches('/')),
        Some(i) => (&path[..i], &path[i + 1..]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capture_paths_must_be_plain_absolute_and_traversal_free() {
        for ok in ["/workspace", "/home/user/app/", "/opt/a.b_c-d"] {
            assert!(capture_path(ok).is_ok(), "{ok}");
        }
        for (bad, why) in [
            ("workspace", "absolute"),
            ("/", "whole filesystem"),
            ("/a/../etc", "\"..\" segment"),
            ("/a/./b", "\".\" segment"),
            ("/a//b", "empty segment"),
            ("/a;rm -rf /", "contains ';'"),
            ("/a$(id)", "contains '$'"),
            ("/a b", "contains ' '"),
            ("/a`b`", "contains '`'"),
        ] {
            let err = capture_path(bad).unwrap_err();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }

    #[test]
    fn resource_names_are_key_and_docker_safe() {
        assert!(resource_name("template", "node-20.deps_v1").is_ok());
        for bad in ["", "-x", "A", "a/b", "a..b", "a b", &"x".repeat(129)] {
            assert!(resource_name("template", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn archive_members_drop_leading_and_trailing_slashes() {
        assert_eq!(archive_member("/workspace/app/"), "workspace/app");
    }
}
