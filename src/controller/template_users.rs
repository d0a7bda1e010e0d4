//! Which SandboxTemplates the Sandboxes name, kept from the Sandbox controller's own watch.
//!
//! The template controller needs Sandboxes for two things only: `status.inUse` (does a
//! Sandbox name this template?) and a prompt retry of a deletion waiting for its users to
//! go. Both follow from the `spec.templateRef` of each Sandbox, so the Sandbox watch feeds
//! this index as its events pass, and a template is reconciled only when its set of users
//! changes — never for a Sandbox's status writes, and without a second Sandbox watch or any
//! engine listing. Only Sandboxes that name a template take memory here.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use futures::channel::mpsc;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;

use crate::api::{Sandbox, SandboxTemplate};

/// A template's key: `(namespace, name)`.
type Key = (String, String);

#[derive(Default)]
struct Index {
    /// The template each Sandbox (by UID) names.
    by_sandbox: HashMap<String, Key>,
    /// How many Sandboxes name each template.
    users: HashMap<Key, usize>,
    /// During a relist: the Sandboxes seen so far (the rest are gone once it is done).
    relisting: Option<HashSet<String>>,
}

/// The index, and the triggers it sends the template controller.
pub struct TemplateUsers {
    index: Mutex<Index>,
    tx: mpsc::UnboundedSender<ObjectRef<SandboxTemplate>>,
    rx: Mutex<Option<mpsc::UnboundedReceiver<ObjectRef<SandboxTemplate>>>>,
}

impl Default for TemplateUsers {
    fn default() -> Self {
        let (tx, rx) = mpsc::unbounded();
        TemplateUsers {
            index: Mutex::default(),
            tx,
            rx: Mutex::new(Some(rx)),
        }
    }
}

impl TemplateUsers {
    /// Whether a Sandbox in `namespace` names template `name`.
    pub fn in_use(&self, namespace: &str, name: &str) -> bool {
        self.lock()
            .users
            .get(&(namespace.to_string(), name.to_string()))
            .is_some_and(|n| *n > 0)
    }

    /// The stream of templates whose users changed (taken once, by the template controller).
    pub fn take_triggers(&self) -> Option<mpsc::UnboundedReceiver<ObjectRef<SandboxTemplate>>> {
        self.rx.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// Follows one event of the Sandbox watch.
    pub fn observe(&self, event: &watcher::Event<Sandbox>) {
        let mut changed = Vec::new();
        {
            let mut index = self.lock();
            match event {
                watcher::Event::Init => index.relisting = Some(HashSet::new()),
                watcher::Event::InitApply(s) | watcher::Event::Apply(s) => {
                    let uid = s.uid().unwrap_or_default();
                    if let Some(seen) = index.relisting.as_mut() {
                        seen.insert(uid.clone());
                    }
                    let named = s
                        .spec
                        .template_ref
                        .as_ref()
                        .map(|r| (s.namespace().unwrap_or_default(), r.name.clone()));
                    changed.extend(index.set(&uid, named));
                }
                watcher::Event::Delete(s) => {
                    changed.extend(index.set(&s.uid().unwrap_or_default(), None));
                }
                watcher::Event::InitDone => {
                    let seen = index.relisting.take().unwrap_or_default();
                    let gone: Vec<String> = index
                        .by_sandbox
                        .keys()
                        .filter(|uid| !seen.contains(*uid))
                        .cloned()
                        .collect();
                    for uid in gone {
                        changed.extend(index.set(&uid, None));
                    }
                }
            }
        }
        for (ns, name) in changed {
            let _ = self.tx.unbounded_send(ObjectRef::new(&name).within(&ns));
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Index {
    /// Records that Sandbox `uid` names `named`; returns the templates whose users changed.
    fn set(&mut self, uid: &str, named: Option<Key>) -> Vec<Key> {
        let before = self.by_sandbox.get(uid).cloned();
        if before == named {
            return Vec::new();
        }
        let mut changed = Vec::new();
        if let Some(old) = before {
            self.by_sandbox.remove(uid);
            if let Some(n) = self.users.get_mut(&old) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    self.users.remove(&old);
                }
            }
            changed.push(old);
        }
        if let Some(new) = named {
            self.by_sandbox.insert(uid.to_string(), new.clone());
            *self.users.entry(new.clone()).or_default() += 1;
            changed.push(new);
        }
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    fn sandbox(uid: &str, template: Option<&str>) -> Sandbox {
        let mut spec = serde_json::json!({"image": "busybox"});
        if let Some(t) = template {
            spec["templateRef"] = serde_json::json!({"name": t});
        }
        serde_json::from_value(serde_json::json!({
            "apiVersion": "sandboxes.dev/v1alpha1",
            "kind": "Sandbox",
            "metadata": {"name": uid, "namespace": "ns", "uid": uid},
            "spec": spec,
        }))
        .expect("sandbox")
    }

    fn drain(
        u: &TemplateUsers,
        rx: &mut mpsc::UnboundedReceiver<ObjectRef<SandboxTemplate>>,
    ) -> Vec<String> {
        let _ = u;
        let mut out = Vec::new();
        while let Some(Some(r)) = rx.next().now_or_never() {
            out.push(r.name);
        }
        out
    }

    use futures::FutureExt;

    #[test]
    fn templates_are_triggered_only_when_their_users_change() {
        let u = TemplateUsers::default();
        let mut rx = u.take_triggers().expect("triggers");
        u.observe(&watcher::Event::Apply(sandbox("a", Some("t"))));
        assert!(u.in_use("ns", "t"));
        assert_eq!(drain(&u, &mut rx), vec!["t"]);
        // A status write (same templateRef) triggers nothing.
        u.observe(&watcher::Event::Apply(sandbox("a", Some("t"))));
        assert!(drain(&u, &mut rx).is_empty());
        u.observe(&watcher::Event::Apply(sandbox("b", None)));
        assert!(drain(&u, &mut rx).is_empty());
        // Renamed: both templates hear of it.
        u.observe(&watcher::Event::Apply(sandbox("a", Some("t2"))));
        assert_eq!(drain(&u, &mut rx), vec!["t", "t2"]);
        assert!(!u.in_use("ns", "t") && u.in_use("ns", "t2"));
        u.observe(&watcher::Event::Delete(sandbox("a", Some("t2"))));
        assert_eq!(drain(&u, &mut rx), vec!["t2"]);
        assert!(!u.in_use("ns", "t2"));
    }

    #[test]
    fn a_relist_forgets_sandboxes_deleted_while_the_watch_was_down() {
        let u = TemplateUsers::default();
        let mut rx = u.take_triggers().expect("triggers");
        u.observe(&watcher::Event::Apply(sandbox("a", Some("t"))));
        u.observe(&watcher::Event::Apply(sandbox("b", Some("t"))));
        drain(&u, &mut rx);
        u.observe(&watcher::Event::Init);
        u.observe(&watcher::Event::InitApply(sandbox("b", Some("t"))));
        u.observe(&watcher::Event::InitDone);
        assert_eq!(drain(&u, &mut rx), vec!["t"]);
        assert!(u.in_use("ns", "t"), "b still names it");
        u.observe(&watcher::Event::Delete(sandbox("b", Some("t"))));
        assert!(!u.in_use("ns", "t"));
    }
}
