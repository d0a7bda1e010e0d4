//! TCP port-forward ([`PortForward`]) through the Pod `portforward` subresource: each call
//! opens its own WebSocket connection for one port, so every client connection gets its own
//! stream, as `kubectl port-forward` does.
//!
//! Nothing listening on the port shows as the stream ending at once; the API server's error
//! message for it (on the port's error channel) is logged, since a [`TunnelStream`] carries
//! bytes only.

use async_trait::async_trait;

use super::KubernetesProvider;
use super::errors::from_kube;
use crate::provider::ProviderResult;
use crate::provider::stream::{PortForward, TunnelStream};

#[async_trait]
impl PortForward for KubernetesProvider {
    async fn connect(&self, id: &str, port: u16) -> ProviderResult<TunnelStream> {
        self.must_be_running(id, "port-forward").await?;
        let what = format!("port-forward to port {port} of sandbox {id}");
        let mut forwarder = self
            .pods()
            .portforward(id, &[port])
            .await
            .map_err(|e| from_kube(e, &what))?;
        let stream = forwarder.take_stream(port).ok_or_else(|| {
            crate::provider::ProviderError::transient(format!("{what}: no stream for the port"))
        })?;
        if let Some(error) = forwarder.take_error(port) {
            let sandbox = id.to_string();
            tokio::spawn(async move {
                if let Some(message) = error.await {
                    tracing::info!(%sandbox, port, %message, "port-forward ended with an error");
                }
            });
        }
        Ok(Box::pin(stream))
    }
}
