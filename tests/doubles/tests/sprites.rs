//! The Sprites double's exec WebSocket against its own contract: a TTY with its size and a
//! resize, stdin and its end, separate streams and the exit frame, `session_info`, and
//! signals both over the socket and through the kill endpoint. Real Docker underneath.
//! Run with `cargo test -p sandbox-doubles --test sprites`.

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use sandbox_doubles::sprites::{self, SpritesDouble, SpritesOptions};
use serde_json::Value;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// Bound on every read: a guard rail, never what a test waits for.
const BOUND: Duration = Duration::from_secs(60);

fn image() -> String {
    std::env::var("SANDBOX_BASE_IMAGE")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "sandbox-operator/base:bookworm".to_string())
}

/// A double with one sprite, `s1`.
async fn double() -> SpritesDouble {
    let d = sprites::spawn(SpritesOptions::new(image())).await;
    let created = reqwest::Client::new()
        .post(format!("{}/v1/sprites", d.base_url))
        .bearer_auth(&d.token)
        .json(&serde_json::json!({"name": "s1"}))
        .send()
        .await
        .expect("create answered");
    assert!(created.status().is_success(), "{}", created.status());
    d
}

/// Opens the exec socket with `query`; returns it and the capabilities header.
async fn open(d: &SpritesDouble, query: &str) -> (Socket, Option<String>) {
    let base = d.base_url.replacen("http://", "ws://", 1);
    let mut request = format!("{base}/v1/sprites/s1/exec?{query}")
        .into_client_request()
        .expect("request");
    let bearer = format!("Bearer {}", d.token).parse().expect("header");
    request.headers_mut().insert("authorization", bearer);
    let (socket, response) = tokio_tungstenite::connect_async(request)
        .await
        .expect("upgraded");
    let caps = response
        .headers()
        .get("x-sprite-capabilities")
        .map(|v| v.to_str().expect("ascii").to_string());
    (socket, caps)
}

/// What arrived until the exit: stdout, stderr, text messages, the exit code.
#[derive(Default, Debug)]
struct Seen {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    texts: Vec<Value>,
    exit: Option<i64>,
}

/// Reads one message into `seen`; false once the exit arrived or the socket ended.
async fn read_one(socket: &mut Socket, seen: &mut Seen, tty: bool) -> bool {
    let next = tokio::time::timeout(BOUND, socket.next()).await;
    let Some(Ok(message)) = next.expect("a message within the bound") else {
        return false;
    };
    match message {
        Message::Binary(data) if tty => seen.stdout.extend_from_slice(&data),
        Message::Binary(data) => match data.first() {
            Some(1) => seen.stdout.extend_from_slice(&data[1..]),
            Some(2) => seen.stderr.extend_from_slice(&data[1..]),
            Some(3) => seen.exit = Some(i64::from(data[1])),
            other => panic!("unexpected stream id {other:?}"),
        },
        Message::Text(text) => {
            let value: Value = serde_json::from_str(&text).expect("JSON text frame");
            if value["type"] == "exit" {
                seen.exit = value["exit_code"].as_i64();
            }
            seen.texts.push(value);
        }
        _ => {}
    }
    seen.exit.is_none()
}

async fn read_until(socket: &mut Socket, seen: &mut Seen, tty: bool, needle: &str) {
    while !String::from_utf8_lossy(&seen.stdout).contains(needle) {
        assert!(
            read_one(socket, seen, tty).await,
            "ended before {needle:?}: {seen:?}"
        );
    }
}

