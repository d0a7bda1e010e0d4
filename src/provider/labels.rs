//! The labels every provider resource carries.
//!
//! They are the only link from a provider resource back to the Kubernetes object that owns
//! it, so the sweeper, crash adoption and event mapping all read them. Their names are fixed
//! by `docs/architecture.md`; do not rename them.

use std::collections::BTreeMap;

use super::ProviderError;

/// Which operator instance manages the resource. The sweeper only ever touches resources
/// carrying its own instance's value.
pub const MANAGED_BY: &str = "sandboxes.dev/managed-by";
/// UID of the owning Kubernetes object.
pub const OWNER_UID: &str = "sandboxes.dev/owner-uid";
/// `<namespace>.<name>` of the owning object.
pub const OWNER: &str = "sandboxes.dev/owner";
/// Kind of the owning object (`Sandbox`, `SandboxVolume`, `SandboxTemplate`).
pub const KIND: &str = "sandboxes.dev/kind";
/// The template id a sandbox booted from (absent when it booted from a plain image).
pub const TEMPLATE: &str = "sandboxes.dev/template";
/// Hash of the create-time configuration a sandbox was built from. A desired configuration
/// with a different hash cannot be applied in place, so the controller recreates.
pub const SPEC_HASH: &str = "sandboxes.dev/spec-hash";
/// A volume's reclaim policy, so the sweeper honours `Retain` without reading the object.
pub const RECLAIM_POLICY: &str = "sandboxes.dev/reclaim-policy";
/// Hash of the SandboxWarmPool template a pool member was built from: a member whose hash
/// is not the pool's current one is rolled (when unclaimed).
pub const POOL_TEMPLATE_HASH: &str = "sandboxes.dev/pool-template-hash";
/// A warm pool member's name (`sbxwp-<pool uid>-<k>`): where the provider's id is not the
/// name (E2B, Fly), this is how the pool knows which names are taken.
pub const POOL_MEMBER: &str = "sandboxes.dev/pool-member";
/// The `sandboxes.dev/kind` of a warm pool's members.
pub const POOL_KIND: &str = "SandboxWarmPool";
/// Prefix reserved for our own labels: caller labels may not use it.
pub const RESERVED_PREFIX: &str = "sandboxes.dev/";

/// The owning object of a provider resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// Operator instance name (`sandboxes.dev/managed-by`).
    pub instance: String,
    /// Kind of the owning object.
    pub kind: String,
    /// Namespace of the owning object.
    pub namespace: String,
    /// Name of the owning object.
    pub name: String,
    /// UID of the owning object.
    pub uid: String,
}

impl Owner {
    /// The four owner labels (see `docs/architecture.md`).
    pub fn labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (MANAGED_BY.to_string(), self.instance.clone()),
            (OWNER_UID.to_string(), self.uid.clone()),
            (
                OWNER.to_string(),
                format!("{}.{}", self.namespace, self.name),
            ),
            (KIND.to_string(), self.kind.clone()),
        ])
    }

    /// Reads an owner back from a resource's labels; `None` when any of them is missing.
    pub fn from_labels(labels: &BTreeMap<String, String>) -> Option<Owner> {
        let owner = labels.get(OWNER)?;
        // Namespaces cannot contain dots, so the first dot splits namespace from name.
        let (namespace, name) = owner.split_once('.')?;
        Some(Owner {
            instance: labels.get(MANAGED_BY)?.clone(),
            kind: labels.get(KIND)?.clone(),
            namespace: namespace.to_string(),
            name: name.to_string(),
            uid: labels.get(OWNER_UID)?.clone(),
        })
    }
}

/// The reason an object stalls with when an id in its status names a provider resource it
/// does not own.
pub const OWNERSHIP_MISMATCH: &str = "OwnershipMismatch";

/// Status is never authority: whoever may write an object's `/status` could point its id at
/// another tenant's sandbox, volume or template (or the egress gateway). An id read from
/// status is acted on only when the resource it names carries the object's owner-uid label;
/// otherwise nothing is touched and the error says which status field to clear.
pub fn ensure_owned(
    field: &str,
    id: &str,
    labels: &BTreeMap<String, String>,
    uid: &str,
) -> Result<(), ProviderError> {
    match labels.get(OWNER_UID) {
        Some(owner) if owner == uid => Ok(()),
        found => {
            let found = found.map_or("absent".to_string(), |o| format!("{o:?}"));
            let why = format!("its {OWNER_UID} label is {found}, this object's UID is {uid}");
            Err(mismatch(field, id, &why))
        }
    }
}

/// A warm pool member an object claimed, as the pool's ledger records it: proof of
/// ownership for a resource that carries the pool's owner labels, not the object's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// UID of the pool (the member's owner-uid label).
    pub pool_uid: String,
    /// The member's provider id the ledger gives to the object.
    pub member: String,
}

/// THE identity rule for sandboxes: the resource under `id` belongs to the object with `uid`
/// when it carries that owner-uid label, or when it is a member of a warm pool whose ledger
/// gives exactly this member to this object (`claim`, read from the pool in the object's
/// own namespace). Used wherever an id read from status is about to be acted on: the
/// Sandbox controller's observe and cleanup, and the access layer.
pub fn ensure_owned_or_claimed(
    field: &str,
    id: &str,
    labels: &BTreeMap<String, String>,
    uid: &str,
    claim: Option<&Claim>,
) -> Result<(), ProviderError> {
    let Some(claim) = claim else {
        return ensure_owned(field, id, labels, uid);
    };
    if labels.get(OWNER_UID) == Some(&uid.to_string()) {
        return Ok(());
    }
    let member_of_pool = labels.get(KIND).map(String::as_str) == Some(POOL_KIND)
        && labels.get(OWNER_UID) == Some(&claim.pool_uid);
    if member_of_pool && claim.member == id {
        return Ok(());
    }
    let why = format!(
        "it is neither labelled {OWNER_UID}={uid} nor the member {:?} of pool {} that the pool's ledger gives this object",
        claim.member, claim.pool_uid
    );
    Err(mismatch(field, id, &why))
}

