//! The processes this replica started, by sandbox and pid. A process's state — its stdin,
//! its output buffer, its readers — lives in the replica that started it: the provider's
//! streaming exec is a connection held by this replica, so another replica reaches it only
//! by forwarding the request here ([`super::forward`]).
//!
//! Each process has one *writer* (the task that moves the provider's output into its
//! [`Ring`]) and any number of *followers* (the `Start` and `Connect` streams reading it).
//! A follower's cursor holds the writer back rather than lose output it has not read, so a
//! slow client slows the process as a full pipe would; with no follower attached, the last
//! [`REPLAY_BYTES`] are kept for a reattach and older output is dropped.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use super::peers;
use super::ring::{Chunk, REPLAY_BYTES, Ring};
use super::wire::{End, ProcessConfig, Selector};
use crate::e2bapi::envd::error::{Code, EnvdError};
use crate::provider::stream::ExecInput;

/// How long an ended process stays reachable by `Connect` (its output and end event), so a
/// client that was away when it ended still learns how.
pub const KEEP_ENDED: Duration = Duration::from_secs(300);

/// What a process was started with.
#[derive(Debug, Clone)]
pub struct Started {
    /// The sandbox id it runs in.
    pub sid: String,
    /// What it runs.
    pub config: ProcessConfig,
    /// Its tag.
    pub tag: Option<String>,
    /// Whether it has a terminal.
    pub pty: bool,
    /// Whether it has a stdin.
    pub stdin: bool,
}

/// One process.
pub struct Process {
    /// Its pid (assigned by this replica).
    pub pid: u32,
    /// What it was started with.
    pub started: Started,
    /// Its input: stdin bytes, resizes, signals (closed once it has ended).
    pub input: mpsc::Sender<ExecInput>,
    state: Mutex<Output>,
    /// Bumped when output or the end arrives.
    wrote: watch::Sender<()>,
    /// Bumped when a follower reads or leaves.
    read: watch::Sender<()>,
}

struct Output {
    ring: Ring,
    end: Option<End>,
    followers: BTreeMap<u64, u64>,
    next_follower: u64,
}

impl Process {
    fn output(&self) -> MutexGuard<'_, Output> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether it has ended.
    pub fn ended(&self) -> bool {
        self.output().end.is_some()
    }

    /// Appends a chunk of output, waiting while a follower has not read what would be dropped.
    pub async fn write(&self, chunk: Chunk) {
        loop {
            let mut read = {
                let mut out = self.output();
                let keep_from = out.followers.values().min().copied().unwrap_or(u64::MAX);
                if out.ring.push(chunk.clone(), keep_from) {
                    break;
                }
                self.read.subscribe()
            };
            if read.changed().await.is_err() {
                return;
            }
        }
        self.wrote.send_replace(());
    }

    /// Records how it ended; its followers deliver that last.
    pub fn finish(&self, end: End) {
        self.output().end = Some(end);
        self.wrote.send_replace(());
    }

    /// A reader of its output from chunk `from` (0: everything; [`Follower::replay`]: what is
    /// still kept).
    pub fn follow(self: &Arc<Self>, from: u64) -> Follower {
        let mut out = self.output();
        let id = out.next_follower;
        out.next_follower += 1;
        let cursor = from.max(out.ring.first());
        out.followers.insert(id, cursor);
        Follower {
            process: self.clone(),
            id,
            cursor,
            wrote: self.wrote.subscribe(),
            done: false,
        }
    }
}

/// What a follower reads next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Output.
    Output(Chunk),
    /// The end (the last event).
    End(End),
}

/// One reader of a process's output; leaving (drop) releases the writer.
pub struct Follower {
    process: Arc<Process>,
    id: u64,
    cursor: u64,
    wrote: watch::Receiver<()>,
    done: bool,
}

/// Chunks handed out per read, so one reader never holds the lock long.
const BATCH: usize = 16;

impl Follower {
    /// From the oldest output still kept.
    pub const REPLAY: u64 = 0;

