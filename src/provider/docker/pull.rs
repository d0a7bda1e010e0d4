//! Images on Docker: which image a create boots, and pulling it from its registry.
//!
//! - **Policy** is Kubernetes' `imagePullPolicy`: `Never` uses only what the engine has,
//!   `IfNotPresent` pulls only an image the engine lacks (so local images — the base image,
//!   anything built or loaded on the engine — never need a registry), `Always` resolves the
//!   reference at the registry on every create.
//! - **Credentials** come with each request; the one whose registry matches the reference is
//!   sent to the engine for that pull only (see [`crate::provider::image`]). Nothing here
//!   stores, logs or prints them; error messages name the Secret they came from.
//! - **One pull per image**: pulls run in the background, one per reference and credential,
//!   and a create that needs an image being pulled answers `Transient` with reason
//!   [`PULLING_IMAGE`] at once instead of holding a provider slot for minutes. Every sandbox
//!   that waited for a pull gets its outcome once (with size and duration, or the error) on
//!   its next create, rather than starting a pull of its own; a sandbox that comes later
//!   starts afresh (so `Always` resolves the tag again). Each pull is bounded by the
//!   provider's `imagePullTimeoutSeconds`.
//! - **Digests**: a create boots an image that came from a registry by its digest reference
//!   (`repository@sha256:…`) and records it on the container, so status can pin it and a
//!   recreate can boot the same bits after the tag has moved.
//! - **Failures are distinct**: the registry refusing the credentials is `Unauthorized`
//!   naming the Secret, a missing repository or tag is `NotFound` naming the reference, and a
//!   registry that cannot be reached is `Transient`.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::auth::DockerCredentials;
use bollard::models::ImageInspect;
use bollard::query_parameters::CreateImageOptionsBuilder;
use futures::TryStreamExt;
use oci_spec::distribution::Reference;

use super::{DockerProvider, is_not_found, map_err};
use crate::provider::image::{self, PULLING_IMAGE};
use crate::provider::{
    ImagePull, ImagePullPolicy, ProviderError, ProviderResult, RegistryCredential,
};

/// How long a finished pull's outcome waits for the creates that waited for it to come back.
const SHARE_WINDOW: Duration = Duration::from_secs(120);

/// What a create boots after the image is settled.
pub(crate) struct Boot {
    /// The reference to create the container from: the digest reference when the image came
    /// from a registry, else the image as named.
    pub reference: String,
    /// `repository@sha256:…`, or the engine's image id for an image no registry knows.
    pub digest: Option<String>,
    /// The pull this create used, if it needed one.
    pub pull: Option<ImagePull>,
}

/// One pull: the reference, and which credential (by fingerprint, never by value).
#[derive(Clone, PartialEq, Eq, Hash)]
struct PullKey {
    reference: String,
    credential: Option<[u8; 32]>,
}

impl PullKey {
    fn new(reference: &str, credential: Option<&RegistryCredential>) -> Self {
        let credential = credential.map(image::fingerprint);
        PullKey {
            reference: reference.to_string(),
            credential,
        }
    }
}

/// One pull's state, with the creates (by sandbox name) waiting for its outcome.
enum Entry {
    Running {
        since: Instant,
        waiters: HashSet<String>,
    },
    Done {
        at: Instant,
        result: Result<ImagePull, ProviderError>,
        waiters: HashSet<String>,
    },
}

/// The pulls in flight and recently finished, shared by every clone of a provider.
pub(crate) struct Pulls {
    entries: Mutex<HashMap<PullKey, Entry>>,
    /// A pull still marked running after this long lost its task (it is bounded by the pull
    /// timeout): it is forgotten, so no sandbox waits for it forever.
    stale_after: Duration,
}

/// What the table says about one pull, for one sandbox.
enum Seen {
    /// Nothing this sandbox waits for.
    None,
    /// In flight; the sandbox is now among its waiters.
    Running,
    /// Finished, and this sandbox waited for it: its outcome, handed out once.
    Done(Result<ImagePull, ProviderError>),
}

