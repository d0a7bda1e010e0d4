//! The labels every provider resource carries.
//!
//! They are the only link from a provider resource back to the Kubernetes object that owns
//! it, so the sweeper, crash adoption and event mapping all read them. Their names are fixed
//! by `docs/architecture.md`; do not rename them.

use std::collections::BTreeMap;

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

/// Merges caller labels under the owner labels. Caller labels in our reserved prefix are
/// refused rather than silently dropped, so a user sees why their label did not appear.
pub fn merge_labels(
    owner: &Owner,
    caller: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>, String> {
    // The controller itself passes operator-internal labels through here; users cannot
    // (the CRD schema rejects the prefix in spec.labels).
    let internal = |k: &str| k == SPEC_HASH || k == TEMPLATE || k == RECLAIM_POLICY;
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
