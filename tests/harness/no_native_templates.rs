//! A provider WITHOUT native templates on a real engine: Docker with its `templates()`
//! capability hidden, everything else delegated. Fly Machines and E2B have no image commit
//! either, so this is how the templates service's exec-and-store path is exercised against
//! real containers, real tar and a real S3 store.

use async_trait::async_trait;
use sandbox_operator::provider::docker::DockerProvider;
use sandbox_operator::provider::{
    BulkFiles, CapacityProbe, CreateRequest, Egress, ExecOutput, ExecRequest, Files, Hibernation,
    Provider, ProviderEvents, ProviderResult, SandboxDescriptor, SandboxQuery, SetResources,
    Templates, Volumes,
};

/// Docker, minus its native templates.
#[derive(Clone)]
pub struct NoNativeTemplates(pub DockerProvider);

#[async_trait]
impl Provider for NoNativeTemplates {
    fn name(&self) -> &str {
        self.0.name()
    }
    fn kind(&self) -> &'static str {
        "docker-without-templates"
    }
    async fn create(&self, request: &CreateRequest) -> ProviderResult<SandboxDescriptor> {
        self.0.create(request).await
    }
    async fn describe(&self, id: &str) -> ProviderResult<Option<SandboxDescriptor>> {
        self.0.describe(id).await
    }
    async fn find(&self, query: &SandboxQuery) -> ProviderResult<Vec<SandboxDescriptor>> {
        self.0.find(query).await
    }
    async fn start(&self, id: &str) -> ProviderResult<()> {
        self.0.start(id).await
    }
    async fn stop(&self, id: &str) -> ProviderResult<()> {
        self.0.stop(id).await
    }
    async fn sleep(&self, id: &str) -> ProviderResult<()> {
        self.0.sleep(id).await
    }
    async fn wake(&self, id: &str) -> ProviderResult<()> {
        self.0.wake(id).await
    }
    async fn destroy(&self, id: &str) -> ProviderResult<()> {
        self.0.destroy(id).await
    }
    async fn exec(&self, id: &str, request: &ExecRequest) -> ProviderResult<ExecOutput> {
        self.0.exec(id, request).await
    }
    fn hibernation(&self) -> Option<&dyn Hibernation> {
        self.0.hibernation()
    }
    fn volumes(&self) -> Option<&dyn Volumes> {
        self.0.volumes()
    }
    /// The one difference: no image commit.
    fn templates(&self) -> Option<&dyn Templates> {
        None
    }
    fn resources(&self) -> Option<&dyn SetResources> {
        self.0.resources()
    }
    fn capacity(&self) -> Option<&dyn CapacityProbe> {
        Provider::capacity(&self.0)
    }
    fn files(&self) -> Option<&dyn Files> {
        self.0.files()
    }
    fn bulk_files(&self) -> Option<&dyn BulkFiles> {
        self.0.bulk_files()
    }
    fn egress(&self) -> Option<&dyn Egress> {
        self.0.egress()
    }
    fn events(&self) -> Option<&dyn ProviderEvents> {
        self.0.events()
    }
}
