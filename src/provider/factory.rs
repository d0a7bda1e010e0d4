//! The one place providers are built from their settings.
//!
//! Each provider module owns its settings type (defaults and validation included); this module
//! only maps a settings variant to its constructor. Adding a provider is its module, its
//! settings variant here and its arm in [`build`].

use std::sync::Arc;

use super::docker::{DockerProvider, DockerSettings};
use super::e2b::{E2bProvider, E2bSettings};
use super::fly::{FlyProvider, FlySettings};
use super::kubernetes::{KubernetesProvider, KubernetesSettings};
use super::sprites::{SpritesProvider, SpritesSettings};
use super::{Provider, ProviderResult};

/// The settings of one provider, by type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProviderSettings {
    /// A Docker engine (boxed: its settings are several times the size of the others').
    Docker(Box<DockerSettings>),
    /// Fly Machines.
    Fly(FlySettings),
    /// E2B.
    E2b(E2bSettings),
    /// Fly Sprites.
    Sprites(SpritesSettings),
    /// Pods on a Kubernetes cluster.
    Kubernetes(KubernetesSettings),
}

impl ProviderSettings {
    /// The provider type as the configuration spells it (`type: docker`).
    pub fn type_name(&self) -> &'static str {
        match self {
            ProviderSettings::Docker(_) => "docker",
            ProviderSettings::Fly(_) => "fly",
            ProviderSettings::E2b(_) => "e2b",
            ProviderSettings::Sprites(_) => "sprites",
            ProviderSettings::Kubernetes(_) => "kubernetes",
        }
    }
}

/// Builds the provider `name` from its settings, contacting it where that is cheap (Docker
/// negotiates its API version), so a provider that cannot work fails at start-up with its
/// settings named rather than at the first reconcile.
pub async fn build(name: &str, settings: &ProviderSettings) -> ProviderResult<Arc<dyn Provider>> {
    match settings {
        ProviderSettings::Docker(s) => Ok(Arc::new(
            DockerProvider::connect_negotiated(name, (**s).clone()).await?,
        )),
        ProviderSettings::Fly(s) => Ok(Arc::new(FlyProvider::connect(name, s.clone()).await?)),
        ProviderSettings::E2b(s) => Ok(Arc::new(E2bProvider::new(name, s.clone())?)),
        ProviderSettings::Sprites(s) => Ok(Arc::new(SpritesProvider::from_settings(name, s)?)),
        ProviderSettings::Kubernetes(s) => Ok(Arc::new(
            KubernetesProvider::connect(name, s.clone()).await?,
        )),
    }
}
