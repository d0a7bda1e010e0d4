//! The main process's output ([`Logs`]) from the engine's log of the container: stdout and
//! stderr interleaved in the order the engine recorded them, as a Pod's log is. Only the
//! engine's log drivers that keep a readable log (`json-file`, `local`, the default) serve it.

use async_trait::async_trait;
use bollard::container::LogOutput;
use bollard::query_parameters::LogsOptions;
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;

use super::{DockerProvider, map_err};
use crate::provider::stream::{LogRequest, Logs};
use crate::provider::{ProviderError, ProviderResult};

#[async_trait]
impl Logs for DockerProvider {
    /// An absent sandbox is `NotFound`; a stopped one still has its log. With `follow`, the
    /// engine ends the stream when the container stops.
    async fn logs(
        &self,
        id: &str,
        request: &LogRequest,
    ) -> ProviderResult<BoxStream<'static, ProviderResult<Bytes>>> {
        if self.inspect(id).await?.is_none() {
            return Err(ProviderError::not_found(format!(
                "sandbox {id} does not exist; its log went with it"
            )));
        }
        let docker = self.engine().await?;
        let what = format!("reading the log of sandbox {id}");
        let stream = docker
            .logs(id, Some(options(request, chrono::Utc::now().timestamp())))
            .map(move |frame| match frame {
                Ok(frame) => Ok(bytes_of(frame)),
                Err(e) => Err(map_err(&what, e)),
            });
        Ok(stream.boxed())
    }
}

/// The engine's log options for `request` at `now` (Unix seconds).
fn options(request: &LogRequest, now: i64) -> LogsOptions {
    let since = request
        .since_seconds
        .map(|s| now.saturating_sub(i64::try_from(s).unwrap_or(i64::MAX)))
        .map(|t| i32::try_from(t.max(0)).unwrap_or(i32::MAX))
        .unwrap_or(0);
    LogsOptions {
        follow: request.follow,
        stdout: true,
        stderr: true,
        since,
        until: 0,
        timestamps: request.timestamps,
        tail: request
            .tail_lines
            .map_or_else(|| "all".to_string(), |n| n.to_string()),
    }
}

fn bytes_of(frame: LogOutput) -> Bytes {
    match frame {
        LogOutput::StdOut { message }
        | LogOutput::StdErr { message }
        | LogOutput::Console { message }
        | LogOutput::StdIn { message } => message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_counts_back_from_now_and_tail_defaults_to_all() {
        let all = options(&LogRequest::default(), 1_000);
        assert_eq!((all.since, all.tail.as_str()), (0, "all"));
        let some = options(
            &LogRequest {
                follow: true,
                tail_lines: Some(5),
                since_seconds: Some(60),
                timestamps: true,
            },
            1_000,
        );
        assert_eq!((some.since, some.tail.as_str()), (940, "5"));
        assert!(some.follow && some.timestamps && some.stdout && some.stderr);
    }
}
