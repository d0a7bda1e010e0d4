//! The routes end to end over real sockets, against the fake provider: authentication,
//! authorization, lookup errors, and each subresource's protocol.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::{SinkExt, StreamExt};
use hyper_util::rt::TokioIo;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use super::authn::{FrontProxy, Peer, UserInfo};
use super::authz::{Attributes, Authorizer};
use super::channel::{self, Outcome};
use super::fake::{Fake, Uploads};
use super::lookup::{Directory, Need, Target};
use super::routes::{AccessState, FrontProxyCell, router};
use super::status::AccessError;
use crate::metrics::Metrics;
use crate::registry::ProviderHandle;

const BASE: &str = "/apis/subresources.sandboxes.dev/v1alpha1/namespaces/ns/sandboxes";

struct Dir {
    capable: ProviderHandle,
    incapable: ProviderHandle,
}

#[async_trait]
impl Directory for Dir {
    async fn find(&self, ns: &str, name: &str, _: Need) -> Result<Target, AccessError> {
        let handle = match name {
            "box" => self.capable.clone(),
            "weak" => self.incapable.clone(),
            "asleep" => {
                return Err(AccessError::Conflict(format!(
                    "sandbox {ns}/{name} is not Ready"
                )));
            }
            _ => {
                return Err(AccessError::NotFound(format!(
                    "sandboxes.sandboxes.dev {name:?} not found"
                )));
            }
        };
        Ok(Target {
            handle,
            id: "id-1".into(),
            heartbeat: None,
        })
    }
}

/// `viewer` may only `get`.
struct Rbac;

#[async_trait]
impl Authorizer for Rbac {
    async fn authorize(&self, user: &UserInfo, attrs: &Attributes) -> Result<(), AccessError> {
        if user.name == "viewer" && attrs.verb != "get" {
            return Err(attrs.denied(&user.name, ""));
        }
        Ok(())
    }
}

fn handle(capable: bool, uploaded: &Uploads) -> ProviderHandle {
    let fake = Fake {
        capable,
        uploaded: uploaded.clone(),
    };
    ProviderHandle::new(Arc::new(fake), 4, Duration::from_secs(5), Metrics::new())
}

struct Server {
    addr: SocketAddr,
    uploaded: Uploads,
}

/// The router on a plain socket whose connections carry `cn` as the verified peer.
async fn server(cn: Option<&str>) -> Server {
    let uploaded = Arc::new(Mutex::new(Vec::new()));
    let front = FrontProxy {
        client_ca_pem: Some("CA".into()),
        allowed_names: vec!["front-proxy-client".into()],
        username_headers: vec!["X-Remote-User".into()],
        group_headers: vec!["X-Remote-Group".into()],
        ..FrontProxy::default()
    };
    let state = AccessState {
        directory: Arc::new(Dir {
            capable: handle(true, &uploaded),
            incapable: handle(false, &uploaded),
        }),
        authorizer: Arc::new(Rbac),
        front: FrontProxyCell::new(front),
        max_upload_bytes: 1024,
    };
    let app = router(state);
    let peer = Peer {
        common_name: cn.map(str::to_string),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            tokio::spawn(super::listener::serve_http(
                TokioIo::new(tcp),
                peer.clone(),
                app.clone(),
            ));
        }
    });
    Server { addr, uploaded }
}

