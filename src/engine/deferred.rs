//! A single key's acquisition leftover kept with the lock it granted
//! ([`Deferred`]), instead of a task of its own per acquisition.

use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::task::{Context, Poll, Wake, Waker};

use futures::FutureExt;
use tokio::runtime::Handle;

use crate::engine::finisher::Leftover;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A poison means a poll of the leftover panicked (caught there); the
    // slot is still an `Option`.
    mutex.lock().unwrap_or_else(|poison| poison.into_inner())
}

/// Whether a lock may keep its leftover at all (see [`Deferred`] for which
/// ones do). A switch kept for measuring: off, every leftover goes on in a
/// task at once, and scenario 5 of the benchmark runs at about 0.90x the
/// floor's throughput against about 1.0x on (`docs/performance.md`).
pub(crate) const KEEP_LEFTOVERS: bool = true;

/// An acquisition's leftover (its requests still pending at the quorum),
/// kept with the lock it granted instead of finished by a task at once
/// ([`InFlight::keeping`]).
///
/// Kept only when all of these hold, else it goes on in a task at once:
/// - it was made in a task on a multi-thread runtime ([`Deferred::new`]
///   says why);
/// - it is a plain `SET` of one key, which reaches its node once handed to
///   the connection (a script may need a second send after `NOSCRIPT`, so
///   may the form a node older than Redis 7.0 gets);
/// - every one of its requests is already in its connection's queue, in
///   its only form ([`Settled::all_queued`]): a request still connecting,
///   or about to be sent again on a fresh connection, needs a task to be
///   sent while the lock is held.
///
/// The slower nodes' replies most often come in a few microseconds after
/// the quorum's, long before the lock is next used: polled then, the
/// leftover is most often done, and costs no task. A task of its own (a
/// spawn, its wake-ups and its end) was a sixth of a busy lock+unlock
/// cycle's client time (scenario 5's profile loop: 41 against 35 µs a
/// cycle with the leftover dropped).
///
/// # Who polls it
/// It stays here until done. Every round on the lock polls it while it
/// runs ([`Deferred::drive`]); each round's requests go behind its
/// requests on each node's connection anyway, and may wait for them to
/// settle. Its wake-ups go to every round that polled it since the last
/// one ([`Pollers`]), so a round that stopped being polled (a `select!`
/// over `&mut` of an `unlock` that lost) does not hold up another: the
/// other polls it itself. The watchdog finishes it when it takes the lock
/// over, and so does dropping the last copy of the lock
/// ([`Deferred::finish`]). Until then its requests, already in their
/// connections' queues, run on the nodes as they would have; what waits
/// is their bookkeeping (a node's failure count, whether it answered), on
/// a lock that nobody uses meanwhile.
///
/// # Worst days
/// - **Another runtime.** The leftover's timer belongs to the round's
///   runtime: it is polled only there, and from anywhere else spawned onto
///   that runtime. A runtime that shut down drops it as it is spawned
///   (each request then counts as settled, as when the runtime dropped a
///   spawned leftover).
/// - **A connection that broke after the grant** (a node restarted): the
///   request is sent again on a fresh connection only while its round's
///   deadline has not passed, nor the keys' expiry ([`Settled::may_send`]).
///   Polled later, it fails instead: a `SET` sent then would hold the key
///   on that node for a whole ttl from then, past the lock's validity, or
///   afresh after it expired.
/// - **Still pending** when finished (a slow node): it goes on in a task
///   of its own, as it did before.
/// - **A panic** while polled drops that leftover alone.
///
/// [`InFlight::keeping`]: crate::engine::inflight::InFlight::keeping
/// [`Settled::all_queued`]: crate::engine::inflight::Settled::all_queued
/// [`Settled::may_send`]: crate::engine::inflight::Settled::may_send
pub(crate) struct Deferred {
    leftover: Mutex<Option<Leftover>>,
    /// Who to wake when the leftover can make progress.
    pollers: Arc<Pollers>,
    /// A waker for [`pollers`](Deferred::pollers), the one the leftover is
    /// polled with.
    waker: Waker,
    runtime: Handle,
}

/// The wakers of the rounds that polled a kept leftover since its last
/// wake-up: it wakes them all. Apart from [`Deferred`], which the
/// leftover's own wakers must not keep alive (its `Drop` finishes it).
#[derive(Default)]
struct Pollers(Mutex<Vec<Waker>>);

impl Pollers {
    fn register(&self, waker: &Waker) {
        let mut wakers = lock(&self.0);
        if !wakers.iter().any(|w| w.will_wake(waker)) {
            wakers.push(waker.clone());
        }
    }
}

impl Wake for Pollers {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let wakers = std::mem::take(&mut *lock(&self.0));
        for waker in wakers {
            waker.wake();
        }
    }
}

