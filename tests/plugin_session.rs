//! The `kubectl sandbox` client (exec and port-forward) against a tiny in-process WebSocket
//! server that speaks the channel codec (`access::channel`): the request's URL and
//! subprotocols, stdout/stderr demultiplexing, the exit code, stdin and its end (the `v5`
//! close frame, none on `v4`), resize messages, refusals mapped to messages that name the
//! fix, and a port-forward relay with its port prefixes. No cluster: the client is kube's,
//! pointed at the server over plain HTTP.

// tungstenite's handshake callback returns its `ErrorResponse` by value (its signature, not ours).
#![allow(clippy::result_large_err)]

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use futures::{SinkExt, StreamExt};
use sandbox_operator::access::channel::{self, Resize, Version};
use sandbox_operator::plugin::api::Subresource;
use sandbox_operator::plugin::connect::{At, Target};
use sandbox_operator::plugin::errors::PluginError;
use sandbox_operator::plugin::exec::{Streams, open, session};
use sandbox_operator::plugin::forward::forward_one;
use sandbox_operator::provider::stream::TermSize;
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};

/// A writer whose bytes the test reads afterwards.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl AsyncWrite for Captured {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, b: &[u8]) -> Poll<io::Result<usize>> {
        self.0.lock().unwrap().extend_from_slice(b);
        Poll::Ready(Ok(b.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// What the server saw of the handshake.
#[derive(Debug, Default, Clone)]
struct Seen {
    uri: String,
    offered: String,
}

type Ws = WebSocketStream<TcpStream>;

/// Serves ONE WebSocket: picks the first of `speaks` that the client offered, records the
/// handshake, and hands the socket to `script`; or refuses every request with `refuse`
/// (kube's client retries a 503).
async fn serve_one<F, Fut>(
    speaks: &'static [&'static str],
    refuse: Option<(u16, String)>,
    script: F,
) -> (String, oneshot::Receiver<Seen>)
where
    F: FnOnce(Ws) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (seen_tx, seen_rx) = oneshot::channel();
    if let Some((code, body)) = refuse {
        tokio::spawn(refuse_all(listener, code, body));
        return (url, seen_rx);
    }
    tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let mut seen = Seen::default();
        let callback = |req: &Request, mut res: Response| -> Result<Response, ErrorResponse> {
            seen.uri = req.uri().to_string();
            seen.offered = req
                .headers()
                .get("sec-websocket-protocol")
                .map(|v| v.to_str().unwrap().to_string())
                .unwrap_or_default();
            let offered: Vec<&str> = seen.offered.split(',').map(str::trim).collect();
            let chosen = speaks.iter().find(|p| offered.contains(p)).unwrap();
            res.headers_mut()
                .insert("sec-websocket-protocol", chosen.parse().unwrap());
            Ok(res)
        };
        let ws = tokio_tungstenite::accept_hdr_async(tcp, callback).await;
        let _ = seen_tx.send(seen);
        if let Ok(ws) = ws {
            script(ws).await;
        }
    });
    (url, seen_rx)
}

/// Answers every upgrade request with `code` and `body`.
async fn refuse_all(listener: TcpListener, code: u16, body: String) {
    while let Ok((tcp, _)) = listener.accept().await {
        let body = body.clone();
        let callback = move |_: &Request, _: Response| -> Result<Response, ErrorResponse> {
            let mut e = ErrorResponse::new(Some(body));
            *e.status_mut() = http::StatusCode::from_u16(code).unwrap();
            Err(e)
        };
        let _ = tokio_tungstenite::accept_hdr_async(tcp, callback).await;
    }
}

fn target(url: &str) -> Target {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let config = kube::Config::new(url.parse().unwrap());
    Target::new(config, Some("team-a".into())).unwrap()
}

fn exec_at(target: &Target) -> At<'_> {
    At {
        ns: &target.namespace,
        name: "demo",
        sub: Subresource::Exec,
    }
}

async fn send(ws: &mut Ws, ch: u8, data: &[u8]) {
    ws.send(Message::Binary(channel::frame(ch, data).into()))
        .await
        .unwrap();
}

