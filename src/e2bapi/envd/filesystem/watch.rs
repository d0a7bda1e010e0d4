//! Watching a directory. Sandbox images carry no inotify tool and the seam has no event
//! stream for files, so a watch lists the directory every [`POLL`] through the seam's exec
//! and reports what [`diff`](super::diff) finds between two listings. Two forms, as envd
//! offers them:
//!
//! - `CreateWatcher` / `GetWatcherEvents` / `RemoveWatcher` (the sync SDKs): a task of this
//!   replica polls into the watcher's queue until it is removed, its directory fails, or
//!   nobody has read it for [`IDLE`]. Watchers live in the memory of the replica that made
//!   them; a watcher id answers only to the sandbox (and token) that made it.
//! - `WatchDir` (the async SDKs): a server stream that polls while the client listens and
//!   stops when it goes away (the response body is dropped).

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use axum::response::Response;
use bytes::Bytes;
use futures::StreamExt;
use serde::Deserialize;
use serde_json::json;

use super::diff::{self, Event, Snapshot};
use super::shell;
use crate::access::lookup::Target;
use crate::connect_json;
use crate::e2bapi::envd::error::{Code, EnvdError};
use crate::e2bapi::envd::rpc;
use crate::e2bapi::envd::target::EnvdTarget;

/// How often a watched directory is listed.
pub const POLL: Duration = Duration::from_millis(250);
/// A watcher nobody has read for this long is dropped (its client went away).
pub const IDLE: Duration = Duration::from_secs(60);
/// Unread events a watcher keeps; past it the watcher fails rather than lose events.
pub const MAX_EVENTS: usize = 10_000;
/// `WatchDir` sends a keepalive after this long without events.
const KEEPALIVE: Duration = Duration::from_secs(30);
/// The listing depth of a recursive watch.
const ALL_DEPTHS: u32 = 4096;

/// `WatchDirRequest` and `CreateWatcherRequest`.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct WatchRequest {
    /// The directory.
    pub path: String,
    /// Also below its subdirectories.
    pub recursive: bool,
    /// Entries in events: not offered (envd 0.6.3; this API announces an older envd).
    #[serde(alias = "include_entry")]
    pub include_entry: bool,
}

/// `GetWatcherEventsRequest` and `RemoveWatcherRequest`.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct WatcherRequest {
    /// The watcher.
    #[serde(alias = "watcher_id")]
    pub watcher_id: String,
}

/// One watched directory and its last listing.
struct Poller {
    target: Target,
    path: String,
    depth: u32,
    last: Snapshot,
}

impl Poller {
    /// The directory's first listing (so the watch starts from what is there now).
    async fn start(target: Target, req: &WatchRequest) -> Result<Poller, EnvdError> {
        if req.include_entry {
            return Err(EnvdError::new(
                Code::InvalidArgument,
                "entries in watch events are not offered; watch without include_entry",
            ));
        }
        let path = shell::path("directory to watch", &req.path)?;
        let depth = if req.recursive { ALL_DEPTHS } else { 1 };
        let last = diff::snapshot(&path, shell::list(&target, &path, depth).await?);
        Ok(Poller {
            target,
            path,
            depth,
            last,
        })
    }

    /// The events since the last listing.
    async fn next(&mut self) -> Result<Vec<Event>, EnvdError> {
        let found = shell::list(&self.target, &self.path, self.depth).await?;
        let now = diff::snapshot(&self.path, found);
        let events = diff::diff(&self.last, &now);
        self.last = now;
        Ok(events)
    }
}

/// What a watcher has found and not yet handed out.
struct Queue {
    events: Vec<Event>,
    failed: Option<EnvdError>,
    read_at: Instant,
}

/// A watcher: its sandbox, its queue, its polling task.
struct Watcher {
    sid: String,
    queue: Arc<Mutex<Queue>>,
    task: tokio::task::AbortHandle,
}

static WATCHERS: LazyLock<Mutex<HashMap<String, Watcher>>> = LazyLock::new(Default::default);

