//! Timeouts, really enforced: a running sandbox whose `endAt` has passed is killed (its
//! container removed), or paused with its memory when it was created with `autoPause`.

use std::time::Duration;

use chrono::Utc;

use super::state::{Expired, Power, Shared};

/// How often the reaper looks.
const TICK: Duration = Duration::from_millis(100);

/// Runs until the task is aborted.
pub(crate) async fn run(shared: Shared) {
    loop {
        tokio::time::sleep(TICK).await;
        reap(&shared).await;
    }
}

async fn reap(shared: &Shared) {
    let now = Utc::now();
    let due: Vec<_> = {
        let mut sandboxes = shared.sandboxes.lock().await;
        let ids: Vec<String> = sandboxes
            .values()
            .filter(|s| s.power == Power::Running && !s.busy && s.end_at <= now)
            .map(|s| s.id.clone())
            .collect();
        ids.into_iter()
            .filter_map(|id| {
                let sandbox = sandboxes.get_mut(&id)?;
                if sandbox.auto_pause {
                    sandbox.busy = true;
                    Some(sandbox.clone())
                } else {
                    sandboxes.remove(&id)
                }
            })
            .collect()
    };
    for sandbox in due {
        let outcome = if sandbox.auto_pause {
            if let Err(e) = super::api::pause_container(shared, &sandbox, true).await {
                tracing::warn!(sandbox = %sandbox.id, error = %e, "e2b double: auto-pause failed");
            }
            "paused"
        } else {
            if let Err(e) = shared.engine.remove(&sandbox.container).await {
                tracing::warn!(sandbox = %sandbox.id, error = %e, "e2b double: timeout kill failed");
            }
            "killed"
        };
        shared
            .expired
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Expired {
                id: sandbox.id.clone(),
                outcome,
            });
    }
}
