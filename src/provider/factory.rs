//! The one place providers are registered: their `type:` names, their settings blocks in the
//! configuration file, how those are checked and how a provider is built from them.
//!
//! Each provider module owns its settings type and implements [`ProviderKind`] for it; the
//! `register!` list at the bottom of this file is the only place that names every provider.
//! From that list come [`ProviderType`] (the `type:` values), [`ProviderSettings`] (one
//! variant per provider), [`ProviderConfig`] (one entry of `providers:` in the configuration
//! file, with one optional settings block per provider) and [`echo_words`]. The operator
//! configuration (`crate::config`) knows none of them by name.
//!
//! # Adding a provider
//!
//! 1. Write its module under `src/provider/` (say `acme/`): a type implementing
//!    [`Provider`](super::Provider) and the capabilities it can honestly offer, and its
//!    settings type (`AcmeSettings`: serde, `camelCase`, `deny_unknown_fields`).
//! 2. In that module, implement [`ProviderKind`] for `AcmeSettings`: what a missing block
//!    means ([`ProviderKind::without_block`]), the checks ([`ProviderKind::check`]), the
//!    credentials to resolve at start-up ([`ProviderKind::secrets`]), the words its event
//!    stream uses for the operator's own changes ([`ProviderKind::echo_words`], if it has a
//!    stream) and how to build it ([`ProviderKind::build`]).
//! 3. Add `pub mod acme;` to `provider/mod.rs` and one line to the `register!` list below:
//!    `Acme(AcmeSettings) => acme`. The configuration then accepts `type: acme` with an
//!    `acme:` block.
//! 4. Let its create check destructure [`CreateRequest`](super::CreateRequest) without `..`
//!    (the compiler then asks it about every new field, rule 10), and run the conformance
//!    suite against it (`tests/conformance/`), with a double under `tests/doubles/` when it is
//!    a remote service.
//!
//! The Helm chart renders the configuration file from its values; a new provider's block is
//! written there as it is in the file.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::docker::DockerSettings;
use super::e2b::E2bSettings;
use super::fly::FlySettings;
use super::kubernetes::KubernetesSettings;
use super::sprites::SpritesSettings;
use super::{Change, Provider, ProviderResult};
use crate::secret::SecretSource;
use crate::validation::Issues;

/// What the factory needs from a provider's settings type.
#[async_trait]
pub trait ProviderKind: fmt::Debug + Send + Sync {
    /// What an entry without its settings block means: `Ok` the defaults when every setting
    /// has one, `Err` the message saying what the block must hold (credentials, an app).
    fn without_block() -> Result<Self, &'static str>
    where
        Self: Sized;

    /// Reports every setting that cannot work, under `at` (e.g. `providers[0].docker`).
    fn check(&self, at: &str, issues: &mut Issues);

    /// The credentials the provider resolves when it is built, by their key in the block, so
    /// the operator fails at start-up naming them rather than at the first reconcile.
    fn secrets(&self) -> Vec<(&'static str, &SecretSource)> {
        Vec::new()
    }

    /// The words ([`ProviderEvent::action`](super::ProviderEvent), before any `:`) the
    /// provider's event stream yields when the operator itself makes `change`, so the
    /// controller does not reconcile again for its own doing. Empty for a provider without a
    /// stream.
    fn echo_words(_change: Change) -> &'static [&'static str]
    where
        Self: Sized,
    {
        &[]
    }

    /// The provider's sandboxes transfer templates with the store at `endpoint` (a URL):
    /// they download and upload archives themselves through presigned URLs. A provider that
    /// closes its engine's host to its sandboxes opens exactly that service, since the store
    /// may run there; one whose sandboxes live elsewhere needs nothing.
    fn open_template_store(&mut self, _endpoint: &str) {}

    /// Builds the provider `name`, contacting it where that is cheap (Docker negotiates its
    /// API version), so a provider that cannot work fails at start-up with its settings named
    /// rather than at the first reconcile.
    async fn build(&self, name: &str) -> ProviderResult<Arc<dyn Provider>>;
}

/// Builds the provider `name` from its settings (see [`ProviderKind::build`]).
pub async fn build(name: &str, settings: &ProviderSettings) -> ProviderResult<Arc<dyn Provider>> {
    settings.kind().build(name).await
}

impl ProviderType {
    /// The name used in the YAML (`type: docker`), also the settings block's key.
    pub fn as_str(self) -> &'static str {
        self.key()
    }
}

impl fmt::Display for ProviderType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl ProviderConfig {
    /// A Docker provider with default settings, as used when no configuration file is given.
    pub fn docker_default(name: impl Into<String>) -> Self {
        ProviderConfig::new(name, ProviderType::Docker)
    }

