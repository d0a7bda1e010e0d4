//! What the providers' interactive capabilities ([`super::stream`]) share: the one rule for
//! signalling an interactive process, reading a byte pipe as a bounded stream, and the
//! bounded queues between a session's tasks and its caller.
//!
//! # Signals
//!
//! Neither Docker's exec API nor the Pod `exec` subresource can signal the process they
//! started, and the pid the engine reports is a host pid, which an operator in a Pod cannot
//! reach. So the argv runs under a small `sh` wrapper that puts a random per-session token in
//! its environment (`SANDBOX_EXEC_TOKEN`) and then `exec`s the argv: the program keeps the
//! wrapper's pid and its environment. A signal is a second, ordinary exec in the same sandbox
//! that finds the session's process by that token in `/proc/*/environ` (the one whose parent
//! does not carry it, so a child the program started is not taken for it) and runs
//! `kill -s NAME` on it. Nothing is written into the sandbox, so nothing is left to remove
//! when the session ends — a clean-up exec after each session would run beside the next
//! one — and a pid reused by another process is never signalled: it lacks the token. The
//! wrapper also sets the initial terminal size with `stty` when a TTY is asked for: a resize
//! sent beside the start may reach the terminal after the program read its size (Docker's
//! API before 1.42 has no size at exec creation at all), while the wrapper's `stty` runs
//! before the program does.
//!
//! The sandbox's image needs `sh`, `cat`, `kill`, `sleep` and, for a TTY, `stty` (every
//! Debian-based image has them), and a `/proc` the sandbox's user can read its own
//! processes' environments in (every Linux container's).

use bytes::{Bytes, BytesMut};
use futures::FutureExt;
use futures::future::BoxFuture;
use futures::stream::{self, BoxStream, StreamExt};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::{mpsc, oneshot};

use super::stream::{ExecInput, ExecSession, ExitStatus, Signal, TermSize};
use super::{ExecOutput, ProviderError, ProviderResult};

/// Bytes read from a process's output at a time, and the size of a pipe buffer between the
/// provider's connection and the caller.
pub const CHUNK: usize = 64 * 1024;

/// Capacity of the input queue ([`super::stream::ExecSession::input`]) and of each output
/// queue, in messages: at most this many chunks wait for a slow side, so nothing is buffered
/// without limit.
pub const QUEUE: usize = 8;

/// A queue a provider's task fills with one output stream's chunks.
pub type Queue = mpsc::Sender<ProviderResult<Bytes>>;

/// The provider's ends of a session made by [`session`]: the output queues its tasks fill,
/// the caller's input as it arrives, and where the exit status goes.
pub struct Ends {
    /// The process's stdout (with a TTY: the terminal's output).
    pub stdout: Queue,
    /// Its stderr; `None` with a TTY, whose one stream carries both.
    pub stderr: Option<Queue>,
    /// What the caller sends: stdin bytes, resizes and signals.
    pub input: mpsc::Receiver<ExecInput>,
    /// The exit status, sent once the process has ended.
    pub exit: oneshot::Sender<ProviderResult<ExitStatus>>,
}

/// A new session of the exec in sandbox `id`: the caller's [`ExecSession`] and the provider's
/// [`Ends`] of the same bounded queues. One constructor so that every provider bounds its
/// queues alike (at most [`QUEUE`] messages wait for a slow side) and leaves stderr out with
/// a TTY in the same way; the provider's tasks only fill and drain them.
pub fn session(id: &str, tty: bool) -> (ExecSession, Ends) {
    let (stdout_tx, stdout_rx) = mpsc::channel(QUEUE);
    let (stderr_tx, stderr_rx) = match tty {
        true => (None, None),
        false => {
            let (tx, rx) = mpsc::channel(QUEUE);
            (Some(tx), Some(rx))
        }
    };
    let (input_tx, input_rx) = mpsc::channel(QUEUE);
    let (exit_tx, exit_rx) = oneshot::channel();
    let caller = ExecSession {
        input: input_tx,
        stdout: queue_stream(stdout_rx),
        stderr: stderr_rx.map(queue_stream),
        exit: exit_future(id, exit_rx),
    };
    let provider = Ends {
        stdout: stdout_tx,
        stderr: stderr_tx,
        input: input_rx,
        exit: exit_tx,
    };
    (caller, provider)
}

