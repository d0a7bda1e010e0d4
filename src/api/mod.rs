//! CRD types (placeholder until the api module lands).
pub mod crds;