    /// The next events: output in order, then the end; empty once the end was delivered.
    /// Cancel-safe: it only waits while it holds nothing.
    pub async fn next(&mut self) -> Vec<Event> {
        loop {
            if self.done {
                return Vec::new();
            }
            self.wrote.borrow_and_update();
            let events = self.take();
            if !events.is_empty() {
                return events;
            }
            if self.wrote.changed().await.is_err() {
                return Vec::new();
            }
        }
    }

    fn take(&mut self) -> Vec<Event> {
        let mut out = self.process.output();
        let (chunks, after) = out.ring.read(self.cursor, BATCH);
        if !chunks.is_empty() {
            self.cursor = after;
            out.followers.insert(self.id, after);
            drop(out);
            self.process.read.send_replace(());
            return chunks.into_iter().map(Event::Output).collect();
        }
        match out.end.clone() {
            Some(end) => {
                self.done = true;
                vec![Event::End(end)]
            }
            None => Vec::new(),
        }
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.process.output().followers.remove(&self.id);
        self.process.read.send_replace(());
    }
}

/// Processes by sandbox id and pid.
type ByPid = HashMap<(String, u32), Arc<Process>>;

/// This replica's processes.
#[derive(Clone)]
pub struct ProcessTable {
    processes: Arc<Mutex<ByPid>>,
    tag: u16,
    next_seq: Arc<AtomicU32>,
}

impl ProcessTable {
    /// The table of the replica tagged `tag`: its pids carry the tag ([`peers::pid`]).
    pub fn new(tag: u16) -> ProcessTable {
        ProcessTable {
            processes: Arc::default(),
            tag,
            next_seq: Arc::new(AtomicU32::new(1)),
        }
    }

    fn map(&self) -> MutexGuard<'_, ByPid> {
        self.processes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a new process with its input, under a fresh pid.
    pub fn add(&self, started: Started, input: mpsc::Sender<ExecInput>) -> Arc<Process> {
        let pid = self.fresh_pid();
        let process = Arc::new(Process {
            pid,
            input,
            state: Mutex::new(Output {
                ring: Ring::new(REPLAY_BYTES),
                end: None,
                followers: BTreeMap::new(),
                next_follower: 0,
            }),
            wrote: watch::channel(()).0,
            read: watch::channel(()).0,
            started,
        });
        let key = (process.started.sid.clone(), pid);
        self.map().insert(key, process.clone());
        process
    }

    /// The next pid of this replica that names no process it still knows (the sequence
    /// wraps after 2²¹ pids).
    fn fresh_pid(&self) -> u32 {
        loop {
            let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
            let pid = peers::pid(self.tag, seq);
            if !self.map().keys().any(|(_, p)| *p == pid) {
                return pid;
            }
        }
    }

    /// Forgets a process.
    pub fn remove(&self, sid: &str, pid: u32) {
        self.map().remove(&(sid.to_string(), pid));
    }

    /// The process of sandbox `sid` that `selector` names, ended or not.
    pub fn find(&self, sid: &str, selector: &Selector) -> Result<Arc<Process>, EnvdError> {
        let map = self.map();
        let found = match selector {
            Selector::Pid(pid) => map.get(&(sid.to_string(), *pid)).cloned(),
            Selector::Tag(tag) => map
                .values()
                .filter(|p| p.started.sid == sid && p.started.tag.as_deref() == Some(tag))
                .max_by_key(|p| (!p.ended(), p.pid))
                .cloned(),
        };
        found.ok_or_else(|| unknown(selector))
    }

    /// The running processes of sandbox `sid`, by pid.
    pub fn running(&self, sid: &str) -> Vec<Arc<Process>> {
        let mut found: Vec<_> = self
            .map()
            .values()
            .filter(|p| p.started.sid == sid && !p.ended())
            .cloned()
            .collect();
        found.sort_by_key(|p| p.pid);
        found
    }
}

