//! Claims: a Sandbox with `spec.warmPoolRef` takes a running member of its pool instead of
//! creating a sandbox, or — with none Ready — is created from the pool's template.
//!
//! The member keeps its pool's owner labels (provider labels cannot change); what moves
//! ownership is the pool's ledger ([`crate::controller::pool::ledger`]), written with a
//! resourceVersion check BEFORE this Sandbox's status records the member. So a crash between
//! the two leaves a ledger entry naming this Sandbox's UID, which the next pass finds and
//! finishes; a Sandbox deleted meanwhile has its member removed by the pool controller.
//! Claims of one pool that arrive together share one member listing and one ledger write
//! ([`super::broker`]). The
//! identity check accepts the member through the ledger (see
//! [`crate::provider::labels::ensure_owned_or_claimed`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::Api;

use crate::api::{Claimant, Sandbox, SandboxSpec, SandboxWarmPool};
use crate::controller::events::warning;
use crate::controller::outcome::{Outcome, Report};
use crate::controller::pool::members;
use crate::controller::pool::pace::Serving;
use crate::controller::{Context, caches};
use crate::provider::SandboxDescriptor;
use crate::provider::labels::Claim;
use crate::registry::ProviderHandle;
use crate::registry::exec::StagedWrite;

use super::SandboxContext;
use super::apply::{Pass, WAIT};
use super::broker::{Ask, Broker, PoolAt};
use super::build::Desired;
use super::observe::owned_by;
use super::resolve::{self, SELF_DELIVERED_ENV_PATH, SelfDeliveredEnv};

/// `status.claim` of a Sandbox served by a running member.
pub const WARM: &str = "warm";
/// `status.claim` of a Sandbox created from its pool's template.
pub const COLD: &str = "cold";

/// The pool a claiming Sandbox names; `None` for a Sandbox without `spec.warmPoolRef`. Read
/// from the watch cache: a claim's ledger write carries the resourceVersion it read, so a
/// cache that was behind costs a fresh read, never a wrong claim. A Sandbox served warm
/// before (`claimed`) whose entry the cached ledger lacks reads it fresh: its proof must not
/// be missed for a cache that is behind.
pub async fn pool(
    r: &Report<'_, Sandbox>,
    sctx: &SandboxContext,
    claimed: bool,
) -> Result<Option<SandboxWarmPool>, Outcome> {
    let Some(pool_ref) = &r.object.spec.warm_pool_ref else {
        return Ok(None);
    };
    let ns = r.object.namespace().unwrap_or_default();
    let api: Api<SandboxWarmPool> = Api::namespaced(r.ctx.client.clone(), &ns);
    let cache = sctx.caches.get().map(|c| &c.pools);
    let uid = r.object.uid().unwrap_or_default();
    let cached = caches::lookup(cache, &api, &ns, &pool_ref.name).await?;
    let pool = match cached {
        Some(p) if !claimed || crate::claims::of(&p, &uid).is_some() => {
            Some(Arc::unwrap_or_clone(p))
        }
        _ => api.get_opt(&pool_ref.name).await?,
    };
    match pool {
        Some(pool) => Ok(Some(pool)),
        None => Err(Outcome::waiting(
            "WarmPoolNotFound",
            format!(
                "spec.warmPoolRef: SandboxWarmPool {:?} does not exist in namespace {ns:?} yet",
                pool_ref.name
            ),
            WAIT,
        )),
    }
}

/// The Sandbox as the pipeline builds it: its pool's template (as members run it) with its
/// own power state and lifetime. Everything else it sets is delivered into the running
/// member ([`env_file`]).
pub fn effective(sandbox: &Sandbox, pool: &SandboxWarmPool) -> Sandbox {
    let spec = SandboxSpec {
        state: sandbox.spec.state,
        lifetime: sandbox.spec.lifetime.clone(),
        ..members::member_spec(&pool.spec.template)
    };
    Sandbox {
        metadata: sandbox.metadata.clone(),
        spec,
        status: sandbox.status.clone(),
    }
}