impl Deferred {
    /// Keeps `leftover` for later, when called from a task on a
    /// multi-thread runtime (a service's workers, where a task per
    /// acquisition cost the most); gives it back everywhere else, to be
    /// finished at once as before. A current-thread runtime runs its tasks
    /// only inside `block_on`, and a `block_on` thread may be the last
    /// code that runtime ever runs: a lock taken there and used or
    /// dropped after its runtime stopped or shut down could leave its
    /// leftover to a runtime that never runs it (a new user's program hung
    /// so on its next step, releasing from a second runtime after the
    /// first had shut down).
    pub(crate) fn new(leftover: Leftover) -> Result<Deferred, Leftover> {
        if !KEEP_LEFTOVERS || tokio::task::try_id().is_none() {
            return Err(leftover);
        }
        match Handle::try_current() {
            Ok(runtime)
                if runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread =>
            {
                let pollers = Arc::new(Pollers::default());
                Ok(Deferred {
                    leftover: Mutex::new(Some(leftover)),
                    waker: Waker::from(pollers.clone()),
                    pollers,
                    runtime,
                })
            }
            _ => Err(leftover),
        }
    }

    fn here(&self) -> bool {
        Handle::try_current().is_ok_and(|current| current.id() == self.runtime.id())
    }

    /// Polls the leftover for a round on the lock, which `cx` wakes when
    /// the leftover can make progress: on the leftover's runtime. From
    /// elsewhere it is spawned onto its runtime instead
    /// ([`finish`](Deferred::finish)). Returns whether it is still kept
    /// here (not done, not handed to a task).
    pub(crate) fn drive(&self, cx: &mut Context<'_>) -> bool {
        let mut slot = match self.leftover.try_lock() {
            Ok(slot) => slot,
            Err(TryLockError::Poisoned(poison)) => poison.into_inner(),
            Err(TryLockError::WouldBlock) => {
                // Another round polls it right now: this one looks again
                // at once (it cannot tell whether that poll saw a wake-up
                // meant for it).
                cx.waker().wake_by_ref();
                return true;
            }
        };
        let Some(leftover) = slot.as_mut() else {
            return false;
        };
        if !self.here() {
            drop(slot);
            self.finish();
            return false;
        }
        // Registered before the poll: a wake-up that comes during it is
        // not lost.
        self.pollers.register(cx.waker());
        let mut own = Context::from_waker(&self.waker);
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            leftover.as_mut().poll(&mut own)
        })) {
            Ok(Poll::Pending) => true,
            Ok(Poll::Ready(())) | Err(_) => {
                *slot = None;
                drop(slot);
                // Done: the rounds' wakers are let go of (a lock kept long
                // after its rounds would keep their tasks' cells alive).
                lock(&self.pollers.0).clear();
                false
            }
        }
    }

    /// Whether the leftover is still kept here (not done, not handed to a
    /// task).
    pub(crate) fn waiting(&self) -> bool {
        lock(&self.leftover).is_some()
    }

    /// Polls the leftover once, on its runtime, and spawns it onto that
    /// runtime when it is not done (or when called from elsewhere). Only
    /// the first call does anything.
    pub(crate) fn finish(&self) {
        let Some(mut leftover) = lock(&self.leftover).take() else {
            return;
        };
        if self.here() {
            let mut cx = Context::from_waker(Waker::noop());
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                leftover.as_mut().poll(&mut cx)
            })) {
                Ok(Poll::Ready(())) | Err(_) => return,
                Ok(Poll::Pending) => {}
            }
        }
        // The rounds that polled it are woken: it is theirs no more (each
        // waits for its requests to settle, as behind a task's).
        self.pollers.wake_by_ref();
        self.runtime.spawn(
            std::panic::AssertUnwindSafe(leftover)
                .catch_unwind()
                .map(|_| ()),
        );
    }
}

impl Drop for Deferred {
    fn drop(&mut self) {
        self.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A waker that counts nothing: its `Arc`'s strong count tells who
    /// still holds it.
    struct Held;

    impl Wake for Held {
        fn wake(self: Arc<Self>) {}
    }

    /// A kept leftover done lets go of the wakers of the rounds that polled
    /// it: a lock kept long after would keep their tasks' cells alive.
    /// Catches the pollers' list kept past the leftover's end.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_done_leftover_lets_go_of_its_pollers() {
        tokio::spawn(async {
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            let leftover: Leftover = Box::pin(async move {
                let _ = rx.await;
            });
            let deferred = Deferred::new(leftover)
                .ok()
                .expect("kept in a task of a multi-thread runtime");
            let round = Arc::new(Held);
            let waker = Waker::from(round.clone());
            let mut cx = Context::from_waker(&waker);
            assert!(deferred.drive(&mut cx), "pending until the reply");
            assert_eq!(Arc::strong_count(&round), 3, "registered once");
            assert!(deferred.drive(&mut cx));
            assert_eq!(Arc::strong_count(&round), 3, "not registered twice");
            tx.send(()).unwrap();
            assert!(!deferred.drive(&mut cx), "done");
            assert_eq!(Arc::strong_count(&round), 2, "the round's waker let go of");
            assert!(!deferred.waiting());
        })
        .await
        .unwrap();
    }
}
