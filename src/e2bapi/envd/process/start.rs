//! `Start` and `Connect`, the two server-streaming methods. `Start` runs the process through
//! the sandbox's provider's streaming exec (the seam), registers it under a pid of this
//! replica and streams its events; a task moves the provider's output into the process's
//! buffer until it ends. `Connect` reattaches: it replays what the buffer still keeps (the
//! last [`super::ring::REPLAY_BYTES`] of output), then follows live output to the end.

use std::sync::Arc;

use axum::Extension;
use axum::http::HeaderMap;
use axum::response::Response;
use bytes::Bytes;
use futures::future::BoxFuture;
use futures::stream::{self, BoxStream, StreamExt};

use super::forward::{Call, Replica};
use super::respond;
use super::ring::Chunk;
use super::table::{Follower, KEEP_ENDED, Process, ProcessTable, Started};
use super::wire::{self, End, Selected, StartRequest};
use crate::access::status::AccessError;
use crate::e2bapi::envd::error::{Code, EnvdError};
use crate::e2bapi::envd::rpc;
use crate::e2bapi::envd::target::EnvdTarget;
use crate::provider::ProviderResult;
use crate::provider::stream::{ExecSession, ExitStatus, StreamExecRequest, TermSize};

/// The terminal size of a PTY asked for without one.
const DEFAULT_SIZE: TermSize = TermSize { cols: 80, rows: 24 };

/// `process.Process/Start`; an error before the first message ends the stream.
pub async fn start(
    t: EnvdTarget,
    replica: Extension<Replica>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    started(t, replica, headers, body)
        .await
        .unwrap_or_else(|e| rpc::stream_failed(&e))
}

