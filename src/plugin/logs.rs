//! `logs`: the main process's output, a plain streaming GET; with `-f` it stays open and
//! every chunk is written (and flushed) as it arrives.

use http::Request;
use http_body_util::BodyExt;
use kube::client::Body;
use tokio::io::{AsyncWrite, AsyncWriteExt};

use super::api::Subresource;
use super::cli::LogsArgs;
use super::connect::{At, Target, send};
use super::errors::PluginError;

/// The query of a log request (kubectl's parameters; defaults are left out).
pub fn query(args: &LogsArgs) -> Vec<(&'static str, String)> {
    let mut q = Vec::new();
    if args.follow {
        q.push(("follow", "true".to_string()));
    }
    if args.tail >= 0 {
        q.push(("tailLines", args.tail.to_string()));
    }
    if let Some(since) = args.since {
        q.push(("sinceSeconds", since.as_secs().max(1).to_string()));
    }
    if args.timestamps {
        q.push(("timestamps", "true".to_string()));
    }
    q
}

/// `logs`: copies the stream to stdout until the server ends it.
pub async fn logs(target: &Target, args: &LogsArgs) -> Result<i32, PluginError> {
    let at = At {
        ns: &target.namespace,
        name: &args.name,
        sub: Subresource::Log,
    };
    let request = Request::get(at.url(&query(args)))
        .body(Body::from(Vec::new()))
        .map_err(|e| PluginError::Usage(format!("building the request: {e}")))?;
    let response = send(target, at, request).await?;
    copy_body(response.into_body(), &mut tokio::io::stdout()).await?;
    Ok(0)
}

/// Writes every data frame of `body` to `out` as it arrives.
pub async fn copy_body(
    mut body: Body,
    out: &mut (dyn AsyncWrite + Send + Unpin),
) -> Result<u64, PluginError> {
    let mut total = 0u64;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| PluginError::Transport(format!("the stream broke: {e}")))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        out.write_all(&data)
            .await
            .and(out.flush().await)
            .map_err(|e| PluginError::local("writing the output", e))?;
        total += data.len() as u64;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn args(follow: bool, tail: i64, since: Option<u64>, timestamps: bool) -> LogsArgs {
        LogsArgs {
            follow,
            tail,
            since: since.map(Duration::from_secs),
            timestamps,
            name: "demo".into(),
        }
    }

    #[test]
    fn only_the_options_given_reach_the_query() {
        assert!(query(&args(false, -1, None, false)).is_empty());
        let q = query(&args(true, 10, Some(90), true));
        assert_eq!(
            q,
            [
                ("follow", "true".to_string()),
                ("tailLines", "10".to_string()),
                ("sinceSeconds", "90".to_string()),
                ("timestamps", "true".to_string()),
            ]
        );
    }
}
