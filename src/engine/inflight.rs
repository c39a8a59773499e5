//! In-flight tracking: which requests of earlier rounds on a lock may still
//! be running, per node, so that a later request to a node (a release, an
//! extension) goes after them (see [`crate::engine::round`]).
//!
//! A later request goes after an earlier one in one of two ways:
//! - **queued behind it** on the same connection, at once, when the earlier
//!   request was handed to that connection in its only form: a standalone
//!   node's connection carries requests in the order they were handed to
//!   it (one writer, a first-in first-out queue), and the node runs them in
//!   that order. The later request still waits, after its own reply, for
//!   the earlier one to settle, and is sent once more if the earlier one
//!   was sent again meanwhile (a fallback form, a fresh connection):
//!   see [`InFlight::queued_on`] and [`InFlight::still_behind`];
//! - **after it settled**, in every other case (not yet sent, sent on a
//!   connection since replaced, a form that may be sent again such as a
//!   script after `NOSCRIPT`, a cluster node).
//!
//! Queued behind, a release right after a grant costs no round trip more
//! than the release alone: it is on the wire behind the `SET`s still in
//! flight to the slower nodes, instead of waiting for their replies.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::sync::Notify;

use crate::engine::deferred::Deferred;
use crate::engine::finisher::{Finishers, Leftover};

/// Which requests of one round have settled, per node. Light on purpose:
/// a guard keeps one for its latest renewal.
#[derive(Debug)]
pub(crate) struct Settled {
    pub(crate) done: Box<[AtomicBool]>,
    /// Per node, where its request went: [`NOT_SENT`], the epoch of the
    /// connection it was handed to plus one (its only form, sent once), or
    /// [`UNORDERED`].
    pub(crate) sent: Box<[AtomicU64]>,
    pub(crate) changed: Notify,
    /// Whether anyone ever waited on [`changed`](Settled::changed): a mark
    /// notifies only then (`notify_waiters` takes a lock, and almost no
    /// round has anyone waiting for it). Set after the waiter registered
    /// and before it looks at `done`, both `SeqCst`, as is the mark's store
    /// to `done` and its load of this: either the waiter sees the mark, or
    /// the mark sees the waiter and wakes it.
    pub(crate) watched: AtomicBool,
    /// Set by the round when its one timer fired: every request still on
    /// the round's deadline has timed out (see [`round`](crate::engine::round)).
    pub(crate) expired: AtomicBool,
    /// Until when a request of the round may still be sent, after a wait
    /// ([`SendUntil`]): `None` (no limit) but for a round that writes the
    /// lock's keys ([`SendBy`](crate::engine::round::SendBy)).
    pub(crate) send_until: Option<SendUntil>,
}

/// Until when a request of a round that writes the lock's keys may still
/// be sent after a wait ([`Settled::may_send`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct SendUntil {
    /// A first send that waited only for its connection to be made (or a
    /// send again after a broken connection): until twice the connect
    /// timeout (the gate's wait, then the attempt) past the round's
    /// deadline, or the keys' expiry if that comes first. A new runtime's
    /// first request to a node makes its connection inside the round (a
    /// TLS handshake on a busy machine may outlast the node timeout), and
    /// is sent then; one whose connection was left to a runtime that is
    /// not driven, and made when it runs again, is not.
    pub(crate) first: std::time::Instant,
    /// A send after the node's earlier requests on the lock settled, or a
    /// second send: until the round's deadline, or the keys' expiry if
    /// that comes first.
    pub(crate) again: std::time::Instant,
}

/// Not handed to a connection (yet).
pub(crate) const NOT_SENT: u64 = 0;
/// Sent in a form that may be sent again without the engine knowing (a
/// script), sent more than once, or to a cluster node: a later request
/// waits until it settled.
pub(crate) const UNORDERED: u64 = u64::MAX;

impl Settled {
    /// A round's state for `nodes` nodes, whose requests may be sent until
    /// `send_until`, where the nodes `asked` says no to are settled from
    /// the start (not asked).
    pub(crate) fn new(
        nodes: usize,
        send_until: Option<SendUntil>,
        asked: impl Fn(usize) -> bool,
    ) -> Settled {
        Settled {
            done: (0..nodes).map(|i| AtomicBool::new(!asked(i))).collect(),
            sent: (0..nodes).map(|_| AtomicU64::new(NOT_SENT)).collect(),
            changed: Notify::new(),
            watched: AtomicBool::new(false),
            expired: AtomicBool::new(false),
            send_until,
        }
    }