async fn get(addr: SocketAddr, path: &str, user: &str) -> (u16, String) {
    let response = reqwest::Client::new()
        .get(format!("http://{addr}{path}"))
        .header("X-Remote-User", user)
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Opens a WebSocket offering `offer`; the server must pick the best we speak.
async fn websocket(addr: SocketAddr, path: &str, offer: &str) -> Ws {
    let mut request = format!("ws://{addr}{path}").into_client_request().unwrap();
    let headers = request.headers_mut();
    headers.insert("Sec-WebSocket-Protocol", offer.parse().unwrap());
    headers.insert("X-Remote-User", "alice".parse().unwrap());
    let (ws, response) = tokio_tungstenite::connect_async(request).await.unwrap();
    let best = if offer.contains("v5") {
        "v5.channel.k8s.io"
    } else {
        "v4.channel.k8s.io"
    };
    assert_eq!(response.headers()["sec-websocket-protocol"], best);
    ws
}

/// Every frame until the error channel's status: (stdout, stderr, outcome).
async fn run_to_exit(ws: &mut Ws) -> (String, String, Outcome) {
    let (mut out, mut err) = (String::new(), String::new());
    while let Some(Ok(message)) = ws.next().await {
        let Message::Binary(data) = message else {
            continue;
        };
        let (ch, payload) = channel::split(&data).unwrap();
        let text = String::from_utf8_lossy(payload).into_owned();
        match ch {
            channel::STDOUT => out.push_str(&text),
            channel::STDERR => err.push_str(&text),
            channel::ERROR => return (out, err, channel::parse_status(payload)),
            _ => {}
        }
    }
    panic!("the socket closed without a status; stdout {out:?}");
}

#[tokio::test]
async fn exec_passes_stdin_resize_and_the_exit_code_through() {
    let s = server(Some("front-proxy-client")).await;
    let q = "command=exit&command=3&stdout=true&stderr=true";
    let mut ws = websocket(s.addr, &format!("{BASE}/box/exec?{q}"), "v5.channel.k8s.io").await;
    let (out, err, outcome) = run_to_exit(&mut ws).await;
    assert_eq!(
        (out.as_str(), err.as_str(), outcome),
        ("out", "err", Outcome::Exited(3))
    );

    let q = "command=cat&stdin=true&stdout=true&tty=true";
    let mut ws = websocket(
        s.addr,
        &format!("{BASE}/box/exec?{q}"),
        "v4.channel.k8s.io, v5.channel.k8s.io",
    )
    .await;
    let resize = br#"{"Width":120,"Height":40}"#;
    ws.send(Message::Binary(
        channel::frame(channel::RESIZE, resize).into(),
    ))
    .await
    .unwrap();
    ws.send(Message::Binary(
        channel::frame(channel::STDIN, b"hello").into(),
    ))
    .await
    .unwrap();
    ws.send(Message::Binary(vec![channel::CLOSE, channel::STDIN].into()))
        .await
        .unwrap();
    let (out, _, outcome) = run_to_exit(&mut ws).await;
    assert_eq!((out.as_str(), outcome), ("120x40hello", Outcome::Exited(0)));
}

#[tokio::test]
async fn forged_user_headers_without_the_front_proxy_certificate_are_refused() {
    for cn in [None, Some("not-the-front-proxy")] {
        let s = server(cn).await;
        let (code, body) = get(s.addr, &format!("{BASE}/box/log"), "system:admin").await;
        assert_eq!(code, 401, "{body}");
        assert!(body.contains("\"reason\":\"Unauthorized\""), "{body}");
        let (code, _) = get(s.addr, "/apis/subresources.sandboxes.dev/v1alpha1", "x").await;
        assert_eq!(code, 401);
    }
}

#[tokio::test]
async fn rbac_lookup_and_capability_errors_are_statuses_that_name_the_fix() {
    let s = server(Some("front-proxy-client")).await;
    let (code, body) = get(s.addr, &format!("{BASE}/box/exec?command=true"), "viewer").await;
    assert_eq!(code, 403, "{body}");
    assert!(
        body.contains(r#"cannot create resource \"sandboxes/exec\""#),
        "{body}"
    );
    let (code, body) = get(s.addr, &format!("{BASE}/box/log?tailLines=2"), "viewer").await;
    assert_eq!((code, body.as_str()), (200, "line 1\ntail=Some(2)\n"));
    let (code, body) = get(s.addr, &format!("{BASE}/missing/log"), "alice").await;
    assert_eq!(code, 404, "{body}");
    assert!(body.contains("missing"), "{body}");
    let (code, _) = get(s.addr, &format!("{BASE}/asleep/log"), "alice").await;
    assert_eq!(code, 409);
    let (code, body) = get(s.addr, &format!("{BASE}/weak/exec?command=true"), "alice").await;
    assert_eq!(code, 501, "{body}");
    assert!(
        body.contains("provider fake cannot exec interactively"),
        "{body}"
    );
    let (code, body) = get(s.addr, &format!("{BASE}/box/exec?command=true"), "alice").await;
    assert_eq!(code, 400, "a plain GET is no WebSocket: {body}");
    let (code, _) = get(s.addr, &format!("{BASE}/box/nosuch"), "alice").await;
    assert_eq!(code, 404);
}

#[tokio::test]
async fn files_download_and_upload_a_tar() {
    let s = server(Some("front-proxy-client")).await;
    let (code, body) = get(s.addr, &format!("{BASE}/box/files?path=/work"), "alice").await;
    assert_eq!((code, body.as_str()), (200, "tar of /work"));
    let (code, _) = get(s.addr, &format!("{BASE}/box/files?path=/absent"), "alice").await;
    assert_eq!(code, 404);
    let put = |body: Vec<u8>| {
        reqwest::Client::new()
            .put(format!("http://{}{BASE}/box/files?path=/dst", s.addr))
            .header("X-Remote-User", "alice")
            .body(body)
            .send()
    };
    assert_eq!(put(b"TAR".to_vec()).await.unwrap().status().as_u16(), 200);
    assert_eq!(
        s.uploaded.lock().unwrap().as_slice(),
        [("/dst".to_string(), b"TAR".to_vec())]
    );
    assert_eq!(put(vec![0; 2048]).await.unwrap().status().as_u16(), 413);
}

#[tokio::test]
async fn port_forward_carries_bytes_and_reports_a_closed_port() {
    let s = server(Some("front-proxy-client")).await;
    let mut ws = websocket(
        s.addr,
        &format!("{BASE}/box/portforward?ports=8080,1"),
        "v4.channel.k8s.io",
    )
    .await;
    let mut seen = Vec::new();
    while seen.len() < 4 {
        let Some(Ok(Message::Binary(data))) = ws.next().await else {
            panic!("closed early")
        };
        seen.push(data.to_vec());
    }
    assert_eq!(seen[0], [&[0u8][..], &8080u16.to_le_bytes()].concat());
    assert_eq!(seen[1], [&[1u8][..], &8080u16.to_le_bytes()].concat());
    ws.send(Message::Binary(channel::frame(0, b"ping").into()))
        .await
        .unwrap();
    let mut error_said = String::new();
    loop {
        let Some(Ok(Message::Binary(data))) = ws.next().await else {
            panic!("closed early")
        };
        match data[0] {
            0 => {
                assert_eq!(&data[1..], b"ping");
                break;
            }
            3 if data.len() > 3 => error_said = String::from_utf8_lossy(&data[1..]).into_owned(),
            _ => {}
        }
    }
    if error_said.is_empty() {
        let Some(Ok(Message::Binary(data))) = ws.next().await else {
            panic!("no error frame")
        };
        error_said = String::from_utf8_lossy(&data[1..]).into_owned();
    }
    assert!(error_said.contains("port 1"), "{error_said}");
}

#[tokio::test]
async fn discovery_lists_the_five_subresources() {
    let s = server(Some("front-proxy-client")).await;
    let (code, body) = get(s.addr, "/apis/subresources.sandboxes.dev/v1alpha1", "x").await;
    assert_eq!(code, 200);
    let list: serde_json::Value = serde_json::from_str(&body).unwrap();
    let names: Vec<&str> = list["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "sandboxes/exec",
            "sandboxes/attach",
            "sandboxes/log",
            "sandboxes/portforward",
            "sandboxes/files"
        ]
    );
    assert_eq!(get(s.addr, "/healthz", "").await, (200, "ok".to_string()));
}
