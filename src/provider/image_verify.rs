//! Asking a registry whether a credential may pull an image, without pulling it: a manifest
//! `HEAD` of the image's digest with the credential (or none), through the registry's own
//! authentication (HTTP basic, or a bearer token from the realm its challenge names, scoped
//! to `repository:<name>:pull`). This is how a Sandbox proves it could have pulled an image
//! another namespace left in a shared cache.
//!
//! Registries on loopback are spoken to over plain HTTP (as the Docker engine does without
//! configuration), every other registry over HTTPS only, so a credential never crosses the
//! network in clear text. Docker Hub's API lives at `registry-1.docker.io`.
//!
//! Successful answers are remembered for [`PASSED_FOR`], keyed by (credential fingerprint or
//! anonymous, repository, digest): a burst of creates (a warm pool filling up, twenty
//! Sandboxes of one image) costs the registry one request, and a revoked credential stops
//! working within that bound. The namespace is not part of the key: the answer is about the
//! credential, and any namespace presenting the very same credential could pull the image
//! too. Refusals and failures are never remembered, so a fixed Secret works on the next try.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use oci_spec::distribution::Reference;
use reqwest::StatusCode;
use reqwest::header::{ACCEPT, CONTENT_TYPE, WWW_AUTHENTICATE};

use super::image::{self, DOCKER_HUB};
use super::types::RegistryCredential;

/// How long a successful verification stands for the same credential and digest.
pub const PASSED_FOR: Duration = Duration::from_secs(60);
/// Bound of one request to a registry or its token service.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
/// Every manifest type a registry may answer an image digest with.
const MANIFEST_TYPES: &str = "application/vnd.oci.image.index.v1+json, \
    application/vnd.oci.image.manifest.v1+json, \
    application/vnd.docker.distribution.manifest.list.v2+json, \
    application/vnd.docker.distribution.manifest.v2+json";

/// What the registry said about the credential and the image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The credential may pull it.
    Allowed,
    /// The registry refused the credential (or its absence) for this repository.
    Refused(StatusCode),
    /// The registry does not serve this digest under this repository.
    Absent,
}

/// The registry could not give an answer (unreachable, timed out, an unexpected status).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct Unavailable(pub String);

type Key = (Option<[u8; 32]>, String);

/// Verifies pull access against registries, remembering successes briefly (see the module
/// docs). Shared by every reconcile.
pub struct Verifier {
    http: reqwest::Client,
    passed: Mutex<HashMap<Key, Instant>>,
}

impl Default for Verifier {
    fn default() -> Self {
        Verifier {
            http: reqwest::Client::builder()
                .timeout(REQUEST_TIMEOUT)
                .build()
                .unwrap_or_default(),
            passed: Mutex::default(),
        }
    }
}

impl Verifier {
    /// Whether `credential` (anonymous when `None`) may pull `pinned`, a
    /// `repository@sha256:…` reference.
    pub async fn verify(
        &self,
        pinned: &Reference,
        credential: Option<&RegistryCredential>,
    ) -> Result<Verdict, Unavailable> {
        let key = (credential.map(image::fingerprint), pinned.whole());
        if self.remembered(&key) {
            return Ok(Verdict::Allowed);
        }
        let verdict = self.ask(pinned, credential).await?;
        if verdict == Verdict::Allowed {
            let mut passed = self.passed.lock().unwrap_or_else(|p| p.into_inner());
            passed.retain(|_, at| at.elapsed() < PASSED_FOR);
            passed.insert(key, Instant::now());
        }
        Ok(verdict)
    }

    fn remembered(&self, key: &Key) -> bool {
        let passed = self.passed.lock().unwrap_or_else(|p| p.into_inner());
        passed.get(key).is_some_and(|at| at.elapsed() < PASSED_FOR)
    }

