//! Warm processes: an exec started ahead of need in a sandbox, waiting for its command.
//!
//! Why: on a container runtime, starting a process in a running sandbox is a runtime exec
//! (`runc exec` behind Docker's exec API and the Pod `exec` subresource) — measured here at
//! about 50 ms for `true`, almost all of it the runtime's own work, before the program runs.
//! A `kubectl sandbox exec`, an E2B `commands.run` and a claim's environment delivery each
//! pay it. So for a provider that says starting a process is that costly
//! ([`Provider::warm_exec`]), the handle keeps one process per sandbox already started — the
//! [`reader`], under the provider's own streaming exec and its signal wrapper — and a
//! request hands it its argv, environment and working directory instead of starting one.
//! The reader `exec`s the program, which then is exactly the process the provider would
//! have started: same stdio, same pid for signals, same exit code. It does so only after a
//! handshake (see [`reader`]), so a request whose reader does not answer starts its process
//! the ordinary way without any risk of running it twice.
//!
//! A *keeper* task owns each waiting process, registered under the sandbox's id. It ends,
//! and leaves the map, when its process ends (the sandbox stopped), when it is not used for
//! its linger time, or when a request takes its process. A request that finds none, or one
//! whose reader does not take its command, starts the process the ordinary way.
//!
//! A waiting reader costs a shell process in the sandbox and one provider connection. Only
//! sandboxes in use get them, [`DEPTH`] at a time: when a request has used the last one, new
//! ones are started once its process ends (lingering [`LINGER`]), and a warm pool's free
//! members get theirs as they join the pool, so a claim's environment delivery and the
//! claimant's first command each find one waiting.

pub mod reader;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::oneshot;

use crate::provider::Provider;
use crate::provider::stream::{ExecInput, ExecSession, StreamExecRequest};

/// How long a waiting process left by a request is kept for the next one.
pub const LINGER: Duration = Duration::from_secs(120);

/// How many processes wait in one sandbox. Two, so that the one a request takes is
/// replaced while the other serves the next request: starting a process is tens of
/// milliseconds of engine CPU, and it then competes with nothing on the path of a request
/// that follows at once (a claim's env delivery and its first command; back-to-back
/// execs). Measured on Docker with one: the replacement for a claim's env delivery, started
/// as the claim wrote its status, slowed that write and the next claim (28 ms → 39 ms median).
pub const DEPTH: usize = 2;

/// How long a taken reader may take to answer its header. It is already running and waiting
/// for it, so this only bounds a frozen or overloaded sandbox, which then gets its process
/// the ordinary way.
const START_BOUND: Duration = Duration::from_secs(2);

/// How a waiting process gets its command once taken.
type Taker = oneshot::Sender<oneshot::Sender<ExecSession>>;

/// One registered keeper: which one, how to take its process, and whether its start has
/// been answered (its process waits, or it could not be started and the keeper is leaving).
struct Keeper {
    serial: u64,
    take: Taker,
    answered: Arc<AtomicBool>,
}

/// A registered keeper's side: its serial, where its process is taken from, and the flag it
/// sets once its start has been answered.
pub struct Registered {
    /// Which keeper.
    pub serial: u64,
    /// Where a request asks for its process.
    pub taken: oneshot::Receiver<oneshot::Sender<ExecSession>>,
    /// Set once the start has been answered.
    pub answered: Arc<AtomicBool>,
}

/// The waiting processes of one provider, by sandbox id, oldest first.
#[derive(Default)]
pub struct WarmExec {
    keepers: Mutex<HashMap<String, Vec<Keeper>>>,
    serial: AtomicU64,
}

/// What a taken process did with a request.
pub enum Handed {
    /// The program runs in it.
    Running(ExecSession),
    /// It ended without starting the program: start it the ordinary way.
    Refused,
}

impl WarmExec {
    /// Whether a process waits (or is being started) in sandbox `id`.
    pub fn has(&self, id: &str) -> bool {
        lock(&self.keepers).contains_key(id)
    }

    /// Whether no process of sandbox `id` is still being started: each registered one waits
    /// (or none is registered, or they could not be started).
    pub fn settled(&self, id: &str) -> bool {
        lock(&self.keepers)
            .get(id)
            .is_none_or(|kept| kept.iter().all(|k| k.answered.load(Ordering::Acquire)))
    }

