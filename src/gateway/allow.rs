//! Allow-list matching: the one rule for which names a sandbox may reach.
//!
//! An entry is either an exact name (`example.com`) or a wildcard (`*.example.com`) that
//! matches every name BELOW `example.com` but not `example.com` itself. Names compare
//! case-insensitively and without a trailing dot. An IP literal never matches: the gateway
//! forwards by name only, so a raw-IP connection has nothing to be allowed by.

use std::net::IpAddr;

/// One sandbox's allow-list, normalised.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList {
    exact: Vec<String>,
    /// Suffixes with their leading dot (`.example.com` for `*.example.com`).
    suffixes: Vec<String>,
}

/// Lower-cases a name and strips one trailing dot; `None` for an empty name or an IP
/// literal (an address is never a name an allow-list can list).
pub fn normalise(name: &str) -> Option<String> {
    let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
    let literal = name.trim_start_matches('[').trim_end_matches(']');
    if name.is_empty() || literal.parse::<IpAddr>().is_ok() {
        None
    } else {
        Some(name)
    }
}

/// Checks one allow-list entry; the error says what is wrong with it.
pub fn check_entry(entry: &str) -> Result<(), String> {
    let name = entry.strip_prefix("*.").unwrap_or(entry);
    let labels_ok = name.split('.').all(|label| {
        !label.is_empty()
            && label.len() <= 63
            && label
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            && !label.starts_with('-')
            && !label.ends_with('-')
    });
    if name.is_empty() || name.len() > 253 || !labels_ok {
        return Err(format!(
            "{entry:?} is not a domain name or a `*.domain` wildcard (letters, digits, '-', '_' \
             in dot-separated labels)"
        ));
    }
    if normalise(name).is_none() {
        return Err(format!(
            "{entry:?} is an IP address; the egress gateway forwards by name only"
        ));
    }
    Ok(())
}

impl AllowList {
    /// Builds a list from entries, skipping (and returning) the ones that are not valid.
    pub fn new<S: AsRef<str>>(entries: &[S]) -> (AllowList, Vec<String>) {
        let mut list = AllowList::default();
        let mut rejected = Vec::new();
        for entry in entries.iter().map(AsRef::as_ref) {
            if check_entry(entry).is_err() {
                rejected.push(entry.to_string());
                continue;
            }
            let lower = entry.to_ascii_lowercase();
            match lower.strip_prefix('*') {
                Some(suffix) => list.suffixes.push(suffix.to_string()),
                None => list.exact.push(lower),
            }
        }
        (list, rejected)
    }

    /// Whether `name` (as a client sent it) may be reached.
    pub fn allows(&self, name: &str) -> bool {
        let Some(name) = normalise(name) else {
            return false;
        };
        self.exact.contains(&name)
            || self
                .suffixes
                .iter()
                .any(|s| name.len() > s.len() && name.ends_with(s.as_str()))
    }

    /// Whether nothing at all is allowed.
    pub fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.suffixes.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_names_and_wildcards_match_as_documented() {
        let (list, rejected) = AllowList::new(&["Example.com", "*.pypi.org"]);
        assert!(rejected.is_empty());
        assert!(list.allows("example.com"));
        assert!(list.allows("EXAMPLE.COM."));
        assert!(
            !list.allows("www.example.com"),
            "an exact entry has no subdomains"
        );
        assert!(list.allows("files.pypi.org"));
        assert!(list.allows("a.b.pypi.org"));
        assert!(
            !list.allows("pypi.org"),
            "*.x is subdomains only, not x itself"
        );
        assert!(!list.allows("evilpypi.org"));
        assert!(!list.allows("pypi.org.evil.com"));
        assert!(!list.allows(""));
    }

    #[test]
    fn ip_literals_never_match_and_bad_entries_are_rejected() {
        let (list, rejected) =
            AllowList::new(&["10.0.0.1", "*.", "a..b", "-x.com", "ok.com", "[::1]"]);
        assert_eq!(rejected, vec!["10.0.0.1", "*.", "a..b", "-x.com", "[::1]"]);
        assert!(!list.allows("10.0.0.1"));
        assert!(!list.allows("[::1]"));
        assert!(list.allows("ok.com"));
        assert!(check_entry("*.example.com").is_ok());
        assert!(check_entry("1.2.3.4").unwrap_err().contains("IP address"));
    }

    #[test]
    fn an_empty_list_allows_nothing() {
        let (list, _) = AllowList::new::<&str>(&[]);
        assert!(list.is_empty());
        assert!(!list.allows("example.com"));
    }
}
