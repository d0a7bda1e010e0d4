//! One end-to-end world for a provider the operator reaches over the network (Fly Machines,
//! Sprites, E2B through their doubles; Kubernetes on the test node): a namespace that is also
//! the operator instance, the Sandbox API in it, the operator binary configured with that one
//! provider, and the provider's far side (its double and what the operator needs to reach it).
//!
//! A test file describes its far side by implementing [`Backend`] for a type of its own and
//! adds its provider's helpers as inherent methods of that type, or of `World<ItsType>` when a
//! helper needs the namespace. The world dereferences to its backend, so a test reads
//! `w.double` whatever the provider.

use std::io::Write;
use std::ops::Deref;
use std::time::Duration;

use kube::Api;
use sandbox_operator::api::Sandbox;
use sandbox_operator::provider::labels::Owner;
use serde_json::{Value, json};

use super::cluster::{apply_yaml_ok, client};
use super::objects::{self, Logged, READY_TIMEOUT};
use super::operator::{Operator, OperatorOptions};

/// A sweeper block that passes every two seconds with a second of grace: a test sees several
/// passes within its deadlines.
pub const SWEEPER: &str = "sweeper:\n  enabled: true\n  intervalSecs: 2\n  graceSecs: 1\n";

/// The far side of one provider: what the operator's configuration says about it.
pub trait Backend {
    /// The provider's name in the configuration (what `spec.provider` names).
    const NAME: &'static str;
    /// Its `type` (also the key of its settings block).
    const TYPE: &'static str;
    /// How long a Sandbox gets to become Ready, or to be gone after a delete, on it.
    const TIMEOUT: Duration = READY_TIMEOUT;
    /// The provider's settings: YAML lines indented by six spaces, each ending in a newline.
    fn settings(&self) -> String;
}

/// One test's world around the far side `B`.
pub struct World<B> {
    /// The Sandbox namespace, also the operator instance (and where it holds its Lease).
    pub ns: String,
    /// Sandboxes in `ns`.
    pub api: Api<Sandbox>,
    /// The provider's far side.
    pub backend: B,
}

impl<B> Deref for World<B> {
    type Target = B;

    fn deref(&self) -> &B {
        &self.backend
    }
}

impl<B: Backend> World<B> {
    /// The world of namespace `ns` (made by [`super::cluster::namespace`]) around `backend`.
    pub async fn around(ns: String, backend: B) -> World<B> {
        let api = Api::namespaced(client().await, &ns);
        World { ns, api, backend }
    }

    /// The operator configuration: the one provider (with `inside` added to its entry, e.g.
    /// `    default: true\n`), then the top-level keys `after` (e.g. a sweeper block).
    pub fn config(&self, inside: &str, after: &str) -> String {
        format!(
            "providers:\n  - name: {}\n    type: {}\n{inside}    {}:\n{}{after}",
            B::NAME,
            B::TYPE,
            B::TYPE,
            self.backend.settings(),
        )
    }

    /// Starts the operator on this world with `after` added to its configuration.
    pub fn operator(&self, after: &str, env: Vec<(String, String)>) -> Operator {
        self.operator_with("", after, env)
    }

    /// [`World::operator`], with `inside` added to the provider's entry.
    pub fn operator_with(&self, inside: &str, after: &str, env: Vec<(String, String)>) -> Operator {
        let options = OperatorOptions {
            env,
            config_extra: self.config(inside, after),
            ..Default::default()
        };
        Operator::start(&self.ns, &self.ns, &options)
    }

    /// Applies the Sandbox `name` with `spec`, as a user would with `kubectl apply`.
    pub fn apply(&self, name: &str, spec: Value) {
        let manifest = json!({
            "apiVersion": "sandboxes.dev/v1alpha1",
            "kind": "Sandbox",
            "metadata": {"name": name},
            "spec": spec,
        });
        let yaml = serde_yaml::to_string(&manifest).expect("a manifest as YAML");
        apply_yaml_ok(&yaml, &self.ns);
    }

    /// Applies `name` under an operator that aborts right after the provider's create (the
    /// `after-create` failpoint; `after` as in [`World::operator`]) and returns the object as
    /// the crash left it, asserting that the process failed and recorded no sandbox id.
    pub async fn crash_after_create(&self, name: &str, spec: Value, after: &str) -> Sandbox {
        let failpoint = ("SANDBOX_OPERATOR_FAILPOINT".into(), "after-create".into());
        let mut op = self.operator(after, vec![failpoint]);
        self.apply(name, spec);
        let status = op.wait_exit(B::TIMEOUT).await;
        assert!(!status.success(), "the failpoint aborts the process");
        let s = self.api.get(name).await.expect("get");
        assert!(
            s.status
                .as_ref()
                .and_then(|st| st.sandbox_id.clone())
                .is_none(),
            "the create was not recorded"
        );
        s
    }

    /// The owner labels of a resource this world's operator made for a Sandbox that has
    /// since been deleted: what its sweeper must reclaim.
    pub fn orphan_labels(&self) -> Value {
        owner_labels(&self.ns, &self.ns, "deleted-long-ago")
    }

    /// Waits for `name` to be Ready at its current generation, within the provider's bound.
    pub async fn wait_ready(&self, name: &str, by: &impl Logged) -> Sandbox {
        objects::wait_ready_within(&self.api, name, by, B::TIMEOUT).await
    }

    /// Deletes `name` and waits, within the provider's bound, until it is gone.
    pub async fn delete_and_wait_gone(&self, name: &str) {
        objects::delete_and_wait_gone_within(&self.api, name, B::TIMEOUT).await;
    }

    /// Merges `spec` into `name`'s spec.
    pub async fn patch_spec(&self, name: &str, spec: Value) {
        objects::patch_spec(&self.api, name, spec).await;
    }
}

/// The UID of a Sandbox that no longer exists.
pub const GONE_UID: &str = "00000000-0000-4000-8000-000000000001";

/// The owner labels of a resource another operator instance made: never ours to sweep.
pub fn foreign_labels() -> Value {
    owner_labels("another-operator", "elsewhere", "thing")
}

/// The owner labels the operator instance `instance` puts on what it makes for the Sandbox
/// `namespace/name` of UID [`GONE_UID`].
fn owner_labels(instance: &str, namespace: &str, name: &str) -> Value {
    let owner = Owner {
        instance: instance.into(),
        kind: "Sandbox".into(),
        namespace: namespace.into(),
        name: name.into(),
        uid: GONE_UID.into(),
    };
    json!(owner.labels())
}

/// A file holding `token` for the operator to read (`token: {file: …}`); removed when the
/// test ends, however it ends.
pub fn token_file(token: &str) -> tempfile::NamedTempFile {
    let mut file = tempfile::NamedTempFile::new().expect("a token file");
    writeln!(file, "{token}").expect("write the token file");
    file
}