    /// Reports the entry's settings blocks under `at`: a block for another type than the
    /// entry's, a missing block its type needs, and every setting of its own block that
    /// cannot work.
    pub fn check(&self, at: &str, issues: &mut Issues) {
        for kind in self.blocks() {
            if kind != self.type_ {
                issues.push(
                    format!("{at}.{kind}"),
                    format!(
                        "settings for `{kind}` on a provider of type `{}`; remove this block or \
                         set `type: {kind}`",
                        self.type_
                    ),
                );
            }
        }
        let at = format!("{at}.{}", self.type_);
        match self.settings() {
            Ok(settings) => settings.kind().check(&at, issues),
            Err(needs) => issues.push(at, needs),
        }
    }
}

/// Generates, from one list of `Variant(SettingsType) => key` lines, everything that names
/// every provider: [`ProviderType`], [`ProviderSettings`], [`ProviderConfig`] and
/// [`echo_words`].
macro_rules! register {
    ($( $(#[doc = $doc:literal])* $variant:ident($settings:ty) => $key:ident ),+ $(,)?) => {
        /// Kind of provider behind a [`ProviderConfig`] (its `type:`).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[serde(rename_all = "lowercase")]
        pub enum ProviderType {
            $( $(#[doc = $doc])* $variant, )+
        }

        impl ProviderType {
            /// Every registered type.
            pub const ALL: &'static [ProviderType] = &[$(ProviderType::$variant),+];

            fn key(self) -> &'static str {
                match self {
                    $( ProviderType::$variant => stringify!($key), )+
                }
            }
        }

        /// The settings of one provider, by type (boxed: they differ a lot in size).
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub enum ProviderSettings {
            $( $(#[doc = $doc])* $variant(Box<$settings>), )+
        }

        impl ProviderSettings {
            /// The provider type as the configuration spells it (`type: docker`).
            pub fn type_name(&self) -> &'static str {
                self.provider_type().as_str()
            }

            /// The provider type.
            pub fn provider_type(&self) -> ProviderType {
                match self {
                    $( ProviderSettings::$variant(_) => ProviderType::$variant, )+
                }
            }

            /// The settings as what the factory needs of them.
            pub fn kind(&self) -> &dyn ProviderKind {
                match self {
                    $( ProviderSettings::$variant(s) => &**s, )+
                }
            }

            /// The settings as what the factory needs of them, to adjust before the build.
            pub fn kind_mut(&mut self) -> &mut dyn ProviderKind {
                match self {
                    $( ProviderSettings::$variant(s) => &mut **s, )+
                }
            }
        }

        /// One named provider of the configuration file. Only the settings block matching
        /// `type` may be present; a type whose settings all have defaults may omit it, a type
        /// that needs credentials may not (see [`ProviderKind::without_block`]).
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        #[serde(rename_all = "camelCase", deny_unknown_fields)]
        pub struct ProviderConfig {
            /// Name Sandboxes use in `spec.provider` (DNS-1123 label).
            pub name: String,
            /// Which provider implementation.
            #[serde(rename = "type")]
            pub type_: ProviderType,
            $(
                #[doc = concat!("Settings for `type: ", stringify!($key), "`.")]
                #[serde(default, skip_serializing_if = "Option::is_none")]
                pub $key: Option<$settings>,
            )+
            /// Name of an entry in `templateStores` used for this provider's templates
            /// (required in practice for providers that cannot commit images, such as Fly).
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub template_store: Option<String>,
        }

        impl ProviderConfig {
            /// An entry of `type_` with no settings block and no template store.
            pub fn new(name: impl Into<String>, type_: ProviderType) -> Self {
                ProviderConfig {
                    name: name.into(),
                    type_,
                    $( $key: None, )+
                    template_store: None,
                }
            }

            /// The settings block matching `type` (the type's defaults when the block is
            /// absent and it has them); `Err` says what a missing block must hold.
            pub fn settings(&self) -> Result<ProviderSettings, &'static str> {
                match self.type_ {
                    $( ProviderType::$variant => match &self.$key {
                        Some(s) => Ok(ProviderSettings::$variant(Box::new(s.clone()))),
                        None => <$settings as ProviderKind>::without_block()
                            .map(|s| ProviderSettings::$variant(Box::new(s))),
                    }, )+
                }
            }

            /// The types whose settings blocks are present.
            pub fn blocks(&self) -> Vec<ProviderType> {
                let mut present = Vec::new();
                $( if self.$key.is_some() {
                    present.push(ProviderType::$variant);
                } )+
                present
            }
        }

        /// The words every registered provider's event stream uses for `change` (see
        /// [`ProviderKind::echo_words`]), each once.
        pub fn echo_words(change: Change) -> Vec<&'static str> {
            let mut words = Vec::new();
            $( words.extend_from_slice(<$settings as ProviderKind>::echo_words(change)); )+
            words.sort_unstable();
            words.dedup();
            words
        }
    };
}

register! {
    /// A Docker engine (bollard).
    Docker(DockerSettings) => docker,
    /// Fly Machines (REST).
    Fly(FlySettings) => fly,
    /// E2B (REST).
    E2b(E2bSettings) => e2b,
    /// Fly Sprites (REST and WebSocket).
    Sprites(SpritesSettings) => sprites,
    /// Pods on a Kubernetes cluster (kube).
    Kubernetes(KubernetesSettings) => kubernetes,
}