/// The claiming Sandbox's `env`, `envFrom` and `selfDeliveredEnv`, as one file delivered
/// into the member the way `selfDeliveredEnv` is (a running process cannot be given new
/// environment variables). Its version is the generation and the selfDeliveredEnv Secret's
/// resourceVersion: never anything derived from the values.
pub async fn env_file(
    sandbox: &Sandbox,
    ctx: &Context,
) -> Result<Option<SelfDeliveredEnv>, Outcome> {
    let spec = &sandbox.spec;
    let mut vars: BTreeMap<String, String> = spec
        .env
        .iter()
        .flatten()
        .map(|v| (v.name.clone(), v.value.clone()))
        .collect();
    let secrets: Api<Secret> =
        Api::namespaced(ctx.client.clone(), &sandbox.namespace().unwrap_or_default());
    for (key, value) in resolve::secret_env(sandbox, &secrets).await? {
        if vars.contains_key(&key) {
            let msg = format!(
                "env var {key:?} is set both in spec.env and by spec.envFrom; remove one of them"
            );
            return Err(Outcome::stalled("InvalidSpec", msg));
        }
        vars.insert(key, value);
    }
    let delivered = resolve::self_delivered_env(sandbox, ctx).await?;
    if vars.is_empty() && delivered.is_none() {
        return Ok(None);
    }
    let mut content = resolve::render_env_file(&vars);
    let mut version = format!("g{}", sandbox.metadata.generation.unwrap_or_default());
    if let Some(d) = delivered {
        content.push_str(&d.content);
        version = format!("{version}-{}", d.version);
    }
    Ok(Some(SelfDeliveredEnv { content, version }))
}

/// How a claiming Sandbox is served: the ledger's proof that a member is its own (`None`:
/// served cold), and the member as the claim just described it, when it did.
#[derive(Default)]
pub struct Settled {
    /// The ledger's proof of ownership.
    pub proof: Option<Claim>,
    /// The member's description, made just before the ledger write.
    pub seen: Option<SandboxDescriptor>,
    /// A member taken by this pass: the claim counts as being served (the pool's refill
    /// waits for it, see [`crate::controller::pool::pace`]) until this is dropped with the
    /// rest of the pass's `Settled`.
    pub serving: Option<Serving>,
    /// The claim's environment, staged in the member it took while the ledger write was
    /// under way (see [`stage`]).
    pub staged: Option<StagedEnv>,
}

/// A claim's environment file staged in its member ([`ProviderHandle::stage_write`]): put in
/// place by the env delivery of the same version, abandoned when dropped.
pub struct StagedEnv {
    version: String,
    write: std::sync::Mutex<Option<StagedWrite>>,
}

impl StagedEnv {
    /// The staged write, when it is the file `version` for sandbox `id`; taken once.
    pub fn take(&self, id: &str, version: &str) -> Option<StagedWrite> {
        let mut write = self
            .write
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let fits = write.as_ref().is_some_and(|w| w.sandbox() == id);
        (fits && self.version == version)
            .then(|| write.take())
            .flatten()
    }
}

