//! The Kubernetes-facing API: the `sandboxes.dev/v1alpha1` custom resources.
//!
//! Pure data plus schema. Admission validation lives in the generated schema (required
//! fields, enums, bounds, patterns and CEL rules), so what reaches the controllers already
//! has the right shape; `crds` renders the CustomResourceDefinitions that carry it.

pub mod budget;
pub mod common;
pub mod crds;
pub mod pool;
pub mod quantity;
pub mod sandbox;
pub mod template;
pub mod volume;

pub use budget::*;
pub use common::*;
pub use pool::*;
pub use quantity::*;
pub use sandbox::*;
pub use template::*;
pub use volume::*;
