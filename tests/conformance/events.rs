//! The events capability: a stream of changes to the resources of one operator instance,
//! each mapped to its owning object, so drift is noticed without polling.

use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::BoxStream;
use sandbox_operator::provider::labels::Owner;
use sandbox_operator::provider::{ProviderEvent, ProviderResult};

use super::Fixture;
use super::support::{Check, OrFail, create};

type Events = BoxStream<'static, ProviderResult<ProviderEvent>>;

/// Reads events until one belongs to `owner` (true) or `until` passes (false), failing on a
/// stream error or on an event of any owner outside `allowed`.
async fn saw(
    events: &mut Events,
    owner: &Owner,
    allowed: &[&Owner],
    until: Instant,
) -> Result<bool, String> {
    loop {
        let next = match tokio::time::timeout_at(until.into(), events.next()).await {
            Err(_) => return Ok(false),
            Ok(None) => return Err("the event stream ended".into()),
            Ok(Some(next)) => next,
        };
        let event = next.or_fail("event stream")?;
        ensure!(
            allowed.iter().any(|o| o.uid == event.owner.uid),
            "an event of a resource that is not this instance's arrived: {event:?}"
        );
        ensure!(
            !event.action.is_empty(),
            "an event without an action: {event:?}"
        );
        if event.owner == *owner {
            return Ok(true);
        }
    }
}

/// Subscribed to this instance, the stream delivers changes to our sandbox mapped to its
/// full owner, and nothing of another instance's.
pub async fn capability_events(fx: &Fixture) -> Check {
    let Some(source) = fx.provider.events() else {
        ensure!(
            !fx.expect.events,
            "events() is None but the provider declares it"
        );
        return Ok(());
    };
    ensure!(
        fx.expect.events,
        "events() is Some but the provider declares none"
    );
    let mut events: Events = source.subscribe(&fx.instance);
    let request = fx.request();
    let id = create(fx, &request).await?.id;
    let owner = request.owner.clone();

    // The subscription is live once a change of ours comes through: start and stop until
    // one does (a change made before the subscription took hold is not seen).
    let deadline = Instant::now() + fx.patience;
    loop {
        ensure!(
            Instant::now() < deadline,
            "no event for sandbox {id} arrived within {:?}",
            fx.patience
        );
        fx.provider.start(&id).await.or_fail("start")?;
        fx.provider.stop(&id).await.or_fail("stop")?;
        let until = (Instant::now() + Duration::from_secs(2)).min(deadline);
        if saw(&mut events, &owner, &[&owner], until).await? {
            break;
        }
    }

    // Live: a foreign instance's sandbox changes, then ours; only ours comes through.
    let mut foreign = fx.request();
    foreign.owner.instance = format!("{}-other", fx.instance);
    let foreign_id = create(fx, &foreign).await?.id;
    fx.provider
        .start(&foreign_id)
        .await
        .or_fail("start foreign")?;
    fx.provider
        .destroy(&foreign_id)
        .await
        .or_fail("destroy foreign")?;
    fx.provider.start(&id).await.or_fail("start")?;
    let until = Instant::now() + fx.patience;
    ensure!(
        saw(&mut events, &owner, &[&owner], until).await?,
        "the start of sandbox {id} produced no event within {:?}",
        fx.patience
    );
    Ok(())
}
