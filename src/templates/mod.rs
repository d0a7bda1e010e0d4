//! Templates in an S3-compatible store: the control-plane half (`store`), the pure scheme
//! (`manifest`: keys, manifest, leases, scripts), the provider-neutral capture/restore
//! (`transfer`), whose restore is the security boundary, and the controller-side templates
//! service over them (`service`) that every template operation goes through.

pub mod manifest;
pub mod service;
pub mod store;
pub mod transfer;