/// Runs `exec` with captured stdout/stderr; returns (exit code, stdout, stderr).
async fn run_exec(
    url: &str,
    command: &[&str],
    stdin: Option<&'static [u8]>,
    resizes: Option<Vec<TermSize>>,
) -> (Result<i32, PluginError>, Captured, Captured) {
    let t = target(url);
    let command: Vec<String> = command.iter().map(|s| s.to_string()).collect();
    let tty = resizes.is_some();
    let (out, err) = (Captured::default(), Captured::default());
    let opened = open(&t, exec_at(&t), &command, stdin.is_some(), tty).await;
    let code = match opened {
        Err(e) => Err(e),
        Ok((socket, version)) => {
            let streams = Streams {
                stdin: stdin.map(|b| Box::new(b) as _),
                stdout: Box::new(out.clone()),
                stderr: Box::new(err.clone()),
                resizes: resizes.map(|r| futures::stream::iter(r).boxed()),
            };
            session(socket, version, streams).await
        }
    };
    (code, out, err)
}

#[tokio::test]
async fn stdout_and_stderr_are_demultiplexed_and_the_exit_code_passes_through() {
    let (url, seen) = serve_one(&channel::EXEC_PROTOCOLS, None, |mut ws| async move {
        send(&mut ws, channel::STDOUT, b"to stdout\n").await;
        send(&mut ws, channel::STDERR, b"to stderr\n").await;
        send(&mut ws, channel::ERROR, channel::exit_status(7).as_bytes()).await;
        let _ = ws.close(None).await;
    })
    .await;
    let (code, out, err) = run_exec(&url, &["sh", "-c", "exit 7"], None, None).await;
    assert_eq!(code.unwrap(), 7);
    assert_eq!(out.text(), "to stdout\n");
    assert_eq!(err.text(), "to stderr\n");
    let seen = seen.await.unwrap();
    assert_eq!(
        seen.uri,
        "/apis/subresources.sandboxes.dev/v1alpha1/namespaces/team-a/sandboxes/demo/exec\
         ?command=sh&command=-c&command=exit+7&stdin=false&stdout=true&stderr=true&tty=false"
    );
    assert_eq!(seen.offered, "v5.channel.k8s.io, v4.channel.k8s.io");
}

/// Echoes stdin to stdout until stdin's close frame (v5), then exits 0; reports whether the
/// close frame came.
async fn echo_until_close(mut ws: Ws, closed: oneshot::Sender<bool>) {
    let mut got_close = false;
    while let Some(Ok(Message::Binary(data))) = ws.next().await {
        match channel::split(&data) {
            Some((channel::STDIN, bytes)) => {
                let bytes = bytes.to_vec();
                send(&mut ws, channel::STDOUT, &bytes).await;
            }
            Some((channel::CLOSE, [channel::STDIN])) => {
                got_close = true;
                break;
            }
            _ => {}
        }
    }
    send(&mut ws, channel::ERROR, channel::exit_status(0).as_bytes()).await;
    let _ = ws.close(None).await;
    let _ = closed.send(got_close);
}

#[tokio::test]
async fn stdin_is_forwarded_and_its_end_is_a_v5_close_frame() {
    let (tx, rx) = oneshot::channel();
    let (url, _) = serve_one(&channel::EXEC_PROTOCOLS, None, |ws| {
        echo_until_close(ws, tx)
    })
    .await;
    let (code, out, _) = run_exec(&url, &["cat"], Some(b"hello\nworld\n"), None).await;
    assert_eq!(code.unwrap(), 0);
    assert_eq!(out.text(), "hello\nworld\n");
    assert!(rx.await.unwrap(), "no close frame for stdin");
}

