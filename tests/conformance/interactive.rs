//! The access layer's capabilities: streaming exec (stdin and its end, exit code, separate
//! streams, a TTY with resize, signals, a large stream, a slow reader), the main process's
//! log with follow, and TCP port-forward. Each check first asserts the capability is offered
//! exactly as the factory declares; a declared-absent capability passes once it is `None`.

use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use sandbox_operator::provider::stream::{
    ExecInput, ExecSession, LogRequest, Logs, PortForward, Signal, StreamExecRequest,
    StreamingExec, TermSize,
};
use sandbox_operator::provider::{ErrorKind, ProviderResult, SandboxState};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::{Instant, timeout};

use super::Fixture;
use super::support::{
    Check, OrFail, create, expect_kind, random_bytes, running, running_from, sh, sha256_hex,
    unique_hex, wait_until,
};

/// Bound on one session's whole run: a guard rail, never what a check waits for.
const SESSION_BOUND: Duration = Duration::from_secs(180);

/// The capability `got` if the factory declares it, `None` if it declares it absent and it
/// is; an error when the two disagree.
fn declared<'a, T: ?Sized>(
    name: &str,
    got: Option<&'a T>,
    want: bool,
) -> Result<Option<&'a T>, String> {
    match (got.is_some(), want) {
        (true, true) | (false, false) => Ok(got),
        (true, false) => Err(format!(
            "{name}() is Some but the factory declares it absent"
        )),
        (false, true) => Err(format!(
            "{name}() is None but the factory declares it offered"
        )),
    }
}

fn exec_of(fx: &Fixture) -> Result<Option<&dyn StreamingExec>, String> {
    declared(
        "streaming_exec",
        fx.provider.streaming_exec(),
        fx.expect.streaming_exec,
    )
}

fn logs_of(fx: &Fixture) -> Result<Option<&dyn Logs>, String> {
    declared("logs", fx.provider.logs(), fx.expect.logs)
}

fn forward_of(fx: &Fixture) -> Result<Option<&dyn PortForward>, String> {
    declared(
        "port_forward",
        fx.provider.port_forward(),
        fx.expect.port_forward,
    )
}

/// A request for `argv` with stdin and without a TTY.
fn request(argv: &[&str]) -> StreamExecRequest {
    StreamExecRequest {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        env: Default::default(),
        cwd: None,
        stdin: true,
        tty: None,
    }
}

async fn start(
    exec: &dyn StreamingExec,
    id: &str,
    request: &StreamExecRequest,
) -> Result<ExecSession, String> {
    exec.exec_stream(id, request)
        .await
        .or_fail(&format!("exec_stream {:?}", request.argv))
}

async fn send(session: &ExecSession, input: ExecInput) -> Check {
    session
        .input
        .send(input)
        .await
        .map_err(|_| "the session's input queue is closed".to_string())
}

/// Reads `stream` to its end.
async fn drain(mut stream: BoxStream<'static, ProviderResult<Bytes>>) -> Result<Vec<u8>, String> {
    let mut all = Vec::new();
    while let Some(chunk) = stream.next().await {
        all.extend_from_slice(&chunk.or_fail("reading an output stream")?);
    }
    Ok(all)
}

/// Reads both streams to their ends, concurrently, then the exit code; all bounded.
async fn outcome(session: ExecSession) -> Result<(Vec<u8>, Vec<u8>, i64), String> {
    let ExecSession {
        input,
        stdout,
        stderr,
        exit,
    } = session;
    let stderr = async move {
        match stderr {
            Some(stream) => drain(stream).await,
            None => Ok(Vec::new()),
        }
    };
    let run = async {
        let (out, err) = tokio::join!(drain(stdout), stderr);
        let code = exit.await.or_fail("the exit status")?.code;
        Ok::<_, String>((out?, err?, code))
    };
    let result = timeout(SESSION_BOUND, run)
        .await
        .map_err(|_| format!("the session did not end within {SESSION_BOUND:?}"))?;
    drop(input);
    result
}

