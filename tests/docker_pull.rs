//! The Docker provider's image pulls against a real registry (Debian's distribution registry
//! on loopback with htpasswd auth, `tests/setup/registry.sh`) and the real engine: the pull
//! policy, credentials matched to the registry, one pull per image for concurrent creates,
//! digests, and failures sorted by what fixes them.

mod harness;

use std::time::{Duration, Instant};

use bollard::query_parameters::InspectContainerOptions;
use harness::docker::{Images, TestEnv, base_image, engine};
use harness::registry::{Registry, push_fresh_image, registry};
use harness::unique;
use sandbox_operator::provider::image::PULLING_IMAGE;
use sandbox_operator::provider::{
    CreateRequest, ErrorKind, ImagePullPolicy, Provider, ProviderError, RegistryCredential,
    SandboxDescriptor,
};

const PULL_DEADLINE: Duration = Duration::from_secs(120);

fn credential(registry: &str, password: &str, source: &str, user: &str) -> RegistryCredential {
    RegistryCredential {
        registry: registry.into(),
        username: user.into(),
        password: password.into(),
        identity_token: None,
        source: source.into(),
    }
}

/// The right credential for the shared registry, behind a decoy for another registry.
fn credentials(r: &Registry, password: &str) -> Vec<RegistryCredential> {
    vec![
        credential("registry.example.com", "decoy-password", "decoy", "x"),
        credential(&r.addr, password, "regcred", &r.user),
    ]
}