/// Settles how the Sandbox is served, before it is observed: the member the ledger gives
/// it (a claim recorded, or interrupted by a crash and finished now), a member taken now,
/// or nothing (cold: it is created from `desired`).
pub async fn settle(
    r: &Report<'_, Sandbox>,
    at: Claiming<'_>,
    desired: &Desired,
    touched: bool,
    pass: &mut Pass,
) -> Result<Settled, Outcome> {
    let Claiming {
        broker,
        handle,
        pool,
        env,
    } = at;
    let uid = r.object.uid().unwrap_or_default();
    if let Some(proof) = crate::claims::of(pool, &uid) {
        record(r, handle, pass, &proof.member).await?;
        let proof = Some(proof);
        return Ok(Settled {
            proof,
            ..Settled::default()
        });
    }
    if pass.current.claim.is_some() || (touched && created_cold(handle, &uid).await?) {
        return Ok(Settled::default());
    }
    let serving = r.ctx.claim_times.begin(pool);
    let (early, foretold) = tokio::sync::oneshot::channel();
    let (taken, staged) = tokio::join!(
        take(r, broker, handle, pool, desired, early),
        stage(handle, env, foretold)
    );
    let taken = taken?;
    r.ctx
        .metrics
        .warm_pool_claim(if taken.is_some() { WARM } else { COLD });
    let Some((proof, seen)) = taken else {
        // A cold claim is a create like the refill's: nothing for the refill to wait for.
        pass.next.claim = Some(COLD.into());
        return Ok(Settled::default());
    };
    r.ctx.failpoint("claim-after-ledger");
    record(r, handle, pass, &proof.member).await?;
    // Staged into another member than the one taken (the ledger write lost a race): dropped
    // here, it is abandoned there.
    let staged = staged.filter(|s| s.0 == proof.member).map(|s| s.1);
    Ok(Settled {
        proof: Some(proof),
        seen,
        serving: Some(serving),
        staged,
    })
}

/// What a claim goes through: the broker, the pool and its provider, and the claim's
/// environment file (delivered into the member it takes).
pub struct Claiming<'a> {
    /// The Sandbox controller's claim broker.
    pub broker: &'a Broker,
    /// The pool's provider.
    pub handle: &'a ProviderHandle,
    /// The pool claimed from.
    pub pool: &'a SandboxWarmPool,
    /// The claim's environment file, when it has one.
    pub env: Option<&'a SelfDeliveredEnv>,
}

/// Stages the claim's environment file in the member the broker means to give it, while
/// the ledger write is under way: the write, with its data, waits beside the file for the
/// env delivery to put it in place, which leaves only a rename on the claim's path after
/// the ledger. Safe before the member is ours: a staged write that is not committed — this
/// pass gets another member, fails, or the operator dies — is removed and never seen (see
/// [`ProviderHandle::stage_write`]). `None` (nothing staged; the delivery writes the file
/// as usual) without a file, a waiting process in the member, or a member foretold.
async fn stage(
    handle: &ProviderHandle,
    env: Option<&SelfDeliveredEnv>,
    foretold: tokio::sync::oneshot::Receiver<String>,
) -> Option<(String, StagedEnv)> {
    let env = env?;
    let member = foretold.await.ok()?;
    handle.provider.files()?;
    let content = env.content.as_bytes();
    let staged = handle
        .stage_write(&member, SELF_DELIVERED_ENV_PATH, content, 0o600)
        .await;
    let write = match staged {
        Ok(write) => write?,
        Err(e) => {
            tracing::debug!(sandbox = %member, error = %e, "claim env not staged");
            return None;
        }
    };
    let staged = StagedEnv {
        version: env.version.clone(),
        write: std::sync::Mutex::new(Some(write)),
    };
    Some((member, staged))
}

/// Whether a sandbox labelled with the Sandbox's own UID exists: a cold create ran before
/// (its status write may have been lost), so the Sandbox stays cold.
async fn created_cold(handle: &ProviderHandle, uid: &str) -> Result<bool, Outcome> {
    let found = handle
        .call("find", handle.provider.find(&owned_by(uid)))
        .await?;
    Ok(!found.is_empty())
}

/// Records the claimed member in the status this pass writes (after the ledger, never
/// before), its labels first. No status write of its own: until the pass's write lands, the
/// ledger's entry naming this Sandbox's UID is the record, and a pass interrupted before it
/// finds the entry and records it again — labels included (the first branch of [`settle`]).
async fn record(
    r: &Report<'_, Sandbox>,
    handle: &ProviderHandle,
    pass: &mut Pass,
    member: &str,
) -> Result<(), Outcome> {
    if pass.current.sandbox_id.as_deref() == Some(member)
        && pass.current.claim.as_deref() == Some(WARM)
    {
        return Ok(());
    }
    relabel(r, handle, member).await?;
    pass.next.sandbox_id = Some(member.to_string());
    pass.next.claim = Some(WARM.into());
    Ok(())
}