/// Reads `stream` into `seen` until `seen` contains `needle`; fails at the stream's end or
/// after [`SESSION_BOUND`].
async fn read_until(
    stream: &mut BoxStream<'static, ProviderResult<Bytes>>,
    seen: &mut Vec<u8>,
    needle: &str,
) -> Check {
    let deadline = Instant::now() + SESSION_BOUND;
    while !String::from_utf8_lossy(seen).contains(needle) {
        let next = tokio::time::timeout_at(deadline, stream.next()).await;
        match next {
            Ok(Some(chunk)) => seen.extend_from_slice(&chunk.or_fail("reading output")?),
            Ok(None) => {
                return Err(format!(
                    "the stream ended before {needle:?}: {:?}",
                    lossy(seen)
                ));
            }
            Err(_) => {
                return Err(format!(
                    "no {needle:?} within {SESSION_BOUND:?}: {:?}",
                    lossy(seen)
                ));
            }
        }
    }
    Ok(())
}

fn lossy(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let start = text.len().saturating_sub(400);
    text.get(start..).unwrap_or(&text).to_string()
}

/// Stdin crosses in order and its end reaches the process: `cat` echoes it and exits 0.
pub async fn stream_exec_delivers_stdin_and_its_end(fx: &Fixture) -> Check {
    let Some(exec) = exec_of(fx)? else {
        return Ok(());
    };
    let id = running(fx).await?;
    let session = start(exec, &id, &request(&["cat"])).await?;
    send(&session, ExecInput::Stdin(Bytes::from_static(b"hello\n"))).await?;
    send(&session, ExecInput::Stdin(Bytes::from_static(b"world"))).await?;
    send(&session, ExecInput::CloseStdin).await?;
    let (out, err, code) = outcome(session).await?;
    ensure!(
        out == b"hello\nworld",
        "cat echoed {:?} (stderr {:?})",
        lossy(&out),
        lossy(&err)
    );
    ensure!(code == 0, "cat exited {code} after the end of its input");
    Ok(())
}

/// The exit code is the process's own, zero or not, with or without stdin.
pub async fn stream_exec_passes_the_exit_code_through(fx: &Fixture) -> Check {
    let Some(exec) = exec_of(fx)? else {
        return Ok(());
    };
    let id = running(fx).await?;
    for (script, stdin, want) in [
        ("exit 7", false, 7),
        ("exit 0", true, 0),
        ("exit 3", true, 3),
    ] {
        let mut req = request(&["sh", "-c", script]);
        req.stdin = stdin;
        let (_, _, code) = outcome(start(exec, &id, &req).await?).await?;
        ensure!(
            code == want,
            "{script:?} (stdin {stdin}) reported exit code {code}"
        );
    }
    let (_, _, code) =
        outcome(start(exec, &id, &request(&["no-such-program-here"])).await?).await?;
    ensure!(
        code == 127,
        "a program that does not exist reported {code}, not 127"
    );
    Ok(())
}