impl Pulls {
    /// A table for pulls bounded by `pull_timeout`.
    pub(crate) fn new(pull_timeout: Duration) -> Self {
        Pulls {
            entries: Mutex::default(),
            stale_after: pull_timeout + Duration::from_secs(60),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PullKey, Entry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Looks the pull up for the sandbox `waiter`: joins it when running, takes its outcome
    /// when it finished while `waiter` waited. Outcomes no waiter came back for (the sandbox
    /// was deleted meanwhile) are forgotten after [`SHARE_WINDOW`].
    fn seen(&self, key: &PullKey, waiter: &str) -> Seen {
        let mut entries = self.lock();
        entries.retain(|_, e| match e {
            Entry::Running { since, .. } => since.elapsed() < self.stale_after,
            Entry::Done { at, waiters, .. } => !waiters.is_empty() && at.elapsed() < SHARE_WINDOW,
        });
        match entries.get_mut(key) {
            None => Seen::None,
            Some(Entry::Running { waiters, .. }) => {
                waiters.insert(waiter.to_string());
                Seen::Running
            }
            Some(Entry::Done {
                result, waiters, ..
            }) => {
                if waiters.remove(waiter) {
                    Seen::Done(result.clone())
                } else {
                    Seen::None
                }
            }
        }
    }

    /// Starts a pull for `waiter` unless one is already running (then `waiter` joins it).
    /// Returns whether the caller must run it.
    fn begin(&self, key: &PullKey, waiter: &str) -> bool {
        let mut entries = self.lock();
        if let Some(Entry::Running { waiters, .. }) = entries.get_mut(key) {
            waiters.insert(waiter.to_string());
            return false;
        }
        let waiters = HashSet::from([waiter.to_string()]);
        let since = Instant::now();
        entries.insert(key.clone(), Entry::Running { since, waiters });
        true
    }

    /// Records the outcome for everyone who waited.
    fn finish(&self, key: PullKey, result: Result<ImagePull, ProviderError>) {
        let mut entries = self.lock();
        let waiters = match entries.remove(&key) {
            Some(Entry::Running { waiters, .. }) => waiters,
            _ => HashSet::new(),
        };
        let at = Instant::now();
        entries.insert(
            key,
            Entry::Done {
                at,
                result,
                waiters,
            },
        );
    }

    fn forget(&self, key: &PullKey) {
        self.lock().remove(key);
    }
}

impl DockerProvider {
    /// Settles the image the create of `sandbox` boots under `policy`: answers at once from
    /// the engine, or starts (or joins) the pull and answers `Transient`/[`PULLING_IMAGE`]
    /// until it is done.
    pub(super) async fn image_for_create(
        &self,
        sandbox: &str,
        image: &str,
        policy: ImagePullPolicy,
        credentials: &[RegistryCredential],
    ) -> ProviderResult<Boot> {
        if policy == ImagePullPolicy::Never {
            return match self.local_image(image).await? {
                Some(local) => Ok(boot(image, &local, None)),
                None => Err(ProviderError::not_found(format!(
                    "image {image:?} is not present on Docker provider {:?} and spec.imagePullPolicy is Never; \
                     load or build it on the engine, or set spec.imagePullPolicy to IfNotPresent",
                    self.name
                ))
                .with_reason("ImageNotPresent")),
            };
        }
        let reference =
            image::parse(image).map_err(|m| ProviderError::invalid(format!("spec.image: {m}")))?;
        let credential = image::credential_for(&reference, credentials);
        let key = PullKey::new(image, credential);
        match self.pulls.seen(&key, sandbox) {
            Seen::Running => return Err(pulling(image, policy)),
            Seen::Done(Err(e)) => return Err(e),
            Seen::Done(Ok(pull)) => match self.local_image(image).await? {
                Some(local) => return Ok(boot(image, &local, Some(pull))),
                // Removed from the engine since: pull it again.
                None => self.pulls.forget(&key),
            },
            Seen::None => {}
        }
        if policy == ImagePullPolicy::IfNotPresent
            && let Some(local) = self.local_image(image).await?
        {
            return Ok(boot(image, &local, None));
        }
        if self.pulls.begin(&key, sandbox) {
            self.spawn_pull(key, &reference, credential).await?;
        }
        Err(pulling(image, policy))
    }

    /// The engine's record of an image, `None` when it does not have it.
    pub(super) async fn local_image(&self, image: &str) -> ProviderResult<Option<ImageInspect>> {
        match self.engine().await?.inspect_image(image).await {
            Ok(found) => Ok(Some(found)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(map_err(&format!("looking up image {image:?}"), e)),
        }
    }

    /// Runs the pull for `key` in the background and records its outcome in the table.
    async fn spawn_pull(
        &self,
        key: PullKey,
        reference: &Reference,
        credential: Option<&RegistryCredential>,
    ) -> ProviderResult<()> {
        let docker = match self.engine().await {
            Ok(d) => d.clone().with_timeout(self.settings.image_pull_timeout()),
            Err(e) => {
                self.pulls.forget(&key);
                return Err(e);
            }
        };
        let job = PullJob {
            image: key.reference.clone(),
            registry: image::registry_of(reference),
            auth: credential.map(|c| {
                (
                    c.source.clone(),
                    DockerCredentials {
                        username: Some(c.username.clone()).filter(|u| !u.is_empty()),
                        password: Some(c.password.clone()).filter(|p| !p.is_empty()),
                        identitytoken: c.identity_token.clone(),
                        serveraddress: Some(c.registry.clone()),
                        ..Default::default()
                    },
                )
            }),
            timeout: self.settings.image_pull_timeout(),
            provider: self.name.clone(),
        };
        let pulls = Arc::clone(&self.pulls);
        tokio::spawn(async move {
            let result = job.run(docker).await;
            if let Err(e) = &result {
                tracing::warn!(image = %job.image, error = %e, "image pull failed");
            }
            pulls.finish(key, result);
        });
        Ok(())
    }
}

/// One pull, with everything it needs moved in (the credential only as the engine's
/// header value, plus the Secret's name for messages).
struct PullJob {
    image: String,
    registry: String,
    auth: Option<(String, DockerCredentials)>,
    timeout: Duration,
    provider: String,
}

impl PullJob {
    async fn run(&self, docker: Docker) -> Result<ImagePull, ProviderError> {
        let started = Instant::now();
        let options = CreateImageOptionsBuilder::default()
            .from_image(&self.image)
            .build();
        let credentials = self.auth.as_ref().map(|(_, c)| c.clone());
        let stream = docker.create_image(Some(options), None, credentials);
        match tokio::time::timeout(self.timeout, stream.try_for_each(|_| async { Ok(()) })).await {
            Err(_) => {
                return Err(ProviderError::transient(format!(
                    "pulling image {:?} did not finish within {} s (the provider's imagePullTimeoutSeconds); retrying",
                    self.image,
                    self.timeout.as_secs()
                ))
                .with_reason("ImagePullTimeout"));
            }
            Ok(Err(e)) => return Err(self.classify(e)),
            Ok(Ok(())) => {}
        }
        let size_bytes = match docker.inspect_image(&self.image).await {
            Ok(i) => i.size.and_then(|s| u64::try_from(s).ok()),
            Err(e) => {
                return Err(map_err(
                    &format!("looking up pulled image {:?}", self.image),
                    e,
                ));
            }
        };
        Ok(ImagePull {
            reference: self.image.clone(),
            size_bytes,
            duration: started.elapsed(),
        })
    }

    /// Sorts an engine pull failure into what the user does about it.
    fn classify(&self, err: bollard::errors::Error) -> ProviderError {
        use bollard::errors::Error as E;
        let (status, message) = match &err {
            E::DockerResponseServerError {
                status_code,
                message,
            } => (Some(*status_code), message.clone()),
            E::DockerStreamError { error } => (None, error.clone()),
            _ => return map_err(&format!("pulling image {:?}", self.image), err),
        };
        match failure_kind(status, &message) {
            Failure::NotFound => ProviderError::not_found(format!(
                "image {:?} does not exist at registry {}: {message}; fix spec.image (repository and tag) or push the image",
                self.image, self.registry
            ))
            .with_reason("ImageNotFound"),
            Failure::Refused => ProviderError::unauthorized(match &self.auth {
                Some((secret, _)) => format!(
                    "registry {} refused the credentials from Secret {secret:?} (spec.imagePullSecrets) for image {:?}: {message}; \
                     fix the user name and password in Secret {secret:?}",
                    self.registry, self.image
                ),
                None => format!(
                    "registry {} requires credentials for image {:?} and no Secret in spec.imagePullSecrets has any for it: {message}; \
                     add a kubernetes.io/dockerconfigjson Secret for {} to spec.imagePullSecrets",
                    self.registry, self.image, self.registry
                ),
            })
            .with_reason("ImagePullUnauthorized"),
            Failure::Unavailable => ProviderError::transient(format!(
                "cannot pull image {:?} from registry {} through Docker provider {:?}: {message}; retrying with backoff",
                self.image, self.registry, self.provider
            ))
            .with_reason("RegistryUnavailable"),
        }
    }
}

/// What a failed pull means for the user.
#[derive(Debug, PartialEq, Eq)]
enum Failure {
    /// The repository or tag does not exist.
    NotFound,
    /// The registry refused (missing or wrong credentials, no permission).
    Refused,
    /// Anything else: the registry or the network may come back.
    Unavailable,
}

/// The engine answers a pull with 404 for a missing manifest, and with 500 and the
/// registry's words for everything else.
fn failure_kind(status: Option<u16>, message: &str) -> Failure {
    let m = message.to_ascii_lowercase();
    let refused = [
        "unauthorized",
        "authentication required",
        "no basic auth credentials",
        "access denied",
        "denied:",
        "401 unauthorized",
        "403 forbidden",
    ];
    if refused.iter().any(|r| m.contains(r)) {
        Failure::Refused
    } else if status == Some(404) || m.contains("manifest unknown") || m.contains("not found: ") {
        Failure::NotFound
    } else {
        Failure::Unavailable
    }
}

/// The answer of a create whose image is being pulled.
fn pulling(image: &str, policy: ImagePullPolicy) -> ProviderError {
    ProviderError::transient(format!(
        "pulling image {image:?} (imagePullPolicy {policy:?}); the sandbox is created when the pull completes"
    ))
    .with_reason(PULLING_IMAGE)
}

/// What to boot for `image` given the engine's record of it: its digest reference when a
/// registry knows it under the same repository, else the image as named with the engine's id
/// as its digest.
fn boot(image: &str, local: &ImageInspect, pull: Option<ImagePull>) -> Boot {
    match registry_digest(image, local) {
        Some(d) => Boot {
            reference: d.clone(),
            digest: Some(d),
            pull,
        },
        None => Boot {
            reference: image.to_string(),
            digest: local.id.clone(),
            pull,
        },
    }
}

/// The engine's `repository@sha256:…` for `image` under the repository it names, if a
/// registry served it there.
pub(super) fn registry_digest(image: &str, local: &ImageInspect) -> Option<String> {
    let wanted = image::parse(image).ok()?;
    local
        .repo_digests
        .iter()
        .flatten()
        .find(|d| image::parse(d).is_ok_and(|p| image::same_repository(&wanted, &p)))
        .cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pull_failures_are_sorted_by_what_fixes_them() {
        let cases = [
            (
                Some(500),
                "unauthorized: authentication required",
                Failure::Refused,
            ),
            (
                Some(500),
                "Head \"http://127.0.0.1:5000/v2/x/manifests/1\": no basic auth credentials",
                Failure::Refused,
            ),
            (
                Some(404),
                "pull access denied for x, repository does not exist or may require 'docker login': denied: requested access to the resource is denied",
                Failure::Refused,
            ),
            (
                Some(404),
                "manifest for 127.0.0.1:5000/x:nope not found: manifest unknown: manifest unknown",
                Failure::NotFound,
            ),
            (
                None,
                "manifest unknown: manifest unknown",
                Failure::NotFound,
            ),
            (
                Some(500),
                "Get \"http://127.0.0.1:5999/v2/\": dial tcp 127.0.0.1:5999: connect: connection refused",
                Failure::Unavailable,
            ),
            (
                Some(500),
                "received unexpected HTTP status: 503 Service Unavailable",
                Failure::Unavailable,
            ),
        ];
        for (status, message, want) in cases {
            assert_eq!(failure_kind(status, message), want, "{message}");
        }
    }

    fn cred(password: &str) -> RegistryCredential {
        RegistryCredential {
            registry: "r:5000".into(),
            username: "u".into(),
            password: password.into(),
            identity_token: None,
            source: "s".into(),
        }
    }

    #[test]
    fn pulls_are_keyed_by_reference_and_credential_and_shared_by_their_waiters() {
        let pulls = Pulls::new(Duration::from_secs(600));
        let right = PullKey::new("r:5000/a:1", Some(&cred("right")));
        let wrong = PullKey::new("r:5000/a:1", Some(&cred("wrong")));
        assert!(right != wrong && right != PullKey::new("r:5000/a:1", None));
        assert!(matches!(pulls.seen(&right, "a"), Seen::None));
        assert!(pulls.begin(&right, "a"));
        assert!(
            !pulls.begin(&right, "b"),
            "a second create joins the running pull"
        );
        assert!(
            matches!(pulls.seen(&right, "c"), Seen::Running),
            "so does a third"
        );
        assert!(
            pulls.begin(&wrong, "d"),
            "other credentials are another pull"
        );
        let done = ImagePull {
            reference: "r:5000/a:1".into(),
            size_bytes: Some(7),
            duration: Duration::from_millis(5),
        };
        pulls.finish(right.clone(), Ok(done.clone()));
        for waiter in ["a", "b", "c"] {
            assert!(matches!(pulls.seen(&right, waiter), Seen::Done(Ok(ref p)) if *p == done));
            assert!(
                matches!(pulls.seen(&right, waiter), Seen::None),
                "handed out once"
            );
        }
        assert!(
            matches!(pulls.seen(&right, "late"), Seen::None),
            "a later create did not wait for it"
        );
        pulls.finish(wrong.clone(), Err(ProviderError::unauthorized("no")));
        assert!(matches!(pulls.seen(&wrong, "d"), Seen::Done(Err(_))));
        assert!(
            pulls.begin(&wrong, "d"),
            "after the failure, a retry pulls afresh"
        );

        let mut lost = Pulls::new(Duration::ZERO);
        lost.stale_after = Duration::ZERO;
        assert!(lost.begin(&right, "a"));
        assert!(
            matches!(lost.seen(&right, "a"), Seen::None),
            "a pull running past its bound is forgotten"
        );
    }

    #[test]
    fn registry_images_boot_by_digest_and_local_ones_by_name() {
        let digest = format!("127.0.0.1:5000/team/app@sha256:{}", "c".repeat(64));
        let local = ImageInspect {
            id: Some("sha256:local".into()),
            repo_digests: Some(vec![
                format!("127.0.0.1:5000/other@sha256:{}", "d".repeat(64)),
                digest.clone(),
            ]),
            ..Default::default()
        };
        let b = boot("127.0.0.1:5000/team/app:1", &local, None);
        assert_eq!(b.reference, digest);
        assert_eq!(b.digest.as_deref(), Some(digest.as_str()));

        let built = ImageInspect {
            id: Some("sha256:local".into()),
            repo_digests: Some(vec![]),
            ..Default::default()
        };
        let b = boot("sandbox-operator/base:bookworm", &built, None);
        assert_eq!(b.reference, "sandbox-operator/base:bookworm");
        assert_eq!(b.digest.as_deref(), Some("sha256:local"));
    }
}
