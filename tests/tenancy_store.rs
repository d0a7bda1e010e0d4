//! Tenancy: a template in the shared S3 store belongs to the namespace that wrote it.
//!
//! Against the real SigV4-checking S3 server (tests/setup/s3.sh) and the real engine:
//! namespace `b` can neither fetch nor boot from a template of namespace `a` unless `a`
//! shares it (`spec.sharedWith`, recorded in the manifest), and a capture from `b` never
//! replaces `a`'s manifest or archive. The provider without image commit (Fly, E2B) is
//! Docker with its templates hidden; the native provider is Docker itself.

mod harness;

use std::sync::Arc;
use std::time::Duration;

use harness::docker::TestEnv;
use harness::no_native_templates::NoNativeTemplates;
use harness::s3::{PurgePrefix, put_owned_template, store};
use harness::unique;
use sandbox_operator::provider::labels::Owner;
use sandbox_operator::provider::{CommitRequest, ErrorKind, Provider, ProviderError};
use sandbox_operator::templates::manifest::{Keys, ManifestOwner};
use sandbox_operator::templates::service::{Boot, TemplateService};
use sandbox_operator::templates::store::TemplateStore;
use sandbox_operator::templates::transfer::{self, Limits, NOT_SHARED, OWNED_ELSEWHERE};

const APP: &str = "/workspace/app";
/// The archive `a` stored: not a tarball, never restored here, compared byte for byte.
const A_ARCHIVE: &str = "archive of namespace a";

fn service(store: Arc<TemplateStore>) -> TemplateService {
    let mut service = TemplateService::new(Limits {
        transfer: Duration::from_secs(300),
        ..Limits::default()
    });
    service.assign("docker-test", &store.settings().name);
    service.add_store(store);
    service
}

fn owner(env: &TestEnv, namespace: &str) -> Owner {
    Owner {
        namespace: namespace.into(),
        ..env.owner("SandboxTemplate", "tpl")
    }
}

/// Puts `a`'s template into the store as the control plane writes it.
async fn put_template_of(store: &TemplateStore, id: &str, a: &Owner) {
    let owner = ManifestOwner {
        namespace: a.namespace.clone(),
        uid: a.uid.clone(),
    };
    put_owned_template(store, id, owner, a.labels(), A_ARCHIVE).await;
}

/// Two namespaces, a store of the test's own, and `a`'s template in it.
struct World {
    env: TestEnv,
    store: Arc<TemplateStore>,
    service: TemplateService,
    fly: NoNativeTemplates,
    a: Owner,
    b: Owner,
    id: String,
    _objects: PurgePrefix,
}

impl World {
    async fn new(test: &str) -> World {
        let env = TestEnv::with_store(test).await;
        let prefix = unique(&format!("t-{test}"));
        let store = Arc::new(store(&prefix, None));
        let (a, b) = (owner(&env, "team-a"), owner(&env, "team-b"));
        let id = unique("tpl-a");
        put_template_of(&store, &id, &a).await;
        World {
            service: service(store.clone()),
            fly: NoNativeTemplates(env.provider.clone()),
            env,
            store,
            a,
            b,
            id,
            _objects: PurgePrefix(prefix),
        }
    }
}

fn assert_refused<T: std::fmt::Debug>(result: Result<T, ProviderError>, reason: &str, what: &str) {
    let err = result.expect_err(what);
    assert!(err.is(ErrorKind::Invalid), "{what}: {err:?}");
    assert_eq!(err.reason(), reason, "{what}: {err:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn another_namespace_cannot_fetch_or_boot_an_unshared_template() {
    let World {
        env,
        store: _,
        service,
        fly,
        a,
        b,
        id,
        _objects,
    } = World::new("tenancy-read").await;

    // The owner's namespace reads it.
    assert!(
        service
            .fetch(&fly, &id, &a)
            .await
            .expect("a fetches")
            .is_some()
    );
    // Another namespace does not: not as a Store template, not as a boot, not onto a
    // native provider (refused before any helper sandbox is made).
    assert_refused(
        service.fetch(&fly, &id, &b).await,
        NOT_SHARED,
        "b fetches a's template",
    );
    assert_refused(
        service.boot(&fly, &id, &b).await,
        NOT_SHARED,
        "b boots from a's template",
    );
    let native = service.fetch(&env.provider, &id, &b).await;
    let message = native.as_ref().map(|_| ()).unwrap_err().to_string();
    assert!(
        message.contains("team-a") && message.contains("spec.sharedWith"),
        "the refusal names the owner, the field and the fix: {message}"
    );
    assert_refused(native, NOT_SHARED, "b fetches a's template onto Docker");

    // Shared by its owner, b may read it; revoked, b may not any more.
    let shared = vec!["team-b".to_string()];
    assert!(
        service
            .share(&fly, &id, &a, &shared)
            .await
            .expect("a shares")
    );
    let boot = service
        .boot(&fly, &id, &b)
        .await
        .expect("b boots a shared template");
    assert!(matches!(boot, Some(Boot::Restore { .. })), "{boot:?}");
    assert_refused(
        service.share(&fly, &id, &b, &[]).await,
        OWNED_ELSEWHERE,
        "only the owner changes the sharing",
    );
    assert!(service.share(&fly, &id, &a, &[]).await.expect("a revokes"));
    assert_refused(service.fetch(&fly, &id, &b).await, NOT_SHARED, "revoked");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_capture_never_overwrites_another_namespaces_template() {
    let World {
        env,
        store,
        service,
        fly,
        a: _,
        b,
        id,
        _objects,
    } = World::new("tenancy-write").await;
    let prefix = store.settings().prefix.clone();
    let keys = Keys::new(&prefix, &id);
    let manifest_before = store.get_text(&keys.manifest()).await.expect("manifest");

    // b captures a sandbox of its own under a's id (publish of a Store-kept template).
    let source = env.name("tenancy-src");
    fly.create(&env.request(&source)).await.expect("create");
    fly.start(&source).await.expect("start");
    let request = CommitRequest {
        sandbox_id: source.clone(),
        template_id: id.clone(),
        capture_paths: vec![APP.into()],
        label: None,
        owner: b.clone(),
        env: Default::default(),
        secret_files: Vec::new(),
    };
    env.provider
        .exec(
            &source,
            &sandbox_operator::provider::ExecRequest::shell(
                "mkdir -p /workspace/app && echo b > /workspace/app/f",
                Duration::from_secs(60),
            ),
        )
        .await
        .expect("write b's file");
    let shared = vec!["team-b".to_string()];
    assert_refused(
        service.commit(&fly, &request, &shared).await,
        OWNED_ELSEWHERE,
        "b captures over a's template",
    );
    assert_eq!(
        store.get_text(&keys.archive()).await.expect("archive"),
        Some(A_ARCHIVE.to_string()),
        "a's archive is untouched"
    );
    assert_eq!(
        store.get_text(&keys.manifest()).await.expect("manifest"),
        manifest_before,
        "a's manifest is untouched"
    );

    // The same capture under an id of b's own is stored, owned by b and shared as asked.
    let own = CommitRequest {
        template_id: unique("tpl-b"),
        ..request
    };
    service
        .commit(&fly, &own, &shared)
        .await
        .expect("b captures its own");
    let m = transfer::manifest(&store, &own.template_id)
        .await
        .expect("read")
        .expect("b's manifest");
    assert_eq!(
        m.owner,
        Some(ManifestOwner {
            namespace: "team-b".into(),
            uid: b.uid.clone(),
        })
    );
    assert_eq!(m.shared_with, shared);
}
