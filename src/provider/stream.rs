//! Interactive access to a running sandbox: streaming exec, main-process logs and TCP
//! port-forward. Three optional capabilities of the seam (see [`super::Provider`]), used by the
//! access layer (the aggregated API) and the E2B-compatible API, never by the controllers.
//!
//! Each is `None` where the provider's API cannot do it (Fly's REST exec runs a command to
//! completion and returns its output: there is no stdin, no TTY and no signal, so Fly has no
//! [`StreamingExec`]). A caller that gets `None` says so to the user; it never falls back to
//! the buffered [`super::Provider::exec`] with a pretence of interactivity.

use std::collections::BTreeMap;
use std::pin::Pin;

use async_trait::async_trait;
use bytes::Bytes;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;

use super::ProviderResult;

/// A terminal's size in character cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TermSize {
    /// Columns.
    pub cols: u16,
    /// Rows.
    pub rows: u16,
}

/// A signal a caller may send to an interactive process. Named, not numbered: signal numbers
/// differ between platforms, and every provider API that takes one takes a name or maps one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// SIGINT.
    Interrupt,
    /// SIGTERM.
    Terminate,
    /// SIGKILL.
    Kill,
    /// SIGHUP.
    Hangup,
}

impl Signal {
    /// The name `kill -s` takes (`INT`, `TERM`, `KILL`, `HUP`).
    pub fn name(self) -> &'static str {
        match self {
            Signal::Interrupt => "INT",
            Signal::Terminate => "TERM",
            Signal::Kill => "KILL",
            Signal::Hangup => "HUP",
        }
    }
}

/// What to start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamExecRequest {
    /// argv; nothing re-parses it.
    pub argv: Vec<String>,
    /// Extra environment for this process only.
    pub env: BTreeMap<String, String>,
    /// Working directory; the sandbox's default when `None`.
    pub cwd: Option<String>,
    /// Whether the process gets a stdin. Without it, its stdin is at EOF from the start.
    pub stdin: bool,
    /// A TTY of this initial size. With a TTY, stdout and stderr are one stream (the
    /// terminal's), so [`ExecSession::stderr`] is `None`.
    pub tty: Option<TermSize>,
}

/// Input to a running process, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecInput {
    /// Bytes for its stdin.
    Stdin(Bytes),
    /// Closes its stdin (EOF); later `Stdin` input is dropped.
    CloseStdin,
    /// Resizes its TTY (ignored without one).
    Resize(TermSize),
    /// Sends it a signal.
    Signal(Signal),
}

/// How an interactive process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitStatus {
    /// Its exit code; a process killed by signal N reports 128 + N, as a shell does.
    pub code: i64,
}

/// A running interactive process.
///
/// The output streams end when the process's side closes; `exit` resolves once the process
/// has ended and its output has been delivered. Dropping the session (or `input`) does not
/// kill the process by itself on every provider: send [`Signal::Kill`] first when that matters.
pub struct ExecSession {
    /// Where the caller sends stdin bytes, resizes and signals. Bounded: a caller that
    /// outpaces the process waits, so stdin is never buffered without limit.
    pub input: mpsc::Sender<ExecInput>,
    /// Its stdout (with a TTY: the terminal's output). Backpressure reaches the process: a
    /// slow reader slows the writer rather than growing a buffer.
    pub stdout: BoxStream<'static, ProviderResult<Bytes>>,
    /// Its stderr; `None` with a TTY.
    pub stderr: Option<BoxStream<'static, ProviderResult<Bytes>>>,
    /// Its exit status.
    pub exit: BoxFuture<'static, ProviderResult<ExitStatus>>,
}

/// Interactive processes: stdin, TTY with resize, signals, separate streams, exit code.
#[async_trait]
pub trait StreamingExec: Send + Sync {
    /// Starts `request` in the running sandbox `id`. An absent sandbox is `NotFound`; one
    /// that is not running is `Conflict` (never started on the caller's behalf).
    async fn exec_stream(
        &self,
        id: &str,
        request: &StreamExecRequest,
    ) -> ProviderResult<ExecSession>;
}

/// Which part of the main process's output to read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogRequest {
    /// Keep the stream open and deliver new output as it is written.
    pub follow: bool,
    /// Only the last N lines of what is already there.
    pub tail_lines: Option<u64>,
    /// Only output written in the last N seconds.
    pub since_seconds: Option<u64>,
    /// Prefix each line with its RFC 3339 timestamp.
    pub timestamps: bool,
}

/// The main process's output (stdout and stderr interleaved, as a Pod's log is).
#[async_trait]
pub trait Logs: Send + Sync {
    /// The log of sandbox `id`. With `follow`, the stream ends when the sandbox stops.
    async fn logs(
        &self,
        id: &str,
        request: &LogRequest,
    ) -> ProviderResult<BoxStream<'static, ProviderResult<Bytes>>>;
}

/// A bidirectional byte stream to one TCP port inside a sandbox.
pub trait Tunnel: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Tunnel for T {}

/// One TCP connection to a port inside a sandbox.
pub type TunnelStream = Pin<Box<dyn Tunnel>>;

/// TCP port-forward.
#[async_trait]
pub trait PortForward: Send + Sync {
    /// Opens one connection to `port` inside the running sandbox `id`. Nothing listening
    /// there is `Transient` from this call, never a tunnel that ends at once (the caller's
    /// error channel says so); one connection per call, so every client connection gets
    /// its own.
    async fn connect(&self, id: &str, port: u16) -> ProviderResult<TunnelStream>;
}