/// Puts the claim's `spec.labels` on the member, before status records it (so a crash in
/// between labels it again). A provider that fixes labels at create cannot: a Warning
/// says so (a claim served cold gets them at create).
async fn relabel(
    r: &Report<'_, Sandbox>,
    handle: &ProviderHandle,
    member: &str,
) -> Result<(), Outcome> {
    let Some(labels) = r.object.spec.labels.as_ref().filter(|l| !l.is_empty()) else {
        return Ok(());
    };
    let Some(relabel) = handle.provider.relabel() else {
        let msg = format!(
            "spec.labels are not on the claimed member {member}: provider {} cannot change \
             the labels of a running sandbox",
            handle.name()
        );
        warning(r.ctx, r.object, "LabelsNotApplied", msg).await;
        return Ok(());
    };
    handle
        .call("add_labels", relabel.add_labels(member, labels))
        .await?;
    Ok(())
}

/// The claim's `spec.labels` on a cold create: beside the request's own labels, and not
/// in its spec hash (which stays the pool template's, as the members' is).
pub fn cold_labels(sandbox: &Sandbox, desired: &mut Desired) {
    let own = sandbox.spec.labels.iter().flatten();
    let free: Vec<_> = own
        .filter(|(k, _)| !desired.request.labels.contains_key(*k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    desired.request.labels.extend(free);
}

/// Takes a Ready member of the pool through the broker: one that runs and was built to the
/// very spec this Sandbox would be created with, entered in the ledger for this Sandbox by a
/// resourceVersion-checked write, with its description when the broker made one. `None`
/// when no such member is free.
async fn take(
    r: &Report<'_, Sandbox>,
    broker: &Broker,
    handle: &ProviderHandle,
    pool: &SandboxWarmPool,
    desired: &Desired,
    early: tokio::sync::oneshot::Sender<String>,
) -> Result<Option<(Claim, Option<SandboxDescriptor>)>, Outcome> {
    let api: Api<SandboxWarmPool> =
        Api::namespaced(r.ctx.client.clone(), &pool.namespace().unwrap_or_default());
    let at = PoolAt {
        ctx: r.ctx,
        api: &api,
        read: pool,
        handle,
    };
    let ask = Ask {
        claimant: Claimant {
            name: r.object.name_any(),
            uid: r.object.uid().unwrap_or_default(),
        },
        spec_hash: desired.spec_hash.clone(),
    };
    let taken = broker.claim(&at, ask, Some(early)).await?;
    Ok(taken.map(|t| {
        let proof = Claim {
            pool_uid: pool.uid().unwrap_or_default(),
            member: t.member,
        };
        (proof, t.seen)
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{DesiredState, EnvVar, SandboxWarmPoolSpec};

    #[test]
    fn a_claim_runs_the_pool_template_with_its_own_state_and_lifetime() {
        let pool = SandboxWarmPool::new(
            "p",
            SandboxWarmPoolSpec {
                replicas: 1,
                template: SandboxSpec {
                    image: Some("img".into()),
                    ..SandboxSpec::default()
                },
                progress_deadline_seconds: None,
            },
        );
        let mut sandbox = Sandbox::new(
            "s",
            SandboxSpec {
                state: Some(DesiredState::Sleeping),
                env: Some(vec![EnvVar {
                    name: "A".into(),
                    value: "1".into(),
                }]),
                ..SandboxSpec::default()
            },
        );
        sandbox.metadata.uid = Some("u".into());
        let e = effective(&sandbox, &pool);
        assert_eq!(e.spec.image.as_deref(), Some("img"));
        assert_eq!(e.spec.state, Some(DesiredState::Sleeping));
        assert_eq!(
            e.spec.env, None,
            "env is delivered into the member, not created with"
        );
        assert_eq!(e.metadata.uid.as_deref(), Some("u"));
    }
}