/// The wrapper: `$0` is the session's token, `$1` and `$2` the terminal's rows and columns
/// (empty without a TTY), the rest the program's argv.
const WRAPPER: &str = r#"export SANDBOX_EXEC_TOKEN="$0"
if [ -n "$1" ]; then stty rows "$1" cols "$2" 2>/dev/null; fi
shift 2
exec "$@""#;

/// The wrapper that marks the end of the output ([`wrap_marked`]): `$0` is the session's
/// token, `$1` the end mark, the rest the program's argv. The program runs in a subshell that
/// `exec`s it, with stdin from `/dev/null` (the caller asked for none), so it is found and
/// started as with [`WRAPPER`]; its exit code is the wrapper's. The word that both marks
/// arrived is a line on the exec's stdin ([`ACK_LINE`]; the connection ending is one too).
/// Nothing follows the marks: the wrapper's own streams go to `/dev/null` first.
const MARKED_WRAPPER: &str = r#"export SANDBOX_EXEC_TOKEN="$0"
m=$1
shift
(exec "$@") </dev/null
rc=$?
printf '%s' "$m"
printf '%s' "$m" >&2
exec >/dev/null 2>&1
read -r _
exit "$rc""#;

/// The signaller: looks (bounded, inside the sandbox: the program may not have started yet)
/// for the process whose environment carries the variable `$0` (`NAME=token`) and whose
/// parent's does not, and sends it the signal named `$1`. The environment's NUL separators
/// are dropped by the command substitution; the token's fixed length keeps the match exact.
const SIGNALLER: &str = r#"t="$0"
i=0
while [ "$i" -lt 50 ]; do
  for d in /proc/[0-9]*; do
    case "$(cat "$d/environ" 2>/dev/null)" in *"$t"*) ;; *) continue ;; esac
    pp=
    while read -r k v; do [ "$k" = PPid: ] && pp=$v; done <"$d/status"
    case "$(cat "/proc/$pp/environ" 2>/dev/null)" in *"$t"*) continue ;; esac
    kill -s "$1" "${d#/proc/}"
    exit
  done
  sleep 0.1
  i=$((i+1))
done
echo "no process of this session is running (or /proc/PID/environ is unreadable)" >&2
exit 1"#;

/// An argv wrapped for signals (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wrapped {
    /// What to run instead of the caller's argv.
    pub argv: Vec<String>,
    /// The session's token, in its process's environment as `SANDBOX_EXEC_TOKEN`.
    pub token: String,
    /// The mark written after the program's output on stdout and on stderr, when the
    /// wrapper marks the end ([`wrap_marked`]).
    pub end_mark: Option<String>,
}

fn token() -> String {
    format!("{:016x}", fastrand::u64(..))
}

/// Wraps `argv` so that it can be signalled, with the initial terminal size `tty`.
pub fn wrap(argv: &[String], tty: Option<TermSize>) -> Wrapped {
    let token = token();
    let (rows, cols) = match tty {
        Some(size) => (size.rows.to_string(), size.cols.to_string()),
        None => (String::new(), String::new()),
    };
    let mut wrapped = vec![
        "sh".to_string(),
        "-c".into(),
        WRAPPER.into(),
        token.clone(),
        rows,
        cols,
    ];
    wrapped.extend(argv.iter().cloned());
    Wrapped {
        argv: wrapped,
        token,
        end_mark: None,
    }
}

/// The line on the exec's stdin that tells a [`wrap_marked`] wrapper both marks arrived.
pub const ACK_LINE: &[u8] = b"\n";

/// Wraps `argv` (without a TTY or stdin) so that it can be signalled and so that the end of
/// its output is marked on stdout and stderr ([`super::end_mark`]): after the program exits
/// the wrapper writes the mark and waits for [`ACK_LINE`] on its stdin, and only then exits
/// with the program's code.
pub fn wrap_marked(argv: &[String]) -> Wrapped {
    let token = token();
    let end_mark = format!("\u{1e}sandbox-exec-end:{token}\u{1e}");
    let mut wrapped = vec![
        "sh".to_string(),
        "-c".into(),
        MARKED_WRAPPER.into(),
        token.clone(),
        end_mark.clone(),
    ];
    wrapped.extend(argv.iter().cloned());
    Wrapped {
        argv: wrapped,
        token,
        end_mark: Some(end_mark),
    }
}

