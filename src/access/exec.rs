//! `exec`: a new process in the sandbox, bridged to the client's WebSocket in the Pod exec
//! channel protocol ([`super::channel`]). The process is started before the `101`, so a
//! failure to start is an HTTP error the client reads as a Status; once switched, its exit
//! code travels on the error channel.

use axum::body::Body;
use axum::http::{Request, Response};
use bytes::Bytes;
use futures::stream::{BoxStream, SelectAll};
use futures::{SinkExt, StreamExt};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;

use super::channel::{self, Resize, Version};
use super::lookup::Target;
use super::params::ExecParams;
use super::status::AccessError;
use super::upgrade::{self, Socket};
use crate::provider::ProviderResult;
use crate::provider::stream::{ExecInput, ExecSession, Signal};

/// Starts the process and answers the upgrade.
pub async fn serve(
    target: Target,
    mut request: Request<Body>,
) -> Result<Response<Body>, AccessError> {
    let params = ExecParams::from_query(request.uri().query())?;
    let handle = &target.handle;
    if !handle.can_exec_stream() {
        return Err(AccessError::NotImplemented(format!(
            "provider {} cannot exec interactively",
            handle.name()
        )));
    }
    let version = Version::negotiate(upgrade::offered(request.headers())).ok_or_else(|| {
        AccessError::BadRequest(format!(
            "exec speaks the WebSocket subprotocols {:?}",
            channel::EXEC_PROTOCOLS
        ))
    })?;
    // Checked before the process starts, so a plain request starts nothing.
    let accept = upgrade::check(request.headers(), version.protocol())?;
    let session = handle
        .exec_stream(&target.id, &params.request)
        .await
        .map_err(|e| AccessError::from_provider("exec", &e))?;
    let (response, on) = upgrade::switch(&mut request, &accept, version.protocol())?;
    // The session counts as traffic for as long as it lasts.
    let heartbeat = target.heartbeat;
    tokio::spawn(async move {
        let _heartbeat = heartbeat;
        let kill = session.input.clone();
        match upgrade::socket(on).await {
            Some(socket) => bridge(socket, session, version, &params).await,
            None => {
                let _ = kill.send(ExecInput::Signal(Signal::Kill)).await;
            }
        }
    });
    Ok(response)
}

/// Runs the session over the socket until the process has exited and said so.
async fn bridge(socket: Socket, session: ExecSession, version: Version, params: &ExecParams) {
    let (mut sink, stream) = socket.split();
    let ExecSession {
        input,
        stdout,
        stderr,
        exit,
    } = session;
    let kill = input.clone();
    let reader = tokio::spawn(pump_input(stream, input, version));
    let delivered = pump_output(&mut sink, output(stdout, stderr, params)).await;
    let status = match delivered {
        Err(Gone) => {
            // The client went away: nobody will read the rest, so the process ends too.
            let _ = kill.send(ExecInput::Signal(Signal::Kill)).await;
            reader.abort();
            return;
        }
        Ok(Some(failure)) => channel::failure_status(&failure),
        Ok(None) => match exit.await {
            Ok(status) => channel::exit_status(status.code),
            Err(e) => channel::failure_status(&e.to_string()),
        },
    };
    let frame = channel::frame(channel::ERROR, status.as_bytes());
    let _ = sink.send(Message::Binary(frame.into())).await;
    let _ = sink.close().await;
    upgrade::await_close(reader).await;
}

/// The client has gone away.
struct Gone;

type Output = BoxStream<'static, (u8, ProviderResult<Bytes>)>;

/// stdout and stderr as one stream of (channel, chunk), only the ones the client asked for.
fn output(
    stdout: BoxStream<'static, ProviderResult<Bytes>>,
    stderr: Option<BoxStream<'static, ProviderResult<Bytes>>>,
    params: &ExecParams,
) -> SelectAll<Output> {
    let mut all: SelectAll<Output> = SelectAll::new();
    let (want_out, want_err) = (params.stdout, params.stderr);
    all.push(
        stdout
            .filter(move |_| futures::future::ready(want_out))
            .map(|c| (channel::STDOUT, c))
            .boxed(),
    );
    if let Some(stderr) = stderr {
        all.push(
            stderr
                .filter(move |_| futures::future::ready(want_err))
                .map(|c| (channel::STDERR, c))
                .boxed(),
        );
    }
    all
}

/// Frames output until both streams end. `Ok(Some(message))` when a stream failed.
async fn pump_output<S>(sink: &mut S, mut output: SelectAll<Output>) -> Result<Option<String>, Gone>
where
    S: futures::Sink<Message> + Unpin,
{
    while let Some((ch, chunk)) = output.next().await {
        match chunk {
            Ok(bytes) if bytes.is_empty() => {}
            Ok(bytes) => {
                let frame = channel::frame(ch, &bytes);
                sink.send(Message::Binary(frame.into()))
                    .await
                    .map_err(|_| Gone)?;
            }
            Err(e) => return Ok(Some(e.to_string())),
        }
    }
    Ok(None)
}

/// The client's frames as process input: stdin, resize, and (v5) the stdin close, until the
/// client closes the socket (which closes stdin). Frames that come after the process ended
/// are read and dropped ([`upgrade::await_close`] says why).
async fn pump_input<S, E>(mut stream: S, input: mpsc::Sender<ExecInput>, version: Version)
where
    S: futures::Stream<Item = Result<Message, E>> + Unpin,
{
    while let Some(Ok(message)) = stream.next().await {
        let data = match message {
            Message::Binary(data) => data,
            Message::Close(_) => break,
            _ => continue,
        };
        let Some((ch, payload)) = channel::split(&data) else {
            continue;
        };
        let event = match ch {
            channel::STDIN => ExecInput::Stdin(data.slice(1..)),
            channel::RESIZE => match serde_json::from_slice::<Resize>(payload) {
                Ok(size) => ExecInput::Resize(size.into()),
                Err(_) => continue,
            },
            channel::CLOSE
                if version == Version::V5 && payload.first() == Some(&channel::STDIN) =>
            {
                ExecInput::CloseStdin
            }
            _ => continue,
        };
        let _ = input.send(event).await;
    }
    let _ = input.send(ExecInput::CloseStdin).await;
}
