//! End to end on Fly Sprites: Sandbox objects in a real kube-apiserver → the operator binary
//! with a `type: sprites` provider → the Sprites double (each sprite a real local Docker
//! container). Each test has its own namespace, operator instance and double.

mod harness;

use std::collections::BTreeMap;
use std::time::Duration;

use harness::cluster::*;
use harness::metrics::{PassCount, Passes};
use harness::objects::{READY_TIMEOUT, delete_and_wait_gone, patch_spec, sandbox_id, wait_ready};
use harness::wait_for;
use harness::world::{Backend, SWEEPER, foreign_labels, token_file};
use kube::Api;
use sandbox_doubles::sprites::{self, SpritesDouble, SpritesOptions};
use sandbox_operator::api::{Sandbox, condition};
use sandbox_operator::provider::sprites::SpritesProvider;
use sandbox_operator::provider::{ExecRequest, Provider};
use serde_json::{Value, json};

/// The Sprites side of a test's world: a double and the token file the operator reads.
struct Sprites {
    double: SpritesDouble,
    token: tempfile::NamedTempFile,
}

impl Backend for Sprites {
    const NAME: &'static str = "sprites";
    const TYPE: &'static str = "sprites";

    fn settings(&self) -> String {
        format!(
            "      apiUrl: {}\n      org: e2e\n      token: {{file: {}}}\n",
            self.double.base_url,
            self.token.path().display(),
        )
    }
}

/// One test's world: a namespace (= operator instance) and a Sprites double.
type World = harness::world::World<Sprites>;

impl World {
    async fn new(prefix: &str) -> World {
        let double = sprites::spawn(SpritesOptions::new(harness::docker::base_image())).await;
        let sprites = Sprites {
            token: token_file(&double.token),
            double,
        };
        World::around(namespace(prefix).await, sprites).await
    }

    async fn shutdown(self) {
        self.backend.double.shutdown().await;
    }
}

impl Sprites {
    /// A provider at the double, as a user's own tooling would reach the sprite.
    fn provider(&self) -> SpritesProvider {
        SpritesProvider::new("e2e", &self.double.base_url, self.double.token.clone())
            .expect("a provider at the double")
    }

    /// A GET straight at the API.
    async fn get(&self, path: &str) -> Value {
        reqwest::Client::new()
            .get(format!("{}{path}", self.double.base_url))
            .bearer_auth(&self.double.token)
            .send()
            .await
            .expect("answered")
            .json()
            .await
            .expect("JSON")
    }

    /// Creates a sprite straight through the API (someone else's tooling, or a crashed
    /// operator elsewhere) with `labels` (a JSON object of strings).
    async fn plant(&self, labels: Value) -> String {
        let name = format!("planted-{:012x}", fastrand::u64(..) >> 16);
        let labels: Vec<String> = labels
            .as_object()
            .expect("labels as an object")
            .iter()
            .map(|(k, v)| format!("{k}={}", v.as_str().expect("a string label value")))
            .collect();
        let body = json!({"name": name, "labels": labels});
        reqwest::Client::new()
            .post(format!("{}/v1/sprites", self.double.base_url))
            .bearer_auth(&self.double.token)
            .json(&body)
            .send()
            .await
            .expect("plant")
            .error_for_status()
            .expect("planted");
        name
    }

    /// `DELETE /v1/sprites/…` requests the double answered, by path.
    fn deletions(&self) -> Vec<String> {
        self.double
            .requests_to("DELETE", "")
            .into_iter()
            .filter(|p| !p.contains("/fs/"))
            .collect()
    }
}

fn sprite() -> Value {
    json!({"provider": "sprites"})
}

