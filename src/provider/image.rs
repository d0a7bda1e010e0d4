//! Image references and the registry credentials that apply to them: provider-neutral, so
//! every provider that pulls picks credentials the same way.
//!
//! Matching follows what Kubernetes users already know from `imagePullSecrets`: a credential
//! applies when its registry key names the image's registry — Docker Hub's aliases
//! (`docker.io`, `index.docker.io`, `registry-1.docker.io`, `registry.hub.docker.com`, the
//! legacy `https://index.docker.io/v1/`) are one registry — with an optional `*` label
//! (`*.example.com`) and an optional repository path prefix (`example.com/team`). Among
//! several matches the most specific wins (an exact host over a wildcard, then the longer
//! path), and on a tie the first one listed.

use std::collections::BTreeMap;

use base64::Engine;
use oci_spec::distribution::Reference;
use serde::Deserialize;

use super::types::RegistryCredential;

/// The reason of the `Transient` error a provider's `create` answers while it pulls the
/// image in the background: the caller looks again shortly instead of backing off, and
/// reports the pull as progress rather than as a failure.
pub const PULLING_IMAGE: &str = "PullingImage";

/// Docker Hub's registry, as image references normalise to it.
pub const DOCKER_HUB: &str = "docker.io";

/// Names Docker Hub is written as in credentials and references.
const DOCKER_HUB_ALIASES: &[&str] = &[
    "docker.io",
    "index.docker.io",
    "registry-1.docker.io",
    "registry.hub.docker.com",
];

/// Parses an image reference the way Docker does (`busybox` is
/// `docker.io/library/busybox:latest`). The error names the reference and the fix.
pub fn parse(image: &str) -> Result<Reference, String> {
    image.parse::<Reference>().map_err(|e| {
        format!(
            "{image:?} is not a valid image reference ({e}); write it as [registry/]repository[:tag][@sha256:digest], e.g. 127.0.0.1:5000/team/app:1"
        )
    })
}

/// The registry an image is pulled from, with Docker Hub's aliases folded into `docker.io`.
pub fn registry_of(reference: &Reference) -> String {
    canonical_host(reference.registry())
}

/// Whether two references name the same repository (registry aliases folded).
pub fn same_repository(a: &Reference, b: &Reference) -> bool {
    registry_of(a) == registry_of(b) && a.repository() == b.repository()
}

/// Whether the reference `name` lies in `repository` (Docker Hub's aliases folded): how a
/// template image is recognised under any of its names.
pub fn in_repository(name: &str, repository: &str) -> bool {
    match (parse(name), parse(repository)) {
        (Ok(n), Ok(r)) => same_repository(&n, &r),
        _ => false,
    }
}

/// The credential to pull `reference` with, if any applies (see the module docs).
pub fn credential_for<'a>(
    reference: &Reference,
    credentials: &'a [RegistryCredential],
) -> Option<&'a RegistryCredential> {
    let registry = registry_of(reference);
    let mut best: Option<((bool, usize), &RegistryCredential)> = None;
    for credential in credentials {
        let Some(rank) = rank(&credential.registry, &registry, reference.repository()) else {
            continue;
        };
        if best.as_ref().is_none_or(|(r, _)| rank > *r) {
            best = Some((rank, credential));
        }
    }
    best.map(|(_, c)| c)
}

/// How specifically `key` matches the image's registry and repository — (exact host, path
/// segments) — or `None` when it does not apply.
fn rank(key: &str, registry: &str, repository: &str) -> Option<(bool, usize)> {
    let (host, path) = split_key(key);
    let exact = !host.split('.').any(|label| label == "*");
    if !host_matches(&host, registry) {
        return None;
    }
    let prefix: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let repo: Vec<&str> = repository.split('/').collect();
    let applies = prefix.len() <= repo.len() && prefix.iter().zip(&repo).all(|(p, r)| p == r);
    applies.then_some((exact, prefix.len()))
}

/// A credential key as host (aliases folded, lower case) and repository path prefix: the
/// scheme and the registry API paths (`/v1/`, `/v2/`) are not part of the match.
fn split_key(key: &str) -> (String, String) {
    let key = key.trim();
    let key = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    let (host, path) = key.split_once('/').unwrap_or((key, ""));
    let path = path.trim_matches('/');
    let path = match path {
        "v1" | "v2" => "",
        other => other,
    };
    (canonical_host(host), path.to_string())
}

fn canonical_host(host: &str) -> String {
    let host = host.to_ascii_lowercase();
    if DOCKER_HUB_ALIASES.contains(&host.as_str()) {
        DOCKER_HUB.to_string()
    } else {
        host
    }
}

