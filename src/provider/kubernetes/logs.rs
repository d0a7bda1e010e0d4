//! The main process's output ([`Logs`]): the Pod's log (the kubelet's record of the sandbox
//! container's stdout and stderr, interleaved), through the `log` subresource.
//!
//! A stopped sandbox has no log: stopping deletes its Pod (see the module docs of the
//! provider), and the gated successor never ran. Its log call is refused by the API server
//! (`Invalid`, "waiting to start").

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::{self, BoxStream, StreamExt};
use futures::{AsyncBufRead, AsyncBufReadExt};
use kube::api::LogParams;

use super::KubernetesProvider;
use super::errors::from_kube;
use super::pod::CONTAINER;
use crate::provider::stream::{LogRequest, Logs};
use crate::provider::{ProviderError, ProviderResult};

#[async_trait]
impl Logs for KubernetesProvider {
    async fn logs(
        &self,
        id: &str,
        request: &LogRequest,
    ) -> ProviderResult<BoxStream<'static, ProviderResult<Bytes>>> {
        self.must_get_pod(id).await?;
        let what = format!("reading the log of sandbox {id}");
        let reader = self
            .pods()
            .log_stream(id, &params(request))
            .await
            .map_err(|e| from_kube(e, &what))?;
        Ok(chunks(Box::pin(reader), what))
    }
}

fn params(request: &LogRequest) -> LogParams {
    let clamp = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    LogParams {
        container: Some(CONTAINER.to_string()),
        follow: request.follow,
        tail_lines: request.tail_lines.map(clamp),
        since_seconds: request.since_seconds.map(clamp),
        timestamps: request.timestamps,
        ..LogParams::default()
    }
}

/// The log as it arrives, one buffered read at a time (nothing read ahead of the consumer).
fn chunks<R>(reader: R, what: String) -> BoxStream<'static, ProviderResult<Bytes>>
where
    R: AsyncBufRead + Send + Unpin + 'static,
{
    stream::unfold(Some(reader), move |state| {
        let what = what.clone();
        async move {
            let mut reader = state?;
            match reader.fill_buf().await {
                Ok([]) => None,
                Ok(buffer) => {
                    let chunk = Bytes::copy_from_slice(buffer);
                    reader.consume_unpin(chunk.len());
                    Some((Ok(chunk), Some(reader)))
                }
                Err(e) => Some((
                    Err(ProviderError::transient(format!(
                        "{what}: the stream broke ({e})"
                    ))),
                    None,
                )),
            }
        }
    })
    .boxed()
}