    pub(crate) fn all(&self) -> bool {
        self.done.iter().all(|d| d.load(Ordering::Acquire))
    }

    /// Whether every request that has not settled is in its connection's
    /// queue, in its only form: none is connecting, none is to be sent
    /// again (each marks itself [`UNORDERED`] as soon as it is). Such a
    /// request reaches its node however late its future is polled next.
    pub(crate) fn all_queued(&self) -> bool {
        self.done.iter().zip(self.sent.iter()).all(|(done, sent)| {
            done.load(Ordering::Acquire)
                || !matches!(sent.load(Ordering::Acquire), NOT_SENT | UNORDERED)
        })
    }

    /// Whether a request of this round may still be sent after a wait
    /// (`again`: after the node's earlier requests settled, or a second
    /// send on a fresh connection or in a fallback form; else a first send
    /// that waited for its connection): one that writes the lock's keys
    /// (an acquisition, an extension that heals) not past its
    /// [`SendUntil`]. A `SET` sent later would hold the key on that node
    /// for a whole ttl from then: past the lock's validity, set afresh
    /// after the lock expired, or after a release that stopped waiting
    /// for it (that wait is bounded). A lock's kept leftover ([`Deferred`])
    /// is polled whenever the lock is next used, and a request may wait
    /// for a connection up to the connect timeout: neither sends then.
    pub(crate) fn may_send(&self, again: bool) -> bool {
        let Some(until) = self.send_until else {
            return true;
        };
        let until = match again {
            true => until.again,
            false => until.first,
        };
        std::time::Instant::now() < until
    }
}

/// Marks one node's request of a round settled when dropped: when it
/// completed, and also when it was dropped unfinished (see
/// [`InFlight::settled`]).
pub(crate) struct Mark {
    pub(crate) settled: Arc<Settled>,
    pub(crate) index: usize,
}

impl Mark {
    /// Records that the request was handed to the connection of `epoch`
    /// in its only form (`Some`), or that a later request must wait for it
    /// to settle (`None`). The first is recorded only after the request is
    /// in the connection's queue, the second before it is sent again.
    pub(crate) fn sent(&self, epoch: Option<u64>) {
        let stamp = epoch.map_or(UNORDERED, |e| e.wrapping_add(1).min(UNORDERED - 1));
        self.settled.sent[self.index].store(stamp, Ordering::Release);
    }
}

impl Drop for Mark {
    fn drop(&mut self) {
        self.settled.done[self.index].store(true, Ordering::SeqCst);
        if self.settled.watched.load(Ordering::SeqCst) {
            self.settled.changed.notify_waiters();
        }
    }
}

/// Which requests of earlier rounds on a lock may still be running, per
/// node. A clone shares the same view: it is what each node's request of a
/// round takes, so it costs a reference count, and nothing when empty.
#[derive(Clone, Default)]
pub(crate) struct InFlight {
    rounds: Option<Arc<[Arc<Settled>]>>,
    /// The granting round's leftover, kept with the lock until it is next
    /// used or dropped ([`Deferred`]).
    deferred: Option<Arc<Deferred>>,
}

impl InFlight {
    /// Waits until every earlier request to node `index` has settled:
    /// answered, timed out, or dropped unfinished. A request that was dropped
    /// after it was written to the socket still runs on the node, but before
    /// anything sent to that node later, on the same connection.
    ///
    /// # Cancel safety
    /// Cancel-safe: it only watches.
    pub(crate) async fn settled(&self, index: usize) {
        for round in self.rounds() {
            let Some(done) = round.done.get(index) else {
                continue;
            };
            if done.load(Ordering::Acquire) {
                continue;
            }
            loop {
                // Register before looking, so that a mark in between is not
                // missed.
                let changed = round.changed.notified();
                let mut changed = std::pin::pin!(changed);
                changed.as_mut().enable();
                round.watched.store(true, Ordering::SeqCst);
                if done.load(Ordering::SeqCst) {
                    break;
                }
                changed.await;
            }
        }
    }