async fn started(
    t: EnvdTarget,
    Extension(replica): Extension<Replica>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, EnvdError> {
    rpc::refuse_other_user(&headers, None)?;
    let (request, started) = plan(&t.sid, rpc::enveloped(&body)?)?;
    let handle = &t.target.handle;
    if !handle.can_exec_stream() {
        return Err(EnvdError::new(
            Code::Unimplemented,
            format!(
                "provider {} cannot run interactive processes",
                handle.name()
            ),
        ));
    }
    let session = handle
        .exec_stream(&t.target.id, &request)
        .await
        .map_err(|e| EnvdError::from(AccessError::from_provider("starting the process", &e)))?;
    let ExecSession {
        input,
        stdout,
        stderr,
        exit,
    } = session;
    let process = replica.table.add(started, input);
    let follower = process.follow(0);
    let output = merged(stdout, stderr, process.started.pty);
    tokio::spawn(run(replica.table, process.clone(), output, exit));
    Ok(respond::events(
        process.pid,
        follower,
        rpc::keepalive(&headers),
    ))
}

/// `process.Process/Connect`: answered by the replica holding the process; an error before
/// the first message ends the stream.
pub async fn connect(
    t: EnvdTarget,
    replica: Extension<Replica>,
    call: Call,
    body: Bytes,
) -> Response {
    connected(t, replica, call, body)
        .await
        .unwrap_or_else(|e| rpc::stream_failed(&e))
}

async fn connected(
    t: EnvdTarget,
    Extension(replica): Extension<Replica>,
    call: Call,
    body: Bytes,
) -> Result<Response, EnvdError> {
    let request: Selected = rpc::enveloped(&body)?;
    let selector = wire::selector(request.process)?;
    if let Some(answer) = replica.elsewhere(&call, &t.sid, &selector, body).await? {
        return Ok(answer);
    }
    let process = replica.table.find(&t.sid, &selector)?;
    let follower = process.follow(Follower::REPLAY);
    Ok(respond::events(
        process.pid,
        follower,
        rpc::keepalive(call.headers()),
    ))
}

/// The seam's request and what the table records, from a `Start` request.
fn plan(sid: &str, request: StartRequest) -> Result<(StreamExecRequest, Started), EnvdError> {
    let config = request.process.unwrap_or_default();
    if config.cmd.is_empty() {
        return Err(EnvdError::new(
            Code::InvalidArgument,
            "process.cmd is empty: name the program to run",
        ));
    }
    let tty = match &request.pty {
        Some(pty) if pty.size.is_some() => Some(wire::term_size(pty)?),
        Some(_) => Some(DEFAULT_SIZE),
        None => None,
    };
    // envd gives a process a stdin unless told otherwise; a terminal always has one.
    let stdin = tty.is_some() || request.stdin.unwrap_or(true);
    let mut argv = vec![config.cmd.clone()];
    argv.extend(config.args.iter().cloned());
    let exec = StreamExecRequest {
        argv,
        env: config.envs.clone(),
        cwd: config.cwd.clone(),
        stdin,
        tty,
    };
    let started = Started {
        sid: sid.to_string(),
        config,
        tag: request.tag,
        pty: tty.is_some(),
        stdin,
    };
    Ok((exec, started))
}

type Output = BoxStream<'static, ProviderResult<Chunk>>;

/// stdout (the terminal's output with a PTY) and stderr as one stream of chunks.
fn merged(
    stdout: BoxStream<'static, ProviderResult<Bytes>>,
    stderr: Option<BoxStream<'static, ProviderResult<Bytes>>>,
    pty: bool,
) -> Output {
    let kind = if pty { Chunk::Pty } else { Chunk::Stdout };
    let stdout = stdout.map(move |c| c.map(kind)).boxed();
    match stderr {
        Some(stderr) => stream::select(stdout, stderr.map(|c| c.map(Chunk::Stderr))).boxed(),
        None => stdout,
    }
}

/// Moves the output into the process's buffer until it ends, records how it ended, and
/// forgets it [`KEEP_ENDED`] later.
async fn run(
    table: ProcessTable,
    process: Arc<Process>,
    mut output: Output,
    exit: BoxFuture<'static, ProviderResult<ExitStatus>>,
) {
    let mut broke = None;
    while let Some(chunk) = output.next().await {
        match chunk {
            Ok(chunk) if chunk.bytes().is_empty() => {}
            Ok(chunk) => process.write(chunk).await,
            Err(e) => {
                broke = Some(e.to_string());
                break;
            }
        }
    }
    drop(output);
    let end = match exit.await {
        Ok(status) => End {
            code: Some(status.code),
            error: broke,
        },
        Err(e) => End {
            code: None,
            error: Some(broke.unwrap_or_else(|| e.to_string())),
        },
    };
    process.finish(end);
    tokio::time::sleep(KEEP_ENDED).await;
    table.remove(&process.started.sid, process.pid);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start_request(json: &str) -> StartRequest {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn a_start_becomes_the_seams_request() {
        let r = start_request(
            r#"{"process":{"cmd":"/bin/bash","args":["-l","-c","echo hi"],"envs":{"A":"1"},"cwd":"/tmp"},"stdin":false}"#,
        );
        let (exec, started) = plan("sid", r).unwrap();
        assert_eq!(exec.argv, ["/bin/bash", "-l", "-c", "echo hi"]);
        assert_eq!(
            (exec.env["A"].as_str(), exec.cwd.as_deref()),
            ("1", Some("/tmp"))
        );
        assert!(!exec.stdin && exec.tty.is_none() && !started.pty);
        let pty = start_request(
            r#"{"process":{"cmd":"bash"},"pty":{"size":{"cols":100,"rows":30}},"stdin":false}"#,
        );
        let (exec, started) = plan("sid", pty).unwrap();
        assert_eq!(
            exec.tty,
            Some(TermSize {
                cols: 100,
                rows: 30
            })
        );
        assert!(exec.stdin && started.pty, "a terminal has a stdin");
        let (exec, _) = plan("sid", start_request(r#"{"process":{"cmd":"cat"}}"#)).unwrap();
        assert!(exec.stdin, "envd's default");
        assert!(plan("sid", start_request(r#"{"process":{"cmd":""}}"#)).is_err());
    }
}