#[tokio::test]
async fn a_v4_server_gets_stdin_but_no_close_frame() {
    let (url, seen) = serve_one(&["v4.channel.k8s.io"], None, |mut ws| async move {
        let mut frames = Vec::new();
        // v4: the client cannot say stdin ended; the "process" ends after 6 bytes.
        let mut received = 0;
        while received < 6 {
            let Some(Ok(Message::Binary(data))) = ws.next().await else {
                break;
            };
            frames.push(data.to_vec());
            received += data.len() - 1;
        }
        assert!(frames.iter().all(|f| f[0] == channel::STDIN), "{frames:?}");
        send(&mut ws, channel::ERROR, channel::exit_status(3).as_bytes()).await;
        let _ = ws.close(None).await;
    })
    .await;
    let (code, _, _) = run_exec(&url, &["cat"], Some(b"hello\n"), None).await;
    assert_eq!(code.unwrap(), 3);
    assert!(seen.await.unwrap().offered.contains("v5.channel.k8s.io"));
}

#[tokio::test]
async fn terminal_sizes_go_out_as_resize_messages() {
    let (tx, rx) = oneshot::channel();
    let (url, seen) = serve_one(&channel::EXEC_PROTOCOLS, None, |mut ws| async move {
        let mut sizes = Vec::new();
        while sizes.len() < 2 {
            let Some(Ok(Message::Binary(data))) = ws.next().await else {
                break;
            };
            if let Some((channel::RESIZE, json)) = channel::split(&data) {
                sizes.push(serde_json::from_slice::<Resize>(json).unwrap());
            }
        }
        let _ = tx.send(sizes);
        send(&mut ws, channel::ERROR, channel::exit_status(0).as_bytes()).await;
        let _ = ws.close(None).await;
    })
    .await;
    let sizes = vec![
        TermSize { cols: 80, rows: 24 },
        TermSize {
            cols: 120,
            rows: 40,
        },
    ];
    let (code, _, _) = run_exec(&url, &["sh"], None, Some(sizes)).await;
    assert_eq!(code.unwrap(), 0);
    let got = rx.await.unwrap();
    assert_eq!(
        got,
        [
            Resize {
                width: 80,
                height: 24
            },
            Resize {
                width: 120,
                height: 40
            }
        ]
    );
    let uri = seen.await.unwrap().uri;
    assert!(uri.ends_with("stderr=false&tty=true"), "{uri}");
}

#[tokio::test]
async fn a_failure_status_is_an_error_not_an_exit_code() {
    let (url, _) = serve_one(&channel::EXEC_PROTOCOLS, None, |mut ws| async move {
        let status = channel::failure_status("executable file not found: nope");
        send(&mut ws, channel::ERROR, status.as_bytes()).await;
        let _ = ws.close(None).await;
    })
    .await;
    let (code, _, _) = run_exec(&url, &["nope"], None, None).await;
    let e = code.unwrap_err().to_string();
    assert!(e.contains("executable file not found"), "{e}");
}

fn status(code: u16, reason: &str, message: &str, name: Option<&str>) -> String {
    let mut v = serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
        "code": code, "reason": reason, "message": message});
    if let Some(n) = name {
        v["details"] =
            serde_json::json!({"name": n, "group": "sandboxes.dev", "kind": "sandboxes"});
    }
    v.to_string()
}

#[tokio::test]
async fn refusals_become_messages_that_name_the_fix() {
    let cases = [
        (
            404,
            status(
                404,
                "NotFound",
                "sandboxes \"demo\" not found",
                Some("demo"),
            ),
            "kubectl get sandboxes -n team-a",
        ),
        (
            403,
            status(403, "Forbidden", "denied", None),
            "you may not create sandboxes/exec in namespace team-a: ask for the edit role",
        ),
        (
            409,
            status(409, "Conflict", "the sandbox is Stopped", None),
            "Sandbox team-a/demo is not Ready (the sandbox is Stopped)",
        ),
        (
            501,
            status(501, "NotImplemented", "fly has no interactive exec", None),
            "cannot run an interactive process",
        ),
        (
            503,
            "service unavailable".to_string(),
            "kubectl get apiservice v1alpha1.subresources.sandboxes.dev",
        ),
    ];
    for (code, body, expected) in cases {
        let (url, _) = serve_one(&channel::EXEC_PROTOCOLS, Some((code, body)), |_| async {}).await;
        let (result, _, _) = run_exec(&url, &["true"], None, None).await;
        let e = result.unwrap_err().to_string();
        assert!(e.contains(expected), "{code}: {e}");
    }
}

