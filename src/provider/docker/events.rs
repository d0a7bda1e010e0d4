//! Drift notifications from the Docker event stream.
//!
//! The controllers learn about changes made behind their back (a container stopped, killed
//! by the OOM killer, removed, a volume deleted) from `GET /events`, not by polling. Two
//! subscriptions are merged:
//!
//! - container events, filtered BY THE ENGINE on `type=container`, our `managed-by` label and
//!   an allow-list of lifecycle actions. Container events carry the container's labels as
//!   actor attributes, so each maps to its owner directly. Exec events (`exec_create`,
//!   `exec_start`, `exec_die`) and health checks are excluded: the controller's own execs
//!   would otherwise trigger its own reconciles, forever.
//! - volume events (`create`, `destroy`). Docker 20.10 does NOT put a volume's labels on its
//!   events (the actor attributes hold only the driver), so no label filter can select ours.
//!   The stream therefore seeds a name → owner map from one labelled volume listing, learns
//!   new volumes by inspecting them on `create`, and maps `destroy` through the map. The
//!   events are requested from just before the listing (`since`), so nothing that happens
//!   while the map is seeded is missed. A managed volume that is gone before the stream
//!   could inspect it (destroyed before the subscription, or in the instant after its
//!   creation) cannot be mapped; the periodic resync covers it.
//!
//! Events whose resource lacks any of the four owner labels, or carries another instance's,
//! are skipped. When either subscription fails or ends, the merged stream yields one `Err`
//! and ends: the caller resubscribes with backoff.

use std::collections::{BTreeMap, HashMap};
use std::time::{SystemTime, UNIX_EPOCH};

use bollard::Docker;
use bollard::models::EventMessage;
use bollard::query_parameters::{EventsOptionsBuilder, ListVolumesOptionsBuilder};
use futures::stream::{self, BoxStream};
use futures::{StreamExt, future};

use super::{DockerProvider, is_not_found, map_err};
use crate::provider::labels::{MANAGED_BY, Owner};
use crate::provider::{Change, ProviderError, ProviderEvent, ProviderEvents, ProviderResult};

/// Container actions that may mean drift. Anything else (exec_*, health_status, attach,
/// resize, top, archive-path, …) is noise — or, for exec, our own doing.
pub(crate) const CONTAINER_ACTIONS: &[&str] = &[
    "create", "start", "restart", "die", "stop", "kill", "oom", "pause", "unpause", "destroy",
    "update", "rename",
];
/// The actions the engine reports when the operator itself makes `change` (see
/// [`ProviderKind::echo_words`](crate::provider::ProviderKind::echo_words)). A hibernation
/// that cannot pause falls back to a stop, hence its `kill`/`die`/`stop`.
pub(crate) fn echo_words(change: Change) -> &'static [&'static str] {
    match change {
        Change::Create => &["create"],
        Change::Start => &["start"],
        Change::Stop => &["kill", "die", "stop"],
        Change::Destroy => &["kill", "die", "destroy"],
        Change::Hibernate => &["pause", "kill", "die", "stop"],
        Change::Resume => &["unpause", "start"],
        Change::SetResources => &["update"],
    }
}

/// Volume actions that may mean drift.
pub(crate) const VOLUME_ACTIONS: &[&str] = &["create", "destroy"];

/// The owner described by a resource's labels, if it belongs to `instance`.
pub(crate) fn owner_for(labels: &BTreeMap<String, String>, instance: &str) -> Option<Owner> {
    Owner::from_labels(labels).filter(|o| o.instance == instance)
}

/// Maps one container event to a provider event (pure, for tests).
pub(crate) fn container_event(msg: &EventMessage, instance: &str) -> Option<ProviderEvent> {
    let action = msg.action.as_deref()?;
    if !CONTAINER_ACTIONS.contains(&action) {
        return None;
    }
    let attributes = msg.actor.as_ref()?.attributes.as_ref()?;
    let labels: BTreeMap<String, String> = attributes
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    Some(ProviderEvent {
        owner: owner_for(&labels, instance)?,
        action: action.to_string(),
    })
}

fn ended(what: &str) -> ProviderError {
    ProviderError::transient(format!(
        "the Docker {what} event stream ended (engine restarted or connection dropped); resubscribe"
    ))
}

fn filters(pairs: &[(&str, Vec<String>)]) -> HashMap<String, Vec<String>> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

fn container_events(
    docker: Docker,
    instance: String,
) -> BoxStream<'static, ProviderResult<ProviderEvent>> {
    let options = EventsOptionsBuilder::default()
        .filters(&filters(&[
            ("type", vec!["container".into()]),
            ("label", vec![format!("{MANAGED_BY}={instance}")]),
            (
                "event",
                CONTAINER_ACTIONS.iter().map(|a| a.to_string()).collect(),
            ),
        ]))
        .build();
    docker
        .events(Some(options))
        .filter_map(move |item| {
            future::ready(match item {
                Ok(msg) => container_event(&msg, &instance).map(Ok),
                Err(e) => Some(Err(map_err("watching Docker container events", e))),
            })
        })
        .chain(stream::once(future::ready(Err(ended("container")))))
        .boxed()
}

/// State of the volume subscription: the engine, our instance, what we know of our volumes.
struct VolumeWatch {
    docker: Docker,
    instance: String,
    owners: HashMap<String, Owner>,
    events: Option<BoxStream<'static, Result<EventMessage, bollard::errors::Error>>>,
}