/// Creates until the pull is over: returns the final answer and how many times the provider
/// answered "still pulling" first.
async fn create_through_pull(
    env: &TestEnv,
    request: &CreateRequest,
) -> (Result<SandboxDescriptor, ProviderError>, usize) {
    let deadline = Instant::now() + PULL_DEADLINE;
    let mut pulling = 0;
    loop {
        match env.provider.create(request).await {
            Err(e) if e.reason() == PULLING_IMAGE => {
                assert!(e.is(ErrorKind::Transient), "{e}");
                pulling += 1;
                assert!(
                    Instant::now() < deadline,
                    "still pulling after {PULL_DEADLINE:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => return (other, pulling),
        }
    }
}

fn image_request(env: &TestEnv, image: &str, policy: ImagePullPolicy) -> CreateRequest {
    let mut request = env.request(&env.name("pull"));
    request.image = Some(image.to_string());
    request.image_pull_policy = policy;
    request
}

#[tokio::test]
async fn a_private_image_is_pulled_with_the_matching_credential_and_booted_by_digest() {
    let env = TestEnv::new("pull-ok").await;
    let r = registry();
    let docker = engine().await;
    let repo = unique("pull/ok");
    let digest = push_fresh_image(&docker, &base_image(), &r, &repo, "1", "ok").await;
    let image = format!("{}/{repo}:1", r.addr);
    let _cleanup = Images(vec![image.clone(), digest.clone()]);

    let mut request = image_request(&env, &image, ImagePullPolicy::IfNotPresent);
    request.registry_credentials = credentials(&r, &r.password);
    let (created, pulling) = create_through_pull(&env, &request).await;
    let created = created.expect("created after the pull");
    assert!(pulling >= 1, "the first create answers PullingImage");
    let pull = created
        .image_pull
        .clone()
        .expect("the create reports its pull");
    assert_eq!(pull.reference, image);
    assert!(pull.size_bytes.is_some_and(|s| s > 0));
    assert_eq!(created.image_digest.as_deref(), Some(digest.as_str()));
    assert_eq!(
        created.image.as_deref(),
        Some(digest.as_str()),
        "booted by digest"
    );

    let described = env.provider.describe(&created.id).await.unwrap().unwrap();
    assert_eq!(described.image_digest.as_deref(), Some(digest.as_str()));
    assert_eq!(described.image_pull, None, "only create reports a pull");

    // The credential never reaches the container's configuration.
    let inspect = docker
        .inspect_container(&created.id, None::<InspectContainerOptions>)
        .await
        .unwrap();
    let json = serde_json::to_string(&inspect).unwrap();
    assert!(!json.contains(&r.password) && !json.contains("decoy-password"));
    assert!(
        !format!("{request:?}").contains(&r.password),
        "Debug redacts"
    );

    // Present now: a second sandbox of the same image does not pull again.
    let mut again = image_request(&env, &image, ImagePullPolicy::IfNotPresent);
    again.registry_credentials = request.registry_credentials.clone();
    let gets_before = r.blob_gets(&repo).values().sum::<usize>();
    let (second, _) = create_through_pull(&env, &again).await;
    let second = second.unwrap();
    assert_eq!(second.image_digest.as_deref(), Some(digest.as_str()));
    assert_eq!(r.blob_gets(&repo).values().sum::<usize>(), gets_before);
}

#[tokio::test]
async fn refused_credentials_are_unauthorized_name_the_secret_and_create_nothing() {
    let env = TestEnv::new("pull-auth").await;
    let r = registry();
    let docker = engine().await;
    let repo = unique("pull/auth");
    let digest = push_fresh_image(&docker, &base_image(), &r, &repo, "1", "auth").await;
    let image = format!("{}/{repo}:1", r.addr);
    let _cleanup = Images(vec![image.clone(), digest]);

    let mut request = image_request(&env, &image, ImagePullPolicy::IfNotPresent);
    request.registry_credentials = credentials(&r, "not-the-password");
    let (result, _) = create_through_pull(&env, &request).await;
    let err = result.expect_err("a wrong password cannot pull");
    assert!(err.is(ErrorKind::Unauthorized), "{err}");
    assert_eq!(err.reason(), "ImagePullUnauthorized");
    assert!(err.message().contains("\"regcred\""), "{err}");
    assert!(!err.message().contains("not-the-password"), "{err}");
    assert!(
        env.provider
            .describe(&request.name)
            .await
            .unwrap()
            .is_none()
    );

    let mut anonymous = image_request(&env, &image, ImagePullPolicy::IfNotPresent);
    anonymous.registry_credentials = vec![credential("registry.example.com", "p", "decoy", "x")];
    let (result, _) = create_through_pull(&env, &anonymous).await;
    let err = result.expect_err("no credential for this registry");
    assert!(err.is(ErrorKind::Unauthorized), "{err}");
    assert!(
        err.message().contains("no Secret in spec.imagePullSecrets"),
        "{err}"
    );
}

#[tokio::test]
async fn a_missing_tag_is_not_found_and_names_the_reference() {
    let env = TestEnv::new("pull-missing").await;
    let r = registry();
    let image = format!("{}/{}:nope", r.addr, unique("pull/missing"));
    let mut request = image_request(&env, &image, ImagePullPolicy::IfNotPresent);
    request.registry_credentials = credentials(&r, &r.password);
    let (result, _) = create_through_pull(&env, &request).await;
    let err = result.expect_err("nothing to pull");
    assert!(err.is(ErrorKind::NotFound), "{err}");
    assert_eq!(err.reason(), "ImageNotFound");
    assert!(err.message().contains(&image), "{err}");
}

#[tokio::test]
async fn an_unreachable_registry_is_transient() {
    let env = TestEnv::new("pull-down").await;
    let closed = sandbox_doubles::ports::quiet_port();
    let image = format!("127.0.0.1:{closed}/down/app:1");
    let request = image_request(&env, &image, ImagePullPolicy::Always);
    let (result, pulling) = create_through_pull(&env, &request).await;
    let err = result.expect_err("nothing listens there");
    assert!(pulling >= 1);
    assert!(err.is(ErrorKind::Transient), "{err}");
    assert_eq!(err.reason(), "RegistryUnavailable");
    assert!(err.message().contains(&image), "{err}");
}

#[tokio::test]
async fn local_images_are_never_pulled_under_if_not_present_or_never() {
    let env = TestEnv::new("pull-local").await;
    let r = registry();
    for policy in [ImagePullPolicy::IfNotPresent, ImagePullPolicy::Never] {
        let mut request = image_request(&env, &base_image(), policy);
        // Credentials for an unreachable registry: a pull attempt would fail.
        request.registry_credentials = vec![credential("docker.io", "p", "hub", "x")];
        let created = env.provider.create(&request).await.expect("no pull needed");
        assert_eq!(created.image_pull, None, "{policy:?}");
        assert_eq!(created.image.as_deref(), Some(base_image().as_str()));
        assert!(
            created
                .image_digest
                .as_deref()
                .is_some_and(|d| d.starts_with("sha256:")),
            "a local image's digest is its image id: {:?}",
            created.image_digest
        );
    }

    let repo = unique("pull/never");
    let absent = format!("{}/{repo}:1", r.addr);
    let request = image_request(&env, &absent, ImagePullPolicy::Never);
    let err = env
        .provider
        .create(&request)
        .await
        .expect_err("not present");
    assert!(err.is(ErrorKind::NotFound), "{err}");
    assert_eq!(err.reason(), "ImageNotPresent");
    assert!(err.message().contains("imagePullPolicy is Never"), "{err}");
    assert_eq!(
        r.manifest_requests(&repo),
        0,
        "Never never asks the registry"
    );
}

#[tokio::test]
async fn concurrent_creates_of_one_new_image_share_one_pull() {
    let env = TestEnv::new("pull-shared").await;
    let r = registry();
    let docker = engine().await;
    let repo = unique("pull/shared");
    let digest = push_fresh_image(&docker, &base_image(), &r, &repo, "1", "shared").await;
    let image = format!("{}/{repo}:1", r.addr);
    let _cleanup = Images(vec![image.clone(), digest.clone()]);
    assert!(
        r.blob_gets(&repo).is_empty(),
        "nothing pulled the image yet"
    );

    let requests: Vec<CreateRequest> = (0..20)
        .map(|_| {
            let mut request = image_request(&env, &image, ImagePullPolicy::IfNotPresent);
            request.registry_credentials = credentials(&r, &r.password);
            request
        })
        .collect();
    let results =
        futures::future::join_all(requests.iter().map(|rq| create_through_pull(&env, rq))).await;
    let mut durations = Vec::new();
    for (result, _) in results {
        let created = result.expect("created");
        assert_eq!(created.image_digest.as_deref(), Some(digest.as_str()));
        durations.push(
            created
                .image_pull
                .expect("each create waited for the pull")
                .duration,
        );
    }
    durations.dedup();
    assert_eq!(durations.len(), 1, "one pull, shared: {durations:?}");

    let gets = r.blob_gets(&repo);
    assert!(!gets.is_empty(), "the image was pulled");
    assert!(
        gets.values().all(|n| *n == 1),
        "every blob fetched once: {gets:?}"
    );
}

#[tokio::test]
async fn always_pulls_again_and_boots_the_moved_tag() {
    let env = TestEnv::new("pull-always").await;
    let r = registry();
    let docker = engine().await;
    let repo = unique("pull/always");
    let first = push_fresh_image(&docker, &base_image(), &r, &repo, "1", "first").await;
    let image = format!("{}/{repo}:1", r.addr);
    let mut cleanup = Images(vec![image.clone(), first.clone()]);

    let mut request = image_request(&env, &image, ImagePullPolicy::Always);
    request.registry_credentials = credentials(&r, &r.password);
    let (a, _) = create_through_pull(&env, &request).await;
    assert_eq!(a.unwrap().image_digest.as_deref(), Some(first.as_str()));

    let second = push_fresh_image(&docker, &base_image(), &r, &repo, "1", "second").await;
    cleanup.0.push(second.clone());
    assert_ne!(first, second);
    // A later create resolves the tag again: the moved tag is booted, the running sandbox
    // is left alone.
    let mut later = image_request(&env, &image, ImagePullPolicy::Always);
    later.registry_credentials = request.registry_credentials.clone();
    let (b, pulling) = create_through_pull(&env, &later).await;
    assert!(
        pulling >= 1,
        "Always pulls although the engine has the tag's old image"
    );
    assert_eq!(b.unwrap().image_digest.as_deref(), Some(second.as_str()));
    let first_sandbox = env.provider.describe(&request.name).await.unwrap().unwrap();
    assert_eq!(first_sandbox.image_digest.as_deref(), Some(first.as_str()));
}
