//! The aggregated API `subresources.sandboxes.dev` end to end: the operator (a host process)
//! registered with the real kube-apiserver by an APIService, requests going through the
//! real aggregation layer (front-proxy certificate, user headers), RBAC decided by the real
//! authorizer, sandboxes on the real Docker engine.

mod harness;

use std::time::Duration;

use harness::aggregated::*;
use harness::cluster::*;
use harness::docker::Purge;
use harness::objects::wait_ready;
use kube::Api;
use sandbox_operator::access::channel::{self, Outcome};
use sandbox_operator::api::Sandbox;

/// A namespace with a Ready Sandbox `box` and an operator serving the aggregated API.
async fn world(prefix: &str) -> (String, Aggregated, Purge) {
    let ns = namespace(prefix).await;
    let purge = Purge(ns.clone());
    let api = Aggregated::start(&ns).await;
    apply_yaml_ok(&sandbox_yaml("box"), &ns);
    let sandboxes: Api<Sandbox> = Api::namespaced(client().await, &ns);
    wait_ready(&sandboxes, "box", &api.operator).await;
    (ns, api, purge)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_apiservice_becomes_available_and_exec_returns_the_exit_code() {
    let (ns, api, _purge) = world("access-exec").await;
    assert!(available().starts_with("True"), "{}", available());
    let admin = client().await;
    let script = "echo out; echo err >&2; exit 7";
    let run = exec(&admin, &ns, "box", &["sh", "-c", script])
        .await
        .unwrap_or_else(|e| {
            panic!(
                "exec through the API server: {e}\n{}",
                api.operator.log_tail()
            )
        });
    assert_eq!(run.outcome, Outcome::Exited(7), "{run:?}");
    assert_eq!(
        (run.stdout.as_str(), run.stderr.as_str()),
        ("out\n", "err\n")
    );
    let ok = exec(&admin, &ns, "box", &["true"])
        .await
        .expect("exec true");
    assert_eq!(ok.outcome, Outcome::Exited(0));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_view_user_reads_logs_but_cannot_exec() {
    let (ns, api, _purge) = world("access-view").await;
    apply_chart_roles();
    let viewer = user("viewer");
    bind(&viewer, "view", &ns);
    let as_viewer = client_as(&viewer, &["system:authenticated"]).await;
    let log = path(&ns, "box", "log");
    let text = harness::wait_for(
        "the view role to allow sandboxes/log",
        Duration::from_secs(30),
        || {
            let (c, log) = (as_viewer.clone(), log.clone());
            async move {
                let request = http::Request::get(log).body(Vec::new()).expect("request");
                c.request_text(request).await.map_err(|e| e.to_string())
            }
        },
    )
    .await;
    assert!(
        text.contains("hello from box"),
        "log: {text:?}\n{}",
        api.operator.log_tail()
    );
    let denied = exec(&as_viewer, &ns, "box", &["true"]).await;
    let message = format!("{:?}", denied.expect_err("a view user must not exec"));
    assert!(message.contains("403"), "{message}");
    assert!(
        message.contains(r#"cannot create resource "sandboxes/exec""#)
            || message.contains("sandboxes/exec"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_user_bound_to_one_namespace_cannot_exec_into_anothers_sandbox() {
    let (ns, _api, _purge) = world("access-tenant").await;
    apply_chart_roles();
    let other = namespace("access-other").await;
    let (insider, outsider) = (user("insider"), user("outsider"));
    bind(&insider, "edit", &ns);
    bind(&outsider, "edit", &other);
    let as_insider = client_as(&insider, &["system:authenticated"]).await;
    let ran = harness::wait_for(
        "the edit role to allow sandboxes/exec",
        Duration::from_secs(30),
        || {
            let c = as_insider.clone();
            let ns = ns.clone();
            async move {
                exec(&c, &ns, "box", &["true"])
                    .await
                    .map_err(|e| e.to_string())
            }
        },
    )
    .await;
    assert_eq!(
        ran.outcome,
        Outcome::Exited(0),
        "the insider may exec in its own namespace"
    );
    let as_outsider = client_as(&outsider, &["system:authenticated"]).await;
    let denied = exec(&as_outsider, &ns, "box", &["true"]).await;
    let message = format!("{:?}", denied.expect_err("an outsider must not exec"));
    assert!(
        message.contains("403") && message.contains(&ns),
        "{message}"
    );
}

/// The operator's own SubjectAccessReview, not only the API server's check in front of it: a
/// user allowed through by the API server (a grant in `subresources.sandboxes.dev`) but
/// without `create` on `sandboxes/exec` in `sandboxes.dev` is refused by the operator.
#[tokio::test(flavor = "multi_thread")]
async fn the_operator_reviews_each_request_itself() {
    let (ns, _api, _purge) = world("access-sar").await;
    let proxied_only = user("proxied");
    let role = r#"apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: proxied-only}
rules:
  - apiGroups: ["subresources.sandboxes.dev"]
    resources: ["sandboxes/exec"]
    verbs: ["get", "create"]
"#;
    apply_yaml_ok(role, &ns);
    kubectl_ok(
        &[
            "create",
            "rolebinding",
            "proxied-only",
            "--role=proxied-only",
            &format!("--user={proxied_only}"),
            "-n",
            &ns,
        ],
        None,
    );
    let as_user = client_as(&proxied_only, &["system:authenticated"]).await;
    let message = harness::wait_for(
        "the operator's review to refuse",
        Duration::from_secs(30),
        || {
            let (c, ns) = (as_user.clone(), ns.clone());
            async move {
                match exec(&c, &ns, "box", &["true"]).await {
                    Ok(run) => Err(format!("exec ran: {run:?}")),
                    Err(e) => {
                        let m = e.to_string();
                        // the API server's own refusal names its group; wait for the operator's
                        if m.contains("API group \"sandboxes.dev\"") {
                            Ok(m)
                        } else {
                            Err(m)
                        }
                    }
                }
            }
        },
    )
    .await;
    assert!(
        message.contains("403") && message.contains(r#"cannot create resource "sandboxes/exec""#),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn requests_straight_to_the_listener_without_the_front_proxy_certificate_are_refused() {
    let ns = namespace("access-forged").await;
    let api = Aggregated::start(&ns).await;
    let url = format!(
        "https://{}:{}{}",
        server_name(),
        api.addr.port(),
        path(&ns, "box", "log")
    );
    let ca = reqwest::Certificate::from_pem(api.ca_pem.as_bytes()).expect("ca");
    let builder = || {
        reqwest::Client::builder()
            .tls_certs_only([ca.clone()])
            .resolve(&server_name(), api.addr)
    };
    let forged = |c: reqwest::Client| {
        c.get(&url)
            .header("X-Remote-User", "system:admin")
            .header("X-Remote-Group", "system:masters")
            .send()
    };
    // No client certificate at all: 401, whatever the headers say.
    let response = forged(builder().build().expect("client"))
        .await
        .expect("an answer");
    assert_eq!(response.status().as_u16(), 401);
    let body = response.text().await.expect("body");
    assert!(body.contains("Unauthorized"), "{body}");
    // A certificate of the cluster CA (a real client identity, but not the front proxy's CA).
    let pki = harness::cache().join("cluster/pki");
    let mut pem = std::fs::read(pki.join("apiserver-kubelet-client.crt")).expect("cert");
    pem.extend(std::fs::read(pki.join("apiserver-kubelet-client.key")).expect("key"));
    let identity = reqwest::Identity::from_pem(&pem).expect("identity");
    let client = builder().identity(identity).build().expect("client");
    match forged(client).await {
        Err(_) => {}
        Ok(r) => assert_eq!(
            r.status().as_u16(),
            401,
            "a cluster-CA certificate was believed"
        ),
    }
}

/// The output's tail and the exit status reach a client that reads them late: the process
/// writes 1 MiB and ends while the client reads nothing, and the client sends two frames (as
/// a client's pings or keystrokes would) before it reads. When the operator dropped its
/// socket right after the status, those frames made the API server's proxy write into the
/// dropped socket, fail, and close both sides, losing what it still held for the client.
#[tokio::test(flavor = "multi_thread")]
async fn a_late_reader_gets_the_whole_output_and_the_status() {
    use futures::{SinkExt, StreamExt};
    const SIZE: usize = 1 << 20;
    let (ns, _api, _purge) = world("access-late").await;
    let admin = client().await;
    let done = format!("/tmp/done-{}", harness::unique("late"));
    let script = format!("head -c {SIZE} /dev/zero | tr '\\0' x && touch {done}");
    let query = url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs([("command", "sh"), ("command", "-c"), ("command", &script)])
        .append_pair("stdout", "true")
        .finish();
    let uri = format!("{}?{query}", path(&ns, "box", "exec"));
    let request = http::Request::get(uri).body(Vec::new()).expect("request");
    let mut ws = admin.connect(request).await.expect("exec").into_stream();
    harness::wait_for("the process to end", Duration::from_secs(60), || async {
        let probe = exec(&admin, &ns, "box", &["test", "-e", &done]).await;
        match probe.map(|p| p.outcome) {
            Ok(Outcome::Exited(0)) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    for _ in 0..2 {
        // An empty text frame, which the operator ignores (made by `From`: kube's
        // tungstenite is another major version than ours).
        // A failed send is the loss itself: what arrived is checked below.
        if ws.send(String::new().into()).await.is_err() {
            break;
        }
        // Not a synchronisation: the time a slow client takes before it reads.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let (mut out, mut status) = (0usize, None);
    while let Some(Ok(message)) = ws.next().await {
        let data = message.into_data();
        match channel::split(&data) {
            Some((channel::STDOUT, payload)) => out += payload.len(),
            Some((channel::ERROR, payload)) => status = Some(channel::parse_status(payload)),
            _ => {}
        }
    }
    assert_eq!((out, status), (SIZE, Some(Outcome::Exited(0))));
}
