//! `exec` and `attach`: one process's streams over the exec channel protocol
//! ([`crate::access::channel`]). Stdin goes out on channel 0 (and, on `v5`, its end as a close
//! frame), terminal sizes on channel 4; stdout and stderr come back on 1 and 2 and go to our
//! own stdout and stderr; the final status on channel 3 carries the exit code, which becomes
//! the plugin's.

use futures::stream::BoxStream;
use futures::{Sink, SinkExt, Stream, StreamExt};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

use super::api::Subresource;
use super::cli::{AttachArgs, ExecArgs};
use super::connect::{At, Socket, Target, upgrade};
use super::errors::PluginError;
use super::terminal;
use crate::access::channel::{self, CLOSE, ERROR, Outcome, RESIZE, STDERR, STDIN, STDOUT, Version};
use crate::provider::stream::TermSize;

/// How much stdin one frame carries at most.
const STDIN_CHUNK: usize = 32 * 1024;

/// The local ends of a session.
pub struct Streams {
    /// Where the process's stdin comes from (`None`: it gets none).
    pub stdin: Option<Box<dyn AsyncRead + Send + Unpin>>,
    /// Where its stdout (and, with a TTY, its whole terminal output) goes.
    pub stdout: Box<dyn AsyncWrite + Send + Unpin>,
    /// Where its stderr goes.
    pub stderr: Box<dyn AsyncWrite + Send + Unpin>,
    /// Terminal sizes to send, the first being the initial size (`None`: no TTY).
    pub resizes: Option<BoxStream<'static, TermSize>>,
}

/// Runs one session over an upgraded `socket` speaking `version`; returns the process's exit
/// code (0 when the server closed without a status, as kubectl reads it).
pub async fn session<S>(socket: S, version: Version, streams: Streams) -> Result<i32, PluginError>
where
    S: Stream<Item = Result<Message, WsError>> + Sink<Message, Error = WsError> + Send + 'static,
{
    let (sink, mut incoming) = socket.split();
    let (tx, rx) = mpsc::channel::<Vec<u8>>(16);
    let writer = tokio::spawn(forward_frames(rx, sink));
    let Streams {
        stdin,
        mut stdout,
        mut stderr,
        resizes,
    } = streams;
    let mut pumps = Vec::new();
    if let Some(stdin) = stdin {
        pumps.push(tokio::spawn(pump_stdin(stdin, tx.clone(), version)));
    }
    if let Some(resizes) = resizes {
        pumps.push(tokio::spawn(pump_resizes(resizes, tx.clone())));
    }
    drop(tx);
    let mut outcome = None;
    while let Some(message) = incoming.next().await {
        let data = match message {
            Ok(Message::Binary(data)) => data,
            Ok(Message::Close(_)) => break,
            Ok(_) => continue,
            // The status came: however the connection ends now, the process has ended.
            Err(_) if outcome.is_some() => break,
            Err(e) => return Err(PluginError::Transport(format!("the session broke: {e}"))),
        };
        match channel::split(&data) {
            Some((STDOUT, bytes)) => write_flush(&mut stdout, bytes, "stdout").await?,
            Some((STDERR, bytes)) => write_flush(&mut stderr, bytes, "stderr").await?,
            Some((ERROR, bytes)) => outcome = Some(channel::parse_status(bytes)),
            _ => {}
        }
    }
    pumps.iter().for_each(|p| p.abort());
    writer.abort();
    exit_code(outcome)
}

/// The plugin's exit code for the session's final status.
fn exit_code(outcome: Option<Outcome>) -> Result<i32, PluginError> {
    match outcome {
        None => Ok(0),
        Some(Outcome::Exited(code)) => Ok(i32::try_from(code)
            .ok()
            .filter(|c| (0..=255).contains(c))
            .unwrap_or(1)),
        Some(Outcome::Failed(message)) => Err(PluginError::Remote(message)),
    }
}

async fn write_flush(
    out: &mut (dyn AsyncWrite + Send + Unpin),
    bytes: &[u8],
    what: &str,
) -> Result<(), PluginError> {
    out.write_all(bytes)
        .await
        .and(out.flush().await)
        .map_err(|e| PluginError::local(format!("writing the process's {what}"), e))
}

/// Sends each queued frame as one binary message, in order.
async fn forward_frames<K>(mut rx: mpsc::Receiver<Vec<u8>>, mut sink: K)
where
    K: Sink<Message, Error = WsError> + Unpin,
{
    while let Some(frame) = rx.recv().await {
        if sink.send(Message::Binary(frame.into())).await.is_err() {
            return;
        }
    }
}

