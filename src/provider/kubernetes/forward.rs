//! TCP port-forward ([`PortForward`]) through the Pod `portforward` subresource: each call
//! opens its own WebSocket connection for one port, so every client connection gets its own
//! stream, as `kubectl port-forward` does.
//!
//! **Nothing listening is an error at connect.** The node dials the port inside the Pod's
//! network namespace as soon as the forward is open, and a refused dial comes back as a
//! message on the port's error channel; a successful dial sends nothing (the protocol has no
//! "connected" frame). So `connect` waits a short, bounded [`REFUSAL_WINDOW`] for that
//! message: a refusal within it is `Transient` with the node's own words; past it, the
//! tunnel is handed out and a later error is only logged, since a [`TunnelStream`] carries
//! bytes only.

use std::time::Duration;

use async_trait::async_trait;

use super::KubernetesProvider;
use super::errors::from_kube;
use crate::provider::stream::{PortForward, TunnelStream};
use crate::provider::{ProviderError, ProviderResult};

/// How long a new forward waits for the node to report a refused dial. The node dials right
/// after it sent the port's opening frames, and a refusal inside the Pod's own network
/// namespace is immediate, so the message trails the upgrade by one node → API server hop
/// (under a millisecond on the test nodes; this leaves room for a loaded machine). The
/// wait is added to every successful connect, so it stays short; a refusal later than this
/// ends the tunnel at once and is logged.
const REFUSAL_WINDOW: Duration = Duration::from_millis(150);

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
        let missing =
            |part: &str| ProviderError::transient(format!("{what}: no {part} for the port"));
        let stream = forwarder
            .take_stream(port)
            .ok_or_else(|| missing("stream"))?;
        let error = forwarder
            .take_error(port)
            .ok_or_else(|| missing("error channel"))?;
        settle(error, &what, id, port).await?;
        Ok(Box::pin(stream))
    }
}

/// Waits [`REFUSAL_WINDOW`] for the port's error channel: a message in it is `Transient`
/// (nothing listens, most likely), the channel closing is the forward gone; silence is a
/// connection, and whatever the channel says later is logged.
async fn settle(
    error: impl Future<Output = Option<String>> + Send + Unpin + 'static,
    what: &str,
    id: &str,
    port: u16,
) -> ProviderResult<()> {
    let mut error = error;
    match tokio::time::timeout(REFUSAL_WINDOW, &mut error).await {
        Ok(Some(message)) => Err(ProviderError::transient(format!(
            "{what}: the node could not connect to it (does anything listen on port {port} \
             inside the sandbox?): {message}"
        ))),
        Ok(None) => Err(ProviderError::transient(format!(
            "{what}: the forward closed as soon as it opened"
        ))),
        Err(_) => {
            let sandbox = id.to_string();
            tokio::spawn(async move {
                if let Some(message) = error.await {
                    tracing::info!(%sandbox, port, %message, "port-forward ended with an error");
                }
            });
            Ok(())
        }
    }
}