/// The argv that delivers `signal` to the process of the session with `token`.
pub fn signal_argv(token: &str, signal: Signal) -> Vec<String> {
    vec![
        "sh".into(),
        "-c".into(),
        SIGNALLER.into(),
        format!("SANDBOX_EXEC_TOKEN={token}"),
        signal.name().into(),
    ]
}

/// An empty argv is `Invalid`, naming the sandbox.
pub fn check_argv(id: &str, argv: &[String]) -> ProviderResult<()> {
    if argv.is_empty() {
        return Err(ProviderError::invalid(format!(
            "exec in sandbox {id}: the command is empty; give at least the program to run"
        )));
    }
    Ok(())
}

/// Reads `reader` as a stream of chunks of at most [`CHUNK`] bytes, ending at its end of
/// file. Nothing is read ahead of the consumer: a slow consumer leaves the bytes in the pipe,
/// so the writer behind it waits. A read error ends the stream with `Transient` naming `what`.
pub fn read_stream<R>(reader: R, what: String) -> BoxStream<'static, ProviderResult<Bytes>>
where
    R: AsyncRead + Send + Unpin + 'static,
{
    stream::unfold(Some(reader), move |state| {
        let what = what.clone();
        async move {
            let mut reader = state?;
            let mut buffer = BytesMut::with_capacity(CHUNK);
            match reader.read_buf(&mut buffer).await {
                Ok(0) => None,
                Ok(_) => Some((Ok(buffer.freeze()), Some(reader))),
                Err(e) => Some((
                    Err(ProviderError::transient(format!(
                        "{what}: the stream broke ({e})"
                    ))),
                    None,
                )),
            }
        }
    })
    .fuse()
    .boxed()
}

/// The session's exit future: what the task that saw the process end sends, or `Transient`
/// when that task ended without a word.
pub fn exit_future(
    id: &str,
    exit: oneshot::Receiver<ProviderResult<ExitStatus>>,
) -> BoxFuture<'static, ProviderResult<ExitStatus>> {
    let id = id.to_string();
    exit.map(move |r| {
        r.unwrap_or_else(|_| {
            Err(ProviderError::transient(format!(
                "exec in sandbox {id}: the session ended without an exit status"
            )))
        })
    })
    .boxed()
}

