//! Members: what a pool's members are built from (its template, through the Sandbox
//! controller's own resolve and build, so a member is exactly what a Sandbox of that spec
//! would be) and how they are found again (the pool's owner-uid label).

use kube::ResourceExt;
use sha2::{Digest, Sha256};

use crate::api::{Sandbox, SandboxSpec, SandboxWarmPool};
use crate::controller::Context;
use crate::controller::outcome::Outcome;
use crate::controller::sandbox::build::{self, Desired};
use crate::controller::sandbox::{SandboxContext, images, resolve};
use crate::provider::labels::{Owner, POOL_KIND, POOL_MEMBER, POOL_TEMPLATE_HASH};
use crate::provider::{ProviderError, SandboxDescriptor};
use crate::registry::ProviderHandle;

use super::decide::Member;

/// Hash of a pool's template: every field, so any change rolls the unclaimed members.
/// 32 hex characters fit a label value.
pub fn template_hash(template: &SandboxSpec) -> String {
    let material = serde_json::to_string(template).unwrap_or_default();
    let digest = Sha256::digest(material.as_bytes());
    digest.iter().take(16).map(|b| format!("{b:02x}")).collect()
}

/// The template as a member runs it: the power state, lifetime and per-Sandbox env file are
/// a claimant's, never the pool's.
pub fn member_spec(template: &SandboxSpec) -> SandboxSpec {
    SandboxSpec {
        state: None,
        lifetime: None,
        self_delivered_env: None,
        warm_pool_ref: None,
        ..template.clone()
    }
}

/// The pool seen as a Sandbox of its template (its own name, namespace and UID): what the
/// Sandbox controller's resolve and build take.
pub fn as_sandbox(pool: &SandboxWarmPool) -> Sandbox {
    let mut s = Sandbox::new(&pool.name_any(), member_spec(&pool.spec.template));
    s.metadata.namespace = pool.namespace();
    s.metadata.uid = pool.uid();
    s
}

/// The create request of a member called `name`: the template's, owned by the pool and
/// carrying the template's hash.
pub async fn desired(
    sctx: &SandboxContext,
    pool: &SandboxWarmPool,
    handle: &ProviderHandle,
    hash: &str,
) -> Result<Desired, Outcome> {
    let shape = as_sandbox(pool);
    let resolved = resolve::references(&shape, sctx, handle).await?;
    let mut desired = build::desired(&shape, &sctx.ctx.instance, &resolved)
        .map_err(|msg| Outcome::stalled("InvalidTemplate", format!("spec.template: {msg}")))?;
    desired.request.owner = Owner {
        kind: POOL_KIND.into(),
        ..desired.request.owner
    };
    desired
        .request
        .labels
        .insert(POOL_TEMPLATE_HASH.into(), hash.to_string());
    images::admit(&shape, &sctx.ctx, handle, &mut desired.request).await?;
    Ok(desired)
}

/// Every member the provider holds for the pool with `uid`, whatever its state, recorded
/// for claims to pick from (see [`super::sightings`]).
pub async fn observe(
    ctx: &Context,
    handle: &ProviderHandle,
    uid: &str,
) -> Result<Vec<SandboxDescriptor>, ProviderError> {
    let query = crate::controller::sandbox::observe::owned_by(uid);
    let found = handle.upkeep("find", handle.provider.find(&query)).await?;
    ctx.sightings.record(uid, &found);
    Ok(found)
}

/// A descriptor as the pure decide step reads it.
pub fn member(d: &SandboxDescriptor) -> Member {
    Member {
        id: d.id.clone(),
        state: d.state,
        has_run: d.started_at.has_run(),
        template_hash: d.labels.get(POOL_TEMPLATE_HASH).cloned(),
        created_at: d.created_at,
        // A member made before the label existed: on the providers that had pools then
        // (Docker, Kubernetes) the id is the name.
        name: d.labels.get(POOL_MEMBER).unwrap_or(&d.id).clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::DesiredState;

    #[test]
    fn a_member_carries_nothing_of_a_claimant() {
        let template = SandboxSpec {
            image: Some("img".into()),
            state: Some(DesiredState::Stopped),
            ..SandboxSpec::default()
        };
        let spec = member_spec(&template);
        assert_eq!(spec.state, None);
        assert_eq!(spec.image.as_deref(), Some("img"));
    }

    #[test]
    fn a_member_is_known_by_its_name_label_not_the_provider_id() {
        let d = SandboxDescriptor {
            labels: [(POOL_MEMBER.to_string(), "sbxwp-u-0".to_string())].into(),
            ..SandboxDescriptor::bare("e2b-id-1", crate::provider::SandboxState::Running)
        };
        let m = member(&d);
        assert_eq!(m.name, "sbxwp-u-0");
        let taken = [m.name];
        assert_eq!(
            super::super::decide::member_names("u", &taken, 1),
            ["sbxwp-u-1"]
        );
    }

    #[test]
    fn any_template_change_changes_the_hash() {
        let a = SandboxSpec::default();
        let b = SandboxSpec {
            image: Some("x".into()),
            ..SandboxSpec::default()
        };
        assert_ne!(template_hash(&a), template_hash(&b));
        assert_eq!(template_hash(&a), template_hash(&a.clone()));
    }
}
