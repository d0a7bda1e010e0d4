//! The unary methods on running processes — `List`, `SendInput`, `SendSignal`, `Update`,
//! `CloseStdin` — and the client-streaming `StreamInput`. Input goes to the process through
//! its session's input queue (the seam's [`ExecInput`]), in order: a resize takes effect
//! before the keystrokes sent after it.

use axum::Extension;
use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use futures::StreamExt;
use serde_json::json;

use super::table::{Process, ProcessTable};
use super::wire::{
    self, Selected, SendInputRequest, SendSignalRequest, StreamInput, UpdateRequest,
};
use crate::connect_json::{Decoder, Frame, end_of_stream, envelope};
use crate::e2bapi::envd::error::{Code, EnvdError};
use crate::e2bapi::envd::rpc;
use crate::e2bapi::envd::target::EnvdTarget;
use crate::provider::stream::ExecInput;

/// `process.Process/List`: the running processes this replica started in the sandbox.
pub async fn list(t: EnvdTarget, Extension(table): Extension<ProcessTable>) -> Response {
    let processes: Vec<_> = table
        .running(&t.sid)
        .iter()
        .map(|p| wire::process_info(p.pid, &p.started.config, p.started.tag.as_deref()))
        .collect();
    rpc::ok(json!({"processes": processes}))
}

/// `process.Process/SendInput`.
pub async fn send_input(
    t: EnvdTarget,
    Extension(table): Extension<ProcessTable>,
    body: Bytes,
) -> Result<Response, EnvdError> {
    let request: SendInputRequest = rpc::unary(&body)?;
    let process = table.find(&t.sid, &wire::selector(request.process)?)?;
    let bytes = wire::input_bytes(request.input)?;
    stdin(&process, bytes).await?;
    Ok(rpc::ok(json!({})))
}

/// `process.Process/SendSignal`.
pub async fn send_signal(
    t: EnvdTarget,
    Extension(table): Extension<ProcessTable>,
    body: Bytes,
) -> Result<Response, EnvdError> {
    let request: SendSignalRequest = rpc::unary(&body)?;
    let process = table.find(&t.sid, &wire::selector(request.process)?)?;
    let signal = wire::signal(&request.signal)?;
    deliver(&process, ExecInput::Signal(signal)).await?;
    Ok(rpc::ok(json!({})))
}

/// `process.Process/Update`: a PTY's new size.
pub async fn update(
    t: EnvdTarget,
    Extension(table): Extension<ProcessTable>,
    body: Bytes,
) -> Result<Response, EnvdError> {
    let request: UpdateRequest = rpc::unary(&body)?;
    let process = table.find(&t.sid, &wire::selector(request.process)?)?;
    let Some(pty) = request.pty else {
        return Ok(rpc::ok(json!({})));
    };
    if !process.started.pty {
        return Err(EnvdError::new(
            Code::FailedPrecondition,
            format!("process {} has no terminal to resize", process.pid),
        ));
    }
    deliver(&process, ExecInput::Resize(wire::term_size(&pty)?)).await?;
    Ok(rpc::ok(json!({})))
}

/// `process.Process/CloseStdin`.
pub async fn close_stdin(
    t: EnvdTarget,
    Extension(table): Extension<ProcessTable>,
    body: Bytes,
) -> Result<Response, EnvdError> {
    let request: Selected = rpc::unary(&body)?;
    let process = table.find(&t.sid, &wire::selector(request.process)?)?;
    deliver(&process, ExecInput::CloseStdin).await?;
    Ok(rpc::ok(json!({})))
}

/// `process.Process/StreamInput`: a start message naming the process, then input messages,
/// each delivered as it arrives.
pub async fn stream_input(
    t: EnvdTarget,
    Extension(table): Extension<ProcessTable>,
    body: Body,
) -> Result<Response, EnvdError> {
    let mut body = body.into_data_stream();
    let mut decoder = Decoder::default();
    let mut process = None;
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| {
            EnvdError::new(Code::Unavailable, format!("reading the input stream: {e}"))
        })?;
        decoder.push(&chunk);
        while let Some(frame) = decoder
            .next_frame()
            .map_err(|e| EnvdError::new(Code::InvalidArgument, e))?
        {
            let Frame::Message(message) = frame else {
                continue;
            };
            match rpc::parse(message)? {
                StreamInput::Start { process: selected } => {
                    process = Some(table.find(&t.sid, &wire::selector(selected)?)?);
                }
                StreamInput::Data { input } => {
                    let target = process.as_ref().ok_or_else(|| {
                        EnvdError::new(Code::InvalidArgument, "input before the start message")
                    })?;
                    stdin(target, wire::input_bytes(input)?).await?;
                }
                StreamInput::Keepalive {} => {}
            }
        }
    }
    let frames = [envelope(&json!({})), end_of_stream(&json!({}))];
    Ok(rpc::streaming(futures::stream::iter(frames)))
}

/// Bytes for the process's stdin (or its terminal).
async fn stdin(process: &Process, bytes: Bytes) -> Result<(), EnvdError> {
    if !process.started.stdin {
        return Err(EnvdError::new(
            Code::FailedPrecondition,
            format!(
                "process {} was started without stdin: start it with stdin=True",
                process.pid
            ),
        ));
    }
    deliver(process, ExecInput::Stdin(bytes)).await
}

/// Queues `input` for a running process; an ended one is not_found, as envd answers.
async fn deliver(process: &Process, input: ExecInput) -> Result<(), EnvdError> {
    let ended = || EnvdError::new(Code::NotFound, format!("process {} has ended", process.pid));
    if process.ended() {
        return Err(ended());
    }
    process.input.send(input).await.map_err(|_| ended())
}
