//! sandbox-operator: turns `Sandbox`, `SandboxTemplate` and `SandboxVolume` objects into
//! isolated code sandboxes on a provider, and keeps them converged.
//!
//! Layout: `api` holds the CRD types (pure data + schema), `provider` the provider seam and
//! its implementations. Kubernetes I/O lives only in the controllers; the provider seam and
//! domain types know nothing of it.

pub mod access;
pub mod api;
pub mod claims;
pub mod config;
pub mod connect_json;
pub mod controller;
pub mod e2bapi;
pub mod gateway;
pub mod idle;
pub mod jitter;
pub mod kube_client;
pub mod leader;
pub mod metrics;
pub mod plugin;
pub mod provider;
pub mod registry;
pub mod run;
pub mod secret;
pub mod server;
pub mod supervisor;
pub mod telemetry;
pub mod templates;
pub mod validation;
