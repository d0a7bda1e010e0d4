//! The unary methods on running processes — `List`, `SendInput`, `SendSignal`, `Update`,
//! `CloseStdin` — and the client-streaming `StreamInput`. Input goes to the process through
//! its session's input queue (the seam's [`ExecInput`]), in order: a resize takes effect
//! before the keystrokes sent after it.

use axum::Extension;
use axum::body::{Body, BodyDataStream};
use axum::response::Response;
use bytes::Bytes;
use futures::StreamExt;
use serde_json::{Value, json};

use super::forward::{Call, Owner, Reached, Replica};
use super::table::Process;
use super::wire::{
    self, Selected, SendInputRequest, SendSignalRequest, StreamInput, UpdateRequest,
};
use crate::connect_json::{Decoder, Frame, end_of_stream, envelope};
use crate::e2bapi::envd::error::{Code, EnvdError};
use crate::e2bapi::envd::rpc;
use crate::e2bapi::envd::target::EnvdTarget;
use crate::provider::stream::ExecInput;

/// `process.Process/List`: the running processes of the sandbox in every live replica
/// (this one's, and each other's as it answers the same request forwarded). A replica that
/// does not answer fails the list rather than shorten it.
pub async fn list(
    t: EnvdTarget,
    Extension(replica): Extension<Replica>,
    call: Call,
    body: Bytes,
) -> Result<Response, EnvdError> {
    let mut processes: Vec<_> = replica
        .table
        .running(&t.sid)
        .iter()
        .map(|p| wire::process_info(p.pid, &p.started.config, p.started.tag.as_deref()))
        .collect();
    for url in replica.others(&call).await? {
        let answer = replica
            .forward(&url, &call, &t.sid, body.clone().into())
            .await?;
        processes.extend(listed(&url, answer).await?);
    }
    Ok(rpc::ok(json!({"processes": processes})))
}

/// The processes in another replica's `List` answer.
async fn listed(url: &str, answer: Response) -> Result<Vec<Value>, EnvdError> {
    let failed = |what: String| {
        EnvdError::new(
            Code::Unavailable,
            format!("listing the processes of the operator replica at {url}: {what}"),
        )
    };
    let status = answer.status();
    let body = axum::body::to_bytes(answer.into_body(), LIST_LIMIT)
        .await
        .map_err(|e| failed(e.to_string()))?;
    if !status.is_success() {
        return Err(failed(format!(
            "{status}: {}",
            String::from_utf8_lossy(&body)
        )));
    }
    let mut message: Value = serde_json::from_slice(&body).map_err(|e| failed(e.to_string()))?;
    match message.get_mut("processes").map(Value::take) {
        Some(Value::Array(processes)) => Ok(processes),
        None => Ok(Vec::new()),
        Some(other) => Err(failed(format!("processes is {other}"))),
    }
}

/// The largest `List` answer read from another replica.
const LIST_LIMIT: usize = 16 << 20;

/// `process.Process/SendInput`.
pub async fn send_input(
    t: EnvdTarget,
    Extension(replica): Extension<Replica>,
    call: Call,
    body: Bytes,
) -> Result<Response, EnvdError> {
    let request: SendInputRequest = rpc::unary(&body)?;
    let selector = wire::selector(request.process)?;
    let process = match replica.reach(&call, &t.sid, &selector, body).await? {
        Reached::Here(process) => process,
        Reached::Answered(answer) => return Ok(answer),
    };
    let bytes = wire::input_bytes(request.input)?;
    stdin(&process, bytes).await?;
    Ok(rpc::ok(json!({})))
}

/// `process.Process/SendSignal`.
pub async fn send_signal(
    t: EnvdTarget,
    Extension(replica): Extension<Replica>,
    call: Call,
    body: Bytes,
) -> Result<Response, EnvdError> {
    let request: SendSignalRequest = rpc::unary(&body)?;
    let selector = wire::selector(request.process)?;
    let process = match replica.reach(&call, &t.sid, &selector, body).await? {
        Reached::Here(process) => process,
        Reached::Answered(answer) => return Ok(answer),
    };
    let signal = wire::signal(&request.signal)?;
    deliver(&process, ExecInput::Signal(signal)).await?;
    Ok(rpc::ok(json!({})))
}

