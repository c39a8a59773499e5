//! The lock guard that lives as long as the work: `LockGuard`, its shared
//! view `LockWatch`, and the reasons a held lock can be lost.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, watch};

use crate::engine::Inner;
use crate::engine::lock::Lock;
use crate::engine::watchdog::{self, State, Stop};
use crate::protocol::error::{Error, LossReason};

/// A read-only, cloneable view of a guarded lock: what the work needs to
/// check that it still holds the lock. Given to the closure of
/// [`Redlock::with_lock`](crate::Redlock::with_lock), and available from
/// [`LockGuard::watch`].
#[derive(Clone)]
pub struct LockWatch {
    rx: watch::Receiver<State>,
}

impl LockWatch {
    pub(crate) fn new(rx: watch::Receiver<State>) -> Self {
        LockWatch { rx }
    }

    /// The lock as last granted or renewed (its token, key and `expires_at`).
    pub fn lock(&self) -> Lock {
        self.rx.borrow().lock.clone()
    }

    /// The instant the validity ends; it moves forward with each renewal.
    pub fn expires_at(&self) -> Instant {
        self.rx.borrow().lock.expires_at
    }

    /// Time left until [`expires_at`](LockWatch::expires_at), zero once the
    /// lock is lost.
    pub fn validity(&self) -> Duration {
        let state = self.rx.borrow();
        if state.lost.is_some() {
            return Duration::ZERO;
        }
        state.lock.validity()
    }

    /// Whether the lock is still held: not reported lost, and its `expires_at`
    /// not passed. Never true after `expires_at`, whatever the renewal task
    /// is doing.
    pub fn is_held(&self) -> bool {
        let state = self.rx.borrow();
        state.lost.is_none() && state.lock.is_valid()
    }

    /// Why the lock was lost, if it was. `Some` exactly when
    /// [`is_held`](LockWatch::is_held) is false.
    pub fn loss(&self) -> Option<LossReason> {
        self.rx.borrow().loss()
    }

    /// How many renewals have succeeded.
    pub fn renewals(&self) -> u64 {
        self.rx.borrow().renewals
    }

    /// Resolves once the lock is no longer held: a renewal found the key
    /// taken over, the `max_hold` limit was reached, the lock was released,
    /// or `expires_at` passed without a renewal. It resolves at `expires_at`
    /// at the latest (give or take the scheduling of the watchdog task), even
    /// if a node hangs in the middle of a renewal. When it resolves,
    /// [`is_held`](LockWatch::is_held) is false and
    /// [`loss`](LockWatch::loss) gives the same reason.
    ///
    /// # Cancel safety
    /// Cancel-safe: it only watches.
    pub async fn lost(&self) -> LossReason {
        let mut rx = self.rx.clone();
        loop {
            let expires_at = {
                let state = rx.borrow_and_update();
                if let Some(reason) = &state.lost {
                    return reason.clone();
                }
                state.lock.expires_at
            };
            // The watchdog publishes every loss, at `expires_at` at the
            // latest; wait for it, so that the reason is the one it found.
            if rx.changed().await.is_err() {
                // The watchdog is gone (forgotten, or its runtime shut
                // down): nothing renews any more, so the lock ends at its
                // `expires_at`.
                tokio::time::sleep_until(expires_at.into()).await;
                let state = rx.borrow();
                return state.loss().unwrap_or(LossReason::Expired {
                    last_error: state.last_error.clone(),
                });
            }
        }
    }
}

impl fmt::Debug for LockWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.rx.borrow();
        f.debug_struct("LockWatch")
            .field("lock", &state.lock)
            .field("lost", &state.lost)
            .field("renewals", &state.renewals)
            .finish()
    }
}

/// A lock renewed in the background for as long as the guard lives. Made by
/// [`Redlock::acquire`](crate::Redlock::acquire),
/// [`try_acquire`](crate::Redlock::try_acquire) and
/// [`acquire_within`](crate::Redlock::acquire_within).
///
/// While the guard lives, a watchdog task extends the lock on a quorum every
/// renewal interval (ttl / 3 by default). If a renewal cannot reach a quorum
/// before the validity runs out, or finds the key taken over, the lock is
/// reported lost: [`is_held`](LockGuard::is_held) turns false and
/// [`lost`](LockGuard::lost) resolves, no later than `expires_at`.
///
/// Release it with [`release`](LockGuard::release). Dropping it stops the
/// renewal and releases the lock from the watchdog task, without blocking;
/// if the Tokio runtime that ran [`acquire`](crate::Redlock::acquire) has
/// shut down, nothing runs any more and the keys expire after their ttl.
/// [`forget`](LockGuard::forget) stops the renewal and leaves the keys to
/// expire: the shape of a job that must not run twice in one slot.
///
/// # Examples
/// ```no_run
/// use std::time::Duration;
/// use redlock_quorum::{Error, Redlock};
///
/// # async fn export(_batch: u32) {}
/// # async fn run(redlock: Redlock) -> Result<(), Error> {
/// let guard = redlock.acquire("export", Duration::from_secs(10)).await?;
/// for batch in 0..100 {
///     // Before each step that needs the lock, check that it is still held.
///     if let Some(reason) = guard.loss() {
///         eprintln!("stopping at batch {batch}: {reason}");
///         return Ok(()); // dropping the guard releases what is left
///     }
///     export(batch).await;
/// }
/// guard.release().await?;
/// # Ok(())
/// # }
/// ```
#[must_use = "dropping the guard releases the lock at once"]
pub struct LockGuard {
    watch: LockWatch,
    stop: Option<oneshot::Sender<Stop>>,
}