fn watchers() -> std::sync::MutexGuard<'static, HashMap<String, Watcher>> {
    WATCHERS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn lock(queue: &Mutex<Queue>) -> std::sync::MutexGuard<'_, Queue> {
    queue
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `CreateWatcher`: lists the directory now, then polls it in the background.
pub async fn create(t: EnvdTarget, h: HeaderMap, body: Bytes) -> Result<Response, EnvdError> {
    rpc::refuse_other_user(&h, None)?;
    let req: WatchRequest = rpc::unary(&body)?;
    let poller = Poller::start(t.target, &req).await?;
    let id = format!("w-{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..));
    let queue = Arc::new(Mutex::new(Queue {
        events: Vec::new(),
        failed: None,
        read_at: Instant::now(),
    }));
    let task = tokio::spawn(feed(poller, id.clone(), queue.clone())).abort_handle();
    let watcher = Watcher {
        sid: t.sid,
        queue,
        task,
    };
    watchers().insert(id.clone(), watcher);
    Ok(rpc::ok(json!({ "watcherId": id })))
}

/// Polls into `queue` until the watcher goes unread for [`IDLE`], then forgets it. A failed
/// watcher polls no more but waits out its idle time, so its client can still read why.
async fn feed(mut poller: Poller, id: String, queue: Arc<Mutex<Queue>>) {
    loop {
        tokio::time::sleep(POLL).await;
        let (idle, failed) = {
            let q = lock(&queue);
            (q.read_at.elapsed() > IDLE, q.failed.is_some())
        };
        if idle {
            watchers().remove(&id);
            return;
        }
        if failed {
            continue;
        }
        let found = poller.next().await;
        absorb(&mut lock(&queue), found);
    }
}

/// One poll's outcome into the queue: its events, or the failure that ends the watch
/// (including more unread events than [`MAX_EVENTS`], rather than losing some).
fn absorb(q: &mut Queue, found: Result<Vec<Event>, EnvdError>) {
    match found {
        Ok(events) if q.events.len() + events.len() <= MAX_EVENTS => q.events.extend(events),
        Ok(_) => {
            let full = format!("more than {MAX_EVENTS} events went unread; watch again");
            q.failed = Some(EnvdError::new(Code::Internal, full));
        }
        Err(e) => q.failed = Some(e),
    }
}

/// The queue of watcher `id` when sandbox `sid` made it; another sandbox's watcher is as
/// unknown as a missing one.
fn owned(
    all: &HashMap<String, Watcher>,
    id: &str,
    sid: &str,
) -> Result<Arc<Mutex<Queue>>, EnvdError> {
    all.get(id)
        .filter(|w| w.sid == sid)
        .map(|w| w.queue.clone())
        .ok_or_else(|| unknown(id))
}

/// `GetWatcherEvents`: what the watcher found since the last call; once it has failed and
/// everything was handed out, its error (and the watcher is gone).
pub async fn events(t: EnvdTarget, h: HeaderMap, body: Bytes) -> Result<Response, EnvdError> {
    rpc::refuse_other_user(&h, None)?;
    let req: WatcherRequest = rpc::unary(&body)?;
    let queue = owned(&watchers(), &req.watcher_id, &t.sid)?;
    let mut q = lock(&queue);
    q.read_at = Instant::now();
    if q.events.is_empty()
        && let Some(e) = q.failed.take()
    {
        if let Some(w) = watchers().remove(&req.watcher_id) {
            w.task.abort();
        }
        return Err(e);
    }
    let events: Vec<_> = q.events.drain(..).map(|e| e.wire()).collect();
    Ok(rpc::ok(json!({ "events": events })))
}

/// `RemoveWatcher`: stops polling and forgets the watcher.
pub async fn remove(t: EnvdTarget, h: HeaderMap, body: Bytes) -> Result<Response, EnvdError> {
    rpc::refuse_other_user(&h, None)?;
    let req: WatcherRequest = rpc::unary(&body)?;
    let mut all = watchers();
    owned(&all, &req.watcher_id, &t.sid)?;
    if let Some(w) = all.remove(&req.watcher_id) {
        w.task.abort();
    }
    Ok(rpc::ok(json!({})))
}

fn unknown(id: &str) -> EnvdError {
    EnvdError::new(
        Code::NotFound,
        format!(
            "watcher {id:?} not found (removed, failed, unread for {}s, or made by another replica)",
            IDLE.as_secs()
        ),
    )
}

/// `WatchDir`: a `start` message, then the events as they are found, until the client goes
/// away or the directory cannot be listed (the stream's error).
pub async fn watch_dir(t: EnvdTarget, h: HeaderMap, body: Bytes) -> Response {
    let started = match start_stream(t, &h, &body).await {
        Ok(poller) => poller,
        Err(e) => return rpc::stream_failed(&e),
    };
    let first = futures::stream::once(async { connect_json::envelope(&json!({"start": {}})) });
    let rest = futures::stream::unfold(Some(started), |state| async move {
        let mut poller = state?;
        let mut quiet = Duration::ZERO;
        loop {
            tokio::time::sleep(POLL).await;
            match poller.next().await {
                Ok(events) if !events.is_empty() => {
                    let frames: Vec<u8> = events
                        .iter()
                        .flat_map(|e| connect_json::envelope(&json!({"filesystem": e.wire()})))
                        .collect();
                    return Some((Bytes::from(frames), Some(poller)));
                }
                Ok(_) if quiet >= KEEPALIVE => {
                    return Some((
                        connect_json::envelope(&json!({"keepalive": {}})),
                        Some(poller),
                    ));
                }
                Ok(_) => quiet += POLL,
                Err(e) => return Some((connect_json::end_of_stream(&e.end_of_stream()), None)),
            }
        }
    });
    rpc::streaming(first.chain(rest))
}

/// The enveloped `WatchDirRequest`, and the directory's first listing.
async fn start_stream(t: EnvdTarget, h: &HeaderMap, body: &Bytes) -> Result<Poller, EnvdError> {
    rpc::refuse_other_user(h, None)?;
    let req: WatchRequest = rpc::enveloped(body)?;
    Poller::start(t.target, &req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue() -> Queue {
        Queue {
            events: Vec::new(),
            failed: None,
            read_at: Instant::now(),
        }
    }

    fn event(name: &str) -> Event {
        Event {
            name: name.into(),
            kind: diff::EventType::Create,
        }
    }

    #[tokio::test]
    async fn a_watcher_answers_only_to_the_sandbox_that_made_it() {
        let task = tokio::spawn(async {}).abort_handle();
        let q = Arc::new(Mutex::new(queue()));
        let w = Watcher {
            sid: "a-ns".into(),
            queue: q.clone(),
            task,
        };
        let all = HashMap::from([("w-1".to_string(), w)]);
        assert!(Arc::ptr_eq(&owned(&all, "w-1", "a-ns").unwrap(), &q));
        assert_eq!(
            owned(&all, "w-1", "b-ns").err().unwrap().code,
            Code::NotFound
        );
        assert_eq!(
            owned(&all, "w-2", "a-ns").err().unwrap().code,
            Code::NotFound
        );
    }

    #[test]
    fn events_queue_up_to_the_bound_then_the_watch_fails_rather_than_drop_some() {
        let mut q = queue();
        absorb(&mut q, Ok(vec![event("a"), event("b")]));
        assert_eq!(q.events.len(), 2);
        absorb(&mut q, Ok(vec![event("c"); MAX_EVENTS - 1]));
        assert_eq!(q.events.len(), 2, "nothing of an overflowing poll is kept");
        assert_eq!(q.failed.as_ref().map(|e| e.code), Some(Code::Internal));
        let mut q = queue();
        absorb(&mut q, Err(EnvdError::new(Code::NotFound, "gone")));
        assert_eq!(q.failed.map(|e| e.code), Some(Code::NotFound));
    }
}