/// `pattern` against `host`, both `name[:port]`: the ports must be equal, and each label of
/// the name equal or `*` (one label, as in `*.example.com`).
fn host_matches(pattern: &str, host: &str) -> bool {
    let (p_name, p_port) = pattern.split_once(':').unwrap_or((pattern, ""));
    let (h_name, h_port) = host.split_once(':').unwrap_or((host, ""));
    if p_port != h_port {
        return false;
    }
    let p: Vec<&str> = p_name.split('.').collect();
    let h: Vec<&str> = h_name.split('.').collect();
    p.len() == h.len() && p.iter().zip(&h).all(|(p, h)| *p == "*" || p == h)
}

/// A credential's identity without its value: a SHA-256 over its registry key and secrets,
/// length-prefixed. Pulls and verifications are keyed by it, so two Secrets holding the same
/// credential share them and nothing keyed by it can be turned back into the secret.
pub fn fingerprint(credential: &RegistryCredential) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for part in [
        credential.registry.as_str(),
        credential.username.as_str(),
        credential.password.as_str(),
        credential.identity_token.as_deref().unwrap_or(""),
    ] {
        h.update(part.len().to_le_bytes());
        h.update(part.as_bytes());
    }
    h.finalize().into()
}

/// The operator's `openImages` setting: images every namespace may boot from a provider's
/// shared cache without proving it could pull them. An entry is a reference (`repo:tag`,
/// `repo@sha256:…`; a missing tag means `latest`, Docker Hub's aliases are one registry) or a
/// prefix ending in `*` (`registry.example.com/base/*`), matched against the reference as
/// written and as Docker normalises it (`docker.io/library/busybox:latest`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpenImages {
    entries: Vec<String>,
}

impl OpenImages {
    /// The setting's entries (checked by [`check_open_image`] at start-up).
    pub fn new(entries: &[String]) -> Self {
        OpenImages {
            entries: entries.iter().map(|e| e.trim().to_string()).collect(),
        }
    }

    /// Whether `image` (as a Sandbox names it) is open to every namespace.
    pub fn allows(&self, image: &str) -> bool {
        let normal = parse(image).ok().map(|r| normalized(&r));
        self.entries
            .iter()
            .any(|entry| match entry.strip_suffix('*') {
                Some(prefix) => {
                    image.starts_with(prefix)
                        || normal.as_ref().is_some_and(|n| n.starts_with(prefix))
                }
                None => {
                    entry == image
                        || normal.is_some() && parse(entry).ok().map(|r| normalized(&r)) == normal
                }
            })
    }
}

/// `registry/repository[:tag][@digest]` with the registry's aliases folded.
fn normalized(reference: &Reference) -> String {
    let mut out = format!("{}/{}", registry_of(reference), reference.repository());
    if let Some(tag) = reference.tag() {
        out.push(':');
        out.push_str(tag);
    }
    if let Some(digest) = reference.digest() {
        out.push('@');
        out.push_str(digest);
    }
    out
}

/// Why an `openImages` entry cannot work, if it cannot: empty, blank inside, a `*` anywhere
/// but at the end, or (without `*`) not an image reference.
pub fn check_open_image(entry: &str) -> Result<(), String> {
    let entry = entry.trim();
    let stem = entry.strip_suffix('*').unwrap_or(entry);
    if entry.is_empty() || entry.contains(char::is_whitespace) {
        return Err(
            "is empty or contains blanks; write an image reference or a prefix ending in `*`"
                .into(),
        );
    }
    if stem.contains('*') {
        return Err(format!(
            "{entry:?} has a `*` before its end; only a trailing `*` (a prefix) is supported"
        ));
    }
    if stem.len() == entry.len() {
        parse(entry)?;
    }
    Ok(())
}

#[derive(Deserialize)]
struct DockerConfig {
    auths: BTreeMap<String, AuthEntry>,
}

#[derive(Deserialize)]
struct AuthEntry {
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    identitytoken: Option<String>,
}

/// Reads the credentials of a Docker `config.json` document (the `.dockerconfigjson` key of
/// a `kubernetes.io/dockerconfigjson` Secret), tagging each with `source`.
///
/// Errors describe the shape that is wrong, never the content: the document is a secret.
pub fn credentials_from_docker_config(
    json: &[u8],
    source: &str,
) -> Result<Vec<RegistryCredential>, String> {
    let config: DockerConfig = serde_json::from_slice(json).map_err(|_| {
        "is not a Docker config document of the form {\"auths\": {\"<registry>\": {\"username\": …, \"password\": …}}}".to_string()
    })?;
    config
        .auths
        .into_iter()
        .map(|(registry, entry)| credential(registry, entry, source))
        .collect()
}

