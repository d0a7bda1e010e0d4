use super::*;
use crate::api::SandboxSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

fn sandbox(name: &str, secs: i64, meta: &[(&str, &str)], paused: bool) -> Sandbox {
    let mut s = Sandbox::new(name, SandboxSpec::default());
    s.metadata.namespace = Some("a".into());
    s.metadata.creation_timestamp = Some(Time(
        k8s_openapi::jiff::Timestamp::from_second(secs).unwrap(),
    ));
    let m: BTreeMap<String, String> = meta
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    s.metadata.labels = Some([(MANAGED_LABEL.to_string(), "true".to_string())].into());
    s.metadata.annotations = Some(
        [(
            mapping::METADATA_ANNOTATION.to_string(),
            serde_json::to_string(&m).unwrap(),
        )]
        .into(),
    );
    if paused {
        s.spec.state = Some(crate::api::DesiredState::Sleeping);
    }
    s
}

fn names(items: &[Sandbox]) -> Vec<String> {
    items.iter().map(|s| s.name_any()).collect()
}

#[test]
fn the_sdks_metadata_query_decodes_twice() {
    // Sandbox.list(query=SandboxQuery(metadata={"run id": "a&b"})) sends this.
    let q = parse("metadata=run%2520id%3Da%2526b&state=running,paused&limit=2").unwrap();
    assert_eq!(q.metadata["run id"], "a&b");
    assert_eq!(q.states, ["running", "paused"]);
    assert_eq!(q.limit, 2);
    assert!(selector(&q).starts_with("e2b.sandboxes.dev/sandbox=true,meta.e2b.sandboxes.dev/k"));
    for bad in [
        "limit=0",
        "limit=101",
        "state=dead",
        "order=up",
        "nextToken=%%%",
    ] {
        assert_eq!(
            parse(bad).unwrap_err().status,
            axum::http::StatusCode::BAD_REQUEST,
            "{bad}"
        );
    }
}

#[test]
fn pages_follow_start_time_and_filters_are_exact() {
    let now = Utc::now();
    let items = vec![
        sandbox("e2b-aaaaaaaaaaa1", 100, &[("user", "alice")], false),
        sandbox("e2b-aaaaaaaaaaa2", 300, &[("user", "alice")], true),
        sandbox("e2b-aaaaaaaaaaa3", 200, &[("user", "alice")], false),
        sandbox("e2b-aaaaaaaaaaa4", 400, &[("user", "bob")], false),
    ];
    let mut q = parse("metadata=user%3Dalice&limit=2").unwrap();
    let (first, next) = page(items.clone(), &q, now);
    assert_eq!(names(&first), ["e2b-aaaaaaaaaaa2", "e2b-aaaaaaaaaaa3"]);
    q.after = Some(cursor(&next.unwrap()).unwrap());
    let (second, next) = page(items.clone(), &q, now);
    assert_eq!(names(&second), ["e2b-aaaaaaaaaaa1"]);
    assert_eq!(next, None);
    let running = parse("state=running&order=asc").unwrap();
    let (all, _) = page(items.clone(), &running, now);
    assert_eq!(
        names(&all),
        ["e2b-aaaaaaaaaaa1", "e2b-aaaaaaaaaaa3", "e2b-aaaaaaaaaaa4"]
    );
    let mut foreign = items[0].clone();
    foreign.metadata.labels = None;
    assert!(
        page(
            vec![foreign],
            &Query {
                limit: 10,
                ..Query::default()
            },
            now
        )
        .0
        .is_empty()
    );
}

#[test]
fn a_killed_sandbox_leaves_the_list_at_once() {
    let mut killed = sandbox("e2b-aaaaaaaaaaa5", 100, &[], false);
    killed.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
    let all = Query {
        limit: 10,
        ..Query::default()
    };
    let kept = sandbox("e2b-aaaaaaaaaaa6", 200, &[], false);
    let (items, _) = page(vec![killed, kept], &all, Utc::now());
    assert_eq!(names(&items), ["e2b-aaaaaaaaaaa6"]);
}