/// [`ensure_owned`] for resources whose provider name derives from the owner's UID (volumes):
/// the name itself is the proof, so no provider call is needed.
pub fn ensure_named(field: &str, id: &str, own: &str) -> Result<(), ProviderError> {
    if id == own {
        return Ok(());
    }
    Err(mismatch(
        field,
        id,
        &format!("this object's own is {own:?}"),
    ))
}

/// The `OwnershipMismatch` error: what was refused, why, and the fix.
fn mismatch(field: &str, id: &str, why: &str) -> ProviderError {
    ProviderError::invalid(format!(
        "{field} names {id:?}, which this object does not own ({why}); nothing was changed. \
         Status is written by the operator only: remove {field} from the status (kubectl \
         patch --subresource=status) and revoke the status write that set it"
    ))
    .with_reason(OWNERSHIP_MISMATCH)
}

/// Merges caller labels under the owner labels. Caller labels in our reserved prefix are
/// refused rather than silently dropped, so a user sees why their label did not appear.
pub fn merge_labels(
    owner: &Owner,
    caller: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>, String> {
    // The controller itself passes operator-internal labels through here; users cannot
    // (the CRD schema rejects the prefix in spec.labels).
    let internal = |k: &str| {
        [
            SPEC_HASH,
            TEMPLATE,
            RECLAIM_POLICY,
            POOL_TEMPLATE_HASH,
            POOL_MEMBER,
        ]
        .contains(&k)
    };
    if let Some(bad) = caller
        .keys()
        .find(|k| k.starts_with(RESERVED_PREFIX) && !internal(k))
    {
        return Err(format!(
            "label {bad:?} uses the reserved prefix {RESERVED_PREFIX:?}; rename it in spec.labels"
        ));
    }
    let mut all = caller.clone();
    all.extend(owner.labels());
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner() -> Owner {
        Owner {
            instance: "ops".into(),
            kind: "Sandbox".into(),
            namespace: "team-a".into(),
            name: "web.v2".into(),
            uid: "1234".into(),
        }
    }

    #[test]
    fn owner_round_trips_through_labels_even_with_dotted_names() {
        assert_eq!(Owner::from_labels(&owner().labels()), Some(owner()));
    }

    #[test]
    fn only_the_owner_uid_label_proves_ownership() {
        let labels = owner().labels();
        assert!(ensure_owned("status.sandboxId", "c1", &labels, "1234").is_ok());
        let e = ensure_owned("status.sandboxId", "c1", &labels, "9999").unwrap_err();
        assert_eq!(e.reason(), OWNERSHIP_MISMATCH);
        assert!(e.message().contains("status.sandboxId"), "{}", e.message());
        let e = ensure_owned("status.sandboxId", "gw", &BTreeMap::new(), "1234").unwrap_err();
        assert!(e.message().contains("absent"), "{}", e.message());
    }

    #[test]
    fn a_claimed_member_is_owned_only_by_its_claimant_per_the_ledger() {
        let mut member = owner();
        member.kind = POOL_KIND.into();
        member.uid = "pool-1".into();
        let labels = member.labels();
        let claim = Claim {
            pool_uid: "pool-1".into(),
            member: "c1".into(),
        };
        let ok = ensure_owned_or_claimed("status.sandboxId", "c1", &labels, "s-1", Some(&claim));
        assert!(ok.is_ok());
        // Another member of the same pool, a member of another pool, or no ledger entry: refused.
        for (id, pool, claim) in [
            ("c2", "pool-1", true),
            ("c1", "pool-2", true),
            ("c1", "pool-1", false),
        ] {
            let mut other = member.clone();
            other.uid = pool.into();
            let proof = Claim {
                pool_uid: "pool-1".into(),
                member: "c1".into(),
            };
            let c = claim.then_some(&proof);
            let e = ensure_owned_or_claimed("status.sandboxId", id, &other.labels(), "s-1", c)
                .unwrap_err();
            assert_eq!(e.reason(), OWNERSHIP_MISMATCH, "{id} {pool} {claim}");
        }
        // A sandbox labelled with the object's own UID stays its own.
        assert!(ensure_owned_or_claimed("f", "x", &owner().labels(), "1234", Some(&claim)).is_ok());
    }

    #[test]
    fn a_uid_derived_name_is_its_own_proof() {
        assert!(ensure_named("status.volumeName", "sbxv-1", "sbxv-1").is_ok());
        let e = ensure_named("status.volumeName", "sbxv-2", "sbxv-1").unwrap_err();
        assert_eq!(e.reason(), OWNERSHIP_MISMATCH);
        assert!(e.message().contains("\"sbxv-1\""), "{}", e.message());
    }

    #[test]
    fn caller_labels_cannot_use_the_reserved_prefix() {
        let caller = BTreeMap::from([("sandboxes.dev/owner-uid".to_string(), "x".to_string())]);
        assert!(
            merge_labels(&owner(), &caller)
                .unwrap_err()
                .contains("reserved prefix")
        );
        let ok = BTreeMap::from([("team".to_string(), "a".to_string())]);
        let merged = merge_labels(&owner(), &ok).unwrap();
        assert_eq!(merged.get("team").map(String::as_str), Some("a"));
        assert_eq!(merged.get(OWNER_UID).map(String::as_str), Some("1234"));
    }
}
