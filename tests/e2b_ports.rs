//! Port URLs of the E2B-compatible API (src/e2bapi/ports): `{port}-{sandboxID}.{domain}`,
//! what the official SDK's `get_host(port)` gives, reaches the sandbox's TCP port over HTTP
//! and WebSocket through the provider's port-forward, on the API's own listener. A sandbox
//! answers only a request carrying its `e2b-traffic-access-token` (403 otherwise, as E2B
//! answers a restricted one) unless it was created with `allowPublicTraffic: true` — the
//! default is restricted, so another tenant who learns an id reaches nothing; a port with
//! nothing listening is E2B's 502. The servers run in the sandbox (tests/e2b/scenarios_ports.py).

mod harness;

use sandbox_doubles::ports::quiet_port;
use std::net::SocketAddr;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use harness::cluster::namespace;
use harness::e2b_sdk::{Sdk, api_up, ensure_sleep_crd, key_for, options};
use harness::operator::{Operator, OperatorOptions};
use harness::tenant::tenant;
use harness::wait_for;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

const HTTP_PORT: u16 = 8080;
const WS_PORT: u16 = 8081;
const TOKEN_HEADER: &str = "e2b-traffic-access-token";

/// What the scenario `serve_ports` answers.
struct Served {
    sid: String,
    http_host: String,
    ws_host: String,
    traffic_token: Option<String>,
    envd_token: String,
}

fn serve(sdk: &Sdk, key: &str, network: Value) -> Served {
    let args = json!({"timeout": 600, "http": HTTP_PORT, "ws": WS_PORT, "network": network});
    let r = sdk.ok(key, "serve_ports", args);
    let text = |k: &str| {
        r[k].as_str()
            .unwrap_or_else(|| panic!("{k}: {r}"))
            .to_string()
    };
    Served {
        sid: text("sandbox_id"),
        http_host: text("http_host"),
        ws_host: text("ws_host"),
        traffic_token: r["traffic_token"].as_str().map(str::to_string),
        envd_token: text("envd_token"),
    }
}

/// A client that sends every `host` to the API on loopback (the wildcard DNS of an install).
fn client(host: &str, port: u16) -> reqwest::Client {
    reqwest::Client::builder()
        .resolve(host, SocketAddr::from(([127, 0, 0, 1], port)))
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client")
}

/// `POST http://{host}:{port}/{path}` with `token` in the traffic header when given.
async fn post(host: &str, port: u16, path: &str, token: Option<&str>) -> (u16, String) {
    let mut request = client(host, port)
        .post(format!("http://{host}:{port}{path}"))
        .body("ping");
    if let Some(t) = token {
        request = request.header(TOKEN_HEADER, t);
    }
    let response = request.send().await.expect("send");
    let status = response.status().as_u16();
    (status, response.text().await.expect("body"))
}

/// The HTTP server answers through the port URL (polled: the SDK started it in the
/// background, and it listens a moment later).
async fn http_answers(host: &str, port: u16, token: Option<&str>) {
    wait_for(
        "the sandbox's HTTP server through its port URL",
        Duration::from_secs(60),
        || async move {
            let (status, body) = post(host, port, "/hello?x=1", token).await;
            match (status, body.as_str()) {
                (200, "POST /hello?x=1 ping") => Ok(()),
                _ => Err(format!("{status}: {body}")),
            }
        },
    )
    .await;
}

/// A WebSocket to the echo server through the port URL: two messages come back.
async fn websocket_echoes(host: &str, port: u16, token: Option<&str>) {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let mut request = format!("ws://{host}:{port}/echo")
        .into_client_request()
        .expect("request");
    if let Some(t) = token {
        request
            .headers_mut()
            .insert(TOKEN_HEADER, t.parse().expect("header"));
    }
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let (mut ws, response) = tokio_tungstenite::client_async(request, tcp)
        .await
        .expect("WebSocket handshake through the port URL");
    assert_eq!(response.status().as_u16(), 101);
    for text in ["first message", "second message"] {
        ws.send(Message::text(text)).await.expect("send");
        let echoed = tokio::time::timeout(Duration::from_secs(20), ws.next())
            .await
            .expect("an echo within 20 s")
            .expect("a frame")
            .expect("a message");
        assert_eq!(echoed, Message::text(text));
    }
    ws.close(None).await.expect("close");
}

#[tokio::test]
async fn port_urls_reach_http_and_websocket_servers_in_the_sandbox() {
    ensure_sleep_crd();
    let port = quiet_port();
    let a = tenant("e2b-ports", &options(port)).await;
    let b = namespace("e2b-ports-b").await;
    let _op_b = Operator::start(&b, &b, &OperatorOptions::default());
    let key = key_for(&a.ns);
    api_up(port).await;
    let sdk = Sdk::python(port);

    let open = serve(&sdk, &key, json!({"allow_public_traffic": true}));
    assert_eq!(open.http_host, format!("{HTTP_PORT}-{}.e2b.test", open.sid));
    assert_eq!(
        open.traffic_token, None,
        "allow_public_traffic: true opens the URLs"
    );
    http_answers(&open.http_host, port, None).await;
    websocket_echoes(&open.ws_host, port, None).await;
    closed_port(&open.sid, port).await;

    restricted(&sdk, &key_for(&b), port, Value::Null).await;
    restricted(
        &sdk,
        &key_for(&b),
        port,
        json!({"allow_public_traffic": false}),
    )
    .await;
    assert_eq!(
        sdk.ok(&key, "kill", json!({"sandbox_id": open.sid}))["killed"],
        true
    );
}

/// Nothing listens on the port: E2B's 502, naming the sandbox and the port.
async fn closed_port(sid: &str, port: u16) {
    let host = format!("8089-{sid}.e2b.test");
    let (status, body) = post(&host, port, "/", None).await;
    assert_eq!(status, 502, "{body}");
    let body: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    assert_eq!(
        body["message"], "The sandbox is running but port is not open",
        "{body}"
    );
    assert_eq!(body["port"], 8089, "{body}");
    assert_eq!(body["sandboxId"], sid, "{body}");
}

/// Another tenant's sandbox created with `network` (the default, or `allowPublicTraffic:
/// false`): without its traffic token, or with a wrong one (its envd token included), 403
/// on HTTP and WebSocket; with it, the servers answer.
async fn restricted(sdk: &Sdk, key: &str, port: u16, network: Value) {
    let closed = serve(sdk, key, network);
    let token = closed
        .traffic_token
        .clone()
        .expect("a traffic access token");
    assert_ne!(token, closed.envd_token);
    http_answers(&closed.http_host, port, Some(&token)).await;
    websocket_echoes(&closed.ws_host, port, Some(&token)).await;
    let wrong = format!("{token}x");
    for presented in [None, Some(wrong.as_str()), Some(closed.envd_token.as_str())] {
        let (status, body) = post(&closed.http_host, port, "/", presented).await;
        assert_eq!(status, 403, "{presented:?}: {body}");
        assert!(body.contains(TOKEN_HEADER), "{body}");
        assert!(!body.contains(&token), "the token never shows: {body}");
    }
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let refused =
        tokio_tungstenite::client_async(format!("ws://{}:{port}/", closed.ws_host), tcp).await;
    match refused {
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => {
            assert_eq!(r.status().as_u16(), 403)
        }
        other => panic!("a WebSocket without the token must be refused: {other:?}"),
    }
    assert_eq!(
        sdk.ok(key, "kill", json!({"sandbox_id": closed.sid}))["killed"],
        true
    );
}
