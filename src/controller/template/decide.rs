//! Decide (pure): what the spec asks for + what is known about the template → the steps
//! to take, or why nothing can be done. Table-tested below.

use kube::ResourceExt;
use sha2::{Digest, Sha256};

use crate::api::{SandboxTemplate, TemplateSource};

/// The provider template id of a SandboxTemplate: `spec.templateId`, else `sbxt-<uid>`.
pub fn template_id(template: &SandboxTemplate) -> String {
    template
        .spec
        .template_id
        .clone()
        .unwrap_or_else(|| format!("sbxt-{}", template.uid().unwrap_or_default()))
}

/// Hash of what a capture is made from: the Sandbox, the paths (as a set) and the label.
pub fn capture_hash(template: &SandboxTemplate) -> String {
    let mut paths = template.spec.capture_paths.clone().unwrap_or_default();
    for p in &mut paths {
        let trimmed = p.trim_end_matches('/').len();
        p.truncate(trimmed);
    }
    paths.sort();
    paths.dedup();
    let material = serde_json::json!({
        "sandboxRef": template.spec.sandbox_ref.as_ref().map(|r| r.name.clone()),
        "capturePaths": paths,
        "label": template.spec.label,
    });
    let digest = Sha256::digest(material.to_string().as_bytes());
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// What the spec asks for, reduced to what [`decide`] needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Desired {
    /// Where the template comes from.
    pub source: TemplateSource,
    /// The capture inputs' hash (`Capture` only).
    pub hash: String,
    /// Whether it should be in the shared store.
    pub publish: bool,
}

/// What is known about the template, reduced to what [`decide`] needs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Observed {
    /// The provider holds a template under the id.
    pub exists: bool,
    /// It is labelled with another object's UID (`Some(owner)`): not ours to replace.
    pub foreign_owner: Option<String>,
    /// `status.captureHash`: what the template at the provider was captured from.
    pub captured_hash: Option<String>,
    /// `status.published`.
    pub published: bool,
}

/// One provider action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Capture `capturePaths` of `sandboxRef` (replacing an earlier capture).
    Capture,
    /// Restore the template from the shared store onto the provider.
    Fetch,
    /// Copy the template into the shared store.
    Publish,
    /// Remove the copy from the shared store.
    Unpublish,
}

/// The decision of one reconcile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Run these steps, in order (none: converged).
    Steps(Vec<Step>),
    /// Nothing can be done until the spec or the world changes: `(reason, message)`.
    Stall(&'static str, String),
}