/// The verdict on a helper exec (a signal, a clean-up): a non-zero exit is `Transient`,
/// carrying the helper's stderr (the signaller says why it could not signal).
pub fn helper_verdict(id: &str, argv: &[String], out: &ExecOutput) -> ProviderResult<()> {
    if out.exit_code != 0 {
        return Err(ProviderError::transient(format!(
            "exec in sandbox {id}: {:?} exited {}: {}",
            argv.last(),
            out.exit_code,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// The receiving end of a bounded queue as a stream (it ends when every sender is gone).
pub fn queue_stream<T: Send + 'static>(queue: mpsc::Receiver<T>) -> BoxStream<'static, T> {
    stream::unfold(queue, |mut queue| async move {
        let item = queue.recv().await?;
        Some((item, queue))
    })
    .fuse()
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wrapper_keeps_the_argv_whole_and_carries_a_fresh_token() {
        let argv = vec!["printf".to_string(), "%s\n".into(), "a b".into()];
        let a = wrap(&argv, None);
        let b = wrap(&argv, Some(TermSize { cols: 80, rows: 24 }));
        assert_ne!(a.token, b.token);
        assert_eq!(
            a.token.len(),
            16,
            "fixed length: the signaller's match is exact"
        );
        assert_eq!(a.argv[3], a.token);
        assert_eq!(&a.argv[4..6], ["", ""]);
        assert_eq!(&b.argv[4..6], ["24", "80"]);
        assert_eq!(&a.argv[6..], argv.as_slice());
        let kill = signal_argv(&a.token, Signal::Terminate);
        let variable = format!("SANDBOX_EXEC_TOKEN={}", a.token);
        assert_eq!(&kill[3..], [variable.as_str(), "TERM"]);
    }

    /// The wrapper and the signaller as a sandbox runs them (here with the host's `sh` and
    /// `/proc`): the signal reaches the session's program — not a child that inherited the
    /// token, and nothing of another session.
    #[test]
    fn the_signaller_finds_the_sessions_program_by_its_token() {
        use std::os::unix::process::ExitStatusExt;
        use std::process::Command;
        let spawn = |argv: &[String]| Command::new(&argv[0]).args(&argv[1..]).spawn();
        let program = ["sh", "-c", "sleep 30 & wait"].map(String::from);
        let ours = wrap(&program, None);
        let other = wrap(&["sleep".to_string(), "30".into()], None);
        let mut ours_child = spawn(&ours.argv).expect("spawn the session");
        let mut other_child = spawn(&other.argv).expect("spawn another session");
        let kill = signal_argv(&ours.token, Signal::Terminate);
        let sent = Command::new(&kill[0])
            .args(&kill[1..])
            .output()
            .expect("signaller");
        assert!(
            sent.status.success(),
            "{}",
            String::from_utf8_lossy(&sent.stderr)
        );
        let ended = ours_child.wait().expect("wait");
        assert_eq!(ended.signal(), Some(15), "SIGTERM: {ended:?}");
        assert!(other_child.try_wait().expect("try_wait").is_none());
        other_child.kill().ok();
        other_child.wait().ok();
    }

    /// The marking wrapper as a sandbox runs it: the program's output (its stdin empty),
    /// then the mark on each stream; the wrapper waits for the word on stdin and then exits
    /// with the program's code.
    #[test]
    fn the_marked_wrapper_marks_both_streams_and_waits_for_the_word() {
        use std::io::{Read, Write};
        use std::process::{Command, Stdio};
        let program = ["sh", "-c", "cat; echo out; echo err >&2; exit 3"].map(String::from);
        let wrapped = wrap_marked(&program);
        let mark = wrapped.end_mark.clone().expect("a mark");
        let mut child = Command::new(&wrapped.argv[0])
            .args(&wrapped.argv[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the session");
        let mut stdin = child.stdin.take().expect("stdin");
        let mut stdout = child.stdout.take().expect("stdout");
        let mut seen = Vec::new();
        let mut byte = [0u8; 1];
        while !String::from_utf8_lossy(&seen).ends_with(&mark) {
            assert_eq!(stdout.read(&mut byte).expect("read"), 1, "{seen:?}");
            seen.push(byte[0]);
        }
        assert_eq!(String::from_utf8_lossy(&seen), format!("out\n{mark}"));
        assert!(
            child.try_wait().expect("try_wait").is_none(),
            "it waits for the word"
        );
        stdin.write_all(ACK_LINE).expect("the word on stdin");
        let ended = child.wait_with_output().expect("wait");
        assert_eq!(ended.status.code(), Some(3));
        assert_eq!(
            String::from_utf8_lossy(&ended.stderr),
            format!("err\n{mark}")
        );
    }

    #[tokio::test]
    async fn a_session_joins_the_providers_ends_to_the_callers() {
        let (with_tty, _ends) = session("s", true);
        assert!(with_tty.stderr.is_none(), "a TTY has one output stream");
        let (caller, ends) = session("s", false);
        ends.stdout.send(Ok(Bytes::from_static(b"out"))).await.ok();
        let stderr = ends.stderr.expect("a stderr queue without a TTY");
        stderr.send(Ok(Bytes::from_static(b"err"))).await.ok();
        caller.input.send(ExecInput::CloseStdin).await.ok();
        let mut input = ends.input;
        assert!(matches!(input.recv().await, Some(ExecInput::CloseStdin)));
        drop((ends.stdout, stderr));
        let out: Vec<_> = caller.stdout.collect().await;
        assert_eq!(out.len(), 1);
        let err: Vec<_> = caller.stderr.expect("stderr without a TTY").collect().await;
        assert_eq!(err.len(), 1);
        ends.exit.send(Ok(ExitStatus { code: 7 })).ok();
        assert_eq!(caller.exit.await.map(|e| e.code).ok(), Some(7));
    }

    #[tokio::test]
    async fn a_pipe_reads_as_chunks_until_its_end() {
        let data = vec![7u8; 3 * CHUNK + 5];
        let chunks: Vec<_> = read_stream(std::io::Cursor::new(data.clone()), "t".into())
            .collect()
            .await;
        let joined: Vec<u8> = chunks
            .into_iter()
            .flat_map(|c| c.map(|b| b.to_vec()).unwrap_or_default())
            .collect();
        assert_eq!(joined, data);
    }
}
