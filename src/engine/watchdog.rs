//! The watchdog: a task per guard that renews the lock while the guard
//! lives, reports its loss, and releases it when the guard goes.
//!
//! One task per guard, sleeping on one timer, is the simplest design that
//! scales: a sleeping Tokio task costs a few hundred bytes and no CPU, so ten
//! thousand guards cost only their renewals (see `benches/redlock/`).

use std::future::Future;
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, watch};
use tokio::time::sleep_until;

use crate::api::guard::{LockGuard, LockWatch, State, Stop};
use crate::engine::acquire::{Patience, Redlock};
use crate::engine::lock::Lock;
use crate::protocol::error::{Error, LossReason};
use crate::protocol::timing::{Ttl, after, alarm};
use crate::trace::{self, InSpan};

impl Redlock {
    /// Acquires `resource` (with the retries of [`lock`](Redlock::lock)) and
    /// returns a guard that renews it in the background on a quorum, every
    /// renewal interval (ttl / 3 unless the builder's `renew_interval` says
    /// otherwise), until the guard is released, forgotten or dropped, the
    /// lock is lost, or the builder's `max_hold` is reached.
    ///
    /// # Examples
    /// ```no_run
    /// use std::time::Duration;
    /// use redlock_quorum::{Error, Redlock};
    ///
    /// # async fn rebuild_index() {}
    /// # async fn run(redlock: Redlock) -> Result<(), Error> {
    /// let guard = redlock.acquire("reindex", Duration::from_secs(10)).await?;
    /// tokio::select! {
    ///     () = rebuild_index() => {}
    ///     reason = guard.lost() => eprintln!("lock lost: {reason}"),
    /// }
    /// guard.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`lock`](Redlock::lock), and [`Error::InvalidSetting`] when the
    /// configured renewal interval is not shorter than `ttl` minus the drift
    /// allowance, or [`Error::TtlTooShortToRenew`] when `ttl` is too short
    /// for the default interval.
    ///
    /// # Cancel safety
    /// As [`lock`](Redlock::lock): dropping the future leaves no key behind.
    /// Once it returned, the guard owns the lock.
    pub async fn acquire(&self, resource: &str, ttl: Duration) -> Result<LockGuard, Error> {
        let patience = Patience::Retries(self.inner.config.retry_count);
        self.acquire_patiently(resource, ttl, patience).await
    }