    /// Whether every earlier request to node `index` has settled, now.
    pub(crate) fn settled_now(&self, index: usize) -> bool {
        self.rounds().iter().all(|round| {
            round
                .done
                .get(index)
                .is_none_or(|d| d.load(Ordering::Acquire))
        })
    }

    /// Whether a request to node `index` handed now to the connection of
    /// `epoch` goes after every earlier request there that has not settled:
    /// each was handed to that connection, in its only form. Returns which
    /// rounds were unsettled (a bit per round, for [`still_behind`]), or
    /// `None` when the request must wait for them to settle instead.
    ///
    /// [`still_behind`]: InFlight::still_behind
    pub(crate) fn queued_on(&self, index: usize, epoch: u64) -> Option<u64> {
        let stamp = epoch.wrapping_add(1).min(UNORDERED - 1);
        let rounds = self.rounds();
        if rounds.len() > 64 {
            return None;
        }
        let mut unsettled = 0u64;
        for (i, round) in rounds.iter().enumerate() {
            let Some(done) = round.done.get(index) else {
                continue;
            };
            if done.load(Ordering::Acquire) {
                continue;
            }
            if round.sent[index].load(Ordering::Acquire) != stamp {
                return None;
            }
            unsettled |= 1 << i;
        }
        Some(unsettled)
    }

    /// After a request queued behind the `unsettled` rounds on the
    /// connection of `epoch` ([`queued_on`](InFlight::queued_on)) was
    /// answered, and those rounds settled: whether none of them was sent
    /// again meanwhile (else the request must be sent once more, now
    /// that they settled).
    pub(crate) fn still_behind(&self, index: usize, epoch: u64, unsettled: u64) -> bool {
        let stamp = epoch.wrapping_add(1).min(UNORDERED - 1);
        self.rounds()
            .iter()
            .enumerate()
            .filter(|(i, _)| unsettled & (1 << i) != 0)
            .all(|(_, round)| round.sent[index].load(Ordering::Acquire) == stamp)
    }

    /// The requests of one round that may still run (none when `settled`
    /// says every node's request settled).
    pub(crate) fn of(settled: Arc<Settled>) -> InFlight {
        if settled.all() {
            return InFlight::default();
        }
        InFlight {
            rounds: Some(Arc::from([settled])),
            deferred: None,
        }
    }

    /// These rounds (the granting round's), keeping its `leftover` to be
    /// polled when the lock is next used, or finished when its last copy
    /// is dropped ([`Deferred`]); finished at once where it cannot be kept:
    /// no runtime to finish it on later, or a request not yet in its
    /// connection's queue ([`Settled::all_queued`]).
    pub(crate) fn keeping(mut self, leftover: Option<Leftover>, finishers: &Finishers) -> InFlight {
        let Some(leftover) = leftover else {
            return self;
        };
        if !self.rounds().iter().all(|round| round.all_queued()) {
            finishers.finish(leftover);
            return self;
        }
        match Deferred::new(leftover) {
            Ok(deferred) => self.deferred = Some(Arc::new(deferred)),
            Err(leftover) => finishers.finish(leftover),
        }
        self
    }

    /// The lock's kept leftover, for a round on the lock to poll while it
    /// runs ([`Deferred::drive`]): that round's requests may wait for its
    /// requests to settle.
    pub(crate) fn deferred(&self) -> Option<&Deferred> {
        self.deferred.as_deref()
    }

    /// Finishes the kept leftover, if any ([`Deferred::finish`]), where no
    /// round on the lock follows at once (the watchdog's first renewal is
    /// a third of the ttl away), and lets go of it: a guard's lock, and
    /// every renewal's, then carries nothing more.
    pub(crate) fn finish_deferred(&mut self) {
        if let Some(deferred) = self.deferred.take() {
            deferred.finish();
        }
    }

    fn rounds(&self) -> &[Arc<Settled>] {
        self.rounds.as_deref().unwrap_or(&[])
    }

    /// These rounds followed by `later`, without the rounds that have
    /// settled on every node.
    pub(crate) fn and(&self, later: &InFlight) -> InFlight {
        let rounds: Vec<Arc<Settled>> = self
            .rounds()
            .iter()
            .chain(later.rounds())
            .filter(|round| !round.all())
            .cloned()
            .collect();
        InFlight {
            rounds: (!rounds.is_empty()).then(|| rounds.into()),
            // The lock's kept leftover goes along while it waits: the round
            // given these rounds to go behind drives it.
            deferred: [&self.deferred, &later.deferred]
                .into_iter()
                .flatten()
                .find(|deferred| deferred.waiting())
                .cloned(),
        }
    }
}