    /// Registers a keeper for `id` unless [`DEPTH`] are there, for the task that starts its
    /// process; `None` when the sandbox has its keepers already.
    pub fn register(&self, id: &str) -> Option<Registered> {
        let mut keepers = lock(&self.keepers);
        let kept = keepers.entry(id.to_string()).or_default();
        if kept.len() >= DEPTH {
            return None;
        }
        let serial = self.serial.fetch_add(1, Ordering::Relaxed);
        let (take, taken) = oneshot::channel();
        let answered = Arc::new(AtomicBool::new(false));
        kept.push(Keeper {
            serial,
            take,
            answered: answered.clone(),
        });
        Some(Registered {
            serial,
            taken,
            answered,
        })
    }

    /// Removes the keeper `serial` of `id`, if it is still registered.
    pub fn deregister(&self, id: &str, serial: u64) {
        let mut keepers = lock(&self.keepers);
        if let Some(kept) = keepers.get_mut(id) {
            kept.retain(|k| k.serial != serial);
            if kept.is_empty() {
                keepers.remove(id);
            }
        }
    }

    /// A waiting process of sandbox `id`, the oldest first, once its keeper has started it;
    /// `None` when there is none, or none could be started, or each ended meanwhile.
    pub async fn take(&self, id: &str) -> Option<ExecSession> {
        while let Some(keeper) = self.pop(id) {
            let (reply, session) = oneshot::channel();
            if keeper.take.send(reply).is_err() {
                continue;
            }
            if let Ok(session) = session.await {
                return Some(session);
            }
        }
        None
    }

    /// Unregisters the oldest keeper of `id`.
    fn pop(&self, id: &str) -> Option<Keeper> {
        let mut keepers = lock(&self.keepers);
        let kept = keepers.get_mut(id)?;
        let first = (!kept.is_empty()).then(|| kept.remove(0));
        if kept.is_empty() {
            keepers.remove(id);
        }
        first
    }
}

/// What a keeper runs to start its process: the reader, with a stdin for the header.
pub fn reader_request() -> StreamExecRequest {
    StreamExecRequest {
        argv: vec!["sh".into(), "-c".into(), reader::READER.into()],
        env: Default::default(),
        cwd: None,
        stdin: true,
        tty: None,
    }
}

