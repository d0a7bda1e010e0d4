//! Images: a Sandbox may boot an image from a provider's shared cache only if it could have
//! pulled that image itself. One Docker engine's cache serves every namespace and remembers
//! no credential, so before a create the controller decides, on every provider with an
//! [`ImageCache`]:
//!
//! - a template image (the provider's template repository, by any name or by image id) is
//!   never booted through `spec.image`: templates are reached only through `spec.templateRef`,
//!   which resolves in the Sandbox's own namespace;
//! - an image of the operator's `openImages` setting is open to every namespace;
//! - an image the cache does not hold is pulled by the create with the Sandbox's own
//!   credentials, so the registry decides; `IfNotPresent` becomes `Always` for that create,
//!   so a copy another namespace caches in between is not booted unverified;
//! - `Always` pulls with the Sandbox's own credentials as well;
//! - any other cached image is verified at its registry with the Sandbox's credential for it
//!   (anonymous without one): a manifest request for the cached digest
//!   ([`crate::provider::image_verify`]). An image no registry serves (built or loaded on the
//!   engine) cannot be verified and is refused unless listed.
//!
//! Refusals stall with [`IMAGE_NOT_ALLOWED`] and a message naming `spec.image` and the fix.
//! The provider's default image (a Sandbox naming none) is the platform's choice and is not
//! checked.

use oci_spec::distribution::Reference;

use crate::api::Sandbox;
use crate::controller::Context;
use crate::controller::outcome::Outcome;
use crate::provider::image::{self, OpenImages};
use crate::provider::image_verify::{Verdict, Verifier};
use crate::provider::{CachedImage, CreateRequest, ImagePullPolicy, ProviderError};
use crate::registry::ProviderHandle;

/// The reason of every refusal of an image.
pub const IMAGE_NOT_ALLOWED: &str = "ImageNotAllowed";

/// The operator's image rules: the open list and the registry verifier (with its memory of
/// recent successes).
#[derive(Default)]
pub struct ImageRules {
    /// The `openImages` setting.
    pub open: OpenImages,
    /// Verifies pull access at registries.
    pub verifier: Verifier,
}

impl ImageRules {
    /// The rules for the `openImages` setting `open`.
    pub fn new(open: &[String]) -> Self {
        ImageRules {
            open: OpenImages::new(open),
            verifier: Verifier::default(),
        }
    }
}

/// What the rules say before any registry is asked.
#[derive(Debug, PartialEq)]
enum Decision {
    Allow,
    /// Not cached: the create pulls it with the Sandbox's own credentials.
    PullOwn,
    Refuse(String),
    /// Cached from a registry: ask it with the Sandbox's credential.
    Verify(Reference),
}

/// Decides whether the create of `request` for `sandbox` may proceed, and adjusts its pull
/// policy (see the module docs). `Err` is the outcome that ends the pass.
pub async fn admit(
    sandbox: &Sandbox,
    ctx: &Context,
    handle: &ProviderHandle,
    request: &mut CreateRequest,
) -> Result<(), Outcome> {
    let Some(cache) = handle.provider.image_cache() else {
        return Ok(());
    };
    let (None, Some(image)) = (&request.template, request.image.clone()) else {
        return Ok(());
    };
    let named = named(sandbox, &image);
    let why = Why {
        named: &named,
        provider: handle.name(),
        template_repository: cache.template_repository(),
    };
    if image::in_repository(&image, why.template_repository) {
        return Err(refuse(why.template()));
    }
    let open = ctx.images.open.allows(&named);
    // An open image named by reference needs no look at the cache: its name is not a template
    // repository's (checked above), and anyone may boot it. An image id might be a template
    // image's, so it is looked up.
    if open && !is_image_id(&image) {
        return Ok(());
    }
    let cached = handle
        .call("inspect_image", cache.cached(&image))
        .await
        .map_err(Outcome::failed)?;
    match decide(&why, request.image_pull_policy, cached.as_ref(), open) {
        Decision::Allow => Ok(()),
        Decision::PullOwn => {
            request.image_pull_policy = ImagePullPolicy::Always;
            Ok(())
        }
        Decision::Refuse(message) => Err(refuse(message)),
        Decision::Verify(pinned) => verify(&why, ctx, &pinned, request).await,
    }
}

