//! The engine's image cache as the controller's image rules see it ([`ImageCache`]): one
//! cache for every namespace, so what it holds says nothing about who may boot it.

use async_trait::async_trait;

use super::DockerProvider;
use super::pull::registry_digest;
use crate::provider::image;
use crate::provider::{CachedImage, ImageCache, ProviderResult};

#[async_trait]
impl ImageCache for DockerProvider {
    fn template_repository(&self) -> &str {
        &self.settings.template_repository
    }

    /// Looks `image` up as a create would (so an image id finds its image too): a template
    /// image is one tagged into the template repository under any name.
    async fn cached(&self, image: &str) -> ProviderResult<Option<CachedImage>> {
        let Some(local) = self.local_image(image).await? else {
            return Ok(None);
        };
        let repository = &self.settings.template_repository;
        let template = local
            .repo_tags
            .iter()
            .flatten()
            .any(|tag| image::in_repository(tag, repository));
        Ok(Some(CachedImage {
            template,
            registry_digest: registry_digest(image, &local),
        }))
    }
}
