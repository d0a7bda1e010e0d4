//! `SandboxWarmPool`: ready sandboxes of one shape, kept in advance so that a Sandbox naming
//! the pool (`spec.warmPoolRef`) takes a running one instead of waiting for a create.

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{Condition, no_default};
use super::sandbox::SandboxSpec;

/// Desired state of a SandboxWarmPool: `replicas` running, unclaimed members built from
/// `template`.
// Several `printcolumn(...)` entries repeat `type_`, which clippy misreads as a duplicate.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "sandboxes.dev",
    version = "v1alpha1",
    kind = "SandboxWarmPool",
    plural = "sandboxwarmpools",
    singular = "sandboxwarmpool",
    shortname = "sbxwp",
    category = "sandboxes",
    namespaced,
    status = "SandboxWarmPoolStatus",
    derive = "PartialEq",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas"
    ),
    doc = "A SandboxWarmPool keeps running, unclaimed sandboxes of one shape, so that a Sandbox naming it in spec.warmPoolRef is served by an already running one.",
    printcolumn(
        name = "Desired",
        type_ = "integer",
        json_path = ".spec.replicas",
        description = "Unclaimed members wanted"
    ),
    printcolumn(
        name = "Ready",
        type_ = "integer",
        json_path = ".status.readyReplicas",
        description = "Unclaimed members running the current template"
    ),
    printcolumn(
        name = "Updated",
        type_ = "integer",
        json_path = ".status.updatedReplicas",
        description = "Unclaimed members built from the current template"
    ),
    printcolumn(
        name = "Claimed",
        type_ = "integer",
        json_path = ".status.claimedReplicas",
        description = "Members taken by Sandboxes"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(validation = Rule::new("!has(self.template.warmPoolRef)").message("spec.template.warmPoolRef: a pool's members are created from its template, they cannot claim from a pool; remove it").field_path(".template.warmPoolRef").reason(Reason::FieldValueForbidden))]
#[serde(rename_all = "camelCase")]
pub struct SandboxWarmPoolSpec {
    /// How many running, unclaimed members to keep. A claim takes one away and the pool
    /// makes another in the background. `kubectl scale sbxwp/NAME --replicas=N` sets it.
    #[schemars(range(min = 0, max = 1000))]
    pub replicas: i32,

    /// The shape of every member: a Sandbox spec (provider, image or templateRef,
    /// resources, ports, egress, volumes, …). A change rolls the unclaimed members (new ones
    /// are made first, old ones removed once the new ones run); claimed members are never
    /// touched.
    pub template: SandboxSpec,

    /// Seconds a roll (or a fill) may take before the pool reports `Stalled` with reason
    /// `ProgressDeadlineExceeded`, which Flux and Argo CD read as failed. 600 when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub progress_deadline_seconds: Option<i64>,
}

/// Observed state of a SandboxWarmPool, written by the operator only.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxWarmPoolStatus {
    /// The `metadata.generation` this status was computed from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready` (the wanted number of current members run), `Reconciling` and `Stalled`, the
    /// way kstatus reads them.
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    #[serde(default)]
    #[schemars(transform = no_default)]
    pub conditions: Vec<Condition>,
    /// Unclaimed members, whatever their template and state (the scale subresource's count).
    #[serde(default)]
    #[schemars(transform = no_default)]
    pub replicas: i32,
    /// Unclaimed members of the current template that are running and can be claimed.
    #[serde(default)]
    #[schemars(transform = no_default)]
    pub ready_replicas: i32,
    /// Unclaimed members of the current template.
    #[serde(default)]
    #[schemars(transform = no_default)]
    pub updated_replicas: i32,
    /// Members taken by Sandboxes (they belong to those Sandboxes now).
    #[serde(default)]
    #[schemars(transform = no_default)]
    pub claimed_replicas: i32,
    /// Hash of the current template, as the members built from it carry it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_hash: Option<String>,
    /// The ledger of members whose ownership moved or is moving: taken by a Sandbox, or
    /// being removed by the pool. Written only by a patch that first tests `ledgerRevision`
    /// as read (or, for the first entry, the resourceVersion), so two writers can never both
    /// take one member (see docs/architecture.md, "Warm pool claims").
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 5000))]
    pub ledger: Vec<LedgerEntry>,
    /// How many times the ledger was written. Every ledger write tests it and raises it by
    /// one, so a write carries its own change (an entry added, entries removed), not the
    /// whole ledger it read and the whole ledger it wants.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub ledger_revision: Option<i64>,
}

/// One member in the ledger.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LedgerEntry {
    /// The member's provider id.
    pub member: String,
    /// The Sandbox that claimed it; absent while the pool itself removes the member.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claimed_by: Option<Claimant>,
}

/// The Sandbox a member belongs to.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Claimant {
    /// Its name (in the pool's namespace).
    pub name: String,
    /// Its UID: a Sandbox of the same name made later is another claimant.
    pub uid: String,
}

impl SandboxWarmPoolStatus {
    /// The ledger entry of `member`.
    pub fn entry(&self, member: &str) -> Option<&LedgerEntry> {
        self.ledger.iter().find(|e| e.member == member)
    }

    /// The member claimed by the Sandbox with `uid`.
    pub fn claimed_by(&self, uid: &str) -> Option<&LedgerEntry> {
        self.ledger
            .iter()
            .find(|e| e.claimed_by.as_ref().is_some_and(|c| c.uid == uid))
    }
}