/// Whether `image` names an image by its id (`sha256:…`, or the bare hex id or a prefix of
/// it) rather than by a reference.
fn is_image_id(image: &str) -> bool {
    let hex = image.strip_prefix("sha256:").unwrap_or(image);
    !hex.is_empty()
        && hex
            .chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
}

/// The rules, given what the cache holds (see the module docs).
fn decide(
    why: &Why<'_>,
    policy: ImagePullPolicy,
    cached: Option<&CachedImage>,
    open: bool,
) -> Decision {
    let Some(cached) = cached else {
        return match policy {
            ImagePullPolicy::IfNotPresent => Decision::PullOwn,
            // `Never` fails at the provider (nothing to boot); `Always` pulls anyway.
            _ => Decision::Allow,
        };
    };
    if cached.template {
        return Decision::Refuse(why.template());
    }
    if open || policy == ImagePullPolicy::Always {
        return Decision::Allow;
    }
    match cached.registry_digest.as_deref().map(image::parse) {
        Some(Ok(pinned)) => Decision::Verify(pinned),
        _ => Decision::Refuse(why.local()),
    }
}

/// Asks the registry whether the Sandbox's credential for it may pull `pinned`.
async fn verify(
    why: &Why<'_>,
    ctx: &Context,
    pinned: &Reference,
    request: &CreateRequest,
) -> Result<(), Outcome> {
    let credential = image::credential_for(pinned, &request.registry_credentials);
    let registry = image::registry_of(pinned);
    let verdict = ctx.images.verifier.verify(pinned, credential).await;
    let answer = match verdict {
        Ok(Verdict::Allowed) => return Ok(()),
        Ok(Verdict::Refused(status)) => format!("refused it ({status})"),
        Ok(Verdict::Absent) => format!("does not serve {}", pinned.whole()),
        Err(e) => {
            let e = ProviderError::transient(format!(
                "spec.image {:?} is cached on provider {:?}; verifying that this Sandbox could pull it \
                 from registry {registry} failed: {e}; retrying",
                why.named, why.provider
            ));
            return Err(Outcome::failed(e.with_reason("RegistryUnavailable")));
        }
    };
    let presented = match credential {
        Some(c) => format!(
            "the credential of Secret {:?} (spec.imagePullSecrets)",
            c.source
        ),
        None => "no credential (no Secret in spec.imagePullSecrets has one for it)".to_string(),
    };
    Err(refuse(why.unverified(&registry, &presented, &answer)))
}

/// What the messages say: the image as the Sandbox names it and where it is cached.
struct Why<'a> {
    named: &'a str,
    provider: &'a str,
    template_repository: &'a str,
}

impl Why<'_> {
    fn template(&self) -> String {
        format!(
            "spec.image {:?} is a template image (repository {:?} of provider {:?}); template images \
             are reachable only through spec.templateRef naming a SandboxTemplate in this namespace: \
             set spec.templateRef instead of spec.image",
            self.named, self.template_repository, self.provider
        )
    }

    fn local(&self) -> String {
        format!(
            "spec.image {:?} is an image on provider {:?} that no registry is known to serve (built or \
             loaded there, or named by its image id), and it is not in the operator's openImages \
             setting; a cached image runs only for a Sandbox that could have pulled it itself: push \
             it to a registry and add an imagePullSecret for it to spec.imagePullSecrets, or ask the \
             platform team to add it to openImages",
            self.named, self.provider
        )
    }

    fn unverified(&self, registry: &str, presented: &str, answer: &str) -> String {
        format!(
            "spec.image {:?} is cached on provider {:?}, but this Sandbox presented {presented} and \
             registry {registry} {answer}; a cached image runs only for a Sandbox that could have \
             pulled it itself: add a kubernetes.io/dockerconfigjson Secret for {registry} to \
             spec.imagePullSecrets (or fix the one named), or ask the platform team to add the image \
             to the operator's openImages setting",
            self.named, self.provider
        )
    }
}