/// Stdin to channel 0; at its end, on `v5`, the close frame for channel 0 (on `v4` the
/// process's stdin stays open: that protocol cannot say otherwise).
async fn pump_stdin(
    mut stdin: Box<dyn AsyncRead + Send + Unpin>,
    tx: mpsc::Sender<Vec<u8>>,
    version: Version,
) {
    let mut buf = vec![0u8; STDIN_CHUNK];
    loop {
        match stdin.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if tx.send(channel::frame(STDIN, &buf[..n])).await.is_err() {
                    return;
                }
            }
        }
    }
    if version == Version::V5 {
        let _ = tx.send(channel::frame(CLOSE, &[STDIN])).await;
    }
}

/// Each terminal size to channel 4, as the resize JSON.
async fn pump_resizes(mut resizes: BoxStream<'static, TermSize>, tx: mpsc::Sender<Vec<u8>>) {
    while let Some(size) = resizes.next().await {
        let Ok(json) = serde_json::to_vec(&channel::Resize::from(size)) else {
            continue;
        };
        if tx.send(channel::frame(RESIZE, &json)).await.is_err() {
            return;
        }
    }
}

/// The query of an exec or attach request (kubectl's parameters; with a TTY, stderr is the
/// terminal's, so none is asked for).
pub fn query(command: &[String], stdin: bool, tty: bool) -> Vec<(&'static str, String)> {
    let mut q: Vec<(&str, String)> = command.iter().map(|c| ("command", c.clone())).collect();
    q.push(("stdin", stdin.to_string()));
    q.push(("stdout", "true".to_string()));
    q.push(("stderr", (!tty).to_string()));
    q.push(("tty", tty.to_string()));
    q
}

/// `exec`: runs the command and returns its exit code.
pub async fn exec(target: &Target, args: &ExecArgs) -> Result<i32, PluginError> {
    let at = At {
        ns: &target.namespace,
        name: &args.name,
        sub: Subresource::Exec,
    };
    interactive(target, at, &args.command, args.stdin, args.tty).await
}

/// `attach`: joins the main process and returns its exit code when it ends.
pub async fn attach(target: &Target, args: &AttachArgs) -> Result<i32, PluginError> {
    let at = At {
        ns: &target.namespace,
        name: &args.name,
        sub: Subresource::Attach,
    };
    interactive(target, at, &[], args.stdin, args.tty).await
}

/// Opens an exec (or attach) WebSocket for `command`; returns it with the protocol version
/// the server chose.
pub async fn open(
    target: &Target,
    at: At<'_>,
    command: &[String],
    stdin: bool,
    tty: bool,
) -> Result<(Socket, Version), PluginError> {
    let url = at.url(&query(command, stdin, tty));
    let (socket, protocol) = upgrade(target, at, url, &channel::EXEC_PROTOCOLS).await?;
    let version = Version::negotiate([protocol.as_str()]).unwrap_or(Version::V4);
    Ok((socket, version))
}

/// Connects, puts the terminal in raw mode for a TTY with stdin, and runs the session.
async fn interactive(
    target: &Target,
    at: At<'_>,
    command: &[String],
    stdin: bool,
    mut tty: bool,
) -> Result<i32, PluginError> {
    if tty && stdin && !terminal::stdin_is_terminal() {
        eprintln!("Unable to use a TTY - input is not a terminal or the right kind of file");
        tty = false;
    }
    let (socket, version) = open(target, at, command, stdin, tty).await?;
    let resizes = if tty {
        Some(terminal::resizes().map_err(|e| PluginError::local("watching SIGWINCH", e))?)
    } else {
        None
    };
    let raw = if tty && stdin {
        Some(terminal::RawMode::enter().map_err(|e| PluginError::local("raw terminal", e))?)
    } else {
        None
    };
    let streams = Streams {
        stdin: stdin.then(|| Box::new(tokio::io::stdin()) as Box<dyn AsyncRead + Send + Unpin>),
        stdout: Box::new(tokio::io::stdout()),
        stderr: Box::new(tokio::io::stderr()),
        resizes,
    };
    let result = session(socket, version, streams).await;
    drop(raw);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tty_asks_for_no_separate_stderr() {
        let q = query(&["ls".into(), "-l".into()], true, true);
        let s: Vec<String> = q.iter().map(|(k, v)| format!("{k}={v}")).collect();
        assert_eq!(
            s,
            [
                "command=ls",
                "command=-l",
                "stdin=true",
                "stdout=true",
                "stderr=false",
                "tty=true"
            ]
        );
        let q = query(&["true".into()], false, false);
        assert!(q.contains(&("stderr", "true".to_string())));
        assert!(q.contains(&("stdin", "false".to_string())));
    }

    #[test]
    fn exit_codes_pass_through_and_failures_are_errors() {
        assert_eq!(exit_code(None).unwrap(), 0);
        assert_eq!(exit_code(Some(Outcome::Exited(42))).unwrap(), 42);
        assert_eq!(exit_code(Some(Outcome::Exited(300))).unwrap(), 1);
        assert!(exit_code(Some(Outcome::Failed("no such file".into()))).is_err());
    }
}
