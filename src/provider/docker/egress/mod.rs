//! Egress on Docker: allow-lists enforced by an egress gateway of our own, and the
//! observed verdict.
//!
//! Where a sandbox's traffic can go is decided at create by its allow-list and is fixed for
//! the container's life ([`Placement`]): unrestricted sandboxes sit on their namespace's
//! network (inter-container traffic off, see `networks`); `allowedDomains: []` is network mode `none` (nothing at all); a
//! non-empty list puts the sandbox on the gateway's internal network with the gateway as its
//! only resolver (see `gateway` and the `crate::gateway` module for what is enforced). A
//! changed list within the gateway placement is applied in place by rewriting the sandbox's
//! policy file; a change across placements recreates the sandbox (the placement is part of
//! the controller's spec hash through [`EgressPolicy::placement`]).

mod gateway;
mod isolation;
mod policy;
mod settings;
mod verdict;

pub(crate) use gateway::Gateway;
pub use gateway::{COMPONENT, COMPONENT_LABEL};
pub(crate) use isolation::Reach;
pub use settings::EgressGatewaySettings;

/// Where a sandbox's traffic goes, fixed at create.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Placement {
    /// The namespace's network: unrestricted egress, no sandbox-to-sandbox traffic.
    Open,
    /// Network mode `none`: no egress at all.
    Cut,
    /// Behind the egress gateway: only listed names.
    Gateway,
}

impl Placement {
    /// The placement an allow-list asks for.
    pub(crate) fn of(allowed: Option<&[String]>) -> Placement {
        match allowed {
            None => Placement::Open,
            Some([]) => Placement::Cut,
            Some(_) => Placement::Gateway,
        }
    }

    /// Its name (in the spec hash and in messages).
    pub(crate) fn key(self) -> &'static str {
        match self {
            Placement::Open => "open",
            Placement::Cut => "none",
            Placement::Gateway => "gateway",
        }
    }
}