#[tokio::test]
async fn port_forward_relays_one_connection_with_the_port_prefixes() {
    let (url, seen) = serve_one(&["v4.channel.k8s.io"], None, |mut ws| async move {
        let prefix = channel::port_prefix(8080);
        send(&mut ws, 0, &prefix).await;
        send(&mut ws, 1, &prefix).await;
        while let Some(Ok(Message::Binary(data))) = ws.next().await {
            let (ch, bytes) = channel::split(&data).unwrap();
            assert_eq!(ch, 0);
            send(&mut ws, 0, &bytes.to_ascii_uppercase()).await;
        }
    })
    .await;
    let t = target(&url);
    let (mut local, remote_end) = tokio::io::duplex(1024);
    let relay = tokio::spawn(async move { forward_one(&t, "demo", 8080, remote_end).await });
    local.write_all(b"ping").await.unwrap();
    let mut buf = [0u8; 4];
    local.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"PING");
    drop(local);
    relay.await.unwrap().unwrap();
    let seen = seen.await.unwrap();
    assert!(
        seen.uri.ends_with("/sandboxes/demo/portforward?ports=8080"),
        "{}",
        seen.uri
    );
    assert_eq!(seen.offered, "v4.channel.k8s.io");
    assert_eq!(
        Version::negotiate([seen.offered.as_str()]),
        Some(Version::V4)
    );
}

#[tokio::test]
async fn an_unreachable_api_server_is_named_with_the_os_cause() {
    let port = sandbox_doubles::ports::quiet_port();
    let (result, _, _) = run_exec(&format!("http://127.0.0.1:{port}"), &["true"], None, None).await;
    let e = result.unwrap_err().to_string();
    assert!(
        e.contains(&format!(
            "cannot reach the API server at http://127.0.0.1:{port}"
        )),
        "{e}"
    );
    assert!(e.contains("Connection refused"), "{e}");
    assert!(e.contains("--context"), "{e}");
}

/// A kubeconfig whose current context points at `url` with namespace `ns`.
fn kubeconfig_for(url: &str, ns: &str) -> tempfile::NamedTempFile {
    let file = tempfile::NamedTempFile::new().unwrap();
    let yaml = format!(
        "apiVersion: v1\nkind: Config\n\
         clusters: [{{name: fake, cluster: {{server: \"{url}\"}}}}]\n\
         users: [{{name: u, user: {{}}}}]\n\
         contexts: [{{name: c, context: {{cluster: fake, user: u, namespace: {ns}}}}}]\n\
         current-context: c\n"
    );
    std::fs::write(file.path(), yaml).unwrap();
    file
}

/// The built binary, with stdin left open, exits with the remote exit code as soon as the
/// process ends (its stdin reader must not hold it), in the context's namespace.
#[tokio::test(flavor = "multi_thread")]
async fn the_binary_exits_with_the_remote_code_while_its_stdin_is_still_open() {
    let (url, seen) = serve_one(&channel::EXEC_PROTOCOLS, None, |mut ws| async move {
        send(&mut ws, channel::STDOUT, b"done\n").await;
        send(&mut ws, channel::ERROR, channel::exit_status(4).as_bytes()).await;
        let _ = ws.close(None).await;
    })
    .await;
    let kubeconfig = kubeconfig_for(&url, "from-context");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_kubectl-sandbox"))
        .env("KUBECONFIG", kubeconfig.path())
        .args(["exec", "-i", "demo", "--", "cat"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let _open_stdin = child.stdin.take();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("kubectl-sandbox did not exit after the remote process ended");
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(status.code(), Some(4));
    let mut out = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut out).unwrap();
    assert_eq!(out, "done\n");
    let uri = seen.await.unwrap().uri;
    assert!(
        uri.contains("/namespaces/from-context/sandboxes/demo/exec?"),
        "{uri}"
    );
}
