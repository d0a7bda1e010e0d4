//! E2B sandbox ids: each one names its Sandbox object, namespace included, so any router
//! (this REST API, a later envd or port router that sees only `E2b-Sandbox-Id` or the host
//! `{port}-{sandboxID}.{domain}`) finds the object from the id alone, without an index.
//!
//! The id is `{suffix}-{namespace}`, the object is `e2b-{suffix}` in `namespace`, and the
//! suffix is [`SUFFIX_LEN`] characters of `[a-z0-9]`: its fixed length makes the split
//! unambiguous although namespaces contain `-`. Every character is a DNS label character, so
//! the id fits a host name; `{port}-{sandboxID}` fits one DNS label (63) for namespaces of up
//! to 44 characters.

/// Length of the random part of an id.
pub const SUFFIX_LEN: usize = 12;
/// Prefix of the Sandbox objects' names.
pub const NAME_PREFIX: &str = "e2b-";

/// The Sandbox object an id names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxRef {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

/// A new id in `namespace`.
pub fn generate(namespace: &str) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let suffix: String = (0..SUFFIX_LEN)
        .map(|_| char::from(ALPHABET[fastrand::usize(..ALPHABET.len())]))
        .collect();
    format!("{suffix}-{namespace}")
}

/// The object `id` names; `None` when it is not one of ours.
pub fn parse(id: &str) -> Option<SandboxRef> {
    let suffix = id.get(..SUFFIX_LEN)?;
    let namespace = id.get(SUFFIX_LEN..)?.strip_prefix('-')?;
    let lower = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    let valid_ns = !namespace.is_empty()
        && namespace.len() <= 63
        && namespace.chars().all(|c| lower(c) || c == '-')
        && !namespace.starts_with('-')
        && !namespace.ends_with('-');
    (suffix.chars().all(lower) && valid_ns).then(|| SandboxRef {
        namespace: namespace.to_string(),
        name: format!("{NAME_PREFIX}{suffix}"),
    })
}

/// The id of the object `name` in `namespace`; `None` for objects not made by this API.
pub fn of(namespace: &str, name: &str) -> Option<String> {
    let suffix = name.strip_prefix(NAME_PREFIX)?;
    let id = format!("{suffix}-{namespace}");
    parse(&id).map(|_| id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_names_its_namespace_and_object_and_round_trips() {
        let id = generate("team-a-prod");
        let r = parse(&id).unwrap();
        assert_eq!(r.namespace, "team-a-prod");
        assert!(r.name.starts_with(NAME_PREFIX));
        assert_eq!(of(&r.namespace, &r.name).as_deref(), Some(id.as_str()));
        assert_ne!(generate("a"), generate("a"));
    }

    #[test]
    fn foreign_ids_and_names_are_not_ours() {
        for bad in [
            "",
            "short-a",
            "abcdefghijkl",
            "abcdefghijkl-",
            "ABCDEFGHIJKL-a",
            "abcdefghijkl_a",
            "abcdefghijkl-a/b",
            "abcdefghijkl--a",
        ] {
            assert_eq!(parse(bad), None, "{bad}");
        }
        assert_eq!(of("a", "my-sandbox"), None);
        assert_eq!(of("a", "e2b-x"), None);
    }
}
