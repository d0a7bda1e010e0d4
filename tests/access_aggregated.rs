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
use sandbox_operator::access::channel::Outcome;
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
        message.contains("cannot create resource \\\"sandboxes/exec\\\"")
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