    /// Acquires `resource` with one attempt and a renewing guard: the
    /// guard of [`acquire`](Redlock::acquire), the patience of
    /// [`try_lock`](Redlock::try_lock). The shape of a scheduled job that
    /// every instance starts and only one may run.
    ///
    /// # Examples
    /// ```no_run
    /// use std::time::Duration;
    /// use redlock_quorum::{Error, Redlock};
    ///
    /// # async fn send_invoices() {}
    /// # async fn run(redlock: Redlock) -> Result<(), Error> {
    /// // Every instance's cron fires at 02:00; one runs the job.
    /// match redlock.try_acquire("job:invoices:2026-12-02", Duration::from_secs(60)).await {
    ///     Ok(guard) => {
    ///         send_invoices().await;
    ///         // Keep the key until it expires, so that an instance whose
    ///         // clock fired late does not run the job a second time.
    ///         guard.forget();
    ///     }
    ///     Err(Error::Conflict { .. }) => {} // another instance runs it
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`acquire`](Redlock::acquire), without the retries.
    ///
    /// # Cancel safety
    /// As [`acquire`](Redlock::acquire).
    pub async fn try_acquire(&self, resource: &str, ttl: Duration) -> Result<LockGuard, Error> {
        self.acquire_patiently(resource, ttl, Patience::Retries(0))
            .await
    }

    /// Acquires `resource` with a renewing guard, waiting at most about
    /// `wait` for another holder to let go: the guard of
    /// [`acquire`](Redlock::acquire), the patience of
    /// [`lock_within`](Redlock::lock_within).
    ///
    /// # Errors
    /// As [`acquire`](Redlock::acquire).
    ///
    /// # Cancel safety
    /// As [`acquire`](Redlock::acquire).
    pub async fn acquire_within(
        &self,
        resource: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<LockGuard, Error> {
        let patience = Patience::Until(after(Instant::now(), wait));
        self.acquire_patiently(resource, ttl, patience).await
    }

    async fn acquire_patiently(
        &self,
        resource: &str,
        ttl: Duration,
        patience: Patience,
    ) -> Result<LockGuard, Error> {
        let interval = self.renew_interval(ttl)?;
        let lock = self.lock_patiently(&[resource], ttl, patience).await?;
        Ok(self.guard(lock, ttl, interval))
    }

    /// Runs `work` under the lock: acquires `resource` with a renewing guard
    /// (as [`acquire`](Redlock::acquire)), runs the future that `work` makes
    /// from the guard's [`LockWatch`], and releases the lock when it ends.
    ///
    /// If the lock is lost while the future runs, the future is dropped
    /// (cancelled at its current await point) and [`Error::LockLost`] is
    /// returned. If the future finished but the lock was not held for the
    /// whole of it (work that blocked the thread past the validity, so that
    /// the loss could not cancel it), the value is dropped and
    /// [`Error::LockLost`] is returned too. The lock is released on every
    /// exit path: success, loss, a panic in the future (released from the
    /// watchdog task as the guard unwinds, then the panic goes on), and the
    /// cancellation of `with_lock` itself. A failed release after the work
    /// succeeded is not reported: the work's value is returned and the keys
    /// expire with their ttl.
    ///
    /// Work that writes to a resource outside Redis should still check
    /// [`LockWatch::is_held`] before each write, or better, pass a fencing
    /// token: cancellation only happens at await points.
    ///
    /// # Examples
    /// ```no_run
    /// use std::time::Duration;
    /// use redlock_quorum::{Error, Redlock};
    ///
    /// # async fn run(redlock: Redlock) -> Result<(), Error> {
    /// let rows = redlock
    ///     .with_lock("ledger", Duration::from_secs(5), |watch| async move {
    ///         // ... check watch.is_held() before each write ...
    ///         assert!(watch.is_held());
    ///         42
    ///     })
    ///     .await?;
    /// assert_eq!(rows, 42);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`acquire`](Redlock::acquire), and [`Error::LockLost`] when the
    /// lock was lost before the work finished.
    ///
    /// # Cancel safety
    /// Dropping the future drops the work and releases the lock from the
    /// watchdog task.
    pub async fn with_lock<F, Fut, T>(
        &self,
        resource: &str,
        ttl: Duration,
        work: F,
    ) -> Result<T, Error>
    where
        F: FnOnce(LockWatch) -> Fut,
        Fut: Future<Output = T>,
    {
        let guard = self.acquire(resource, ttl).await?;
        // Boxed so that it can be dropped before the release on loss.
        let mut work = Box::pin(work(guard.watch()));
        let outcome = tokio::select! {
            // On a tie, loss wins: the work's result may not be trusted.
            biased;
            reason = guard.lost() => Err(reason),
            value = &mut work => Ok(value),
        };
        drop(work);
        // The work may have finished after `expires_at` without yielding
        // to the watchdog: the guard never says "held" past `expires_at`.
        let outcome = match outcome {
            Ok(value) => match guard.loss() {
                None => Ok(value),
                Some(reason) => Err(reason),
            },
            Err(reason) => Err(reason),
        };
        let _ = guard.release().await;
        outcome.map_err(|reason| Error::LockLost {
            resource: resource.to_owned(),
            reason,
        })
    }

    /// The renewal interval for a ttl: the configured one, or ttl / 3.
    pub(crate) fn renew_interval(&self, ttl: Duration) -> Result<Duration, Error> {
        let config = &self.inner.config;
        let checked = Ttl::new(ttl, config.drift_factor)?;
        let usable = checked.duration - checked.drift;
        match config.renew_interval {
            None => {
                let interval = checked.duration / 3;
                if interval.is_zero() || interval >= usable {
                    return Err(Error::TtlTooShortToRenew {
                        ttl,
                        drift: checked.drift,
                    });
                }
                Ok(interval)
            }
            Some(interval) if interval >= usable => Err(Error::InvalidSetting {
                setting: "renew_interval",
                reason: "must be shorter than the ttl minus the drift allowance",
            }),
            Some(interval) => Ok(interval),
        }
    }

    /// Wraps a granted lock in a guard and starts its watchdog.
    pub(crate) fn guard(&self, lock: Lock, ttl: Duration, interval: Duration) -> LockGuard {
        let (state_tx, state_rx) = watch::channel(State {
            lock,
            lost: None,
            renewals: 0,
            last_error: None,
        });
        let (stop_tx, stop_rx) = oneshot::channel();
        tokio::spawn(watchdog(self.clone(), state_tx, stop_rx, ttl, interval));
        LockGuard::new(state_rx, stop_tx)
    }
}

