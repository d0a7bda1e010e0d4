//! The sweeper against the real Docker engine and the real API server.
//!
//! Each test has its own namespace and operator-instance name, plants provider resources
//! that must be reclaimed next to look-alikes that must survive, runs passes, and asserts
//! the exact survivors. No operator process runs in most of these tests: the owning objects
//! are plain API objects, so nothing but the sweeper acts on the provider.
//!
//! Ages without sleeping: every resource that must be "old" is planted first, then the
//! [`cut`] is taken, then the resources that must be "young"; a pass judged at
//! `cut + grace` sees the first group at least `grace` old and the second younger than
//! `grace` (the engine and the test share one clock). Listings report creation times in
//! whole seconds and the sweeper rounds ages down, so the cut is a whole second after the
//! old group and the young group is planted once the clock has passed it.

mod harness;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bollard::models::{ContainerCreateBody, HostConfig, Mount, MountType};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, InspectContainerOptions, StartContainerOptions,
};
use chrono::Utc;
use harness::cluster::{client, kubeconfig, namespace};
use harness::docker::base_image;
use harness::metrics::has_line;
use harness::{unique, wait_for};
use k8s_openapi::api::events::v1::Event as K8sEvent;
use kube::Api;
use kube::api::{ListParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use sandbox_operator::api::{Sandbox, SandboxTemplate, SandboxVolume};
use sandbox_operator::config::SweeperConfig;
use sandbox_operator::controller::sweeper::Sweeper;
use sandbox_operator::controller::sweeper::report::{Action, Outcome, PassReport};
use sandbox_operator::metrics::Metrics;
use sandbox_operator::provider::docker::{DockerProvider, DockerSettings};
use sandbox_operator::provider::labels::{Owner, RECLAIM_POLICY};
use sandbox_operator::provider::{
    CommitRequest, CreateRequest, ExecOutput, ExecRequest, Provider, ProviderError, ProviderResult,
    Resources, RestartPolicy, SandboxDescriptor, SandboxQuery, Template, Templates, VolumeInfo,
    VolumeQuery, Volumes,
};
use sandbox_operator::registry::ProviderHandle;

/// The grace period the library-level tests judge with.
const GRACE: Duration = Duration::from_secs(3600);

/// The cut between the "old" and the "young" resources of a test (see the module docs): the
/// next whole second after now — a listing reports whatever was created before this call at
/// least a second before the cut, which the sweeper's rounded-down age needs — returned once
/// the clock has reached it, so whatever is created after the call is not older than it.
async fn cut() -> chrono::DateTime<Utc> {
    use chrono::DurationRound;
    let now = Utc::now();
    let cut = now
        .duration_trunc(chrono::TimeDelta::seconds(1))
        .expect("truncate to seconds")
        + chrono::TimeDelta::seconds(1);
    wait_for(
        "the clock to pass the cut",
        Duration::from_secs(5),
        || async {
            if Utc::now() >= cut {
                Ok(())
            } else {
                Err(format!("now {} < cut {cut}", Utc::now()))
            }
        },
    )
    .await;
    cut
}

/// The template repository the Docker provider tags templates into (its default).
const TEMPLATE_REPO: &str = "sandbox-operator/template";

/// Removes everything a test planted — by name, and by instance label as a net — and its
/// namespace, also when the test panicked.
#[derive(Default)]
struct Cleanup {
    containers: Vec<String>,
    volumes: Vec<String>,
    images: Vec<String>,
    instances: Vec<String>,
    namespace: Option<String>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let docker = |args: &[&str]| {
            let _ = Command::new("docker").args(args).output();
        };
        let labelled = |what: &[&str], instance: &str| -> Vec<String> {
            let filter = format!("label=sandboxes.dev/managed-by={instance}");
            let mut args = what.to_vec();
            args.extend(["--filter", filter.as_str()]);
            Command::new("docker")
                .args(&args)
                .output()
                .map(|o| {
                    String::from_utf8_lossy(&o.stdout)
                        .split_whitespace()
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default()
        };
        let mut containers = self.containers.clone();
        let mut volumes = self.volumes.clone();
        for instance in &self.instances {
            containers.extend(labelled(&["ps", "-aq"], instance));
            volumes.extend(labelled(&["volume", "ls", "-q"], instance));
        }
        for chunk in containers.chunks(100) {
            let mut args = vec!["rm", "-f", "-v"];
            args.extend(chunk.iter().map(String::as_str));
            docker(&args);
        }
        for image in &self.images {
            docker(&["rmi", "-f", image]);
        }
        for chunk in volumes.chunks(100) {
            let mut args = vec!["volume", "rm", "-f"];
            args.extend(chunk.iter().map(String::as_str));
            docker(&args);
        }
        if let Some(ns) = &self.namespace {
            let _ = harness::cluster::kubectl(&["delete", "namespace", ns, "--wait=false"], None);
        }
    }
}

/// One test's world: namespace, instance, provider, clients, and what it planted.
struct World {
    ns: String,
    instance: String,
    provider: DockerProvider,
    docker: bollard::Docker,
    client: kube::Client,
    cleanup: Cleanup,
    /// A never-started foreign container templates are committed from.
    template_source: Option<String>,
}

/// Where a planted resource lives, to check whether it survived.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Res {
    Container(String),
    Volume(String),
    Template(String),
}

impl Res {
    /// The `kind/id` a report's `reclaimed()` uses.
    fn key(&self) -> String {
        match self {
            Res::Container(id) => format!("sandbox/{id}"),
            Res::Volume(id) => format!("volume/{id}"),
            Res::Template(id) => format!("template/{id}"),
        }
    }
}

impl World {
    async fn new(prefix: &str) -> World {
        let ns = namespace(prefix).await;
        let instance = unique(&format!("{prefix}-i"));
        let provider = DockerProvider::connect_negotiated(
            "docker",
            DockerSettings {
                default_image: Some(base_image()),
                ..Default::default()
            },
        )
        .await
        .expect("the Docker engine answers (run tests/setup/docker.sh)");
        let mut cleanup = Cleanup::default();
        cleanup.instances.push(instance.clone());
        cleanup.namespace = Some(ns.clone());
        World {
            ns,
            instance,
            provider,
            docker: harness::docker::engine().await,
            client: client().await,
            cleanup,
            template_source: None,
        }
    }

    fn handle(&self, metrics: &Metrics) -> ProviderHandle {
        ProviderHandle::new(
            Arc::new(self.provider.clone()),
            16,
            Duration::from_secs(120),
            metrics.clone(),
        )
    }

    fn sweeper(&self, metrics: &Metrics, grace: Duration, max: usize) -> Sweeper {
        let config = SweeperConfig {
            enabled: true,
            interval_secs: 300,
            grace_secs: grace.as_secs(),
            dry_run: false,
            max_deletions_per_pass: max,
        };
        Sweeper::new(
            self.client.clone(),
            metrics.clone(),
            &self.instance,
            &config,
        )
    }

    /// An owner in this world whose object does not exist.
    fn ghost(&self, kind: &str, name: &str) -> Owner {
        Owner {
            instance: self.instance.clone(),
            kind: kind.into(),
            namespace: self.ns.clone(),
            name: name.into(),
            uid: unique("uid"),
        }
    }

    /// Creates an API object and returns it as an owner (with its real UID).
    async fn live(&self, kind: &str, name: &str) -> Owner {
        let meta = serde_json::json!({"name": name, "namespace": self.ns});
        let pp = PostParams::default();
        let uid = match kind {
            "Sandbox" => {
                let obj: Sandbox = serde_json::from_value(serde_json::json!({
                    "apiVersion": "sandboxes.dev/v1alpha1", "kind": "Sandbox", "metadata": meta,
                    "spec": {"image": base_image()}
                }))
                .expect("sandbox");
                Api::<Sandbox>::namespaced(self.client.clone(), &self.ns)
                    .create(&pp, &obj)
                    .await
                    .expect("create Sandbox")
                    .metadata
                    .uid
            }
            "SandboxVolume" => {
                let obj: SandboxVolume = serde_json::from_value(serde_json::json!({
                    "apiVersion": "sandboxes.dev/v1alpha1", "kind": "SandboxVolume", "metadata": meta,
                    "spec": {"reclaimPolicy": "Delete"}
                }))
                .expect("volume");
                Api::<SandboxVolume>::namespaced(self.client.clone(), &self.ns)
                    .create(&pp, &obj)
                    .await
                    .expect("create SandboxVolume")
                    .metadata
                    .uid
            }
            _ => {
                let obj: SandboxTemplate = serde_json::from_value(serde_json::json!({
                    "apiVersion": "sandboxes.dev/v1alpha1", "kind": "SandboxTemplate", "metadata": meta,
                    "spec": {"sandboxRef": {"name": "whatever"}, "capturePaths": ["/data"]}
                }))
                .expect("template");
                Api::<SandboxTemplate>::namespaced(self.client.clone(), &self.ns)
                    .create(&pp, &obj)
                    .await
                    .expect("create SandboxTemplate")
                    .metadata
                    .uid
            }
        };
        Owner {
            instance: self.instance.clone(),
            kind: kind.into(),
            namespace: self.ns.clone(),
            name: name.into(),
            uid: uid.expect("the API server sets a UID"),
        }
    }

    /// A sandbox created by the provider with `owner`'s labels; started or never started.
    async fn container(&mut self, owner: &Owner, started: bool) -> Res {
        self.container_from(owner, started, None).await
    }

    /// Like [`World::container`], booted from `template` when given.
    async fn container_from(
        &mut self,
        owner: &Owner,
        started: bool,
        template: Option<&str>,
    ) -> Res {
        let name = unique("sw-c");
        self.cleanup.containers.push(name.clone());
        let request = CreateRequest {
            name: name.clone(),
            owner: owner.clone(),
            image: Some(base_image()),
            template: template.map(str::to_string),
            command: None,
            restart_policy: RestartPolicy::Never,
            env: BTreeMap::new(),
            labels: BTreeMap::new(),
            resources: Resources::default(),
            ports: vec![],
            volumes: vec![],
            allowed_domains: None,
            idle_action: None,
            image_pull_policy: Default::default(),
            registry_credentials: Vec::new(),
            secret_env_keys: Default::default(),
        };
        self.provider
            .create(&request)
            .await
            .expect("create sandbox");
        if started {
            self.provider.start(&name).await.expect("start sandbox");
        }
        Res::Container(name)
    }

    /// A container without any of our labels, optionally mounting volumes and running a
    /// command to completion (so it ends up stopped, not never-started).
    async fn foreign(&mut self, image: &str, mounts: &[String], run: Option<&[&str]>) -> String {
        let name = unique("sw-foreign");
        self.cleanup.containers.push(name.clone());
        let body = ContainerCreateBody {
            image: Some(image.to_string()),
            cmd: run.map(|argv| argv.iter().map(|s| s.to_string()).collect()),
            host_config: Some(HostConfig {
                mounts: Some(
                    mounts
                        .iter()
                        .map(|v| Mount {
                            typ: Some(MountType::VOLUME),
                            source: Some(v.clone()),
                            target: Some(format!("/mnt/{v}")),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        };
        let options = CreateContainerOptionsBuilder::default().name(&name).build();
        self.docker
            .create_container(Some(options), body)
            .await
            .expect("create foreign container");
        if run.is_some() {
            self.docker
                .start_container(&name, None::<StartContainerOptions>)
                .await
                .expect("start foreign container");
            let docker = self.docker.clone();
            let probe = name.clone();
            wait_for(&format!("{name} to exit"), Duration::from_secs(30), || {
                let docker = docker.clone();
                let probe = probe.clone();
                async move {
                    let c = docker
                        .inspect_container(&probe, None::<InspectContainerOptions>)
                        .await
                        .map_err(|e| e.to_string())?;
                    let state = c.state.unwrap_or_default();
                    match (state.running, state.started_at.as_deref()) {
                        (Some(false), Some(t)) if !t.starts_with("0001") => Ok(()),
                        other => Err(format!("{other:?}")),
                    }
                }
            })
            .await;
        }
        name
    }

    /// A labelled volume owned by `owner`, with a reclaim-policy label when given.
    async fn volume(&mut self, owner: &Owner, policy: Option<&str>) -> Res {
        let name = unique("sw-v");
        self.cleanup.volumes.push(name.clone());
        let mut labels = owner.labels();
        if let Some(p) = policy {
            labels.insert(RECLAIM_POLICY.into(), p.into());
        }
        let volumes = self.provider.volumes().expect("docker has volumes");
        volumes
            .create_volume(&name, &labels)
            .await
            .expect("create volume");
        Res::Volume(name)
    }

    /// A template owned by `owner`, committed through the provider.
    async fn template(&mut self, owner: &Owner) -> Res {
        let source = match &self.template_source {
            Some(s) => s.clone(),
            None => {
                let s = self.foreign(&base_image(), &[], None).await;
                self.template_source = Some(s.clone());
                s
            }
        };
        let id = unique("sw-t");
        self.cleanup.images.push(format!("{TEMPLATE_REPO}:{id}"));
        let templates = self.provider.templates().expect("docker has templates");
        templates
            .commit(&CommitRequest {
                sandbox_id: source,
                template_id: id.clone(),
                capture_paths: vec![],
                label: None,
                owner: owner.clone(),
                env: Default::default(),
                secret_files: Vec::new(),
            })
            .await
            .expect("commit template");
        Res::Template(id)
    }

    async fn exists(&self, res: &Res) -> bool {
        match res {
            Res::Container(id) => self
                .docker
                .inspect_container(id, None::<InspectContainerOptions>)
                .await
                .is_ok(),
            Res::Volume(id) => self.docker.inspect_volume(id).await.is_ok(),
            Res::Template(id) => self
                .docker
                .inspect_image(&format!("{TEMPLATE_REPO}:{id}"))
                .await
                .is_ok(),
        }
    }

    /// Asserts which of `all` exist, naming every mismatch at once.
    async fn assert_exactly(&self, survivors: &[&Res], gone: &[&Res], when: &str) {
        let mut wrong = Vec::new();
        for r in survivors {
            if !self.exists(r).await {
                wrong.push(format!("{r:?} should have survived"));
            }
        }
        for r in gone {
            if self.exists(r).await {
                wrong.push(format!("{r:?} should be gone"));
            }
        }
        assert!(wrong.is_empty(), "{when}: {}", wrong.join("; "));
    }

    /// Events in this world's namespace: (reason, regarding name, regarding uid).
    async fn events(&self) -> Vec<(String, String, String)> {
        let api: Api<K8sEvent> = Api::namespaced(self.client.clone(), &self.ns);
        let list = api.list(&ListParams::default()).await.expect("list events");
        list.items
            .into_iter()
            .map(|e| {
                let r = e.regarding.unwrap_or_default();
                (
                    e.reason.unwrap_or_default(),
                    r.name.unwrap_or_default(),
                    r.uid.unwrap_or_default(),
                )
            })
            .collect()
    }
}

fn keys(res: &[&Res]) -> Vec<String> {
    let mut out: Vec<String> = res.iter().map(|r| r.key()).collect();
    out.sort();
    out
}

fn row<'a>(
    report: &'a PassReport,
    res: &Res,
) -> &'a sandbox_operator::controller::sweeper::report::Row {
    report
        .rows
        .iter()
        .find(|r| format!("{}/{}", r.kind, r.id) == res.key())
        .unwrap_or_else(|| panic!("no row for {res:?} in\n{}", report.render_table()))
}

/// A pass enumerates with one container list call (no inspect per container, however many
/// there are), still tells wreckage from what once ran, and describes each candidate it
/// would delete once, right before (never the ones it keeps): counted through a proxy in
/// front of the engine.
#[tokio::test(flavor = "multi_thread")]
async fn a_pass_enumerates_with_list_calls_only() {
    let mut w = World::new("sweep-list").await;
    let ghost = w.ghost("Sandbox", "ghost");
    let ran = [
        w.container(&ghost, true).await,
        w.container(&ghost, true).await,
    ];
    let never_ran = [
        w.container(&ghost, false).await,
        w.container(&ghost, false).await,
    ];
    let now = cut().await + GRACE;
    let proxy = harness::engine_proxy::EngineProxy::start().await;
    let counted = DockerProvider::connect_negotiated(
        "docker",
        DockerSettings {
            endpoint: Some(proxy.endpoint.clone()),
            default_image: Some(base_image()),
            ..Default::default()
        },
    )
    .await
    .expect("a provider behind the counting proxy");
    let metrics = Metrics::new();
    let handle = ProviderHandle::new(
        Arc::new(counted),
        16,
        Duration::from_secs(120),
        metrics.clone(),
    );
    let report = w
        .sweeper(&metrics, GRACE, 100)
        .with_dry_run(true)
        .pass_at(&handle, now)
        .await;
    let table = report.render_table();
    assert_eq!(report.outcome, Outcome::Completed, "{table}");
    let inspects = proxy.count(|k| k == "GET /containers/{id}/json");
    let lists = proxy.count(|k| k == "GET /containers/json");
    // One container listing serves the sandboxes, the volumes' holders and the templates'
    // users (the Docker provider's `inventory`); each of the four reclaimable sandboxes is
    // then described by itself before the (dry-run) deletion.
    assert_eq!(
        (lists, inspects),
        (1, 4),
        "one container list call per pass, one inspect per deletion: {:#?}",
        proxy.counts()
    );
    assert_eq!(report.reclaimed().len(), 4, "{table}");
    for r in &never_ran {
        assert!(row(&report, r).why.contains("never started"), "{table}");
    }
    for r in &ran {
        assert!(!row(&report, r).why.contains("never started"), "{table}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pass_reclaims_exactly_orphans_wreckage_unattached_volumes_and_unused_templates() {
    let mut w = World::new("sweep-exact").await;
    let live = w.live("Sandbox", "live").await;
    let live_volume = w.live("SandboxVolume", "keep-volume").await;
    let live_template = w.live("SandboxTemplate", "keep-template").await;
    let ghost = w.ghost("Sandbox", "ghost");
    let recreated = Owner {
        uid: unique("old-uid"),
        ..live.clone()
    };
    let gone_volume = w.ghost("SandboxVolume", "gone-volume");
    let gone_template = w.ghost("SandboxTemplate", "gone-template");
    let other_instance = Owner {
        instance: unique("other"),
        ..w.ghost("Sandbox", "theirs")
    };
    w.cleanup.instances.push(other_instance.instance.clone());

    // Must be reclaimed.
    let orphan = w.container(&ghost, true).await;
    let orphan_of_recreated = w.container(&recreated, true).await;
    let wreckage_ownerless = w.container(&ghost, false).await;
    let wreckage_live_owner = w.container(&live, false).await;
    let volume_ownerless = w.volume(&gone_volume, Some("Delete")).await;
    let template_unused = w.template(&gone_template).await;

    // Must survive.
    let healthy = w.container(&live, true).await;
    let foreign = Res::Container(w.foreign(&base_image(), &[], None).await);
    let theirs = w.container(&other_instance, false).await;
    let their_volume = w
        .volume(
            &Owner {
                kind: "SandboxVolume".into(),
                ..other_instance.clone()
            },
            Some("Delete"),
        )
        .await;
    let volume_on_stopped = w.volume(&gone_volume, Some("Delete")).await;
    let Res::Volume(held) = volume_on_stopped.clone() else {
        unreachable!()
    };
    let stopped_holder = w
        .foreign(&base_image(), std::slice::from_ref(&held), Some(&["true"]))
        .await;
    let volume_retained = w.volume(&gone_volume, Some("Retain")).await;
    let volume_unlabelled_policy = w.volume(&gone_volume, None).await;
    let volume_owned = w.volume(&live_volume, Some("Delete")).await;
    let template_in_use = w.template(&gone_template).await;
    let Res::Template(used) = template_in_use.clone() else {
        unreachable!()
    };
    // In use by a live Sandbox booted from it. (Not by a container created from the image
    // outside the operator: a template image carries its SandboxTemplate's owner labels, so
    // such a container would inherit them and be one of ours.)
    let template_user = w.container_from(&live, true, Some(&used)).await;
    let template_owned = w.template(&live_template).await;

    // Younger than the grace period at the pass's `now`: an in-flight create.
    let cut = cut().await;
    let young_wreckage = w.container(&ghost, false).await;

    let metrics = Metrics::new();
    let report = w
        .sweeper(&metrics, GRACE, 100)
        .pass_at(&w.handle(&metrics), cut + GRACE)
        .await;
    let table = report.render_table();
    println!("{table}");
    assert_eq!(report.outcome, Outcome::Completed, "{table}");

    let reclaimed = [
        &orphan,
        &orphan_of_recreated,
        &wreckage_ownerless,
        &wreckage_live_owner,
        &volume_ownerless,
        &template_unused,
    ];
    let survivors = [
        &healthy,
        &foreign,
        &theirs,
        &their_volume,
        &volume_on_stopped,
        &volume_retained,
        &volume_unlabelled_policy,
        &volume_owned,
        &template_in_use,
        &template_owned,
        &young_wreckage,
    ];
    assert_eq!(report.reclaimed(), keys(&reclaimed), "{table}");
    w.assert_exactly(&survivors, &reclaimed, "after the pass")
        .await;
    assert!(
        w.exists(&Res::Container(stopped_holder.clone())).await && w.exists(&template_user).await
    );

    // What it kept is reported with the reason.
    let why = |r: &Res| row(&report, r).why.clone();
    assert_eq!(row(&report, &young_wreckage).action, Action::Kept);
    assert_eq!(why(&young_wreckage), "younger than the grace period");
    assert_eq!(
        why(&volume_on_stopped),
        format!("attached to {stopped_holder}")
    );
    assert_eq!(why(&volume_retained), "reclaim policy Retain");
    assert!(why(&volume_unlabelled_policy).contains("Retain is the default"));
    assert_eq!(why(&template_in_use), "in use (or use unknown)");
    assert!(
        why(&orphan_of_recreated).contains("is another object now"),
        "{table}"
    );
    assert_eq!(
        report.owner_alive, 4,
        "healthy sandbox, template user, owned volume and owned template:\n{table}"
    );
    assert!(
        !report
            .rows
            .iter()
            .any(|r| r.id == *foreign_id(&foreign) || r.id == *foreign_id(&theirs))
    );

    // Metrics by category and outcome.
    for needle in [
        "sandbox_operator_sweep_deletions_total{category=\"orphan\",outcome=\"deleted\"} 2",
        "sandbox_operator_sweep_deletions_total{category=\"wreckage\",outcome=\"deleted\"} 2",
        "sandbox_operator_sweep_deletions_total{category=\"volume\",outcome=\"deleted\"} 1",
        "sandbox_operator_sweep_deletions_total{category=\"template\",outcome=\"deleted\"} 1",
        "sandbox_operator_sweep_passes_total 1",
    ] {
        assert!(
            has_line(&metrics.render(), needle),
            "missing {needle} in\n{}",
            metrics.render()
        );
    }

    // Every deletion is an Event on the owner (by UID, also when the owner is gone).
    let events = w.events().await;
    let has = |reason: &str, owner: &Owner| {
        events
            .iter()
            .filter(|(r, n, u)| r == reason && *n == owner.name && *u == owner.uid)
            .count()
    };
    assert_eq!(
        has("SweptWreckage", &live),
        1,
        "wreckage of a live owner is reported on it: {events:?}"
    );
    assert_eq!(has("SweptWreckage", &ghost), 1, "{events:?}");
    assert_eq!(has("SweptOrphan", &ghost), 1, "{events:?}");
    assert_eq!(has("SweptOrphan", &recreated), 1, "{events:?}");
    assert_eq!(has("SweptVolume", &gone_volume), 1, "{events:?}");
    assert_eq!(has("SweptTemplate", &gone_template), 1, "{events:?}");

    // A second pass on the same picture finds nothing more to do.
    let again = w
        .sweeper(&metrics, GRACE, 100)
        .pass_at(&w.handle(&metrics), cut + GRACE)
        .await;
    assert!(again.reclaimed().is_empty(), "{}", again.render_table());
    w.assert_exactly(&survivors, &[], "after a second pass")
        .await;
}

fn foreign_id(r: &Res) -> &String {
    match r {
        Res::Container(id) | Res::Volume(id) | Res::Template(id) => id,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn dry_run_deletes_nothing_and_lists_exactly_what_a_real_pass_then_deletes() {
    let mut w = World::new("sweep-dry").await;
    let live = w.live("Sandbox", "live").await;
    let ghost = w.ghost("Sandbox", "ghost");
    let gone_volume = w.ghost("SandboxVolume", "gone");
    let gone_template = w.ghost("SandboxTemplate", "gone");
    let eligible = [
        w.container(&ghost, true).await,
        w.container(&ghost, false).await,
        w.container(&live, false).await,
        w.volume(&gone_volume, Some("Delete")).await,
        w.template(&gone_template).await,
    ];
    let keepers = vec![
        w.container(&live, true).await,
        w.volume(&gone_volume, Some("Retain")).await,
    ];
    let cut = cut().await;
    let young = w.container(&ghost, false).await;
    let now = cut + GRACE;

    let metrics = Metrics::new();
    let dry = w
        .sweeper(&metrics, GRACE, 100)
        .with_dry_run(true)
        .pass_at(&w.handle(&metrics), now)
        .await;
    println!("{}", dry.render_table());
    assert!(dry.dry_run && dry.outcome == Outcome::Completed);
    let listed = dry.reclaimed();
    assert_eq!(
        listed,
        keys(&eligible.iter().collect::<Vec<_>>()),
        "{}",
        dry.render_table()
    );
    assert!(
        dry.rows
            .iter()
            .filter(|r| r.category.is_some())
            .all(|r| r.action == Action::WouldDelete)
    );
    let everything: Vec<&Res> = eligible.iter().chain(&keepers).chain([&young]).collect();
    w.assert_exactly(&everything, &[], "after the dry run")
        .await;
    assert!(
        has_line(
            &metrics.render(),
            "sandbox_operator_sweep_deletions_total{category=\"wreckage\",outcome=\"dry_run\"} 2"
        ),
        "{}",
        metrics.render()
    );
    assert!(!metrics.render().contains("outcome=\"deleted\""));
    assert!(
        w.events().await.is_empty(),
        "a dry run publishes no deletion Events"
    );

    let real = w
        .sweeper(&metrics, GRACE, 100)
        .pass_at(&w.handle(&metrics), now)
        .await;
    println!("{}", real.render_table());
    assert_eq!(
        real.reclaimed(),
        listed,
        "the real pass deletes exactly what the dry run listed"
    );
    assert!(real.with_action(&Action::Deleted).count() == listed.len());
    let survivors: Vec<&Res> = keepers.iter().chain([&young]).collect();
    w.assert_exactly(
        &survivors,
        &eligible.iter().collect::<Vec<_>>(),
        "after the real pass",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_cap_stops_a_runaway_pass_and_reports_what_it_left() {
    let mut w = World::new("sweep-cap").await;
    let ghost = w.ghost("Sandbox", "ghost");
    // Oldest first, in three groups a whole second apart (listings report creation times
    // in whole seconds): the two of each pass's cap, then the last one.
    let mut wreckage = Vec::new();
    for group in [2, 2, 1] {
        for _ in 0..group {
            wreckage.push(w.container(&ghost, false).await);
        }
        cut().await;
    }
    let now = cut().await + GRACE;
    let metrics = Metrics::new();
    let sweeper = w.sweeper(&metrics, GRACE, 2);
    let handle = w.handle(&metrics);

    let first = sweeper.pass_at(&handle, now).await;
    println!("{}", first.render_table());
    assert_eq!(first.outcome, Outcome::CapReached { deferred: 3 });
    assert_eq!(
        first.reclaimed(),
        keys(&[&wreckage[0], &wreckage[1]]),
        "the oldest go first"
    );
    let deferred: Vec<String> = first
        .with_action(&Action::Deferred)
        .map(|r| format!("{}/{}", r.kind, r.id))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(
        deferred,
        keys(&[&wreckage[2], &wreckage[3], &wreckage[4]]),
        "what it left is reported"
    );
    assert!(
        first.summary().contains("3 left for the next pass"),
        "{}",
        first.summary()
    );
    w.assert_exactly(
        &[&wreckage[2], &wreckage[3], &wreckage[4]],
        &[&wreckage[0], &wreckage[1]],
        "after pass 1",
    )
    .await;
    assert!(
        has_line(
            &metrics.render(),
            "sandbox_operator_sweep_aborted_total{reason=\"deletion_cap\"} 1"
        ),
        "{}",
        metrics.render()
    );
    assert!(has_line(
        &metrics.render(),
        "sandbox_operator_sweep_deletions_total{category=\"wreckage\",outcome=\"deferred\"} 3"
    ));

    // Under the cap a dry run lists exactly the next pass's deletions.
    let dry = w
        .sweeper(&metrics, GRACE, 2)
        .with_dry_run(true)
        .pass_at(&handle, now)
        .await;
    assert_eq!(dry.reclaimed(), keys(&[&wreckage[2], &wreckage[3]]));
    let second = sweeper.pass_at(&handle, now).await;
    assert_eq!(second.reclaimed(), dry.reclaimed());
    assert_eq!(second.outcome, Outcome::CapReached { deferred: 1 });

    let third = sweeper.pass_at(&handle, now).await;
    assert_eq!(third.reclaimed(), keys(&[&wreckage[4]]));
    assert_eq!(third.outcome, Outcome::Completed);
    w.assert_exactly(
        &[],
        &wreckage.iter().collect::<Vec<_>>(),
        "after three passes",
    )
    .await;
}

/// Where the test provider's enumeration breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Break {
    Find,
    ListVolumes,
    ListTemplates,
}

/// The real Docker provider, except that one enumeration fails — as it would with the engine
/// stopped mid-pass — and every deletion is counted.
struct Breaking {
    inner: DockerProvider,
    at: Break,
    deletions: AtomicUsize,
}

impl Breaking {
    fn fail<T>(&self, what: &str) -> ProviderResult<T> {
        Err(ProviderError::transient(format!(
            "{what}: Docker engine unreachable (stopped mid-pass by the test)"
        )))
    }
}

#[async_trait]
impl Provider for Breaking {
    fn name(&self) -> &str {
        "docker"
    }
    fn kind(&self) -> &'static str {
        "docker"
    }
    async fn create(&self, r: &CreateRequest) -> ProviderResult<SandboxDescriptor> {
        self.inner.create(r).await
    }
    async fn describe(&self, id: &str) -> ProviderResult<Option<SandboxDescriptor>> {
        self.inner.describe(id).await
    }
    async fn find(&self, q: &SandboxQuery) -> ProviderResult<Vec<SandboxDescriptor>> {
        if self.at == Break::Find {
            self.fail("listing sandboxes")
        } else {
            self.inner.find(q).await
        }
    }
    async fn start(&self, id: &str) -> ProviderResult<()> {
        self.inner.start(id).await
    }
    async fn stop(&self, id: &str) -> ProviderResult<()> {
        self.inner.stop(id).await
    }
    async fn sleep(&self, id: &str) -> ProviderResult<()> {
        self.inner.sleep(id).await
    }
    async fn wake(&self, id: &str) -> ProviderResult<()> {
        self.inner.wake(id).await
    }
    async fn destroy(&self, id: &str) -> ProviderResult<()> {
        self.deletions.fetch_add(1, Ordering::SeqCst);
        self.inner.destroy(id).await
    }
    async fn exec(&self, id: &str, r: &ExecRequest) -> ProviderResult<ExecOutput> {
        self.inner.exec(id, r).await
    }
    fn volumes(&self) -> Option<&dyn Volumes> {
        Some(self)
    }
    fn templates(&self) -> Option<&dyn Templates> {
        Some(self)
    }
}

#[async_trait]
impl Volumes for Breaking {
    async fn create_volume(
        &self,
        name: &str,
        labels: &BTreeMap<String, String>,
    ) -> ProviderResult<VolumeInfo> {
        Volumes::create_volume(&self.inner, name, labels).await
    }
    async fn remove_volume(&self, name: &str) -> ProviderResult<()> {
        self.deletions.fetch_add(1, Ordering::SeqCst);
        Volumes::remove_volume(&self.inner, name).await
    }
    async fn get_volume(&self, name: &str) -> ProviderResult<Option<VolumeInfo>> {
        Volumes::get_volume(&self.inner, name).await
    }
    async fn list_volumes(&self, q: &VolumeQuery) -> ProviderResult<Vec<VolumeInfo>> {
        if self.at == Break::ListVolumes {
            self.fail("listing volumes")
        } else {
            Volumes::list_volumes(&self.inner, q).await
        }
    }
}

#[async_trait]
impl Templates for Breaking {
    async fn commit(&self, r: &CommitRequest) -> ProviderResult<Template> {
        Templates::commit(&self.inner, r).await
    }
    async fn get_template(&self, id: &str) -> ProviderResult<Option<Template>> {
        Templates::get_template(&self.inner, id).await
    }
    async fn list_templates(&self, prefix: Option<&str>) -> ProviderResult<Vec<Template>> {
        if self.at == Break::ListTemplates {
            self.fail("listing templates")
        } else {
            Templates::list_templates(&self.inner, prefix).await
        }
    }
    async fn remove_template(&self, id: &str) -> ProviderResult<()> {
        self.deletions.fetch_add(1, Ordering::SeqCst);
        Templates::remove_template(&self.inner, id).await
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn engine_failing_mid_pass_aborts_it_with_nothing_deleted() {
    let mut w = World::new("sweep-broken").await;
    let ghost = w.ghost("Sandbox", "ghost");
    let planted = [
        w.container(&ghost, true).await,
        w.container(&ghost, false).await,
        w.volume(&w.ghost("SandboxVolume", "gone"), Some("Delete"))
            .await,
        w.template(&w.ghost("SandboxTemplate", "gone")).await,
    ];
    let all: Vec<&Res> = planted.iter().collect();
    let now = cut().await + GRACE;
    let metrics = Metrics::new();

    // Each enumeration in turn fails; for the later ones the earlier enumerations already
    // returned reclaimable resources, which must not be touched either.
    for at in [Break::Find, Break::ListVolumes, Break::ListTemplates] {
        let breaking = Arc::new(Breaking {
            inner: w.provider.clone(),
            at,
            deletions: AtomicUsize::new(0),
        });
        let handle = ProviderHandle::new(
            breaking.clone(),
            16,
            Duration::from_secs(120),
            metrics.clone(),
        );
        let report = w.sweeper(&metrics, GRACE, 100).pass_at(&handle, now).await;
        println!("{}", report.render_table());
        let Outcome::Aborted { reason } = &report.outcome else {
            panic!("{at:?}: not aborted:\n{}", report.render_table())
        };
        assert!(
            reason.contains("stopped mid-pass by the test"),
            "{at:?}: {reason}"
        );
        assert!(
            report
                .render_table()
                .contains("pass ABORTED, nothing deleted")
        );
        assert_eq!(
            breaking.deletions.load(Ordering::SeqCst),
            0,
            "{at:?}: a deletion was attempted"
        );
        assert!(report.rows.is_empty());
        w.assert_exactly(&all, &[], &format!("after the pass broken at {at:?}"))
            .await;
    }
    assert!(
        has_line(
            &metrics.render(),
            "sandbox_operator_sweep_aborted_total{reason=\"enumeration_failed\"} 3"
        ),
        "{}",
        metrics.render()
    );
    assert!(!metrics.render().contains("sweep_passes_total 1"));

    // The same resources were reclaimable all along: a working pass takes them.
    let report = w
        .sweeper(&metrics, GRACE, 100)
        .pass_at(&w.handle(&metrics), now)
        .await;
    assert_eq!(report.reclaimed(), keys(&all), "{}", report.render_table());
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreadable_api_server_aborts_the_pass_with_nothing_deleted() {
    let mut w = World::new("sweep-noapi").await;
    let ghost = w.ghost("Sandbox", "ghost");
    let planted = [
        w.container(&ghost, true).await,
        w.container(&ghost, false).await,
    ];
    // A client for an API server that is not there (a closed port).
    let mut kc = Kubeconfig::read_from(kubeconfig()).expect("kubeconfig");
    for cluster in &mut kc.clusters {
        if let Some(c) = cluster.cluster.as_mut() {
            c.server = Some("https://127.0.0.1:1".into());
        }
    }
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("config");
    let dead = kube::Client::try_from(config).expect("client");
    let metrics = Metrics::new();
    let settings = SweeperConfig {
        grace_secs: 0,
        ..SweeperConfig::default()
    };
    let sweeper = Sweeper::new(dead, metrics.clone(), &w.instance, &settings);
    let report = sweeper
        .pass_at(&w.handle(&metrics), cut().await + GRACE)
        .await;
    let Outcome::Aborted { reason } = &report.outcome else {
        panic!("not aborted:\n{}", report.render_table())
    };
    assert!(reason.contains("listing Sandbox objects"), "{reason}");
    assert!(
        has_line(
            &metrics.render(),
            "sandbox_operator_sweep_aborted_total{reason=\"owner_lookup_failed\"} 1"
        ),
        "{}",
        metrics.render()
    );
    w.assert_exactly(
        &planted.iter().collect::<Vec<_>>(),
        &[],
        "after the aborted pass",
    )
    .await;
}

/// Runs the built binary's `sweep` with this world's configuration.
fn sweep_cli(config: &PathBuf, ns: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sandbox-operator"))
        .arg("sweep")
        .arg("--config")
        .arg(config)
        .args(args)
        .env("KUBECONFIG", kubeconfig())
        .env("POD_NAMESPACE", ns)
        .env_remove("RUST_LOG")
        .output()
        .expect("run sandbox-operator sweep")
}

fn write_config(w: &World, extra: &str) -> PathBuf {
    let dir = harness::repo().join("target/e2e");
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join(format!("{}-sweep-{}.yaml", w.instance, unique("c")));
    let text = format!("instance: {}\n{extra}", w.instance);
    std::fs::write(&path, text).expect("write config");
    path
}

#[tokio::test(flavor = "multi_thread")]
async fn sweep_command_prints_a_table_and_its_exit_code_says_whether_it_completed() {
    let mut w = World::new("sweep-cli").await;
    let live = w.live("Sandbox", "live").await;
    let ghost = w.ghost("Sandbox", "ghost");
    let orphan = w.container(&ghost, true).await;
    // The engine lists creation times in whole seconds and the cap takes the oldest first
    // (ties by id): the rest are created in a later second than the orphan, so the capped
    // pass below deletes the orphan whatever the ids.
    cut().await;
    let wreckage = w.container(&ghost, false).await;
    let healthy = w.container(&live, true).await;
    let retained = w
        .volume(&w.ghost("SandboxVolume", "v"), Some("Retain"))
        .await;
    // Its owner's whole namespace is gone: the Event cannot be stored there.
    let gone_ns = unique("gone-ns");
    let lost = w
        .container(
            &Owner {
                namespace: gone_ns.clone(),
                ..ghost.clone()
            },
            true,
        )
        .await;
    let config = write_config(
        &w,
        "providers:\n  - name: docker\n    type: docker\nsweeper:\n  graceSecs: 0\n  maxDeletionsPerPass: 10\n",
    );
    let text = |o: &Output| {
        format!(
            "exit {:?}\nstdout:\n{}\nstderr:\n{}",
            o.status.code(),
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };

    let dry = sweep_cli(&config, &w.ns, &["--dry-run"]);
    let out = String::from_utf8_lossy(&dry.stdout).to_string();
    println!("{}", text(&dry));
    assert_eq!(dry.status.code(), Some(0), "{}", text(&dry));
    assert!(
        out.contains("DRY RUN") && out.contains("pass completed: 3 would be deleted"),
        "{out}"
    );
    let header = out
        .lines()
        .find(|l| l.starts_with("WHAT"))
        .expect("a table header");
    for col in ["OWNER", "WHY", "AGE", "ACTION"] {
        assert!(header.contains(col), "{header}");
    }
    let line_of = |out: &str, r: &Res| {
        out.lines()
            .find(|l| l.contains(foreign_id(r).as_str()))
            .map(str::to_string)
    };
    assert!(
        line_of(&out, &orphan)
            .expect("orphan row")
            .contains("orphan: owner Sandbox"),
        "{out}"
    );
    assert!(
        line_of(&out, &wreckage)
            .expect("wreckage row")
            .ends_with("would delete"),
        "{out}"
    );
    assert!(
        line_of(&out, &retained)
            .expect("volume row")
            .contains("reclaim policy Retain"),
        "{out}"
    );
    assert!(
        line_of(&out, &healthy).is_none(),
        "a healthy sandbox is only counted: {out}"
    );
    w.assert_exactly(
        &[&orphan, &wreckage, &healthy, &retained, &lost],
        &[],
        "after the dry run",
    )
    .await;

    // The cap leaves work: exit code 2, the oldest (the orphan) goes first.
    let capped = sweep_cli(&config, &w.ns, &["--max-deletions", "1"]);
    println!("{}", text(&capped));
    assert_eq!(capped.status.code(), Some(2), "{}", text(&capped));
    let out = String::from_utf8_lossy(&capped.stdout).to_string();
    assert!(
        line_of(&out, &orphan)
            .expect("orphan row")
            .ends_with("deleted"),
        "{out}"
    );
    assert!(
        line_of(&out, &wreckage)
            .expect("wreckage row")
            .ends_with("deferred (cap)"),
        "{out}"
    );
    w.assert_exactly(
        &[&wreckage, &healthy, &retained, &lost],
        &[&orphan],
        "after the capped pass",
    )
    .await;

    let done = sweep_cli(&config, &w.ns, &[]);
    println!("{}", text(&done));
    assert_eq!(done.status.code(), Some(0), "{}", text(&done));
    w.assert_exactly(
        &[&healthy, &retained],
        &[&orphan, &wreckage, &lost],
        "after the full pass",
    )
    .await;
    // The Event for the orphan whose namespace is gone went to the operator's Lease in the
    // operator's namespace (POD_NAMESPACE), naming the owner.
    let events: Api<K8sEvent> = Api::namespaced(w.client.clone(), &w.ns);
    let lease = format!("sandbox-operator-{}", w.instance);
    let on_lease: Vec<String> = events
        .list(&ListParams::default())
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|e| {
            let r = e.regarding.clone().unwrap_or_default();
            r.kind.as_deref() == Some("Lease") && r.name.as_deref() == Some(lease.as_str())
        })
        .map(|e| {
            format!(
                "{} {}",
                e.reason.unwrap_or_default(),
                e.note.unwrap_or_default()
            )
        })
        .collect();
    assert!(
        on_lease.len() == 1
            && on_lease[0].starts_with("SweptOrphan ")
            && on_lease[0].contains(&gone_ns)
            && on_lease[0].contains(foreign_id(&lost).as_str()),
        "{on_lease:?}"
    );

    // Could not run: unknown provider, or an engine that is not there — exit 1, and nothing
    // of what is left is touched.
    let unknown = sweep_cli(&config, &w.ns, &["--provider", "nope"]);
    assert_eq!(unknown.status.code(), Some(1), "{}", text(&unknown));
    assert!(
        String::from_utf8_lossy(&unknown.stderr).contains("\"nope\" is not configured"),
        "{}",
        text(&unknown)
    );
    let orphan2 = w.container(&ghost, true).await;
    for endpoint in [
        "unix:///nonexistent/sandbox-operator/docker.sock",
        "tcp://127.0.0.1:1",
    ] {
        let broken = write_config(
            &w,
            &format!(
                "providers:\n  - name: docker\n    type: docker\n    docker:\n      endpoint: {endpoint}\nsweeper:\n  graceSecs: 0\n"
            ),
        );
        let out = sweep_cli(&broken, &w.ns, &[]);
        assert_eq!(out.status.code(), Some(1), "{endpoint}: {}", text(&out));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("error:"),
            "{}",
            text(&out)
        );
    }
    w.assert_exactly(
        &[&orphan2, &healthy, &retained],
        &[],
        "after the failed runs",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_leader_sweeps_periodically_with_events_and_metrics() {
    let mut w = World::new("sweep-leader").await;
    // The operator's instance is this world's instance; it watches this namespace.
    let opts = harness::operator::OperatorOptions {
        config_extra: "providers:\n  - name: docker\n    type: docker\nsweeper:\n  intervalSecs: 1\n  graceSecs: 0\n".into(),
        ..Default::default()
    };
    let ghost = w.ghost("Sandbox", "ghost");
    let retained = w
        .volume(&w.ghost("SandboxVolume", "kept"), Some("Retain"))
        .await;
    let op = harness::operator::Operator::start(&w.ns, &w.instance, &opts);
    let orphan = w.container(&ghost, true).await;
    let started = Instant::now();
    wait_for(
        &format!(
            "the leader's sweeper to reclaim {orphan:?} (log {})",
            op.log.display()
        ),
        Duration::from_secs(90),
        || {
            let docker = w.docker.clone();
            let id = foreign_id(&orphan).clone();
            async move {
                match docker
                    .inspect_container(&id, None::<InspectContainerOptions>)
                    .await
                {
                    Err(_) => Ok(()),
                    Ok(_) => Err("still there".to_string()),
                }
            }
        },
    )
    .await;
    println!(
        "orphan reclaimed {:?} after the operator started",
        started.elapsed()
    );
    assert!(w.exists(&retained).await, "a Retain volume is never swept");
    let scraped = wait_for("sweep metrics on /metrics", Duration::from_secs(30), || {
        let page = op.http_get("/metrics").unwrap_or_default();
        async move {
            if page.contains(
                "sandbox_operator_sweep_deletions_total{category=\"orphan\",outcome=\"deleted\"} 1",
            ) {
                Ok(page)
            } else {
                Err("no orphan deletion counted yet".to_string())
            }
        }
    })
    .await;
    assert!(
        scraped.contains("sandbox_operator_sweep_passes_total"),
        "{scraped}"
    );
    let events = w.events().await;
    assert!(
        events
            .iter()
            .any(|(r, n, u)| r == "SweptOrphan" && *n == ghost.name && *u == ghost.uid),
        "{events:?}"
    );
    drop(op);
}

/// One pass over N labelled containers (default 1,000; `SWEEP_BENCH_N`), each owned by a
/// live Sandbox, against the raw list call in the same run. Not part of `make test`:
///
/// `cargo test --release --test sweeper -- --ignored bench_ --nocapture`
#[tokio::test(flavor = "multi_thread")]
#[ignore = "benchmark: run explicitly (see the doc comment)"]
async fn bench_one_pass_over_many_labelled_containers() {
    use futures::{StreamExt, stream};
    let n: usize = std::env::var("SWEEP_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let w = World::new("sweep-bench").await;
    let api: Api<Sandbox> = Api::namespaced(w.client.clone(), &w.ns);
    let t = Instant::now();
    let owners: Vec<Owner> = stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            let (ns, instance) = (w.ns.clone(), w.instance.clone());
            async move {
                let obj: Sandbox = serde_json::from_value(serde_json::json!({
                    "apiVersion": "sandboxes.dev/v1alpha1", "kind": "Sandbox",
                    "metadata": {"name": format!("s{i}"), "namespace": ns}, "spec": {"image": base_image()}
                }))
                .expect("sandbox");
                let uid = api.create(&PostParams::default(), &obj).await.expect("create").metadata.uid.expect("uid");
                Owner { instance, kind: "Sandbox".into(), namespace: ns, name: format!("s{i}"), uid }
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    println!(
        "created {n} Sandbox objects in {:.1}s",
        t.elapsed().as_secs_f64()
    );
    let t = Instant::now();
    let provider = w.provider.clone();
    stream::iter(owners)
        .map(|owner| {
            let provider = provider.clone();
            async move {
                let request = CreateRequest {
                    name: format!("sbx-{}", owner.uid),
                    owner,
                    image: Some(base_image()),
                    template: None,
                    command: None,
                    restart_policy: RestartPolicy::Never,
                    env: BTreeMap::new(),
                    labels: BTreeMap::new(),
                    resources: Resources::default(),
                    ports: vec![],
                    volumes: vec![],
                    allowed_domains: None,
                    idle_action: None,
                    image_pull_policy: Default::default(),
                    registry_credentials: Vec::new(),
                    secret_env_keys: Default::default(),
                };
                provider.create(&request).await.expect("create container");
            }
        })
        .buffer_unordered(8)
        .collect::<Vec<()>>()
        .await;
    println!(
        "created {n} labelled containers in {:.1}s",
        t.elapsed().as_secs_f64()
    );

    let filters = HashMap::from([(
        "label".to_string(),
        vec![format!("sandboxes.dev/managed-by={}", w.instance)],
    )]);
    let mut raw = Vec::new();
    let mut find = Vec::new();
    let mut pass = Vec::new();
    let metrics = Metrics::new();
    // Young (grace one day): every container is kept, so the pass measures the picture and
    // the decision, not deletions.
    let sweeper = w
        .sweeper(&metrics, Duration::from_secs(86_400), 50)
        .with_dry_run(true);
    let handle = w.handle(&metrics);
    for _ in 0..3 {
        let t = Instant::now();
        let listed = w
            .docker
            .list_containers(Some(bollard::query_parameters::ListContainersOptions {
                all: true,
                filters: Some(filters.clone()),
                ..Default::default()
            }))
            .await
            .expect("list");
        raw.push(t.elapsed().as_secs_f64());
        assert_eq!(listed.len(), n);
        let t = Instant::now();
        let found = w
            .provider
            .find(&SandboxQuery {
                labels: BTreeMap::from([(
                    "sandboxes.dev/managed-by".to_string(),
                    w.instance.clone(),
                )]),
                ..Default::default()
            })
            .await
            .expect("find");
        find.push(t.elapsed().as_secs_f64());
        assert_eq!(found.len(), n);
        let t = Instant::now();
        let report = sweeper.pass(&handle).await;
        pass.push(t.elapsed().as_secs_f64());
        assert_eq!(report.outcome, Outcome::Completed);
        assert_eq!(report.enumerated[0], n);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (raw, find, pass) = (median(&mut raw), median(&mut find), median(&mut pass));
    println!(
        "BENCH n={n}: raw docker list {raw:.3}s, provider find {find:.3}s, full sweep pass {pass:.3}s (pass/raw list = {:.1}x, pass/find = {:.2}x)",
        pass / raw,
        pass / find
    );
    // Tear down the N containers (the Cleanup net would, but in one docker call per 100).
    drop(w);
}