/// `process.Process/Update`: a PTY's new size.
pub async fn update(
    t: EnvdTarget,
    Extension(replica): Extension<Replica>,
    call: Call,
    body: Bytes,
) -> Result<Response, EnvdError> {
    let request: UpdateRequest = rpc::unary(&body)?;
    let selector = wire::selector(request.process)?;
    let process = match replica.reach(&call, &t.sid, &selector, body).await? {
        Reached::Here(process) => process,
        Reached::Answered(answer) => return Ok(answer),
    };
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
    Extension(replica): Extension<Replica>,
    call: Call,
    body: Bytes,
) -> Result<Response, EnvdError> {
    let request: Selected = rpc::unary(&body)?;
    let selector = wire::selector(request.process)?;
    let process = match replica.reach(&call, &t.sid, &selector, body).await? {
        Reached::Here(process) => process,
        Reached::Answered(answer) => return Ok(answer),
    };
    deliver(&process, ExecInput::CloseStdin).await?;
    Ok(rpc::ok(json!({})))
}

/// `process.Process/StreamInput`: a start message naming the process, then input messages,
/// each delivered as it arrives — by the replica holding the process, the whole stream
/// forwarded there when that is another.
pub async fn stream_input(
    t: EnvdTarget,
    Extension(replica): Extension<Replica>,
    call: Call,
    body: Body,
) -> Result<Response, EnvdError> {
    let mut inbound = Inbound::new(body);
    let selector = loop {
        match inbound.next().await? {
            Some(StreamInput::Start { process }) => break wire::selector(process)?,
            Some(StreamInput::Keepalive {}) => {}
            Some(StreamInput::Data { .. }) => return Err(input_before_start()),
            None => return Ok(input_ended()),
        }
    };
    if let Owner::Peer(url) = replica.owner(&call, &selector).await? {
        return replica.forward(&url, &call, &t.sid, inbound.replay()).await;
    }
    inbound.read = None;
    let mut process = replica.table.find(&t.sid, &selector)?;
    while let Some(message) = inbound.next().await? {
        match message {
            StreamInput::Start { process: selected } => {
                process = replica.table.find(&t.sid, &wire::selector(selected)?)?;
            }
            StreamInput::Data { input } => stdin(&process, wire::input_bytes(input)?).await?,
            StreamInput::Keepalive {} => {}
        }
    }
    Ok(input_ended())
}

fn input_before_start() -> EnvdError {
    EnvdError::new(Code::InvalidArgument, "input before the start message")
}

/// The answer once the input stream has ended.
fn input_ended() -> Response {
    let frames = [envelope(&json!({})), end_of_stream(&json!({}))];
    rpc::streaming(futures::stream::iter(frames))
}

/// A client stream's messages as they arrive, and the bytes read so far while they may
/// still be forwarded.
struct Inbound {
    body: BodyDataStream,
    decoder: Decoder,
    read: Option<Vec<Bytes>>,
}

impl Inbound {
    fn new(body: Body) -> Inbound {
        Inbound {
            body: body.into_data_stream(),
            decoder: Decoder::default(),
            read: Some(Vec::new()),
        }
    }

    /// The next message; `None` once the stream has ended.
    async fn next(&mut self) -> Result<Option<StreamInput>, EnvdError> {
        loop {
            let frame = self
                .decoder
                .next_frame()
                .map_err(|e| EnvdError::new(Code::InvalidArgument, e))?;
            match frame {
                Some(Frame::Message(message)) => return rpc::parse(message).map(Some),
                Some(_) => continue,
                None => {}
            }
            let Some(chunk) = self.body.next().await else {
                return Ok(None);
            };
            let chunk = chunk.map_err(|e| {
                EnvdError::new(Code::Unavailable, format!("reading the input stream: {e}"))
            })?;
            if let Some(read) = &mut self.read {
                read.push(chunk.clone());
            }
            self.decoder.push(&chunk);
        }
    }

    /// The whole stream again — what was read, then what is still to come — as a body to
    /// forward.
    fn replay(self) -> reqwest::Body {
        let read = self.read.unwrap_or_default().into_iter().map(Ok);
        reqwest::Body::wrap_stream(futures::stream::iter(read).chain(self.body))
    }
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
