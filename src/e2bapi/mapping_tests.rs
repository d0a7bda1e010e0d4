use super::*;
use crate::e2bapi::wire::NewSandbox;

fn tenant() -> Tenant {
    Tenant {
        namespace: "team-a".into(),
        service_account: "agent".into(),
        key_name: "ci-key".into(),
    }
}

fn now() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z")
        .unwrap()
        .with_timezone(&Utc)
}

fn request(json: serde_json::Value) -> NewSandbox {
    serde_json::from_value(json).unwrap()
}

fn create(json: serde_json::Value) -> Result<Sandbox, ApiError> {
    sandbox(
        &request(json),
        Boot::Image("img".into()),
        &tenant(),
        "e2b-x",
        now(),
    )
}

fn refused(json: serde_json::Value, needle: &str) {
    let e = create(json).unwrap_err();
    assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST, "{e}");
    assert!(
        e.message.contains(needle),
        "{needle:?} not in {}",
        e.message
    );
}

#[test]
fn the_sdk_create_request_maps_to_a_sandbox_in_the_keys_namespace() {
    let s = create(serde_json::json!({
        "templateID": "base", "timeout": 60, "autoPause": false, "autoPauseMemory": true,
        "metadata": {"user": "alice", "run id": "a b&c"},
        "envVars": {"GREETING": "hi"},
    }))
    .unwrap();
    assert_eq!(s.metadata.namespace.as_deref(), Some("team-a"));
    assert_eq!(s.spec.image.as_deref(), Some("img"));
    let l = s.spec.lifetime.as_ref().unwrap();
    assert_eq!(l.shutdown_at.as_deref(), Some("2026-01-01T00:01:00Z"));
    assert_eq!(l.action, Some(LifetimeAction::Delete));
    assert_eq!(s.spec.env.as_ref().unwrap()[0].name, "GREETING");
    assert_eq!(s.spec.egress, None);
    let m = metadata_of(&s);
    assert_eq!(m["run id"], "a b&c");
    let labels = s.metadata.labels.as_ref().unwrap();
    let (k, v) = metadata_label("run id", "a b&c");
    assert_eq!(labels[&k], v);
    assert!(k.len() - "meta.e2b.sandboxes.dev/".len() <= 63 && v.len() <= 63);
    assert_eq!(labels[MANAGED_LABEL], "true");
    let a = s.metadata.annotations.as_ref().unwrap();
    assert_eq!(a[CREATOR_ANNOTATION], "system:serviceaccount:team-a:agent");
    assert_eq!(a[KEY_ANNOTATION], "ci-key");
    assert_eq!(state_of(&s, now()), "running");
}

#[test]
fn a_template_boots_by_reference_and_auto_pause_sleeps_at_the_timeout() {
    let r = request(serde_json::json!({"templateID": "py", "timeout": 10, "autoPause": true}));
    let s = sandbox(&r, Boot::Template("py".into()), &tenant(), "e2b-x", now()).unwrap();
    assert_eq!(s.spec.template_ref.as_ref().unwrap().name, "py");
    assert_eq!(s.spec.image, None);
    assert_eq!(
        s.spec.lifetime.as_ref().unwrap().action,
        Some(LifetimeAction::Sleep)
    );
    assert!(auto_pauses(&s));
    assert_eq!(state_of(&s, now()), "running");
    assert_eq!(
        state_of(&s, now() + chrono::Duration::seconds(10)),
        "paused"
    );
}

#[test]
fn egress_maps_domains_under_a_deny_all() {
    let n = |j| serde_json::from_value::<NetworkConfig>(j).unwrap();
    let allow =
        n(serde_json::json!({"allowOut": ["pypi.org", "*.github.com"], "denyOut": ["0.0.0.0/0"]}));
    let e = egress(None, Some(&allow)).unwrap().unwrap();
    assert_eq!(e.allowed_domains.unwrap(), ["pypi.org", "*.github.com"]);
    let none = egress(Some(false), None).unwrap().unwrap();
    assert_eq!(none.allowed_domains.unwrap(), Vec::<String>::new());
    assert_eq!(egress(Some(true), None).unwrap(), None);
}