async fn to_exit(socket: &mut Socket, seen: &mut Seen, tty: bool) {
    while read_one(socket, seen, tty).await {}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_tty_streams_are_framed_and_stdin_ends() {
    let d = double().await;
    let script = "cat; echo err >&2; exit 5";
    let query = format!("cmd=sh&cmd=-c&cmd={}&stdin=true", urlencode(script));
    let (mut socket, caps) = open(&d, &query).await;
    assert_eq!(caps.as_deref(), Some("signal"));
    socket
        .send(Message::binary([&[0u8][..], b"hello"].concat()))
        .await
        .expect("stdin");
    socket.send(Message::binary(vec![4u8])).await.expect("eof");
    let mut seen = Seen::default();
    to_exit(&mut socket, &mut seen, false).await;
    assert_eq!(seen.stdout, b"hello");
    assert_eq!(seen.stderr, b"err\n");
    assert_eq!(seen.exit, Some(5));
    let info = &seen.texts[0];
    assert_eq!(info["type"], "session_info", "{info}");
    assert!(info["session_id"].as_u64().is_some(), "{info}");
    assert_eq!(info["tty"], false);
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tty_starts_at_its_size_resizes_and_reports_the_exit_as_text() {
    let d = double().await;
    let script = r#"stty size; read l; stty size; exit 4"#;
    let query = format!(
        "cmd=sh&cmd=-c&cmd={}&tty=true&cols=100&rows=30",
        urlencode(script)
    );
    let (mut socket, _) = open(&d, &query).await;
    let mut seen = Seen::default();
    read_until(&mut socket, &mut seen, true, "30 100").await;
    let resize = r#"{"type":"resize","cols":132,"rows":50}"#;
    socket.send(Message::text(resize)).await.expect("resize");
    // The resize is applied before the next frame is read: the line comes after it.
    socket
        .send(Message::binary(&b"go\r"[..]))
        .await
        .expect("line");
    read_until(&mut socket, &mut seen, true, "50 132").await;
    to_exit(&mut socket, &mut seen, true).await;
    assert_eq!(seen.exit, Some(4), "{seen:?}");
    assert_eq!(seen.texts[0]["tty"], true);
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_over_the_socket_ends_the_process() {
    let d = double().await;
    let (mut socket, _) = open(&d, "cmd=sleep&cmd=600").await;
    let signal = r#"{"type":"signal","signal":"TERM"}"#;
    socket.send(Message::text(signal)).await.expect("signal");
    let mut seen = Seen::default();
    to_exit(&mut socket, &mut seen, false).await;
    assert_eq!(seen.exit, Some(143), "{seen:?}");
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_socket_signals_the_kill_endpoint_signals_the_session() {
    let d = double().await;
    d.faults().set_no_ws_signals(true);
    let (mut socket, caps) = open(&d, "cmd=sleep&cmd=600").await;
    assert_eq!(caps, None, "no signal capability advertised");
    let mut seen = Seen::default();
    read_one(&mut socket, &mut seen, false).await;
    let id = seen.texts[0]["session_id"].as_u64().expect("session id");
    let kill = |session: u64| {
        reqwest::Client::new()
            .post(format!(
                "{}/v1/sprites/s1/exec/{session}/kill?signal=SIGINT",
                d.base_url
            ))
            .bearer_auth(&d.token)
            .send()
    };
    let absent = kill(id + 1000).await.expect("answered");
    assert_eq!(absent.status(), 404);
    let answer = kill(id).await.expect("answered");
    assert!(answer.status().is_success(), "{}", answer.status());
    let body = answer.text().await.expect("body");
    assert!(body.contains(r#""type":"signal""#), "{body}");
    to_exit(&mut socket, &mut seen, false).await;
    assert_eq!(seen.exit, Some(130), "{seen:?}");
    d.shutdown().await;
}

/// The port proxy: a hello for a port where nothing listens is answered with an error status
/// and the socket closes; with a listener (a shell reading one line) it connects and bytes
/// cross both ways.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_port_proxy_connects_only_where_something_listens() {
    let d = double().await;
    let base = d.base_url.replacen("http://", "ws://", 1);
    let open_proxy = || async {
        let mut request = format!("{base}/v1/sprites/s1/proxy")
            .into_client_request()
            .expect("request");
        let bearer = format!("Bearer {}", d.token).parse().expect("header");
        request.headers_mut().insert("authorization", bearer);
        tokio_tungstenite::connect_async(request)
            .await
            .expect("upgraded")
            .0
    };
    let mut socket = open_proxy().await;
    let hello = r#"{"host":"localhost","port":9}"#;
    socket.send(Message::text(hello)).await.expect("hello");
    let reply = tokio::time::timeout(BOUND, socket.next())
        .await
        .expect("reply");
    let Some(Ok(Message::Text(text))) = reply else {
        panic!("no text reply: {reply:?}");
    };
    let value: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(value["status"], "error", "{value}");
    let server = "perl -MIO::Socket::INET -e '$s=IO::Socket::INET->new(LocalPort=>7000,Listen=>1,ReuseAddr=>1) or die; $c=$s->accept; $l=<$c>; print $c \"got $l\"' >/dev/null 2>&1 &";
    let (mut exec, _) = open(&d, &format!("cmd=sh&cmd=-c&cmd={}", urlencode(server))).await;
    to_exit(&mut exec, &mut Seen::default(), false).await;
    let mut connected = None;
    for _ in 0..100 {
        let mut socket = open_proxy().await;
        let hello = r#"{"host":"localhost","port":7000}"#;
        socket.send(Message::text(hello)).await.expect("hello");
        if let Some(Ok(Message::Text(text))) = socket.next().await
            && text.contains("connected")
        {
            connected = Some(socket);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut socket = connected.expect("the listener came up");
    socket
        .send(Message::binary(&b"ping\n"[..]))
        .await
        .expect("sent");
    let mut got = Vec::new();
    while let Some(Ok(message)) = tokio::time::timeout(BOUND, socket.next())
        .await
        .expect("bound")
    {
        match message {
            Message::Binary(data) => got.extend_from_slice(&data),
            Message::Close(_) => break,
            _ => {}
        }
    }
    assert_eq!(got, b"got ping\n");
    d.shutdown().await;
}

fn urlencode(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}