/// The extension rounds of a manager's locks that may still run, by lock
/// token. `extend` gives back a new handle that knows its own round, but
/// the handle it was given (and every copy of it) does not: a release
/// through the old handle must still go behind the extension's requests,
/// or the extension, landing after it on a slow node, sets the key again
/// there (its heal path) for a whole ttl. Kept only while some extension
/// round has a request unsettled, so a manager that does not extend, or
/// whose extensions settle on every node before they return, pays one
/// atomic load per step.
#[derive(Default, Debug)]
pub(crate) struct Extensions {
    /// Whether `rounds` may hold anything: read first, without the lock.
    any: std::sync::atomic::AtomicBool,
    rounds: std::sync::Mutex<Rounds>,
}

/// [`Extensions`]' map, and the size past which [`Extensions::record`]
/// drops every settled entry (twice the size left by the last such pass,
/// at least 64): each step looks up and tidies its own token's entry only,
/// so ten thousand watchdogs renewing beside a slow node do not each walk
/// every other lock's entry.
#[derive(Default, Debug)]
struct Rounds {
    by_token: std::collections::HashMap<Box<str>, InFlight>,
    prune_at: usize,
}

impl Extensions {
    /// Records the extension round `round` of the lock of `token`.
    pub(crate) fn record(&self, token: &str, round: &InFlight) {
        if round.rounds.is_none() {
            return;
        }
        let mut rounds = self.rounds.lock().unwrap_or_else(|p| p.into_inner());
        if rounds.by_token.len() >= rounds.prune_at.max(64) {
            rounds.by_token.retain(|_, in_flight| {
                *in_flight = in_flight.and(&InFlight::default());
                in_flight.rounds.is_some()
            });
            rounds.prune_at = 2 * rounds.by_token.len();
        }
        let entry = rounds.by_token.entry(token.into()).or_default();
        *entry = entry.and(round);
        self.any.store(true, Ordering::Release);
    }

    /// What a step on the lock of `token`, whose handle knows `known`, goes
    /// behind: `known` and the extension rounds of that token that may
    /// still run.
    pub(crate) fn behind(&self, token: &str, known: &InFlight) -> InFlight {
        if !self.any.load(Ordering::Acquire) {
            return known.clone();
        }
        let mut rounds = self.rounds.lock().unwrap_or_else(|p| p.into_inner());
        let Some(entry) = rounds.by_token.get_mut(token) else {
            return known.clone();
        };
        *entry = entry.and(&InFlight::default());
        if entry.rounds.is_none() {
            rounds.by_token.remove(token);
            if rounds.by_token.is_empty() {
                self.any.store(false, Ordering::Release);
            }
            return known.clone();
        }
        known.and(entry)
    }
}

impl std::fmt::Debug for InFlight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InFlight")
            .field("rounds", &self.rounds().len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A waiter for a node's request wakes when the request settles on
    /// another thread, its registration and the mark in either order. The
    /// mark notifies only where someone watches: without the waiter's flag
    /// every round here sleeps, and the timeout fails the test. (The flag
    /// set after the waiter looks at `done` would lose a wake-up only in a
    /// window of nanoseconds, which this test does not catch; the
    /// argument for the order is the `SeqCst` pairing on `Settled::watched`.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_waiter_wakes_when_the_request_settles_elsewhere() {
        for round in 0..20_000u32 {
            let settled = Arc::new(Settled::new(2, None, |_| true));
            let in_flight = InFlight::of(settled.clone());
            let mark = Mark {
                settled: settled.clone(),
                index: round as usize % 2,
            };
            let index = mark.index;
            let marker = tokio::spawn(async move {
                if round % 3 == 0 {
                    tokio::task::yield_now().await;
                }
                drop(mark);
            });
            let waited =
                tokio::time::timeout(std::time::Duration::from_secs(5), in_flight.settled(index))
                    .await;
            assert!(
                waited.is_ok(),
                "round {round}: the waiter slept through the mark"
            );
            marker.await.unwrap();
            assert!(in_flight.settled_now(index));
        }
    }
}