fn credential(
    registry: String,
    entry: AuthEntry,
    source: &str,
) -> Result<RegistryCredential, String> {
    let (username, password) = match (entry.username, entry.password, entry.auth) {
        (Some(u), Some(p), _) => (u, p),
        (_, _, Some(auth)) => {
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(auth.trim())
                .ok()
                .and_then(|b| String::from_utf8(b).ok())
                .ok_or_else(|| {
                    format!("the \"auth\" of registry {registry:?} is not base64 of user:password")
                })?;
            let (u, p) = decoded.split_once(':').ok_or_else(|| {
                format!("the \"auth\" of registry {registry:?} is not base64 of user:password")
            })?;
            (u.to_string(), p.to_string())
        }
        (u, _, None) if entry.identitytoken.is_some() => (u.unwrap_or_default(), String::new()),
        _ => {
            return Err(format!(
                "registry {registry:?} has neither username and password, nor auth, nor identitytoken"
            ));
        }
    };
    Ok(RegistryCredential {
        registry,
        username,
        password,
        identity_token: entry.identitytoken.filter(|t| !t.is_empty()),
        source: source.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cred(registry: &str, source: &str) -> RegistryCredential {
        RegistryCredential {
            registry: registry.into(),
            username: "u".into(),
            password: "p".into(),
            identity_token: None,
            source: source.into(),
        }
    }

    fn pick<'a>(image: &str, creds: &'a [RegistryCredential]) -> Option<&'a str> {
        credential_for(&parse(image).unwrap(), creds).map(|c| c.source.as_str())
    }

    #[test]
    fn docker_hub_aliases_are_one_registry() {
        for key in [
            "https://index.docker.io/v1/",
            "docker.io",
            "index.docker.io",
            "registry-1.docker.io",
            "https://registry.hub.docker.com",
        ] {
            let creds = [cred(key, "hub")];
            assert_eq!(pick("python:3.12-slim", &creds), Some("hub"), "{key}");
            assert_eq!(
                pick("docker.io/library/python", &creds),
                Some("hub"),
                "{key}"
            );
            assert_eq!(pick("team/app:1", &creds), Some("hub"), "{key}");
            assert_eq!(pick("ghcr.io/team/app:1", &creds), None, "{key}");
        }
    }

    #[test]
    fn the_registry_must_match_including_its_port() {
        let creds = [cred("127.0.0.1:5000", "local"), cred("ghcr.io", "gh")];
        assert_eq!(pick("127.0.0.1:5000/base:1", &creds), Some("local"));
        assert_eq!(pick("127.0.0.1:5001/base:1", &creds), None);
        assert_eq!(pick("127.0.0.1/base:1", &creds), None);
        let digest = format!("ghcr.io/a/b@sha256:{}", "a".repeat(64));
        assert_eq!(pick(&digest, &creds), Some("gh"));
        let creds = [cred("http://127.0.0.1:5000/v2/", "local")];
        assert_eq!(pick("127.0.0.1:5000/base", &creds), Some("local"));
    }

    #[test]
    fn the_most_specific_match_wins_and_ties_go_to_the_first() {
        let creds = [
            cred("*.example.com", "wild"),
            cred("r.example.com", "host"),
            cred("r.example.com/team", "team"),
            cred("r.example.com/team/app", "app"),
            cred("r.example.com/team", "team-later"),
        ];
        assert_eq!(pick("r.example.com/team/app:1", &creds), Some("app"));
        assert_eq!(pick("r.example.com/team/other:1", &creds), Some("team"));
        assert_eq!(pick("r.example.com/teams/x", &creds), Some("host"));
        assert_eq!(pick("q.example.com/x", &creds), Some("wild"));
        assert_eq!(pick("a.q.example.com/x", &creds), None, "* is one label");
        assert_eq!(pick("example.com/x", &creds), None);
    }

    #[test]
    fn docker_config_documents_are_read_without_echoing_them() {
        let auth = base64::engine::general_purpose::STANDARD.encode("alice:s3cr3t");
        let json = format!(
            r#"{{"auths": {{"127.0.0.1:5000": {{"auth": "{auth}"}},
                "ghcr.io": {{"username": "bob", "password": "tok"}},
                "r.example.com": {{"identitytoken": "refresh"}}}}}}"#
        );
        let creds = credentials_from_docker_config(json.as_bytes(), "regcred").unwrap();
        assert_eq!(creds.len(), 3);
        assert_eq!(creds[0].registry, "127.0.0.1:5000");
        assert_eq!(
            (creds[0].username.as_str(), creds[0].password.as_str()),
            ("alice", "s3cr3t")
        );
        assert_eq!(creds[1].username, "bob");
        assert_eq!(creds[2].identity_token.as_deref(), Some("refresh"));
        assert!(creds.iter().all(|c| c.source == "regcred"));
        let printed = format!("{creds:?}");
        assert!(
            !printed.contains("s3cr3t")
                && !printed.contains("tok\"")
                && !printed.contains("refresh")
        );

        let bad = credentials_from_docker_config(br#"{"auths": {"x": {"password": 12345}}}"#, "s")
            .unwrap_err();
        assert!(!bad.contains("12345"), "{bad}");
        let bad =
            credentials_from_docker_config(br#"{"auths": {"x": {"auth": "bm9jb2xvbg=="}}}"#, "s")
                .unwrap_err();
        assert!(bad.contains("user:password"), "{bad}");
        assert!(credentials_from_docker_config(b"{}", "s").is_err());
    }

    #[test]
    fn open_images_match_references_and_prefixes_like_docker_names_them() {
        let open = OpenImages::new(&[
            "sandbox-operator/base:bookworm".to_string(),
            "registry.example.com/base/*".to_string(),
            "busybox".to_string(),
        ]);
        for yes in [
            "sandbox-operator/base:bookworm",
            "docker.io/sandbox-operator/base:bookworm",
            "index.docker.io/sandbox-operator/base:bookworm",
            "registry.example.com/base/python:3.12",
            "busybox:latest",
            "docker.io/library/busybox",
        ] {
            assert!(open.allows(yes), "{yes}");
        }
        for no in [
            "sandbox-operator/base:trixie",
            "sandbox-operator/template:abc",
            "registry.example.com/based/x:1",
            "registry.example.com/team/app:1",
            "busybox:1.36",
            &format!("sha256:{}", "a".repeat(64)),
        ] {
            assert!(!open.allows(no), "{no}");
        }
        assert!(!OpenImages::default().allows("sandbox-operator/base:bookworm"));
    }

    #[test]
    fn open_image_entries_are_checked() {
        assert!(check_open_image("sandbox-operator/base:bookworm").is_ok());
        assert!(check_open_image("registry.example.com/base/*").is_ok());
        assert!(check_open_image("*").is_ok());
        assert!(check_open_image("").is_err());
        assert!(check_open_image("a b").is_err());
        assert!(
            check_open_image("registry.example.com/*/x")
                .unwrap_err()
                .contains("trailing")
        );
        assert!(check_open_image("Not A Reference").is_err());
    }

    #[test]
    fn fingerprints_tell_credentials_apart_without_holding_them() {
        let a = cred("r:5000", "s");
        let mut b = a.clone();
        b.password = "other".into();
        assert_eq!(fingerprint(&a), fingerprint(&a.clone()));
        assert_ne!(fingerprint(&a), fingerprint(&b));
    }

    #[test]
    fn template_images_are_found_under_every_spelling_of_the_repository() {
        let repo = "sandbox-operator/template";
        for name in [
            "sandbox-operator/template:abc",
            "docker.io/sandbox-operator/template:abc",
            "index.docker.io/sandbox-operator/template",
            &format!("sandbox-operator/template@sha256:{}", "a".repeat(64)),
        ] {
            assert!(in_repository(name, repo), "{name}");
        }
        for name in [
            "sandbox-operator/base:bookworm",
            "sandbox-operator/template-x:1",
            "registry.local/sandbox-operator/template:abc",
        ] {
            assert!(!in_repository(name, repo), "{name}");
        }
        assert!(in_repository(
            "registry.local/templates:x",
            "registry.local/templates"
        ));
    }

    #[test]
    fn references_parse_like_docker() {
        let r = parse("busybox").unwrap();
        assert_eq!(
            (registry_of(&r).as_str(), r.repository(), r.tag()),
            ("docker.io", "library/busybox", Some("latest"))
        );
        let r = parse("index.docker.io/team/app:2").unwrap();
        assert_eq!(registry_of(&r), "docker.io");
        let pinned = format!("docker.io/team/app@sha256:{}", "b".repeat(64));
        assert!(same_repository(&r, &parse(&pinned).unwrap()));
        assert!(!same_repository(&r, &parse("team/other:2").unwrap()));
        assert!(
            parse("Not A Reference")
                .unwrap_err()
                .contains("not a valid image reference")
        );
    }
}