fn refuse(message: String) -> Outcome {
    Outcome::stalled(IMAGE_NOT_ALLOWED, message)
}

/// The image as the Sandbox names it: `spec.image`, unless the create boots another
/// repository (a store template's base image). A digest pinned from status for the same
/// repository is judged as `spec.image` (the open list names what users write).
fn named(sandbox: &Sandbox, image: &str) -> String {
    sandbox
        .spec
        .image
        .clone()
        .filter(|s| {
            s == image
                || matches!((image::parse(s), image::parse(image)),
                    (Ok(a), Ok(b)) if image::same_repository(&a, &b))
        })
        .unwrap_or_else(|| image.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ImagePullPolicy::{Always, IfNotPresent, Never};

    const WHY: Why<'static> = Why {
        named: "127.0.0.1:5000/team/app:1",
        provider: "docker",
        template_repository: "sandbox-operator/template",
    };

    #[test]
    fn ids_are_told_from_references() {
        assert!(is_image_id("sha256:0123abcd"));
        assert!(is_image_id("0123abcd"));
        assert!(!is_image_id("sandbox-operator/base:bookworm"));
        assert!(!is_image_id("busybox"));
    }

    fn cached(template: bool, digest: Option<&str>) -> CachedImage {
        CachedImage {
            template,
            registry_digest: digest.map(str::to_string),
        }
    }

    fn refused(d: Decision, needle: &str) {
        match d {
            Decision::Refuse(m) => {
                assert!(m.contains("spec.image") && m.contains(needle), "{m}")
            }
            other => panic!("expected a refusal naming {needle}, got {other:?}"),
        }
    }

    #[test]
    fn template_images_are_refused_under_every_policy_even_when_open() {
        let template = cached(true, None);
        for policy in [Always, IfNotPresent, Never] {
            refused(decide(&WHY, policy, Some(&template), true), "templateRef");
        }
    }

    #[test]
    fn an_image_not_cached_is_pulled_with_the_sandboxes_own_credentials() {
        assert_eq!(decide(&WHY, IfNotPresent, None, false), Decision::PullOwn);
        assert_eq!(decide(&WHY, Always, None, false), Decision::Allow);
        assert_eq!(decide(&WHY, Never, None, false), Decision::Allow);
    }

    #[test]
    fn cached_images_run_when_open_or_pulled_again_and_are_verified_otherwise() {
        let digest = format!("127.0.0.1:5000/team/app@sha256:{}", "c".repeat(64));
        let registry = cached(false, Some(&digest));
        let local = cached(false, None);
        assert_eq!(decide(&WHY, Never, Some(&local), true), Decision::Allow);
        assert_eq!(
            decide(&WHY, Always, Some(&registry), false),
            Decision::Allow
        );
        for policy in [IfNotPresent, Never] {
            match decide(&WHY, policy, Some(&registry), false) {
                Decision::Verify(pinned) => assert_eq!(pinned.whole(), digest),
                other => panic!("{other:?}"),
            }
            refused(decide(&WHY, policy, Some(&local), false), "openImages");
        }
    }

    #[test]
    fn refusals_name_the_fix() {
        let m = WHY.unverified("127.0.0.1:5000", "no credential", "refused it (401)");
        for needle in [
            "spec.image",
            "spec.imagePullSecrets",
            "openImages",
            "127.0.0.1:5000",
        ] {
            assert!(m.contains(needle), "{needle}: {m}");
        }
        assert!(WHY.template().contains("spec.templateRef"));
    }
}
