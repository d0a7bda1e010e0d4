//! A provider's bound on calls in flight, with two lanes: the calls of a Sandbox someone is
//! waiting for, and the operator's own upkeep (a warm pool's refill, the sweeper).
//!
//! Why not one fair semaphore: a warm pool refilled after a burst of claims queues a create
//! and a start per member, each holding its slot for the engine's create-and-start (a
//! quarter of a second, more on a busy host). Queued first, they took every slot, and the
//! burst's last claims — a describe, a handoff, a file write, milliseconds each — waited
//! behind them. Here upkeep never holds more than [`upkeep_cap`] of the slots, so some are
//! always left for Sandboxes, and a freed slot goes to a waiting Sandbox call before any
//! waiting upkeep call.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

/// Who a provider call is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// A Sandbox's reconcile or a user's request: someone waits for it.
    Sandbox,
    /// The operator's own upkeep: a warm pool's members, the sweeper.
    Upkeep,
}

/// How many of `slots` upkeep may hold at once: all but a quarter (at least one slot is
/// left for Sandboxes, and upkeep always gets at least one).
pub fn upkeep_cap(slots: usize) -> usize {
    slots.saturating_sub((slots / 4).max(1)).max(1)
}

/// The bound: `slots` calls in flight, at most [`upkeep_cap`] of them upkeep.
pub struct Limiter {
    state: Mutex<State>,
    upkeep_cap: usize,
}

struct State {
    free: usize,
    upkeep_held: usize,
    sandbox_waiting: VecDeque<oneshot::Sender<()>>,
    upkeep_waiting: VecDeque<oneshot::Sender<()>>,
}

/// A slot, given back when dropped.
pub struct Permit {
    limiter: Arc<Limiter>,
    lane: Lane,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.limiter.release(self.lane);
    }
}

/// A waiter's side of a grant: dropped before its grant was taken (the call was cancelled),
/// it gives the slot back.
struct Waiter {
    rx: Option<oneshot::Receiver<()>>,
    limiter: Arc<Limiter>,
    lane: Lane,
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if let Some(mut rx) = self.rx.take() {
            rx.close();
            if rx.try_recv().is_ok() {
                self.limiter.release(self.lane);
            }
        }
    }
}

impl Limiter {
    /// A bound of `slots` (at least one).
    pub fn new(slots: usize) -> Arc<Limiter> {
        let slots = slots.max(1);
        Arc::new(Limiter {
            state: Mutex::new(State {
                free: slots,
                upkeep_held: 0,
                sandbox_waiting: VecDeque::new(),
                upkeep_waiting: VecDeque::new(),
            }),
            upkeep_cap: upkeep_cap(slots),
        })
    }

    /// Waits for a slot of `lane`. Cancel-safe: a dropped wait holds nothing.
    pub async fn acquire(self: &Arc<Self>, lane: Lane) -> Permit {
        let rx = {
            let mut s = self.lock();
            if self.may_take(&s, lane) {
                Self::take(&mut s, lane);
                return self.permit(lane);
            }
            let (tx, rx) = oneshot::channel();
            match lane {
                Lane::Sandbox => s.sandbox_waiting.push_back(tx),
                Lane::Upkeep => s.upkeep_waiting.push_back(tx),
            }
            rx
        };
        let mut waiter = Waiter {
            rx: Some(rx),
            limiter: self.clone(),
            lane,
        };
        if let Some(rx) = waiter.rx.as_mut() {
            // The sender is only dropped unsent when the limiter itself is, which the
            // `Arc` this waiter holds rules out; either way the slot is counted as taken.
            let _ = rx.await;
        }
        waiter.rx = None;
        self.permit(lane)
    }