/// Without a TTY, stdout and stderr are separate streams; env and cwd apply.
pub async fn stream_exec_keeps_stdout_and_stderr_apart(fx: &Fixture) -> Check {
    let Some(exec) = exec_of(fx)? else {
        return Ok(());
    };
    let id = running(fx).await?;
    let mut req = request(&["sh", "-c", r#"echo "out $A $(pwd)"; echo "err $A" >&2"#]);
    req.env.insert("A".into(), "x y".into());
    req.cwd = Some("/tmp".into());
    req.stdin = false;
    let session = start(exec, &id, &req).await?;
    ensure!(session.stderr.is_some(), "no stderr stream without a TTY");
    let (out, err, code) = outcome(session).await?;
    ensure!(out == b"out x y /tmp\n", "stdout was {:?}", lossy(&out));
    ensure!(err == b"err x y\n", "stderr was {:?}", lossy(&err));
    ensure!(code == 0, "exited {code}");
    Ok(())
}

/// A TTY starts at the requested size, and a resize reaches the process (`stty size`).
pub async fn stream_exec_tty_has_its_size_and_resizes(fx: &Fixture) -> Check {
    let Some(exec) = exec_of(fx)? else {
        return Ok(());
    };
    let id = running(fx).await?;
    let mut req = request(&[
        "sh",
        "-c",
        r#"stty size; while read l && [ "$l" != q ]; do stty size; done"#,
    ]);
    req.tty = Some(TermSize { cols: 80, rows: 24 });
    let mut session = start(exec, &id, &req).await?;
    ensure!(
        session.stderr.is_none(),
        "a TTY session has a separate stderr stream"
    );
    let mut seen = Vec::new();
    read_until(&mut session.stdout, &mut seen, "24 80").await?;
    send(
        &session,
        ExecInput::Resize(TermSize {
            cols: 132,
            rows: 50,
        }),
    )
    .await?;
    // Each line makes the process print its size again; the resize may land after a line.
    let deadline = Instant::now() + SESSION_BOUND;
    while !String::from_utf8_lossy(&seen).contains("50 132") {
        ensure!(
            Instant::now() < deadline,
            "the resize never showed: {:?}",
            lossy(&seen)
        );
        send(&session, ExecInput::Stdin(Bytes::from_static(b"x\n"))).await?;
        let mut line = Vec::new();
        read_until(&mut session.stdout, &mut line, "\n").await?;
        read_until(&mut session.stdout, &mut line, " ").await?;
        read_until(&mut session.stdout, &mut line, "\n").await?;
        seen.extend_from_slice(&line);
    }
    send(&session, ExecInput::Stdin(Bytes::from_static(b"q\n"))).await?;
    let (_, _, code) = outcome(session).await?;
    ensure!(code == 0, "the TTY session exited {code}");
    Ok(())
}

/// A signal reaches the process: `sleep 600` ended by SIGTERM reports 128 + 15.
pub async fn stream_exec_delivers_signals(fx: &Fixture) -> Check {
    let Some(exec) = exec_of(fx)? else {
        return Ok(());
    };
    let id = running(fx).await?;
    let mut req = request(&["sleep", "600"]);
    req.stdin = false;
    let session = start(exec, &id, &req).await?;
    send(&session, ExecInput::Signal(Signal::Terminate)).await?;
    let (_, err, code) = outcome(session).await?;
    ensure!(
        code == 143,
        "sleep ended by SIGTERM reported {code} (stderr {:?})",
        lossy(&err)
    );
    Ok(())
}

/// 32 MiB cross stdout unchanged (count and checksum), and 8 MiB cross stdin unchanged.
pub async fn stream_exec_carries_a_large_stream(fx: &Fixture) -> Check {
    let Some(exec) = exec_of(fx)? else {
        return Ok(());
    };
    let id = running(fx).await?;
    let script =
        "head -c 33554432 /dev/urandom > /tmp/big && sha256sum /tmp/big >&2 && cat /tmp/big";
    let mut req = request(&["sh", "-c", script]);
    req.stdin = false;
    let (out, err, code) = outcome(start(exec, &id, &req).await?).await?;
    ensure!(code == 0, "the producer exited {code}: {:?}", lossy(&err));
    ensure!(
        out.len() == 32 << 20,
        "{} bytes arrived of {}",
        out.len(),
        32 << 20
    );
    let want = String::from_utf8_lossy(&err);
    ensure!(
        want.starts_with(&sha256_hex(&out)),
        "checksum {} against {want:?}",
        sha256_hex(&out)
    );
    let data = random_bytes(8 << 20, 0x5eed);
    let session = start(exec, &id, &request(&["sha256sum"])).await?;
    let feed = async {
        for piece in data.chunks(256 * 1024) {
            send(&session, ExecInput::Stdin(Bytes::copy_from_slice(piece))).await?;
        }
        send(&session, ExecInput::CloseStdin).await
    };
    timeout(SESSION_BOUND, feed)
        .await
        .map_err(|_| "stdin was not taken".to_string())??;
    let (out, _, code) = outcome(session).await?;
    ensure!(
        code == 0 && String::from_utf8_lossy(&out).starts_with(&sha256_hex(&data)),
        "sha256sum of 8 MiB of stdin said {:?} (exit {code})",
        lossy(&out)
    );
    Ok(())
}

/// A fast producer read slowly: it is held back while nobody reads (nothing buffers its
/// 97 MB), and everything arrives, in order. The size is well above what the hops between
/// the process and the reader can hold: a TCP receive buffer alone may grow to 32 MB here
/// (`net.ipv4.tcp_rmem`), and with 31 MB the Kubernetes exec path once took it all.
pub async fn stream_exec_holds_a_fast_producer_for_a_slow_reader(fx: &Fixture) -> Check {
    const LINES: u32 = 12_000_000;
    let Some(exec) = exec_of(fx)? else {
        return Ok(());
    };
    let id = running(fx).await?;
    let done = format!("/tmp/done-{}", unique_hex());
    let mut req = request(&["sh", "-c", &format!("seq 1 {LINES} && touch {done}")]);
    req.stdin = false;
    let mut session = start(exec, &id, &req).await?;
    let mut seen = Vec::new();
    read_until(&mut session.stdout, &mut seen, "\n").await?;
    // Not a synchronisation: time in which an unbounded buffer would have taken it all.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let probe = format!("if [ -e {done} ]; then echo finished; else echo blocked; fi");
    let state = sh(fx, &id, &probe).await?;
    ensure!(
        state.trim() == "blocked",
        "the producer ran to its end while nobody read its output ({}): its 97 MB were \
         buffered somewhere instead of holding it back",
        state.trim()
    );
    while let Some(chunk) = timeout(SESSION_BOUND, session.stdout.next())
        .await
        .map_err(|_| "stalled")?
    {
        seen.extend_from_slice(&chunk.or_fail("reading slowly")?);
        // Slowly through the first 32 MB (as much as the whole output was before), then as
        // fast as it comes: the check's time stays what it was.
        if seen.len() < 32 << 20 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    let want: String = (1..=LINES).map(|n| format!("{n}\n")).collect();
    session.stdout = futures::stream::empty().boxed();
    let ended = outcome(session).await;
    // A short output says where it lost bytes and how the session ended, so that a loss
    // can be placed (the tail cut at the exit, or bytes gone on the way).
    ensure!(
        seen.len() == want.len(),
        "{} bytes arrived of {} ({}); the session ended {}",
        seen.len(),
        want.len(),
        if want.as_bytes().starts_with(&seen) {
            "a prefix: the tail is missing"
        } else {
            "not a prefix: bytes went missing before the end"
        },
        match &ended {
            Ok((_, _, code)) => format!("with exit status {code}"),
            Err(e) => format!("without an exit status: {e}"),
        }
    );
    ensure!(
        sha256_hex(&seen) == sha256_hex(want.as_bytes()),
        "the sequence arrived changed"
    );
    let (_, _, code) = ended?;
    ensure!(code == 0, "the producer exited {code}");
    Ok(())
}

/// An output's tail outlives its program: the program (without stdin) writes 1 MiB while
/// nobody reads and ends; the caller reads it only 12 s later (`kubectl exec`, whose pings go
/// every 5 s, lost all but ~150 KB of such an output). A provider that holds the program
/// back until the reader reads (it has not ended after 5 s) has nothing to keep; the check
/// above covers it.
pub async fn stream_exec_keeps_the_tail_after_the_program_ended(fx: &Fixture) -> Check {
    const SIZE: usize = 1 << 20;
    let Some(exec) = exec_of(fx)? else {
        return Ok(());
    };
    let id = running(fx).await?;
    let done = format!("/tmp/done-{}", unique_hex());
    let script = format!("head -c {SIZE} /dev/zero | tr '\\0' x && touch {done}");
    let mut req = request(&["sh", "-c", &script]);
    req.stdin = false;
    let session = start(exec, &id, &req).await?;
    let wait = format!(
        "i=0; while [ ! -e {done} ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done; \
         if [ -e {done} ]; then echo ended; else echo held; fi"
    );
    if sh(fx, &id, &wait).await?.trim() == "held" {
        return Ok(());
    }
    // Not a synchronisation: the time the output waits, unread, after its program ended.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let (out, err, code) = outcome(session).await?;
    ensure!(
        out.len() == SIZE && out.iter().all(|b| *b == b'x'),
        "{} bytes of {SIZE} arrived after the program ended (exit {code}, stderr {:?})",
        out.len(),
        lossy(&err)
    );
    ensure!(code == 0, "the program exited {code}");
    Ok(())
}

/// The main process's log: what it wrote so far, then, on a follow stream, a line it writes
/// later; `tail_lines` without follow gives only the last lines and ends.
pub async fn logs_follow_new_lines(fx: &Fixture) -> Check {
    let Some(logs) = logs_of(fx)? else {
        return Ok(());
    };
    ensure!(
        fx.expect.command,
        "the logs check needs a provider that sets the main process"
    );
    let token = unique_hex();
    let script = format!(
        "echo first-{token}; while [ ! -e /tmp/go ]; do sleep 0.1; done; echo later-{token}; \
         exec sleep 100000"
    );
    let mut request = fx.request();
    request.command = Some(vec!["sh".into(), "-c".into(), script]);
    let id = running_from(fx, &request).await?;
    let follow = LogRequest {
        follow: true,
        ..Default::default()
    };
    let mut stream = logs.logs(&id, &follow).await.or_fail("logs with follow")?;
    let mut seen = Vec::new();
    read_until(&mut stream, &mut seen, &format!("first-{token}\n")).await?;
    sh(fx, &id, "touch /tmp/go").await?;
    read_until(&mut stream, &mut seen, &format!("later-{token}\n")).await?;
    let last = LogRequest {
        tail_lines: Some(1),
        ..Default::default()
    };
    let tail = logs
        .logs(&id, &last)
        .await
        .or_fail("logs with tail_lines 1")?;
    let tail = timeout(SESSION_BOUND, drain(tail))
        .await
        .map_err(|_| "a log without follow did not end")??;
    ensure!(
        tail == format!("later-{token}\n").as_bytes(),
        "the last line was {:?}",
        lossy(&tail)
    );
    Ok(())
}

/// Port-forward reaches an HTTP server inside the sandbox, one connection per call.
pub async fn port_forward_reaches_an_http_server(fx: &Fixture) -> Check {
    let Some(forward) = forward_of(fx)? else {
        return Ok(());
    };
    let (id, token) = serving(fx).await?;
    for _ in 0..2 {
        let answer = answered(fx, forward, &id).await?;
        ensure!(
            answer.starts_with("HTTP/1.0 200") && answer.ends_with(&format!("hello-{token}\n")),
            "the server answered {answer:?}"
        );
    }
    Ok(())
}

/// A running sandbox serving HTTP on port 8080: (its id, the token the server answers).
async fn serving(fx: &Fixture) -> Result<(String, String), String> {
    let id = running(fx).await?;
    let token = unique_hex();
    sh(fx, &id, &http_server(&token)).await?;
    Ok((id, token))
}

/// The first answer of the sandbox's HTTP server through `forward`, once it listens.
async fn answered(fx: &Fixture, forward: &dyn PortForward, id: &str) -> Result<String, String> {
    wait_until("the sandbox's HTTP server to answer", fx.patience, || {
        http_get(forward, id)
    })
    .await
}

/// A port with nothing listening is a `Transient` error at connect, not a tunnel that ends
/// at once: the caller's error channel says so. The same sandbox's listening port connects,
/// so the refusal is about the port, not about forwarding as a whole.
pub async fn port_forward_to_a_closed_port_is_transient_at_connect(fx: &Fixture) -> Check {
    let Some(forward) = forward_of(fx)? else {
        return Ok(());
    };
    let (id, _) = serving(fx).await?;
    answered(fx, forward, &id).await?;
    expect_kind(
        forward.connect(&id, 8081).await.map(|_| ()),
        &[ErrorKind::Transient],
        "port-forward to port 8081, where nothing listens",
    )
}

/// A perl HTTP/1.0 server on port 8080 answering every request with `hello-<token>`.
fn http_server(token: &str) -> String {
    format!(
        "cat > /tmp/http.pl <<'PERL'
use IO::Socket::INET;
my $s = IO::Socket::INET->new(LocalPort => 8080, Listen => 5, ReuseAddr => 1) or die $!;
while (my $c = $s->accept) {{
  while (my $l = <$c>) {{ last if $l =~ /^\\r?$/ }}
  print $c \"HTTP/1.0 200 OK\\r\\nContent-Type: text/plain\\r\\n\\r\\nhello-{token}\\n\";
  close $c;
}}
PERL
nohup perl /tmp/http.pl > /dev/null 2>&1 &"
    )
}

async fn http_get(forward: &dyn PortForward, id: &str) -> Result<String, String> {
    let mut tunnel = forward
        .connect(id, 8080)
        .await
        .or_fail("connect to port 8080")?;
    let exchange = async {
        tunnel
            .write_all(b"GET / HTTP/1.0\r\nHost: sandbox\r\n\r\n")
            .await?;
        tunnel.flush().await?;
        let mut answer = Vec::new();
        tunnel.read_to_end(&mut answer).await?;
        Ok::<_, std::io::Error>(answer)
    };
    let answer = timeout(Duration::from_secs(10), exchange)
        .await
        .map_err(|_| "no answer within 10 s".to_string())?
        .map_err(|e| format!("the exchange failed: {e}"))?;
    ensure!(!answer.is_empty(), "connected, but nothing came back");
    Ok(String::from_utf8_lossy(&answer).into_owned())
}

/// An absent sandbox is `NotFound` for every capability; one that is not running is
/// `Conflict` for exec and port-forward (never started on the caller's behalf), and its log
/// is either what it wrote or `Conflict`.
pub async fn stream_capabilities_refuse_absent_and_idle_sandboxes(fx: &Fixture) -> Check {
    let absent = format!("sbx-absent-{}", unique_hex());
    let (exec, logs, forward) = (exec_of(fx)?, logs_of(fx)?, forward_of(fx)?);
    let idle = match exec.is_some() || logs.is_some() || forward.is_some() {
        true => not_running(fx).await?,
        false => String::new(),
    };
    let req = request(&["true"]);
    if let Some(exec) = exec {
        expect_kind(
            exec.exec_stream(&absent, &req).await.map(|_| ()),
            &[ErrorKind::NotFound],
            "exec_stream on an absent sandbox",
        )?;
        expect_kind(
            exec.exec_stream(&idle, &req).await.map(|_| ()),
            &[ErrorKind::Conflict],
            "exec_stream on a sandbox that is not running",
        )?;
    }
    if let Some(logs) = logs {
        let result = logs.logs(&absent, &LogRequest::default()).await.map(|_| ());
        expect_kind(result, &[ErrorKind::NotFound], "logs of an absent sandbox")?;
        // What it wrote before it stopped, or a refusal saying to start it.
        if let Err(e) = logs.logs(&idle, &LogRequest::default()).await {
            ensure!(
                e.is(ErrorKind::Conflict),
                "logs of a sandbox that is not running: {:?}: {e}",
                e.kind()
            );
        }
    }
    if let Some(forward) = forward {
        expect_kind(
            forward.connect(&absent, 80).await.map(|_| ()),
            &[ErrorKind::NotFound],
            "port-forward to an absent sandbox",
        )?;
        expect_kind(
            forward.connect(&idle, 80).await.map(|_| ()),
            &[ErrorKind::Conflict],
            "port-forward to a sandbox that is not running",
        )?;
    }
    Ok(())
}

/// A sandbox that exists and does not run: created, and stopped if the provider started it
/// as it created it.
async fn not_running(fx: &Fixture) -> Result<String, String> {
    let created = create(fx, &fx.request()).await?;
    if created.state == SandboxState::Running {
        fx.provider.stop(&created.id).await.or_fail("stop")?;
    }
    Ok(created.id)
}
