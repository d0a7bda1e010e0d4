//! Provider changes as reconcile triggers: each provider's event stream, mapped through the
//! owner labels to the object it concerns, so drift is noticed without polling.

use futures::channel::mpsc;
use futures::{SinkExt, StreamExt};
use kube::Client;
use kube::runtime::reflector::ObjectRef;
use std::sync::Arc;
use std::time::Duration;

use crate::api::{Sandbox, SandboxVolume};
use crate::controller;
use crate::controller::echoes::Echoes;
use crate::provider::ProviderEvent;
use crate::registry::{ProviderHandle, ProviderRegistry};
use crate::supervisor::TaskSet;

/// Streams of objects to reconcile because their provider resources changed.
///
/// Each provider's event stream is resubscribed with backoff when it drops, so a restarted
/// engine is picked up again. Before resubscribing, the provider is probed; whenever its
/// reachability changes, every object on it is reconciled again: when it stops answering they
/// report it (`Ready=False`, `ProviderUnavailable`) instead of keeping a state nobody can see
/// any more — no event would ever arrive to tell them — and when it answers again they recover
/// at once rather than after their error backoff, and whatever changed while no events could
/// arrive is noticed. A connection that drops while the provider keeps answering is not such a
/// change: the periodic resync is the safety net for events missed then.
///
/// A Sandbox's events that one of our own steps caused (see [`Echoes`]) are dropped: the
/// reconcile that acted observes the result itself.
///
/// Each stream runs as a supervised task: one that ends on its own fails the process like a
/// controller would, since drift would silently stop being noticed.
pub fn provider_triggers(
    tasks: &mut TaskSet,
    providers: &ProviderRegistry,
    instance: &str,
    client: &Client,
    namespace: Option<&str>,
    echoes: Arc<Echoes>,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> (
    mpsc::UnboundedReceiver<ObjectRef<Sandbox>>,
    mpsc::UnboundedReceiver<ObjectRef<SandboxVolume>>,
) {
    let (sandboxes, sbx_rx) = mpsc::unbounded();
    let (volumes, vol_rx) = mpsc::unbounded();
    let stop = futures::FutureExt::shared(Box::pin(stop));
    for handle in providers.iter().filter(|h| h.provider.events().is_some()) {
        let pump = Pump {
            handle: handle.clone(),
            registry: providers.clone(),
            client: client.clone(),
            namespace: namespace.map(str::to_string),
            instance: instance.to_string(),
            echoes: echoes.clone(),
            sandboxes: sandboxes.clone(),
            volumes: volumes.clone(),
            attempt: 0,
            // The controllers' initial listing reconciles everything once: start as
            // reachable.
            reachable: true,
        };
        let stop = stop.clone();
        tasks.spawn("provider event stream", async move {
            tokio::select! {
                () = stop => {}
                () = pump.run() => {}
            }
        });
    }
    (sbx_rx, vol_rx)
}

/// One provider's event stream, pumped into the controllers' trigger channels.
struct Pump {
    handle: ProviderHandle,
    registry: ProviderRegistry,
    client: Client,
    namespace: Option<String>,
    instance: String,
    echoes: Arc<Echoes>,
    sandboxes: mpsc::UnboundedSender<ObjectRef<Sandbox>>,
    volumes: mpsc::UnboundedSender<ObjectRef<SandboxVolume>>,
    /// Consecutive subscriptions that ended without an event.
    attempt: u32,
    /// Whether the provider answered the last probe.
    reachable: bool,
}

impl Pump {
    /// Follows the stream, resubscribing with backoff, until stopped.
    async fn run(mut self) {
        let provider = self.handle.provider.clone();
        let Some(events) = provider.events() else {
            return;
        };
        loop {
            let mut stream = events.subscribe(&self.instance);
            while let Some(item) = stream.next().await {
                match item {
                    Ok(event) => {
                        self.attempt = 0;
                        self.forward(event).await;
                    }
                    Err(err) => {
                        tracing::warn!(%err, provider = provider.name(), "provider event stream failed");
                        break;
                    }
                }
            }
            self.attempt = self.attempt.saturating_add(1);
            let delay = controller::backoff::delay_for(self.attempt).min(Duration::from_secs(30));
            tokio::time::sleep(delay).await;
            self.probe().await;
        }
    }

    /// Sends the object an event concerns to its controller (a Sandbox's echo of our own
    /// step is dropped).
    async fn forward(&mut self, ProviderEvent { owner, action }: ProviderEvent) {
        tracing::debug!(kind = %owner.kind, namespace = %owner.namespace, name = %owner.name, %action, "provider event");
        let (name, ns) = (owner.name.as_str(), owner.namespace.as_str());
        match owner.kind.as_str() {
            "Sandbox" if self.echoes.is_echo(&owner.uid, &action) => {}
            "Sandbox" => {
                let _ = self.sandboxes.send(ObjectRef::new(name).within(ns)).await;
            }
            "SandboxVolume" => {
                let _ = self.volumes.send(ObjectRef::new(name).within(ns)).await;
            }
            _ => {}
        }
    }

    /// Probes the provider; when its reachability changed, reconciles every object on it.
    /// Any answer, even "no such sandbox", means the provider is reachable.
    async fn probe(&mut self) {
        let (handle, provider) = (&self.handle, self.handle.provider.as_ref());
        let up = handle
            .call("probe", provider.describe(REACHABILITY_PROBE))
            .await
            .is_ok();
        if up == self.reachable {
            return;
        }
        self.reachable = up;
        if up {
            self.attempt = 0;
            tracing::info!(
                provider = provider.name(),
                "provider reachable again: reconciling its objects"
            );
        } else {
            tracing::warn!(
                provider = provider.name(),
                "provider unreachable: reconciling its objects so they report it"
            );
        }
        reconcile_objects_on(
            &self.client,
            self.namespace.as_deref(),
            &self.registry,
            provider.name(),
            &mut self.sandboxes,
            &mut self.volumes,
        )
        .await;
    }
}

/// A sandbox id no provider holds: describing it only tells whether the provider answers.
const REACHABILITY_PROBE: &str = "sandbox-operator-reachability-probe";

/// Queues a reconcile of every Sandbox and SandboxVolume (in `namespace`, or everywhere) that
/// lives on `provider`. A failed listing is logged: the periodic resync still covers them.
async fn reconcile_objects_on(
    client: &Client,
    namespace: Option<&str>,
    providers: &ProviderRegistry,
    provider: &str,
    sbx_tx: &mut mpsc::UnboundedSender<ObjectRef<Sandbox>>,
    vol_tx: &mut mpsc::UnboundedSender<ObjectRef<SandboxVolume>>,
) {
    use kube::ResourceExt;
    fn api<K>(client: &Client, namespace: Option<&str>) -> kube::Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        match namespace {
            Some(ns) => kube::Api::namespaced(client.clone(), ns),
            None => kube::Api::all(client.clone()),
        }
    }
    let on = |named: Option<&str>| providers.resolve(named).is_ok_and(|h| h.name() == provider);
    match api::<Sandbox>(client, namespace)
        .list(&Default::default())
        .await
    {
        Ok(list) => {
            for s in list.items.iter().filter(|s| {
                on(s.status
                    .as_ref()
                    .and_then(|st| st.provider.as_deref())
                    .or(s.spec.provider.as_deref()))
            }) {
                let _ = sbx_tx
                    .send(ObjectRef::new(&s.name_any()).within(&s.namespace().unwrap_or_default()))
                    .await;
            }
        }
        Err(err) => {
            tracing::warn!(%err, provider, "cannot list Sandboxes to reconcile them; the periodic resync will")
        }
    }
    match api::<SandboxVolume>(client, namespace)
        .list(&Default::default())
        .await
    {
        Ok(list) => {
            for v in list.items.iter().filter(|v| {
                on(v.status
                    .as_ref()
                    .and_then(|st| st.provider.as_deref())
                    .or(v.spec.provider.as_deref()))
            }) {
                let _ = vol_tx
                    .send(ObjectRef::new(&v.name_any()).within(&v.namespace().unwrap_or_default()))
                    .await;
            }
        }
        Err(err) => {
            tracing::warn!(%err, provider, "cannot list SandboxVolumes to reconcile them; the periodic resync will")
        }
    }
}