    fn permit(self: &Arc<Self>, lane: Lane) -> Permit {
        Permit {
            limiter: self.clone(),
            lane,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a new call of `lane` may take a slot now: one is free, nobody it must let
    /// go first is waiting, and upkeep is under its cap.
    fn may_take(&self, s: &State, lane: Lane) -> bool {
        let free = s.free > 0 && s.sandbox_waiting.is_empty();
        match lane {
            Lane::Sandbox => free,
            Lane::Upkeep => free && s.upkeep_waiting.is_empty() && s.upkeep_held < self.upkeep_cap,
        }
    }

    fn take(s: &mut State, lane: Lane) {
        s.free -= 1;
        if lane == Lane::Upkeep {
            s.upkeep_held += 1;
        }
    }

    fn release(&self, lane: Lane) {
        let mut s = self.lock();
        s.free += 1;
        if lane == Lane::Upkeep {
            s.upkeep_held -= 1;
        }
        self.grant(&mut s);
    }

    /// Hands free slots to waiters: Sandbox calls first, then upkeep under its cap. A
    /// waiter that has gone (its call cancelled) is skipped.
    fn grant(&self, s: &mut State) {
        while s.free > 0 {
            let (lane, next) = if let Some(tx) = s.sandbox_waiting.pop_front() {
                (Lane::Sandbox, tx)
            } else if s.upkeep_held < self.upkeep_cap
                && let Some(tx) = s.upkeep_waiting.pop_front()
            {
                (Lane::Upkeep, tx)
            } else {
                return;
            };
            if next.send(()).is_ok() {
                Self::take(s, lane);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    #[test]
    fn upkeep_leaves_a_quarter_and_always_gets_one() {
        assert_eq!(upkeep_cap(32), 24);
        assert_eq!(upkeep_cap(16), 12);
        assert_eq!(upkeep_cap(4), 3);
        assert_eq!(upkeep_cap(2), 1);
        assert_eq!(upkeep_cap(1), 1);
    }

    #[tokio::test]
    async fn upkeep_stops_at_its_cap_and_sandboxes_take_the_rest() {
        let l = Limiter::new(4);
        let mut held: Vec<Permit> = Vec::new();
        for _ in 0..3 {
            held.push(
                l.acquire(Lane::Upkeep)
                    .now_or_never()
                    .expect("under the cap"),
            );
        }
        assert!(
            l.acquire(Lane::Upkeep).now_or_never().is_none(),
            "at the cap"
        );
        let sandbox = l.acquire(Lane::Sandbox).now_or_never();
        assert!(sandbox.is_some(), "the reserved slot");
        assert!(
            l.acquire(Lane::Sandbox).now_or_never().is_none(),
            "all taken"
        );
    }

    #[tokio::test]
    async fn a_freed_slot_goes_to_a_waiting_sandbox_call_before_earlier_upkeep() {
        let l = Limiter::new(2);
        let first = l.acquire(Lane::Sandbox).await;
        let second = l.acquire(Lane::Sandbox).await;
        let upkeep = tokio::spawn({
            let l = l.clone();
            async move { l.acquire(Lane::Upkeep).await }
        });
        tokio::task::yield_now().await;
        let sandbox = tokio::spawn({
            let l = l.clone();
            async move { l.acquire(Lane::Sandbox).await }
        });
        tokio::task::yield_now().await;
        drop(first);
        let got = tokio::time::timeout(std::time::Duration::from_secs(5), sandbox)
            .await
            .expect("the freed slot went to the sandbox call")
            .expect("the sandbox call");
        assert!(!upkeep.is_finished(), "upkeep waited for the sandbox call");
        drop(second);
        let _upkeep = upkeep.await.expect("then upkeep");
        drop(got);
    }

    #[tokio::test]
    async fn a_cancelled_wait_holds_no_slot() {
        let l = Limiter::new(1);
        let held = l.acquire(Lane::Sandbox).await;
        let mut waiting = Box::pin(l.acquire(Lane::Sandbox));
        assert!((&mut waiting).now_or_never().is_none());
        // Granted on release, then dropped before it was polled again.
        drop(held);
        drop(waiting);
        let again = l.acquire(Lane::Upkeep).now_or_never();
        assert!(again.is_some(), "the slot came back");
    }
}
