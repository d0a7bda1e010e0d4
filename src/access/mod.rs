//! The access layer: how users and agents reach a sandbox with their own Kubernetes identity.
//! An aggregated API (`subresources.sandboxes.dev`) serves exec, attach, log, port-forward and
//! files as subresources of a Sandbox; it reaches providers only through the seam's optional
//! capabilities ([`crate::provider::stream`]), never a provider module directly.

pub mod channel;