/// The not_found answer, naming where process state lives.
fn unknown(selector: &Selector) -> EnvdError {
    let what = match selector {
        Selector::Pid(pid) => format!("process {pid}"),
        Selector::Tag(tag) => format!("a process tagged {tag:?}"),
    };
    EnvdError::new(
        Code::NotFound,
        format!(
            "{what} is not known to this operator replica: a process lives in the replica that \
             started it (the other replicas forward to it while it runs), and is forgotten \
             {}s after it ends",
            KEEP_ENDED.as_secs()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn started(sid: &str, tag: Option<&str>) -> Started {
        Started {
            sid: sid.into(),
            config: ProcessConfig::default(),
            tag: tag.map(Into::into),
            pty: false,
            stdin: true,
        }
    }

    fn out(text: &'static str) -> Chunk {
        Chunk::Stdout(Bytes::from_static(text.as_bytes()))
    }

    #[tokio::test]
    async fn a_follower_reads_everything_then_the_end_and_a_late_one_replays() {
        let table = ProcessTable::new(1);
        let p = table.add(started("s", None), mpsc::channel(1).0);
        let mut first = p.follow(0);
        p.write(out("a")).await;
        p.write(out("b")).await;
        assert_eq!(
            first.next().await,
            vec![Event::Output(out("a")), Event::Output(out("b"))]
        );
        drop(first);
        p.write(out("c")).await;
        p.finish(End {
            code: Some(0),
            error: None,
        });
        let mut late = p.follow(Follower::REPLAY);
        let mut seen = Vec::new();
        loop {
            let events = late.next().await;
            if events.is_empty() {
                break;
            }
            seen.extend(events);
        }
        let end = Event::End(End {
            code: Some(0),
            error: None,
        });
        assert_eq!(
            seen,
            vec![
                Event::Output(out("a")),
                Event::Output(out("b")),
                Event::Output(out("c")),
                end
            ]
        );
    }

    #[tokio::test]
    async fn a_slow_follower_holds_the_writer_back_instead_of_losing_output() {
        let table = ProcessTable::new(1);
        let p = table.add(started("s", None), mpsc::channel(1).0);
        let mut reader = p.follow(0);
        let big = Chunk::Stdout(Bytes::from(vec![b'x'; REPLAY_BYTES / 2]));
        p.write(big.clone()).await;
        p.write(big.clone()).await;
        let writer = {
            let p = p.clone();
            let big = big.clone();
            tokio::spawn(async move { p.write(big).await })
        };
        tokio::task::yield_now().await;
        assert!(
            !writer.is_finished(),
            "the third chunk waits for the reader"
        );
        assert_eq!(reader.next().await.len(), 2);
        writer.await.unwrap();
        assert_eq!(reader.next().await, vec![Event::Output(big)]);
    }

    #[test]
    fn processes_are_found_by_sandbox_and_pid_or_tag_only() {
        let table = ProcessTable::new(1);
        let a = table.add(started("s", Some("web")), mpsc::channel(1).0);
        let b = table.add(started("other", None), mpsc::channel(1).0);
        assert_eq!(b.pid, a.pid + 1);
        assert_eq!(table.find("s", &Selector::Pid(a.pid)).unwrap().pid, a.pid);
        assert_eq!(
            table.find("s", &Selector::Tag("web".into())).unwrap().pid,
            a.pid
        );
        let elsewhere = table.find("s", &Selector::Pid(b.pid)).err().unwrap();
        assert_eq!(elsewhere.code, Code::NotFound);
        assert!(
            elsewhere.message.contains("replica that started it"),
            "{}",
            elsewhere.message
        );
        a.finish(End {
            code: Some(1),
            error: None,
        });
        assert!(
            table.running("s").is_empty(),
            "an ended process is not listed"
        );
        assert!(
            table.find("s", &Selector::Pid(a.pid)).is_ok(),
            "but still reachable"
        );
        table.remove("s", a.pid);
        assert!(table.find("s", &Selector::Pid(a.pid)).is_err());
    }
}