impl LockGuard {
    /// Wraps a granted lock in a guard and starts its watchdog.
    pub(crate) fn start(inner: &Arc<Inner>, lock: Lock, ttl: Duration, interval: Duration) -> Self {
        let (state_rx, stop_tx) = watchdog::spawn(inner.clone(), lock, ttl, interval);
        LockGuard::new(state_rx, stop_tx)
    }

    pub(crate) fn new(rx: watch::Receiver<State>, stop: oneshot::Sender<Stop>) -> Self {
        LockGuard {
            watch: LockWatch::new(rx),
            stop: Some(stop),
        }
    }

    /// The lock as last granted or renewed.
    pub fn lock(&self) -> Lock {
        self.watch.lock()
    }

    /// The instant the validity ends; it moves forward with each renewal.
    pub fn expires_at(&self) -> Instant {
        self.watch.expires_at()
    }

    /// Time left until `expires_at`; zero once lost.
    pub fn validity(&self) -> Duration {
        self.watch.validity()
    }

    /// Whether the lock is still held; see [`LockWatch::is_held`].
    pub fn is_held(&self) -> bool {
        self.watch.is_held()
    }

    /// How many renewals have succeeded.
    pub fn renewals(&self) -> u64 {
        self.watch.renewals()
    }

    /// Why the lock was lost, if it was; see [`LockWatch::loss`].
    pub fn loss(&self) -> Option<LossReason> {
        self.watch.loss()
    }

    /// Resolves once the lock is no longer held; see [`LockWatch::lost`].
    ///
    /// # Cancel safety
    /// Cancel-safe: it only watches.
    pub async fn lost(&self) -> LossReason {
        self.watch.lost().await
    }

    /// A cloneable view of this lock, for the work to check.
    pub fn watch(&self) -> LockWatch {
        self.watch.clone()
    }

    /// Stops the renewal, then releases the lock on every node (the release
    /// is ownership-checked). Returns how many nodes released it.
    ///
    /// # Errors
    /// As [`Redlock::unlock`](crate::Redlock::unlock): [`Error::NotHeld`]
    /// when the lock had already been lost and no node held our token.
    ///
    /// # Cancel safety
    /// Cancel-safe: the release runs in the watchdog task and completes even
    /// if this future is dropped.
    pub async fn release(mut self) -> Result<usize, Error> {
        let resource = self.watch.rx.borrow().lock.label().into_owned();
        let (tx, rx) = oneshot::channel();
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(Stop::Release(Some(tx)));
        }
        rx.await.unwrap_or(Err(Error::NotHeld { resource }))
    }

    /// Stops the renewal and leaves the keys to expire after their ttl,
    /// without releasing them.
    pub fn forget(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(Stop::Forget(None));
        }
    }

    /// Stops the renewal, waits until the watchdog has stopped, and returns
    /// the lock as last renewed: a plain [`Lock`] to
    /// [`extend`](crate::Redlock::extend) (to shorten or lengthen it once),
    /// [`unlock`](crate::Redlock::unlock) or keep, with no renewal left to
    /// land after it. A lock taken with [`lock`](LockGuard::lock) before
    /// stopping may miss the last renewal, whose requests to slow nodes may
    /// still be in flight: an `extend` of it could be overtaken there by
    /// that renewal. The lock returned here knows them, and every later
    /// request on it waits for them on each node.
    ///
    /// # Cancel safety
    /// Dropping the future after it was first polled leaves the renewal
    /// stopped and the keys to expire with their ttl, as
    /// [`forget`](LockGuard::forget) does.
    pub async fn stop_renewing(mut self) -> Lock {
        let (tx, rx) = oneshot::channel();
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(Stop::Forget(Some(tx)));
        }
        match rx.await {
            Ok(lock) => lock,
            // The watchdog task is gone (its runtime shut down): nothing
            // renews any more.
            Err(_) => self.watch.lock(),
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        // Never blocks: a message to the watchdog task, which stops renewing
        // and releases. Without the task (its runtime is gone) the message is
        // lost and the keys expire after their ttl.
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(Stop::Release(None));
        }
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("watch", &self.watch)
            .finish()
    }
}
