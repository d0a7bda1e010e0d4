//! `SandboxVolume`: a named provider volume that Sandboxes mount.

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{Condition, PROVIDER_IMMUTABLE_RULE, no_default, no_description};
use super::quantity::Quantity;

/// Desired state of a SandboxVolume: a named volume on a provider.
// Several `printcolumn(...)` entries repeat `type_`, which clippy misreads as a duplicate.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "sandboxes.dev",
    version = "v1alpha1",
    kind = "SandboxVolume",
    plural = "sandboxvolumes",
    singular = "sandboxvolume",
    shortname = "sbxv",
    category = "sandboxes",
    namespaced,
    status = "SandboxVolumeStatus",
    derive = "PartialEq",
    doc = "A SandboxVolume is a named volume on a provider that Sandboxes in the same namespace mount through spec.volumes. Its data outlives the Sandboxes that use it.",
    printcolumn(
        name = "Provider",
        type_ = "string",
        json_path = ".status.provider",
        description = "Provider holding the volume"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status",
        description = "Whether the volume exists at the provider"
    ),
    printcolumn(
        name = "Attached",
        type_ = "boolean",
        json_path = ".status.attached",
        description = "Whether a sandbox has it attached"
    ),
    printcolumn(
        name = "Reclaim",
        type_ = "string",
        json_path = ".spec.reclaimPolicy",
        description = "What happens to the data when this object is deleted (Retain when empty)"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(validation = Rule::new(PROVIDER_IMMUTABLE_RULE).message("spec.provider is immutable: delete and recreate the SandboxVolume to move it to another provider").field_path(".provider"))]
#[serde(rename_all = "camelCase")]
pub struct SandboxVolumeSpec {
    /// Name of a provider configured in the operator. The operator's default provider is
    /// used when omitted. Immutable: delete and recreate the SandboxVolume to move it to
    /// another provider (its data does not move).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub provider: Option<String>,

    /// What happens to the provider volume and its data when this object is deleted:
    /// `Retain` (keep it; the operator stops managing it) or `Delete` (remove it once no
    /// sandbox has it attached). `Retain` when omitted: a user's data is never deleted by
    /// default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reclaim_policy: Option<ReclaimPolicy>,

    /// Requested size, e.g. `10Gi`. Advisory: providers that cannot size volumes (Docker's
    /// local driver) ignore it, and `status.sizeBytes` reports what the provider observes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<Quantity>,
}

/// What happens to a volume's data when its SandboxVolume is deleted.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, Default, JsonSchema)]
#[schemars(transform = no_description)]
pub enum ReclaimPolicy {
    /// Remove the provider volume and its data.
    Delete,
    /// Keep the provider volume and its data (the default).
    #[default]
    Retain,
}

/// Observed state of a SandboxVolume, written by the operator only.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxVolumeStatus {
    /// The `metadata.generation` this status was computed from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready` (the volume exists at the provider), `Reconciling` and `Stalled`, and why a
    /// deletion is waiting (e.g. the volume is still attached).
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    #[serde(default)]
    #[schemars(transform = no_default)]
    pub conditions: Vec<Condition>,
    /// The provider the volume is on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// Name of the volume at the provider, derived from this object's UID.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub volume_name: Option<String>,
    /// Whether any sandbox (running or stopped) has the volume attached. `true` when the
    /// provider cannot tell.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attached: Option<bool>,
    /// Provider names of the sandboxes it is attached to, when known.
    #[serde(default)]
    #[schemars(transform = no_default)]
    pub attached_to: Vec<String>,
    /// Size on the provider's storage, when reported.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<i64>,
    /// When the provider created the volume (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_at: Option<String>,
}