#[test]
fn what_cannot_be_mapped_is_refused_with_a_400_naming_it() {
    let base = |extra: serde_json::Value| {
        let mut j = serde_json::json!({"templateID": "base"});
        j.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        j
    };
    refused(
        base(serde_json::json!({"network": {"allowOut": ["8.8.8.8"], "denyOut": ["0.0.0.0/0"]}})),
        "8.8.8.8",
    );
    refused(
        base(
            serde_json::json!({"network": {"allowOut": ["10.0.0.0/8"], "denyOut": ["0.0.0.0/0"]}}),
        ),
        "CIDR",
    );
    refused(
        base(serde_json::json!({"network": {"denyOut": ["1.2.3.4/32"]}})),
        "denyOut",
    );
    refused(
        base(serde_json::json!({"network": {"allowOut": ["pypi.org"]}})),
        "restricts nothing",
    );
    refused(
        base(serde_json::json!({"network": {"maskRequestHost": "x"}})),
        "maskRequestHost",
    );
    refused(
        base(serde_json::json!({"autoResume": {"enabled": true}})),
        "autoResume",
    );
    refused(
        base(serde_json::json!({"autoPause": true, "autoPauseMemory": false})),
        "autoPauseMemory",
    );
    refused(
        base(serde_json::json!({"volumeMounts": [{"name": "v", "path": "/v"}]})),
        "volumeMounts",
    );
    refused(base(serde_json::json!({"mcp": {"x": {}}})), "mcp");
    refused(base(serde_json::json!({"envVars": {"1BAD": "x"}})), "1BAD");
    refused(base(serde_json::json!({"timeout": -1})), "timeout");
    refused(base(serde_json::json!({"somethingNew": 1})), "somethingNew");
    // What the SDK sends by default is accepted.
    let ok = base(
        serde_json::json!({"autoPause": false, "autoPauseMemory": true, "mcp": null, "envVars": {}, "metadata": {}}),
    );
    assert!(create(ok).is_ok());
}

#[test]
fn port_urls_are_restricted_unless_the_create_opens_them() {
    for closed in [
        serde_json::json!({"templateID": "base"}),
        serde_json::json!({"templateID": "base", "network": {}}),
        serde_json::json!({"templateID": "base", "network": {"allowPublicTraffic": false}}),
    ] {
        let s = create(closed.clone()).unwrap();
        assert!(restricts_traffic(&s), "{closed}");
        let annotations = s.metadata.annotations.clone().unwrap();
        assert_eq!(annotations[PUBLIC_TRAFFIC_ANNOTATION], "false", "{closed}");
    }
    let open =
        create(serde_json::json!({"templateID": "base", "network": {"allowPublicTraffic": true}}))
            .unwrap();
    assert!(!restricts_traffic(&open));
    // Fail closed: a Sandbox without the annotation, or with any other value, is restricted.
    let mut other = open.clone();
    other.metadata.annotations = None;
    assert!(restricts_traffic(&other));
    let mut typed = open;
    typed
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(PUBLIC_TRAFFIC_ANNOTATION.into(), "yes".into());
    assert!(restricts_traffic(&typed));
}

#[test]
fn a_pool_boot_is_a_claim_with_the_per_task_fields() {
    let r = request(serde_json::json!({
        "templateID": "warm", "timeout": 60, "envVars": {"A": "1"}, "metadata": {"k": "v"},
    }));
    let s = sandbox(&r, Boot::Pool("warm".into()), &tenant(), "e2b-x", now()).unwrap();
    assert_eq!(
        s.spec.warm_pool_ref.map(|p| p.name).as_deref(),
        Some("warm")
    );
    assert_eq!((s.spec.image, s.spec.template_ref), (None, None));
    assert_eq!(s.spec.env.unwrap()[0].name, "A");
    assert!(s.spec.lifetime.is_some());
    let labels = s.metadata.labels.unwrap_or_default();
    assert!(
        labels.contains_key(&metadata_label("k", "v").0),
        "{labels:?}"
    );
}

#[test]
fn a_pool_boot_refuses_egress_by_name() {
    let r = request(serde_json::json!({
        "templateID": "warm",
        "network": {"denyOut": ["0.0.0.0/0"], "allowOut": ["example.com"]},
    }));
    let e = sandbox(&r, Boot::Pool("warm".into()), &tenant(), "e2b-x", now()).unwrap_err();
    assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST);
    assert!(
        e.message.starts_with("network") && e.message.contains("\"warm\""),
        "{}",
        e.message
    );
    let closed = request(serde_json::json!({"templateID": "warm", "allow_internet_access": false}));
    assert!(
        sandbox(
            &closed,
            Boot::Pool("warm".into()),
            &tenant(),
            "e2b-x",
            now()
        )
        .is_err()
    );
}