fn ready(s: &Sandbox) -> Option<(String, String, String)> {
    let st = s.status.as_ref()?;
    condition(&st.conditions, "Ready")
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// Waits until Ready is False with `reason`, and returns its message.
async fn wait_stalled(api: &Api<Sandbox>, name: &str, reason: &str) -> String {
    wait_for(
        &format!("Sandbox {name} {reason}"),
        READY_TIMEOUT,
        || async {
            let s = api.get(name).await.map_err(|e| e.to_string())?;
            match ready(&s) {
                Some((st, r, message)) if st == "False" && r == reason => Ok(message),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await
}

/// A sprite needs no image: the Sandbox becomes Ready, the operator delivers its secret env
/// through the filesystem endpoints, commands run in the sprite it made, and deleting the
/// Sandbox deletes the sprite.
#[tokio::test(flavor = "multi_thread")]
async fn a_sprite_becomes_ready_without_an_image_takes_commands_and_files_and_is_deleted() {
    const VALUE: &str = "sprites-s3cr3t";
    let w = World::new("e2e-sprites-basic").await;
    create_secret(&w.ns, "app-secrets", None, json!({"DB_PASSWORD": VALUE})).await;
    let op = w.operator("", vec![]);
    let mut spec = sprite();
    spec["env"] = json!([{"name": "GREETING", "value": "hello"}]);
    spec["selfDeliveredEnv"] = json!({"name": "app-secrets"});
    w.apply("basic", spec);
    let api = w.api.clone();
    let s = wait_ready(&api, "basic", &op).await;
    let id = sandbox_id(&s);
    let uid = s.metadata.uid.clone().expect("uid");
    assert_eq!(
        id,
        format!("sbx-{uid}"),
        "the sprite's name is the external name"
    );
    assert_eq!(w.double.sprite_names().await, vec![id.clone()]);
    let info = w.get(&format!("/v1/sprites/{id}")).await;
    let labels: Vec<String> = serde_json::from_value(info["labels"].clone()).expect("labels");
    assert!(
        labels.contains(&format!("sandboxes.dev/owner-uid={uid}")),
        "{labels:?}"
    );
    assert_eq!(
        info["url_settings"]["auth"], "sprite",
        "a private URL: {info}"
    );
    let status = s.status.clone().expect("status");
    assert_eq!(status.provider.as_deref(), Some("sprites"));
    assert!(status.started_at.is_some());
    assert!(
        !format!("{status:?}").contains(VALUE),
        "no secret in status"
    );

    let p = w.provider();
    let files = p.files().expect("files");
    let delivered = files
        .read_file(&id, "/run/sandboxes.dev/env")
        .await
        .expect("the delivered env");
    assert!(
        String::from_utf8_lossy(&delivered).contains(VALUE),
        "delivered through the files endpoint"
    );
    let every_byte: Vec<u8> = (0..=255u8).collect();
    files
        .write_file(&id, "/tmp/bytes.bin", &every_byte, 0o600)
        .await
        .expect("write");
    let out = p
        .exec(
            &id,
            &ExecRequest::shell(
                "od -An -tx1 /tmp/bytes.bin | tr -d ' \\n' | cut -c1-8; exit 7",
                Duration::from_secs(30),
            ),
        )
        .await
        .expect("exec");
    assert_eq!(
        (out.exit_code, out.stdout.as_slice()),
        (7, &b"00010203\n"[..])
    );

    delete_and_wait_gone(&api, "basic").await;
    assert!(
        w.double.sprite_names().await.is_empty(),
        "the sprite is deleted"
    );
    assert_eq!(w.double.deletes(), 1);
    drop(op);
    w.shutdown().await;
}

/// Whether a Sandbox needs `spec.image` is its provider's call, not admission's: a sprite
/// refuses one (it boots its own base), naming the field; a Docker provider without a default
/// image stalls a Sandbox that names neither image nor template, naming `spec.image`.
#[tokio::test(flavor = "multi_thread")]
async fn whether_an_image_is_needed_is_decided_by_the_providers_type() {
    let w = World::new("e2e-sprites-image").await;
    let docker = "  - name: docker\n    type: docker\n";
    let op = w.operator(docker, vec![]);
    let api = w.api.clone();
    let mut with_image = sprite();
    with_image["image"] = json!(harness::docker::base_image());
    w.apply("imaged", with_image);
    w.apply("bare-docker", json!({"provider": "docker"}));
    let message = wait_stalled(&api, "imaged", "ProviderUnsupported").await;
    assert!(message.contains("image"), "{message}");
    assert!(message.contains("omit it"), "{message}");
    let message = wait_stalled(&api, "bare-docker", "ProviderRejected").await;
    assert!(message.contains("spec.image"), "{message}");
    assert!(w.double.sprite_names().await.is_empty(), "nothing created");
    for name in ["imaged", "bare-docker"] {
        delete_and_wait_gone(&api, name).await;
    }
    drop(op);
    w.shutdown().await;
}

/// A changed allow-list is one network-policy update of the same sprite; `status.egress` is
/// what the service reports enforcing, so it follows the change (and reads open when the
/// allow-list is removed).
#[tokio::test(flavor = "multi_thread")]
async fn a_changed_allow_list_is_replaced_in_place_and_observed() {
    let w = World::new("e2e-sprites-egress").await;
    let op = w.operator("", vec![]);
    let mut spec = sprite();
    spec["egress"] = json!({"allowedDomains": ["pypi.org"]});
    w.apply("walled", spec);
    let api = w.api.clone();
    let s = wait_ready(&api, "walled", &op).await;
    let id = sandbox_id(&s);
    let policy_path = format!("/v1/sprites/{id}/policy/network");
    let egress = s.status.and_then(|st| st.egress).expect("status.egress");
    assert_eq!(egress.state, "filtered", "{egress:?}");
    assert!(egress.detail.contains("pypi.org"), "{egress:?}");
    assert_eq!(w.get(&policy_path).await["rules"][0]["domain"], "pypi.org");
    let at_create = w.double.requests_to("POST", &policy_path).len();
    assert_eq!(at_create, 1, "the allow-list was set once at create");

    patch_spec(
        &api,
        "walled",
        json!({"egress": {"allowedDomains": ["github.com"]}}),
    )
    .await;
    let what = format!(
        "the new allow-list observed (operator log: {})",
        op.log.display()
    );
    let observed = wait_for(&what, READY_TIMEOUT, || async {
        let s = api.get("walled").await.map_err(|e| e.to_string())?;
        let st = s.status.unwrap_or_default();
        match st.egress {
            Some(e) if e.detail.contains("github.com") => Ok(e),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert_eq!(observed.state, "filtered");
    let s = wait_ready(&api, "walled", &op).await;
    assert_eq!(sandbox_id(&s), id, "replaced in place, not recreated");
    assert_eq!(w.double.creates(), 1);
    assert_eq!(
        w.double.requests_to("POST", &policy_path).len(),
        at_create + 1,
        "one policy update"
    );
    assert_eq!(
        w.get(&policy_path).await["rules"][0]["domain"],
        "github.com"
    );

    patch_spec(&api, "walled", json!({"egress": null})).await;
    wait_for("status.egress open", READY_TIMEOUT, || async {
        let s = api.get("walled").await.map_err(|e| e.to_string())?;
        match s.status.and_then(|st| st.egress) {
            Some(e) if e.state == "open" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert_eq!(w.get(&policy_path).await["rules"], json!([]));
    delete_and_wait_gone(&api, "walled").await;
    drop(op);
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crash_between_create_and_status_write_leaves_exactly_one_sprite() {
    let w = World::new("e2e-sprites-crash").await;
    w.crash_after_create("crashy", sprite(), "").await;
    let api = w.api.clone();
    assert_eq!(w.double.sprite_names().await.len(), 1, "it happened");

    let op = w.operator("", vec![]);
    let s = wait_ready(&api, "crashy", &op).await;
    let live = w.double.sprite_names().await;
    assert_eq!(live.len(), 1, "adopted, not duplicated");
    assert_eq!(w.double.creates(), 1);
    assert_eq!(sandbox_id(&s), live[0]);
    delete_and_wait_gone(&api, "crashy").await;
    drop(op);
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_sweeper_removes_orphans_and_keeps_foreign_sprites() {
    let w = World::new("e2e-sprites-sweep").await;
    let orphan = w.plant(w.orphan_labels()).await;
    let foreign = w.plant(foreign_labels()).await;
    let unlabelled = w.plant(json!({"team": "ops"})).await;
    let op = w.operator(SWEEPER, vec![]);
    let what = format!("the orphan swept (operator log: {})", op.log.display());
    wait_for(&what, READY_TIMEOUT, || async {
        let live = w.double.sprite_names().await;
        if live.contains(&orphan) {
            Err(format!("still live: {live:?}"))
        } else {
            Ok(())
        }
    })
    .await;
    let passes = PassCount::now(&op, Passes::Completed);
    passes.wait_more(2.0, "two more sweeper passes").await;
    let live = w.double.sprite_names().await;
    assert!(live.contains(&foreign), "another instance's sprite is kept");
    assert!(live.contains(&unlabelled), "an unlabelled sprite is kept");
    assert_eq!(
        w.deletions(),
        vec![format!("/v1/sprites/{orphan}")],
        "only the orphan was deleted"
    );
    drop(op);
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_revoked_token_stalls_each_object_once_and_deletes_nothing() {
    let w = World::new("e2e-sprites-revoked").await;
    let op = w.operator(SWEEPER, vec![]);
    let api = w.api.clone();
    for name in ["one", "two"] {
        w.apply(name, sprite());
    }
    for name in ["one", "two"] {
        wait_ready(&api, name, &op).await;
    }
    let sprites = w.double.sprite_names().await;
    assert_eq!(sprites.len(), 2);

    w.double.rotate_token("a-token-the-operator-does-not-have");
    let passes = PassCount::now(&op, Passes::Ended);
    for name in ["one", "two"] {
        patch_spec(
            &api,
            name,
            json!({"env": [{"name": "TOUCH", "value": "1"}]}),
        )
        .await;
    }
    for name in ["one", "two"] {
        wait_stalled(&api, name, "ProviderUnauthorized").await;
    }
    let what = "two sweeper passes after the revocation";
    passes.wait_more(2.0, what).await;

    assert_eq!(
        events_per_object(&w.ns, "ProviderUnauthorized").await,
        BTreeMap::from([("one".to_string(), 1), ("two".to_string(), 1)]),
        "one Event per object"
    );
    assert!(
        w.deletions().is_empty(),
        "no delete is even attempted on a refused token: {:?}",
        w.deletions()
    );
    assert_eq!(w.double.deletes(), 0);
    assert_eq!(w.double.sprite_names().await, sprites);
    drop(op);
    w.shutdown().await;
}

/// A checkpoint restores only its own sprite, so templates go through the store: captured
/// from one sprite by tar over exec, restored into a new sprite the same way, bytes and
/// permission bits intact.
#[tokio::test(flavor = "multi_thread")]
async fn a_template_captured_on_a_sprite_boots_a_second_sprite() {
    use sandbox_operator::api::SandboxTemplate;
    let w = World::new("e2e-sprites-tpl").await;
    let prefix = format!("e2e-{}", w.ns);
    let _objects = harness::s3::PurgePrefix(prefix.clone());
    let (store, keys) = harness::s3::store_config(&prefix);
    let op = w.operator_with("    templateStore: s3\n", &store, keys);
    let api = w.api.clone();
    w.apply("src", sprite());
    let src = wait_ready(&api, "src", &op).await;
    let src_id = sandbox_id(&src);
    let p = w.provider();
    let every_byte: Vec<u8> = (0..=255u8).collect();
    p.files()
        .expect("files")
        .write_file(&src_id, "/workspace/app/bytes.bin", &every_byte, 0o640)
        .await
        .expect("write into the source");

    let template = json!({
        "apiVersion": "sandboxes.dev/v1alpha1",
        "kind": "SandboxTemplate",
        "metadata": {"name": "tpl"},
        "spec": {"sandboxRef": {"name": "src"}, "capturePaths": ["/workspace/app"]},
    });
    apply_yaml_ok(&serde_yaml::to_string(&template).unwrap(), &w.ns);
    let templates: Api<SandboxTemplate> = Api::namespaced(client().await, &w.ns);
    let st = wait_ready(&templates, "tpl", &op)
        .await
        .status
        .expect("status");
    assert!(
        st.ref_.as_deref().is_some_and(|r| r.starts_with("s3://")),
        "captured into the store: {st:?}"
    );

    w.apply(
        "user",
        json!({"provider": "sprites", "templateRef": {"name": "tpl"}}),
    );
    let booted = wait_ready(&api, "user", &op).await;
    let user_id = sandbox_id(&booted);
    assert_ne!(user_id, src_id);
    let back = p
        .files()
        .expect("files")
        .read_file(&user_id, "/workspace/app/bytes.bin")
        .await
        .expect("restored file");
    assert_eq!(back, every_byte, "bytes unchanged");
    let mode = p
        .exec(
            &user_id,
            &ExecRequest::shell(
                "stat -c %a /workspace/app/bytes.bin",
                Duration::from_secs(30),
            ),
        )
        .await
        .expect("stat");
    assert_eq!(mode.stdout, b"640\n");
    assert_eq!(w.double.sprite_names().await.len(), 2);
    for name in ["user", "src"] {
        delete_and_wait_gone(&api, name).await;
    }
    drop(op);
    w.shutdown().await;
}
