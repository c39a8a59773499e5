//! A single key's acquisition leftover kept with the lock it granted
//! ([`Deferred`]), instead of a task of its own per acquisition.

use std::sync::{Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use futures::FutureExt;
use tokio::runtime::Handle;

use crate::engine::finisher::Leftover;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A poison means a poll of the leftover panicked (caught there); the
    // slot is still an `Option`.
    mutex.lock().unwrap_or_else(|poison| poison.into_inner())
}

/// Whether a lock keeps its leftover at all: **off**, until the three
/// defects an audit found against real servers are fixed (each has a test
/// in the audit's file, kept with the notes):
/// - a request that was not in its connection's queue at the grant (the
///   connection broken by a node's restart, or being made) is sent only
///   when the lock is next used: while held, the key is on the quorum
///   alone;
/// - a leftover first polled after the lock expired sends such a request
///   then, and that node holds a fresh key for a whole ttl;
/// - a round that took the leftover and is then neither polled nor
///   dropped (a `select!` over `&mut` of an `unlock`) leaves another round
///   on the same lock waiting, unbounded, for the leftover's requests to
///   settle.
///
/// Off, every leftover goes on in a task at once, as before this pass.
/// On, scenario 5 ran at 1.01x the floor against 0.90x
/// (`docs/performance.md`, the eleventh pass).
pub(crate) const KEEP_LEFTOVERS: bool = false;

/// An acquisition's leftover, kept with the lock it granted instead of
/// finished by a task at once ([`InFlight::keeping`]): only one made in a
/// task on a multi-thread runtime ([`Deferred::new`] says why), and only a
/// plain `SET` of one key's, which reaches its node once handed to the connection
/// (a script may need a second send after `NOSCRIPT`, so may the form a
/// node older than Redis 7.0 gets: theirs go on in a task at once).
///
/// The slower nodes' replies most often come in a few microseconds after
/// the quorum's, long before the lock is next used: finished then, polled
/// once, the leftover is most often done, and costs no task. A task of its
/// own (a spawn, its wake-ups and its end) was a sixth of a busy
/// lock+unlock cycle's client time (scenario 5's profile loop: 41 against
/// 35 µs a cycle with the leftover dropped).
///
/// It is finished when the lock is next used (the next round given the
/// lock's [`InFlight`](crate::engine::inflight::InFlight) drives it with
/// its own requests, see [`Deferred::take`]), when the watchdog takes it
/// over, or when the last copy of the lock is dropped
/// ([`Deferred::finish`]). Until then its requests, already handed to their connections,
/// run on the nodes as they would have; what waits is their bookkeeping
/// (a node's failure count, whether it answered), on a lock that nobody
/// uses meanwhile.
///
/// # Worst days
/// - **Another runtime.** The leftover's timer belongs to the round's
///   runtime: it is polled only there, and from anywhere else spawned onto
///   that runtime. A runtime that shut down drops it as it is spawned
///   (each request then counts as settled, as when the runtime dropped a
///   spawned leftover).
/// - **Still pending** when finished (a slow node): it goes on in a task
///   of its own, as it did before.
/// - **A panic** while polled drops that leftover alone.
///
/// [`InFlight::keeping`]: crate::engine::inflight::InFlight::keeping
pub(crate) struct Deferred {
    leftover: Mutex<Option<Leftover>>,
    runtime: Handle,
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
                Ok(Deferred {
                    leftover: Mutex::new(Some(leftover)),
                    runtime,
                })
            }
            _ => Err(leftover),
        }
    }

    /// The leftover, to be driven by the caller's next round on the lock
    /// ([`round_keeping`](crate::engine::round::round_keeping) polls it
    /// with its own requests, which go behind it on each node's
    /// connection): when called on the leftover's runtime. From elsewhere
    /// it is spawned onto its runtime, and `None` comes back. Only the
    /// first call takes it.
    pub(crate) fn take(&self) -> Option<Leftover> {
        let mut slot = lock(&self.leftover);
        slot.as_ref()?;
        let here = Handle::try_current().is_ok_and(|current| current.id() == self.runtime.id());
        if here {
            return slot.take();
        }
        drop(slot);
        self.finish();
        None
    }

    /// Whether the leftover is still kept here (not yet taken or
    /// finished).
    pub(crate) fn waiting(&self) -> bool {
        lock(&self.leftover).is_some()
    }

    /// Takes back a leftover that [`take`](Deferred::take) gave a round,
    /// which was dropped before it finished it (its caller cancelled), and
    /// finishes it ([`finish`](Deferred::finish)).
    pub(crate) fn put_back(&self, leftover: Leftover) {
        *lock(&self.leftover) = Some(leftover);
        self.finish();
    }

    /// Polls the leftover once, on its runtime, and spawns it onto that
    /// runtime when it is not done (or when called from elsewhere). Only
    /// the first call does anything.
    pub(crate) fn finish(&self) {
        let Some(mut leftover) = lock(&self.leftover).take() else {
            return;
        };
        let here = Handle::try_current().is_ok_and(|current| current.id() == self.runtime.id());
        if here {
            let mut cx = Context::from_waker(Waker::noop());
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                leftover.as_mut().poll(&mut cx)
            })) {
                Ok(Poll::Ready(())) | Err(_) => return,
                Ok(Poll::Pending) => {}
            }
        }
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