    /// One manifest `HEAD`; on a bearer challenge, once more with a token for the repository.
    async fn ask(
        &self,
        pinned: &Reference,
        credential: Option<&RegistryCredential>,
    ) -> Result<Verdict, Unavailable> {
        let digest = pinned
            .digest()
            .ok_or_else(|| Unavailable(format!("{} has no digest", pinned.whole())))?;
        let url = format!(
            "{}/v2/{}/manifests/{digest}",
            endpoint(&image::registry_of(pinned)),
            pinned.repository()
        );
        let head = |auth: Option<Auth>| {
            let request = self.http.head(&url).header(ACCEPT, MANIFEST_TYPES);
            match auth {
                Some(Auth::Basic(u, p)) => request.basic_auth(u, Some(p)),
                Some(Auth::Bearer(t)) => request.bearer_auth(t),
                None => request,
            }
        };
        let failed = |e: reqwest::Error| Unavailable(format!("asking {url}: {e}"));
        let response = head(basic(credential)).send().await.map_err(failed)?;
        let challenge = response
            .headers()
            .get(WWW_AUTHENTICATE)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer_challenge);
        let response = match (response.status(), challenge) {
            (StatusCode::UNAUTHORIZED, Some(challenge)) => {
                let token = self
                    .token(&challenge, pinned.repository(), credential)
                    .await?;
                match token {
                    Some(t) => head(Some(Auth::Bearer(t))).send().await.map_err(failed)?,
                    None => return Ok(Verdict::Refused(StatusCode::UNAUTHORIZED)),
                }
            }
            _ => response,
        };
        verdict(response.status(), &url)
    }

    /// A pull token for `repository` from the challenge's realm, `None` when the token
    /// service refuses the credential.
    async fn token(
        &self,
        challenge: &Challenge,
        repository: &str,
        credential: Option<&RegistryCredential>,
    ) -> Result<Option<String>, Unavailable> {
        let scope = format!("repository:{repository}:pull");
        let mut query = vec![("scope", scope.as_str())];
        if let Some(service) = &challenge.service {
            query.push(("service", service));
        }
        let request = match credential {
            Some(c) if c.identity_token.is_some() => {
                let token = c.identity_token.as_deref().unwrap_or_default();
                let mut form = query.clone();
                form.extend([
                    ("grant_type", "refresh_token"),
                    ("refresh_token", token),
                    ("client_id", "sandbox-operator"),
                ]);
                let body = url::form_urlencoded::Serializer::new(String::new())
                    .extend_pairs(&form)
                    .finish();
                self.http
                    .post(&challenge.realm)
                    .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
                    .body(body)
            }
            _ => {
                let request = self.http.get(&challenge.realm).query(&query);
                match basic(credential) {
                    Some(Auth::Basic(u, p)) => request.basic_auth(u, Some(p)),
                    _ => request,
                }
            }
        };
        let failed = |e: reqwest::Error| {
            Unavailable(format!("asking token service {}: {e}", challenge.realm))
        };
        let response = request.send().await.map_err(failed)?;
        match response.status() {
            s if s.is_success() => {
                let body: serde_json::Value = response.json().await.map_err(failed)?;
                let token = body
                    .get("token")
                    .or_else(|| body.get("access_token"))
                    .and_then(|t| t.as_str());
                Ok(token.map(str::to_string))
            }
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => Ok(None),
            s => Err(Unavailable(format!(
                "token service {} answered {s}",
                challenge.realm
            ))),
        }
    }
}

enum Auth {
    Basic(String, String),
    Bearer(String),
}

/// HTTP basic with the credential's user name and password, when it has them.
fn basic(credential: Option<&RegistryCredential>) -> Option<Auth> {
    credential
        .filter(|c| !c.username.is_empty() && !c.password.is_empty())
        .map(|c| Auth::Basic(c.username.clone(), c.password.clone()))
}

/// The registry's answer to the manifest `HEAD`, sorted.
fn verdict(status: StatusCode, url: &str) -> Result<Verdict, Unavailable> {
    match status {
        s if s.is_success() => Ok(Verdict::Allowed),
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => Ok(Verdict::Refused(status)),
        StatusCode::NOT_FOUND => Ok(Verdict::Absent),
        s => Err(Unavailable(format!("{url} answered {s}"))),
    }
}

