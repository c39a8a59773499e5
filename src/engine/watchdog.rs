//! The watchdog: a task per guard that renews the lock while the guard
//! lives, reports its loss, and releases it when the guard goes.
//!
//! One task per guard, sleeping on one timer, is the simplest design that
//! scales: a sleeping Tokio task costs a few hundred bytes and no CPU, so ten
//! thousand guards cost only their renewals (see `benches/redlock/`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, watch};
use tokio::time::sleep_until;

use crate::engine::Inner;
use crate::engine::lock::Lock;
use crate::protocol::error::{Error, LossReason};
use crate::protocol::timing::{after, alarm};
use crate::trace::{self, InSpan};

/// What the watchdog publishes to the guard and its watches.
#[derive(Debug, Clone)]
pub(crate) struct State {
    /// The lock as last granted or renewed.
    pub(crate) lock: Lock,
    /// Set once, when the lock is lost.
    pub(crate) lost: Option<LossReason>,
    /// Successful renewals so far.
    pub(crate) renewals: u64,
    /// The error of the last renewal, while renewals fail.
    pub(crate) last_error: Option<String>,
}

impl State {
    /// The loss to report: the one the watchdog published, or, past the
    /// `expires_at` before it did, an expiry with the last renewal error.
    pub(crate) fn loss(&self) -> Option<LossReason> {
        if let Some(reason) = &self.lost {
            return Some(reason.clone());
        }
        (!self.lock.is_valid()).then(|| LossReason::Expired {
            last_error: self.last_error.clone(),
        })
    }
}

/// What the guard asks of its watchdog task.
#[derive(Debug)]
pub(crate) enum Stop {
    /// Stop renewing, release on every node, and report the result.
    Release(Option<oneshot::Sender<Result<usize, Error>>>),
    /// Stop renewing and leave the keys to expire; with a sender, send it
    /// the lock as last renewed once renewing has stopped.
    Forget(Option<oneshot::Sender<Lock>>),
}

/// Starts the watchdog of a granted lock: the guard's end of the state
/// channel and of the stop channel.
pub(crate) fn spawn(
    inner: Arc<Inner>,
    mut lock: Lock,
    ttl: Duration,
    interval: Duration,
) -> (watch::Receiver<State>, oneshot::Sender<Stop>) {
    // The granting round's leftover is finished now, not at the first
    // renewal: a held lock's slower nodes count their failures as a
    // lock's would that is used at once.
    lock.in_flight.finish_deferred();
    let (state_tx, state_rx) = watch::channel(State {
        lock,
        lost: None,
        renewals: 0,
        last_error: None,
    });
    let (stop_tx, stop_rx) = oneshot::channel();
    tokio::spawn(watchdog(inner, state_tx, stop_rx, ttl, interval));
    (state_rx, stop_tx)
}

/// The renewal loop of one guard.
async fn watchdog(
    inner: Arc<Inner>,
    state: watch::Sender<State>,
    mut stop: oneshot::Receiver<Stop>,
    ttl: Duration,
    interval: Duration,
) {
    let config = &inner.config;
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
            let _permit = inner.renewals.acquire().await;
            let span = trace::span!("renewal", resource = %current.label());
            // Boxed: the renewal's state lives on the heap only while it
            // runs, so that a sleeping guard's task stays small.
            let renewal = Box::pin(inner.extend(&current, ttl).in_span(span));
            Step::Renewed(attempt, renewal.await)
        };
        let lost = tokio::select! {
            // The end of the validity comes before a renewal that lands at
            // the same moment: the lock is never reported held after
            // `expires_at`.
            biased;
            command = &mut stop => break command.ok(),
            () = sleep_until(alarm(expires_at).into()) => LossReason::Expired {
                last_error: state.borrow().last_error.clone(),
            },
            step = step => match step {
                Step::MaxHold(limit) => LossReason::MaxHold { limit },
                Step::Renewed(attempt, Ok(lock)) => {
                    inner.stats.renewed();
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
                    trace::debug!(resource = %current.label(), %error, "renewal failed; retrying");
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
        trace::warning!(resource = %current.label(), reason = %lost, "lock lost");
        inner.stats.lost();
        state.send_modify(|s| s.lost = Some(lost));
        break (&mut stop).await.ok();
    };

    match command {
        Some(Stop::Forget(reply)) => {
            if let Some(reply) = reply {
                let _ = reply.send(state.borrow().lock.clone());
            }
        }
        // `None`: the guard went away without a word; release as on drop.
        Some(Stop::Release(reply)) => Box::pin(release_guarded(&inner, &state, reply)).await,
        None => Box::pin(release_guarded(&inner, &state, None)).await,
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
    inner: &Arc<Inner>,
    state: &watch::Sender<State>,
    reply: Option<oneshot::Sender<Result<usize, Error>>>,
) {
    let lock = state.borrow().lock.clone();
    let released = inner.unlock(&lock).await;
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
