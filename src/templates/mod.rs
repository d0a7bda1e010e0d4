//! Templates in an S3-compatible store: the control-plane half (`store`), the pure scheme
//! (`manifest`: keys, manifest, leases, scripts) and the provider-neutral capture/restore
//! (`transfer`), whose restore is the security boundary.

pub mod manifest;
pub mod store;
pub mod transfer;
