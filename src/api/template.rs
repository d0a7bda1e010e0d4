//! `SandboxTemplate`: a filesystem captured from a Sandbox, which later Sandboxes boot from.

use kube::{CustomResource, KubeSchema};
use schemars::{Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

use super::common::{Condition, LocalObjectRef, PROVIDER_IMMUTABLE_RULE, no_default};

/// Characters a capture path may contain (it becomes a shell argument and a tar selector).
pub const CAPTURE_PATH_PATTERN: &str = r"^/[A-Za-z0-9._+@,=/-]*$";

/// Desired state of a SandboxTemplate: which paths of which Sandbox to capture.
// Several `printcolumn(...)` entries repeat `type_`, which clippy misreads as a duplicate.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "sandboxes.dev",
    version = "v1alpha1",
    kind = "SandboxTemplate",
    plural = "sandboxtemplates",
    singular = "sandboxtemplate",
    shortname = "sbxt",
    category = "sandboxes",
    namespaced,
    status = "SandboxTemplateStatus",
    derive = "PartialEq",
    doc = "A SandboxTemplate captures paths of a Sandbox's filesystem into a reusable template that new Sandboxes boot from (spec.templateRef), optionally published to a shared store.",
    printcolumn(
        name = "Provider",
        type_ = "string",
        json_path = ".status.provider",
        description = "Provider holding the template"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status",
        description = "Whether the template can be booted from"
    ),
    printcolumn(
        name = "InUse",
        type_ = "boolean",
        json_path = ".status.inUse",
        description = "Whether a sandbox is backed by it"
    ),
    printcolumn(
        name = "Published",
        type_ = "boolean",
        json_path = ".status.published",
        description = "Whether it is in the shared template store"
    ),
    printcolumn(
        name = "Size",
        type_ = "integer",
        json_path = ".status.sizeBytes",
        description = "Size in bytes"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(validation = Rule::new(PROVIDER_IMMUTABLE_RULE).message("spec.provider is immutable: delete and recreate the SandboxTemplate to move it to another provider").field_path(".provider"))]
#[serde(rename_all = "camelCase")]
pub struct SandboxTemplateSpec {
    /// Name of a provider configured in the operator. The provider of `sandboxRef` is used
    /// when omitted; it must match it when set. Immutable: delete and recreate the
    /// SandboxTemplate to move it to another provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub provider: Option<String>,

    /// The Sandbox (in this namespace) whose filesystem is captured. It must exist and have
    /// been started; the capture happens once, when the template is created.
    pub sandbox_ref: LocalObjectRef,

    /// Absolute paths to capture, e.g. `/home/user` or `/opt/venv`: 1 to 32 of them. Only
    /// these paths are restored into sandboxes booted from the template. Each must be a
    /// normalised absolute path (no `..`, `.` or empty segments, not `/` itself) of
    /// letters, digits and `/ . _ - + @ , =` only (no spaces or shell metacharacters).
    #[schemars(schema_with = "capture_paths_schema")]
    pub capture_paths: Vec<String>,

    /// Free-form label recorded with the template (up to 256 characters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub label: Option<String>,

    /// Also publish the template to the provider's shared template store (an S3 bucket) so
    /// sandboxes on other hosts can boot from it. `false` when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub publish: Option<bool>,
}

/// Schema of `spec.capturePaths`: the list bounds, the character pattern and CEL rules
/// whose messages name the field and the fix.
fn capture_paths_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "minItems": 1,
        "maxItems": 32,
        "items": {
            "type": "string",
            "minLength": 1,
            "maxLength": 4096,
            "pattern": CAPTURE_PATH_PATTERN,
            "x-kubernetes-validations": [
                {
                    "rule": "self.startsWith('/')",
                    "message": "spec.capturePaths entries must be absolute paths: start them with /, e.g. /home/user"
                },
                {
                    "rule": "self.matches('^[A-Za-z0-9._+@,=/-]*$')",
                    "message": "spec.capturePaths entries may contain only letters, digits and / . _ - + @ , =: remove spaces and shell metacharacters"
                },
                {
                    "rule": "!self.contains('/../') && !self.endsWith('/..') && self != '/'",
                    "message": "spec.capturePaths entries must not contain '..' segments or be / itself: name the directory to capture, e.g. /home/user"
                },
                {
                    "rule": "!self.contains('//') && !self.contains('/./') && !self.endsWith('/.')",
                    "message": "spec.capturePaths entries must be normalised: remove empty (//) and '.' segments"
                }
            ]
        }
    })
}

/// Observed state of a SandboxTemplate, written by the operator only.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxTemplateStatus {
    /// The `metadata.generation` this status was computed from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready` (the template can be booted from), `Reconciling`, `Stalled`, and why a
    /// deletion is being refused while a sandbox still uses the template.
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    #[serde(default)]
    #[schemars(transform = no_default)]
    pub conditions: Vec<Condition>,
    /// The operator's id for the template at the provider (derived from this object's UID).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub template_id: Option<String>,
    /// The provider's reference to the captured filesystem (an image id, an `s3://` URL).
    /// Opaque: for display only.
    #[serde(rename = "ref", skip_serializing_if = "Option::is_none")]
    pub ref_: Option<String>,
    /// When the capture was taken (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_at: Option<String>,
    /// Size of the template on the provider's storage, when reported.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<i64>,
    /// Whether a sandbox is backed by the template, as checked with the provider. `true`
    /// when the provider cannot tell. A template in use is not deleted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub in_use: Option<bool>,
    /// Whether the template is in the shared template store.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub published: Option<bool>,
    /// The provider holding the template.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
}