/// The base URL of a registry's API (see the module docs for the scheme).
fn endpoint(registry: &str) -> String {
    if registry == DOCKER_HUB {
        return "https://registry-1.docker.io".into();
    }
    let host = registry
        .rsplit_once(':')
        .filter(|(_, port)| port.chars().all(|c| c.is_ascii_digit()))
        .map_or(registry, |(host, _)| host);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let loopback = host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    let scheme = if loopback { "http" } else { "https" };
    format!("{scheme}://{registry}")
}

/// A `Bearer realm="…",service="…"` challenge.
#[derive(Debug, PartialEq, Eq)]
struct Challenge {
    realm: String,
    service: Option<String>,
}

fn bearer_challenge(header: &str) -> Option<Challenge> {
    let rest = header.trim().strip_prefix("Bearer ")?;
    let mut realm = None;
    let mut service = None;
    for part in rest.split(',') {
        let Some((k, v)) = part.trim().split_once('=') else {
            continue;
        };
        let v = v.trim().trim_matches('"').to_string();
        match k.trim() {
            "realm" => realm = Some(v),
            "service" => service = Some(v),
            _ => {}
        }
    }
    Some(Challenge {
        realm: realm?,
        service,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_registries_speak_http_and_all_others_https() {
        assert_eq!(endpoint("127.0.0.1:15000"), "http://127.0.0.1:15000");
        assert_eq!(endpoint("localhost:5000"), "http://localhost:5000");
        assert_eq!(endpoint("[::1]:5000"), "http://[::1]:5000");
        assert_eq!(endpoint("ghcr.io"), "https://ghcr.io");
        assert_eq!(endpoint("10.0.0.5:5000"), "https://10.0.0.5:5000");
        assert_eq!(endpoint("docker.io"), "https://registry-1.docker.io");
    }

    #[test]
    fn bearer_challenges_are_read() {
        let c = bearer_challenge(
            r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:x:pull""#,
        );
        assert_eq!(
            c,
            Some(Challenge {
                realm: "https://auth.docker.io/token".into(),
                service: Some("registry.docker.io".into()),
            })
        );
        assert_eq!(bearer_challenge(r#"Basic realm="x""#), None);
        assert_eq!(bearer_challenge("Bearer service=\"x\""), None);
    }

    #[test]
    fn answers_are_sorted_by_what_they_mean_for_the_sandbox() {
        let v = |s: u16| verdict(StatusCode::from_u16(s).unwrap(), "u");
        assert_eq!(v(200).unwrap(), Verdict::Allowed);
        assert_eq!(v(401).unwrap(), Verdict::Refused(StatusCode::UNAUTHORIZED));
        assert_eq!(v(403).unwrap(), Verdict::Refused(StatusCode::FORBIDDEN));
        assert_eq!(v(404).unwrap(), Verdict::Absent);
        assert!(v(503).is_err() && v(500).is_err());
    }

    #[tokio::test]
    async fn only_successes_are_remembered_and_only_for_their_credential() {
        let verifier = Verifier::default();
        let pinned = image::parse(&format!("127.0.0.1:9/x@sha256:{}", "a".repeat(64))).unwrap();
        let cred = RegistryCredential {
            registry: "127.0.0.1:9".into(),
            username: "u".into(),
            password: "p".into(),
            identity_token: None,
            source: "s".into(),
        };
        let key = |c: Option<&RegistryCredential>| (c.map(image::fingerprint), pinned.whole());
        verifier
            .passed
            .lock()
            .unwrap()
            .insert(key(Some(&cred)), Instant::now());
        assert_eq!(
            verifier.verify(&pinned, Some(&cred)).await.unwrap(),
            Verdict::Allowed
        );
        // Anonymously nothing is remembered, and port 9 answers nothing: no verdict.
        assert!(verifier.verify(&pinned, None).await.is_err());
        assert!(!verifier.remembered(&key(None)));
    }
}