impl VolumeWatch {
    /// Lists our volumes into the map and opens the event stream from just before.
    async fn seed(&mut self) -> ProviderResult<()> {
        let since = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs().saturating_sub(1))
            .unwrap_or(0);
        let listed = self
            .docker
            .list_volumes(Some(
                ListVolumesOptionsBuilder::default()
                    .filters(&filters(&[(
                        "label",
                        vec![format!("{MANAGED_BY}={}", self.instance)],
                    )]))
                    .build(),
            ))
            .await
            .map_err(|e| map_err("listing managed volumes for the event stream", e))?;
        for volume in listed.volumes.unwrap_or_default() {
            let labels: BTreeMap<String, String> = volume.labels.into_iter().collect();
            if let Some(owner) = owner_for(&labels, &self.instance) {
                self.owners.insert(volume.name, owner);
            }
        }
        let options = EventsOptionsBuilder::default()
            .since(&since.to_string())
            .filters(&filters(&[
                ("type", vec!["volume".into()]),
                (
                    "event",
                    VOLUME_ACTIONS.iter().map(|a| a.to_string()).collect(),
                ),
            ]))
            .build();
        self.events = Some(self.docker.events(Some(options)).boxed());
        Ok(())
    }

    /// Maps one volume event, inspecting a newly created volume for its labels.
    async fn handle(&mut self, msg: EventMessage) -> Option<ProviderResult<ProviderEvent>> {
        let action = msg.action.as_deref()?;
        let name = msg.actor.as_ref()?.id.clone()?;
        match action {
            "create" => match self.docker.inspect_volume(&name).await {
                Ok(volume) => {
                    let labels: BTreeMap<String, String> = volume.labels.into_iter().collect();
                    let owner = owner_for(&labels, &self.instance)?;
                    self.owners.insert(name, owner.clone());
                    Some(Ok(ProviderEvent {
                        owner,
                        action: "create".into(),
                    }))
                }
                // Already gone again: its destroy event follows and is mapped (or not) then.
                Err(e) if is_not_found(&e) => None,
                Err(e) => Some(Err(map_err(&format!("inspecting new volume {name}"), e))),
            },
            "destroy" => self.owners.remove(&name).map(|owner| {
                Ok(ProviderEvent {
                    owner,
                    action: "destroy".into(),
                })
            }),
            _ => None,
        }
    }
}

fn volume_events(
    docker: Docker,
    instance: String,
) -> BoxStream<'static, ProviderResult<ProviderEvent>> {
    let watch = VolumeWatch {
        docker,
        instance,
        owners: HashMap::new(),
        events: None,
    };
    stream::unfold(watch, |mut watch| async move {
        if watch.events.is_none()
            && let Err(e) = watch.seed().await
        {
            return Some((Err(e), watch));
        }
        loop {
            let next = watch.events.as_mut()?.next().await;
            match next {
                None => return None,
                Some(Err(e)) => {
                    return Some((Err(map_err("watching Docker volume events", e)), watch));
                }
                Some(Ok(msg)) => {
                    if let Some(item) = watch.handle(msg).await {
                        return Some((item, watch));
                    }
                }
            }
        }
    })
    .chain(stream::once(future::ready(Err(ended("volume")))))
    .boxed()
}

impl ProviderEvents for DockerProvider {
    /// Container and volume changes of resources labelled `managed-by=<instance>`; ends after
    /// its first `Err` (see the module docs).
    fn subscribe(&self, instance: &str) -> BoxStream<'static, ProviderResult<ProviderEvent>> {
        let provider = self.clone();
        let instance = instance.to_string();
        stream::once(async move { provider.engine().await.cloned() })
            .map(move |engine| match engine {
                Ok(docker) => stream::select(
                    container_events(docker.clone(), instance.clone()),
                    volume_events(docker, instance.clone()),
                )
                .boxed(),
                Err(e) => stream::once(future::ready(Err(e))).boxed(),
            })
            .flatten()
            .scan(false, |failed, item| {
                if *failed {
                    return future::ready(None);
                }
                *failed = item.is_err();
                future::ready(Some(item))
            })
            .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bollard::models::{EventActor, EventMessageTypeEnum};

    fn msg(action: &str, attrs: &[(&str, &str)]) -> EventMessage {
        EventMessage {
            typ: Some(EventMessageTypeEnum::CONTAINER),
            action: Some(action.into()),
            actor: Some(EventActor {
                id: Some("abc".into()),
                attributes: Some(
                    attrs
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
            }),
            ..Default::default()
        }
    }

    const OWNED: &[(&str, &str)] = &[
        ("sandboxes.dev/managed-by", "ops"),
        ("sandboxes.dev/owner-uid", "u1"),
        ("sandboxes.dev/owner", "ns.web"),
        ("sandboxes.dev/kind", "Sandbox"),
        ("image", "x"),
        ("name", "sbx-u1"),
    ];

    #[test]
    fn lifecycle_events_map_to_their_owner() {
        let ev = container_event(&msg("die", OWNED), "ops").unwrap();
        assert_eq!(ev.action, "die");
        assert_eq!(ev.owner.uid, "u1");
        assert_eq!(
            (ev.owner.namespace.as_str(), ev.owner.name.as_str()),
            ("ns", "web")
        );
    }

    #[test]
    fn exec_health_and_foreign_events_are_skipped() {
        for action in [
            "exec_create: sh -c true",
            "exec_start: sh",
            "exec_die",
            "health_status: healthy",
            "attach",
        ] {
            assert_eq!(
                container_event(&msg(action, OWNED), "ops"),
                None,
                "{action}"
            );
        }
        assert_eq!(container_event(&msg("die", OWNED), "other-instance"), None);
        assert_eq!(
            container_event(&msg("die", &OWNED[1..]), "ops"),
            None,
            "missing managed-by"
        );
    }
}