/// Decide (pure): desired + observed → steps.
pub fn decide(desired: &Desired, observed: &Observed, id: &str) -> Decision {
    if let Some(owner) = &observed.foreign_owner {
        return Decision::Stall(
            "TemplateIdTaken",
            format!(
                "template id {id} already holds a template of another SandboxTemplate ({owner}); set a different \
                 spec.templateId (a template is never overwritten by another object)"
            ),
        );
    }
    match desired.source {
        TemplateSource::Store => Decision::Steps(if observed.exists {
            Vec::new()
        } else {
            vec![Step::Fetch]
        }),
        TemplateSource::Capture => {
            let mut steps = Vec::new();
            let stale = observed.captured_hash.as_deref() != Some(desired.hash.as_str());
            if stale {
                steps.push(Step::Capture);
            } else if !observed.exists {
                if observed.published {
                    // The local copy vanished; the shared store still has it.
                    steps.push(Step::Fetch);
                } else {
                    return Decision::Stall(
                        "TemplateGone",
                        format!(
                            "the provider no longer holds template {id} (removed outside the operator) and it \
                             was never published; change spec.capturePaths or spec.label to capture again, or \
                             delete the SandboxTemplate (a Sandbox is never booted from the plain image instead)"
                        ),
                    );
                }
            }
            let published_after = observed.published && !stale;
            if desired.publish && !published_after {
                steps.push(Step::Publish);
            }
            if !desired.publish && observed.published {
                steps.push(Step::Unpublish);
            }
            Decision::Steps(steps)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn capture(publish: bool) -> Desired {
        Desired {
            source: TemplateSource::Capture,
            hash: "h1".into(),
            publish,
        }
    }

    fn seen(exists: bool, hash: Option<&str>, published: bool) -> Observed {
        Observed {
            exists,
            foreign_owner: None,
            captured_hash: hash.map(str::to_string),
            published,
        }
    }

    fn steps(d: Decision) -> Vec<Step> {
        match d {
            Decision::Steps(s) => s,
            Decision::Stall(r, m) => panic!("stalled: {r}: {m}"),
        }
    }

    #[test]
    fn capture_decisions() {
        use Step::*;
        let table: &[(Desired, Observed, Vec<Step>)] = &[
            // First capture, then publish when asked.
            (capture(false), seen(false, None, false), vec![Capture]),
            (
                capture(true),
                seen(false, None, false),
                vec![Capture, Publish],
            ),
            // Converged.
            (capture(false), seen(true, Some("h1"), false), vec![]),
            (capture(true), seen(true, Some("h1"), true), vec![]),
            // A spec change recaptures, and a published copy is replaced or removed.
            (capture(false), seen(true, Some("h0"), false), vec![Capture]),
            (
                capture(true),
                seen(true, Some("h0"), true),
                vec![Capture, Publish],
            ),
            (
                capture(false),
                seen(true, Some("h0"), true),
                vec![Capture, Unpublish],
            ),
            // Publish toggled without a recapture.
            (capture(true), seen(true, Some("h1"), false), vec![Publish]),
            (
                capture(false),
                seen(true, Some("h1"), true),
                vec![Unpublish],
            ),
            // The local copy vanished: the shared store is the cache.
            (capture(true), seen(false, Some("h1"), true), vec![Fetch]),
        ];
        for (d, o, want) in table {
            assert_eq!(&steps(decide(d, o, "t")), want, "{d:?} {o:?}");
        }
    }

    #[test]
    fn a_vanished_unpublished_capture_stalls_instead_of_recapturing() {
        match decide(&capture(false), &seen(false, Some("h1"), false), "t") {
            Decision::Stall(reason, msg) => {
                assert_eq!(reason, "TemplateGone");
                assert!(msg.contains("never booted from the plain image"), "{msg}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn store_templates_are_fetched_when_absent() {
        let d = Desired {
            source: TemplateSource::Store,
            hash: "x".into(),
            publish: false,
        };
        assert_eq!(
            steps(decide(&d, &seen(false, None, false), "t")),
            vec![Step::Fetch]
        );
        assert!(steps(decide(&d, &seen(true, None, true), "t")).is_empty());
    }

    #[test]
    fn another_objects_template_is_never_replaced() {
        let mut o = seen(true, None, false);
        o.foreign_owner = Some("ns.other, UID 1".into());
        match decide(&capture(true), &o, "t") {
            Decision::Stall(reason, msg) => {
                assert_eq!(reason, "TemplateIdTaken");
                assert!(msg.contains("spec.templateId"), "{msg}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn capture_hash_ignores_order_and_trailing_slashes_but_not_content() {
        let tpl = |paths: &[&str], label: Option<&str>| -> SandboxTemplate {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "sandboxes.dev/v1alpha1", "kind": "SandboxTemplate",
                "metadata": {"name": "t", "uid": "u1"},
                "spec": {"sandboxRef": {"name": "s"}, "capturePaths": paths, "label": label}
            }))
            .expect("template")
        };
        let a = capture_hash(&tpl(&["/a", "/b/"], None));
        assert_eq!(a, capture_hash(&tpl(&["/b", "/a"], None)));
        assert_ne!(a, capture_hash(&tpl(&["/a"], None)));
        assert_ne!(a, capture_hash(&tpl(&["/a", "/b"], Some("v2"))));
        assert_eq!(template_id(&tpl(&["/a"], None)), "sbxt-u1");
    }
}