/// The renewal loop of one guard.
async fn watchdog(
    redlock: Redlock,
    state: watch::Sender<State>,
    mut stop: oneshot::Receiver<Stop>,
    ttl: Duration,
    interval: Duration,
) {
    let config = &redlock.inner.config;
    let acquired = state.borrow().lock.started_at;
    // A limit too far away to represent is no limit.
    let hold_limit = config
        .max_hold
        .and_then(|limit| Some((limit, acquired.checked_add(limit)?)));
    let mut next = after(acquired, interval);

    // Renew until stopped or lost; then wait for the guard's word.
    let command = loop {
        let current = state.borrow().lock.clone();
        let expires_at = current.expires_at;
        let wake = hold_limit.map_or(next, |(_, at)| next.min(at));
        // Sleep until the next renewal is due, then renew.
        let step = async {
            sleep_until(wake.into()).await;
            if let Some((limit, at)) = hold_limit
                && Instant::now() >= at
            {
                return Step::MaxHold(limit);
            }
            let attempt = Instant::now();
            // Admission: at most `renew_concurrency` renewals in flight per
            // manager. Ten thousand guards renewing in the same instant would
            // otherwise queue 50,000 requests behind each other, every one of
            // them time out, and all retry together (a congestion collapse).
            // The wait counts against the deadline, which the select below
            // still watches.
            let _permit = redlock.inner.renewals.acquire().await;
            let span = trace::span!("renewal", resource = %current.resource);
            // Boxed: the renewal's state lives on the heap only while it
            // runs, so that a sleeping guard's task stays small.
            let renewal = Box::pin(redlock.extend(&current, ttl).in_span(span));
            Step::Renewed(attempt, renewal.await)
        };
        let lost = tokio::select! {
            // The end of the validity comes before a renewal that lands at
            // the same moment: the lock is never reported held after
            // `expires_at`.
            biased;
            command = &mut stop => break command.ok(),
            () = sleep_until(alarm(expires_at)) => LossReason::Expired {
                last_error: state.borrow().last_error.clone(),
            },
            step = step => match step {
                Step::MaxHold(limit) => LossReason::MaxHold { limit },
                Step::Renewed(attempt, Ok(lock)) => {
                    redlock.inner.stats.renewed();
                    state.send_modify(|s| {
                        s.lock = lock;
                        s.renewals += 1;
                        s.last_error = None;
                    });
                    next = after(attempt, interval);
                    continue;
                }
                // A quorum answered that the key is not ours.
                Step::Renewed(_, Err(Error::NotHeld { .. })) => LossReason::TakenOver,
                Step::Renewed(_, Err(e)) => {
                    // No quorum this time: the lock may still be ours (a
                    // node paused, say). Retry until the validity runs out;
                    // another round can take up to the node timeout, so when
                    // less validity than that is left, report the loss now
                    // rather than at the deadline.
                    let error = e.to_string();
                    trace::debug!(resource = %current.resource, %error, "renewal failed; retrying");
                    state.send_modify(|s| s.last_error = Some(error.clone()));
                    let now = Instant::now();
                    if expires_at.saturating_duration_since(now) <= config.node_timeout {
                        LossReason::Expired { last_error: Some(error) }
                    } else {
                        next = after(now, config.retry_delay.min(interval));
                        continue;
                    }
                }
            },
        };
        trace::warning!(resource = %current.resource, reason = %lost, "lock lost");
        redlock.inner.stats.lost();
        state.send_modify(|s| s.lost = Some(lost));
        break (&mut stop).await.ok();
    };

    match command {
        Some(Stop::Forget) => {}
        // `None`: the guard went away without a word; release as on drop.
        Some(Stop::Release(reply)) => Box::pin(release_guarded(&redlock, &state, reply)).await,
        None => Box::pin(release_guarded(&redlock, &state, None)).await,
    }
}

/// One step of the renewal loop.
enum Step {
    /// The `max_hold` limit was reached.
    MaxHold(Duration),
    /// A renewal ran; it started at the instant given.
    Renewed(Instant, Result<Lock, Error>),
}

/// Releases a guard's lock from its watchdog task and tells the watches.
async fn release_guarded(
    redlock: &Redlock,
    state: &watch::Sender<State>,
    reply: Option<oneshot::Sender<Result<usize, Error>>>,
) {
    let lock = state.borrow().lock.clone();
    let released = redlock.unlock(&lock).await;
    // From now on the guard's watches see the lock as gone.
    state.send_modify(|s| {
        if s.lost.is_none() {
            s.lost = Some(LossReason::Released);
        }
        s.lock.expires_at = s.lock.expires_at.min(Instant::now());
    });
    if let Some(reply) = reply {
        let _ = reply.send(released);
    }
}