/// Keeps a started process until it is taken (handed over on `taken`), ends, or waits
/// longer than `linger` (`None`: until taken or ended). Dropping it closes its stdin, and
/// the reader then ends without starting anything.
pub async fn keep(
    mut session: ExecSession,
    taken: oneshot::Receiver<oneshot::Sender<ExecSession>>,
    linger: Option<Duration>,
) {
    let expiry = async {
        match linger {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    let reply = tokio::select! {
        reply = taken => reply.ok(),
        _ = &mut session.exit => None,
        () = expiry => None,
    };
    if let Some(reply) = reply {
        let _ = reply.send(session);
    }
}

/// Hands `request` to a taken reader: its header, then — once the reader's marker says it
/// applied the header — the go (and, without stdin, an end of file right after it).
/// `Refused` when the marker does not come within [`START_BOUND`] for any reason: no go was
/// sent, so the program has not run and never will (the reader's stdin closes as it is
/// dropped here).
pub async fn hand(taken: ExecSession, request: &StreamExecRequest) -> Handed {
    let Some(header) = reader::header(&request.argv, &request.env, request.cwd.as_deref()) else {
        return Handed::Refused;
    };
    let ExecSession {
        input,
        mut stdout,
        stderr,
        exit,
    } = taken;
    if input
        .send(ExecInput::Stdin(Bytes::from(header)))
        .await
        .is_err()
    {
        return Handed::Refused;
    }
    let marked = match tokio::time::timeout(START_BOUND, stdout.next()).await {
        Ok(Some(Ok(chunk))) => chunk.as_ref() == [reader::MARKER],
        Ok(_) | Err(_) => false,
    };
    if !marked
        || input
            .send(ExecInput::Stdin(Bytes::from_static(reader::GO)))
            .await
            .is_err()
    {
        return Handed::Refused;
    }
    if !request.stdin {
        let _ = input.send(ExecInput::CloseStdin).await;
    }
    Handed::Running(ExecSession {
        input,
        stdout,
        stderr,
        exit,
    })
}

/// Whether `provider` keeps warm processes at all.
pub fn wanted(provider: &dyn Provider) -> bool {
    provider.warm_exec() && provider.streaming_exec().is_some()
}

/// A std mutex's guard; a poisoned map (a panic while held) is still consistent: each change
/// of it is one insert or remove.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::interactive;
    use crate::provider::stream::ExitStatus;

    /// A session as a provider would hand it over, and the provider's ends of it.
    fn session() -> (ExecSession, interactive::Ends) {
        interactive::session("s", false)
    }

    #[tokio::test]
    async fn keepers_hand_their_processes_over_oldest_first_up_to_the_depth() {
        let warm = WarmExec::default();
        let Registered {
            serial: first,
            taken,
            answered,
        } = warm.register("a").expect("first keeper");
        let second = warm.register("a").expect("second keeper");
        assert!(!warm.settled("a"), "both are being started");
        answered.store(true, Ordering::Release);
        second.answered.store(true, Ordering::Release);
        assert!(warm.settled("a"));
        let second = second.serial;
        assert!(warm.register("a").is_none(), "{DEPTH} keepers per sandbox");
        let (s, _ends) = session();
        let kept = tokio::spawn(keep(s, taken, None));
        assert!(
            warm.take("a").await.is_some(),
            "the oldest hands its process"
        );
        kept.await.expect("keeper ends");
        assert!(warm.has("a"), "the second still waits");
        warm.deregister("a", first);
        assert!(warm.has("a"), "a finished keeper's exit leaves the others");
        warm.deregister("a", second);
        assert!(!warm.has("a"));
        assert!(warm.take("a").await.is_none());
    }

    #[tokio::test]
    async fn a_take_skips_keepers_that_ended_for_one_that_hands_over() {
        let warm = WarmExec::default();
        drop(warm.register("a").expect("keeper"));
        let taken = warm.register("a").expect("keeper").taken;
        let (s, _ends) = session();
        let kept = tokio::spawn(keep(s, taken, None));
        assert!(warm.take("a").await.is_some());
        kept.await.expect("keeper ends");
    }

    #[tokio::test]
    async fn a_process_that_ended_is_not_handed_over() {
        let warm = WarmExec::default();
        let taken = warm.register("a").expect("keeper").taken;
        let (s, ends) = session();
        ends.exit.send(Ok(ExitStatus { code: 137 })).ok();
        keep(s, taken, None).await;
        assert!(warm.take("a").await.is_none());
    }

    #[tokio::test]
    async fn a_lingering_process_is_dropped_after_its_time() {
        let (s, mut ends) = session();
        let (_take, taken) = oneshot::channel();
        keep(s, taken, Some(Duration::from_millis(10))).await;
        assert!(ends.input.recv().await.is_none(), "its input closed");
    }

    #[tokio::test]
    async fn a_reader_gets_its_go_only_after_its_marker_and_one_that_ends_refuses() {
        let request = StreamExecRequest {
            argv: vec!["true".into()],
            stdin: false,
            ..reader_request()
        };
        let (s, mut ends) = session();
        ends.stdout
            .send(Ok(Bytes::from_static(&[reader::MARKER])))
            .await
            .ok();
        ends.stdout.send(Ok(Bytes::from_static(b"hi"))).await.ok();
        let Handed::Running(mut running) = hand(s, &request).await else {
            panic!("refused")
        };
        let mut sent = Vec::new();
        while let Ok(input) = ends.input.try_recv() {
            sent.push(input);
        }
        assert!(
            matches!(&sent[..], [ExecInput::Stdin(_), ExecInput::Stdin(go), ExecInput::CloseStdin] if go.as_ref() == reader::GO),
            "{sent:?}"
        );
        assert_eq!(
            running.stdout.next().await.and_then(Result::ok).as_deref(),
            Some(&b"hi"[..])
        );
        let (s, mut ends) = session();
        drop(ends.stdout);
        assert!(matches!(hand(s, &request).await, Handed::Refused));
        let mut sent = Vec::new();
        while let Ok(input) = ends.input.try_recv() {
            sent.push(input);
        }
        assert!(
            matches!(&sent[..], [ExecInput::Stdin(_)]),
            "no go: {sent:?}"
        );
    }
}
