//! The acquisition: the attempt loop (retries, waiting, split votes), one
//! attempt's rounds, the round that sends the `SET`, and the grant that
//! turns a quorum into a [`Lock`]. The arithmetic it uses is in
//! [`timing`], the requests in [`acquire`], the quorum rule in the
//! [`tally`](crate::protocol::tally).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::engine::Inner;
use crate::engine::counters::Ended;
use crate::engine::lock::{Held, Lock, new_token};
use crate::engine::release::{Cleanup, release_with};
use crate::engine::round::{self, InFlight, Round, Until};
use crate::engine::wait::registration::Registration;
use crate::protocol::durability::Durability;
use crate::protocol::error::Error;
use crate::protocol::keys;
use crate::protocol::quorum::{Ask, Outcome, quorum};
use crate::protocol::request::acquire::{self, Pttls};
use crate::protocol::tally::Tally;
use crate::protocol::timing::{self, Patience, Ttl};
use crate::trace::{self, InSpan};

impl Inner {
    /// Acquisition of one resource or several with the given patience; see
    /// [`lock`](crate::Redlock::lock).
    pub(crate) async fn lock_patiently(
        self: &Arc<Self>,
        resources: &[&str],
        ttl: Duration,
        patience: Patience,
    ) -> Result<Lock, Error> {
        #[cfg(feature = "tracing")]
        let resource = &*keys::label(resources);
        let span = trace::span!("lock", resource, ?ttl);
        let counted = async {
            let started = Instant::now();
            let result = self.lock_retrying(resources, ttl, patience).await;
            self.stats.ended(match &result {
                Ok(_) => Ended::Granted(started.elapsed()),
                Err(Error::Conflict { .. }) => Ended::Conflict,
                Err(Error::NoQuorum { .. }) => Ended::NoQuorum,
                Err(_) => Ended::Error,
            });
            result
        };
        counted.in_span(span).await
    }

    /// The attempt loop. Each failed attempt that may be followed by another
    /// learns the holder's remaining ttl; the first failure registers the
    /// caller as a waiter (subscribes, then tries again at once), and each
    /// later one sleeps until a release wakes it, the holder's keys expire,
    /// or the timed retry is due, whichever comes first (see [`wait`](crate::engine::wait)).
    pub(crate) async fn lock_retrying(
        self: &Arc<Self>,
        resources: &[&str],
        ttl: Duration,
        patience: Patience,
    ) -> Result<Lock, Error> {
        let ttl = self.check(resources, ttl)?;
        let config = &self.config;
        let started = Instant::now();
        // The budget: see `timing::retry_budget`.
        let (retry_count, last_start) = timing::retry_budget(
            patience,
            started,
            config.retry_delay,
            config.retry_jitter,
            config.node_timeout,
        );
        let mut slept = Duration::ZERO;
        let mut retries = 0;
        let mut splits = 0;
        let mut waiter: Option<Registration> = None;
        loop {
            let budget_left = match patience {
                Patience::Retries(_) => last_start.saturating_duration_since(started + slept),
                Patience::Until(_) => last_start.saturating_duration_since(Instant::now()),
            };
            let last = retries >= retry_count || budget_left.is_zero();
            // A split vote is settled within the attempt only when no retry
            // follows: a retry settles it too, without a burst of rounds from
            // every contender.
            let split_rounds = if last { timing::SPLIT_VOTE_ROUNDS } else { 0 };
            // The holder's ttl is asked for once this caller waits: after
            // the first refusal it subscribes and tries again before it
            // sleeps, so the first attempt is a bare `SET` (an uncontended
            // lock costs one command per node).
            let pttls = Pttls::default();
            let learn = (!last && waiter.is_some()).then_some(&pttls);
            let span = trace::span!("attempt", n = retries);
            // Boxed: the attempt's state (a round's) lives only while it
            // runs, so a caller asleep between attempts holds no room for
            // it (a waiting future of 2.7 KB otherwise). Admitted: at most
            // `ATTEMPTS_IN_FLIGHT` at once (10,000 callers starting
            // together would otherwise hold 20 KB each for a moment).
            // A free permit is taken without a future (the common case).
            let admitted = match self.attempts.try_acquire() {
                Ok(permit) => Ok(permit),
                Err(_) => self.attempts.acquire().await,
            };
            // The attempt's future is made inside the box, never moved.
            let attempt = Box::pin(async {
                self.attempt(resources, ttl, split_rounds, learn)
                    .in_span(span)
                    .await
            });
            let outcome = attempt.await;
            drop(admitted);
            let outcome = match outcome {
                Ok(lock) => {
                    if let Some(waiter) = waiter {
                        waiter.granted();
                    }
                    return Ok(lock);
                }
                Err((e, outcome)) if !last && e.is_retryable() => {
                    trace::debug!(attempt = retries, error = %e, "attempt failed; waiting");
                    outcome
                }
                Err((e, _)) => return Err(e),
            };
            // Subscribe, then try: a release between the refusal and the
            // subscription is not slept through.
            let Some(waiter) = waiter.as_mut() else {
                let keys: Vec<String> = resources.iter().map(|r| self.key(r)).collect();
                waiter = Some(self.waits.register(&keys, config.connect_timeout).await);
                continue;
            };
            let now = Instant::now();
            let pause = timing::after(
                now,
                timing::retry_delay(config.retry_delay, config.retry_jitter),
            );
            let expiry = pttls
                .holder_expiry(self.nodes.len())
                .map(|d| timing::after(now, d));
            if matches!(outcome, Outcome::Refused | Outcome::MayBeHeld) {
                // A wake-up this attempt could not use goes on (for a set,
                // whose holder may be another key's).
                waiter.saw_holder();
            }
            let (wake_at, counted) = match outcome {
                Outcome::Refused => {
                    splits = 0;
                    // Notifications alone suffice when a quorum of nodes has
                    // our subscription; the first waiter of the key keeps
                    // the timed retry for releases nobody publishes.
                    // When the holder's expiry is unknown (the restart
                    // guard, a durability confirmation, a set), the timed
                    // retry stays too: a holder that dies without a
                    // release is then found within a pause, not at the
                    // deadline.
                    let notified = waiter.subscribed_on() >= quorum(self.nodes.len());
                    let poll =
                        (!notified || waiter.is_first() || expiry.is_none()).then_some(pause);
                    let wake_at = [expiry, poll].into_iter().flatten().min();
                    (wake_at.unwrap_or(last_start), true)
                }
                Outcome::Split if splits < timing::SPLIT_VOTE_ROUNDS => {
                    splits += 1;
                    let jitter = timing::split_vote_pause(splits - 1);
                    (timing::after(now, jitter), false)
                }
                _ => (expiry.map_or(pause, |e| e.min(pause)), true),
            };
            let wake_at = match patience {
                Patience::Retries(_) => wake_at.min(timing::after(now, budget_left)),
                Patience::Until(_) => wake_at.min(last_start),
            };
            let woke = waiter.sleep_until(wake_at).await;
            slept += now.elapsed();
            if !woke && counted {
                retries += 1;
            }
        }
    }

    /// One acquisition attempt: a round, and up to `split_rounds` more after
    /// a split vote; see [`lock`](crate::Redlock::lock). With `learn`, a refused
    /// round of one key also reads the holder's remaining ttl.
    pub(crate) async fn attempt(
        self: &Arc<Self>,
        resources: &[&str],
        ttl: Ttl,
        split_rounds: u32,
        learn: Option<&Pttls>,
    ) -> Result<Lock, (Error, Outcome)> {
        let mut split = 0;
        loop {
            match self.round_once(resources, ttl, learn).await {
                Ok(lock) => return Ok(lock),
                // Contenders shared the nodes, or too few answered to tell:
                // settle it now rather than give up.
                Err((_, Outcome::Split | Outcome::MayBeHeld | Outcome::NoQuorum))
                    if split < split_rounds =>
                {
                    trace::debug!(
                        round = split + 1,
                        "split vote or too few answers; another round"
                    );
                    Box::pin(tokio::time::sleep(timing::split_vote_pause(split))).await;
                    split += 1;
                }
                Err(failed) => return Err(failed),
            }
        }
    }

    /// One acquisition round, released everywhere when it fails.
    pub(crate) async fn round_once(
        self: &Arc<Self>,
        resources: &[&str],
        ttl: Ttl,
        learn: Option<&Pttls>,
    ) -> Result<Lock, (Error, Outcome)> {
        let inner = self;
        let mut keys: Vec<String> = resources.iter().map(|r| self.key(r)).collect();
        let mut token = new_token().map_err(|e| (e, Outcome::Errors))?;
        // Cancellation safety: until the attempt has either been granted or
        // released, this guard releases it from a spawned task if the future
        // is dropped.
        let key_expiry = ttl.key_expiry(Instant::now());
        let mut cleanup = Cleanup::new(inner, &keys, &token, key_expiry);
        inner.warm_up().await;
        if let Err(e) = self.configured() {
            cleanup.disarm();
            return Err((e, Outcome::Errors));
        }
        inner.stats.attempt();
        let start = Instant::now();
        // A caller that may wait learns the holder's ttl: `PTTL` rides
        // behind the `SET` of one key (not under the restart guard, whose
        // script reply has its own layout, nor with a durability
        // confirmation, which has its own pipeline; there and for sets the
        // expiry stays unknown and the timed retry bounds the wait).
        let plain =
            inner.generation.guard.is_none() && inner.config.durability == Durability::Memory;
        let (request, pipelined) = match (learn, keys.as_slice(), plain) {
            (Some(_), [key], true) => (acquire::waiting_request(key, &token, ttl.millis), true),
            _ => (
                acquire::request(&inner.generation, &keys, &token, ttl.millis)
                    .durable(inner.config.durability),
                false,
            ),
        };
        // Only a plain `SET` of one key may leave its slower nodes' requests
        // with the lock (see `Deferred`): once handed to a connection it
        // reaches its node with no further step. A script may need one
        // (`NOSCRIPT`), and so may the form a node older than Redis 7.0
        // gets; their leftovers go on in a task at once.
        let deferrable = matches!(request, round::Request::Set(_))
            && !inner.nodes.iter().any(|node| node.old_set());
        let unused = Pttls::default();
        let pttls = learn.unwrap_or(&unused);
        let read_set = acquire::read(&inner.generation, &token, keys.len() > 1);
        let read = |value: &redis::Value| {
            if pipelined {
                acquire::read_waiting(pttls, &read_set)(value)
            } else {
                read_set(value)
            }
        };
        let (Round { tally, in_flight }, leftover) = round::round_keeping(
            inner,
            None,
            Ask::Acquire,
            Until::Decided,
            request,
            &InFlight::default(),
            // From the round's start, after the warm-up (the lock's own
            // validity counts from there too).
            round::SendBy::Deadline(Some(ttl.key_expiry(start))),
            read,
        )
        .await;
        self.note(&tally);
        let outcome = tally.outcome();
        // No await from here to the failure's release, where the guard is
        // armed again: the grant takes the keys and the token, not copies.
        cleanup.disarm();
        drop(cleanup);
        drop(read_set);
        let held = || {
            resources
                .iter()
                .zip(std::mem::take(&mut keys))
                .map(|(resource, key)| Held {
                    resource: (*resource).to_owned(),
                    key,
                })
                .collect()
        };
        match self.grant(held, || std::mem::take(&mut token), ttl, start, tally) {
            Ok(mut lock) => {
                // The slower nodes' requests, kept with the lock: finished
                // when it is next used (see `Deferred`).
                lock.in_flight = match deferrable {
                    true => in_flight.keeping(leftover, &inner.finishers),
                    false => {
                        if let Some(leftover) = leftover {
                            inner.finishers.finish(leftover);
                        }
                        in_flight
                    }
                };
                Ok(lock)
            }
            Err(failed) => {
                if let Some(leftover) = leftover {
                    inner.finishers.finish(leftover);
                }
                let mut cleanup = Cleanup::new(inner, &keys, &token, key_expiry);
                // Release where our key may be: the nodes that agreed, and
                // those that did not answer (a late SET may still land; each
                // node's release waits for that node's SET). A node that
                // answered with another holder's value, or with an error,
                // did not take our SET.
                let mut maybe_ours = failed.nodes_that_may_hold_ours();
                maybe_ours.sort_unstable();
                let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
                // A round without a quorum was nobody's lock: its release
                // wakes no waiter. One that had a quorum but too late
                // (`Late`) may have kept waiters out: they are told.
                // Boxed: a refused attempt's path, its state kept out of
                // every attempt's (boxed per attempt, see `lock_patiently`).
                Box::pin(release_with(
                    inner,
                    Some(&maybe_ours),
                    &keys,
                    &token,
                    ttl.key_expiry(start),
                    &in_flight,
                    matches!(failed, Failed::Round(_)),
                ))
                .await;
                cleanup.disarm();
                Err((failed.into_error(&keys::label(resources)), outcome))
            }
        }
    }

    /// Turns a round into a lock when a quorum agreed with validity left.
    /// `held` makes the lock's resources and keys, and `token` its token,
    /// called only for a grant (an acquisition moves its own in).
    pub(crate) fn grant(
        self: &Arc<Self>,
        held: impl FnOnce() -> Arc<[Held]>,
        token: impl FnOnce() -> String,
        ttl: Ttl,
        start: Instant,
        tally: Tally,
    ) -> Result<Lock, Failed> {
        let Some(quorum_at) = tally.quorum_at.filter(|_| tally.same_server.is_none()) else {
            return Err(Failed::Round(Box::new(tally)));
        };
        // The validity is measured now, not at the quorum: the caller can use
        // only what is left when it gets the lock. It counts from `start`,
        // before the first request was sent.
        let now = Instant::now().max(quorum_at);
        let elapsed = now - start;
        if timing::validity(ttl.duration, elapsed, ttl.drift).is_none() {
            // Every node may hold it: the round stopped at the quorum.
            return Err(Failed::Late {
                elapsed,
                ttl: ttl.duration,
                drift: ttl.drift,
                agreed: (0..self.nodes.len()).collect(),
                unanswered: Vec::new(),
            });
        }
        Ok(Lock {
            held: held(),
            token: token(),
            started_at: start,
            expires_at: ttl.expires_at(start),
            key_expiry: ttl.key_expiry(start),
            in_flight: InFlight::default(),
            adopted: false,
        })
    }
}

/// Why a round did not produce a lock.
pub(crate) enum Failed {
    Round(Box<Tally>),
    Late {
        elapsed: Duration,
        ttl: Duration,
        drift: Duration,
        agreed: Vec<usize>,
        unanswered: Vec<usize>,
    },
}

impl Failed {
    /// The nodes where a failed acquisition's key may be: those that agreed
    /// and those whose state is unknown.
    fn nodes_that_may_hold_ours(&self) -> Vec<usize> {
        let (agreed, unanswered) = match self {
            Failed::Round(tally) => (&tally.agreed, &tally.unanswered),
            Failed::Late {
                agreed, unanswered, ..
            } => (agreed, unanswered),
        };
        match self {
            Failed::Round(tally) => agreed
                .iter()
                .chain(unanswered)
                .chain(&tally.young)
                .chain(&tally.wrote)
                .copied()
                .collect(),
            Failed::Late { .. } => agreed.iter().chain(unanswered).copied().collect(),
        }
    }

    pub(crate) fn into_error(self, resource: &str) -> Error {
        match self {
            Failed::Round(tally) => (*tally).into_error(resource),
            Failed::Late {
                elapsed,
                ttl,
                drift,
                ..
            } => Error::ValidityExpired {
                resource: resource.to_owned(),
                elapsed,
                ttl,
                drift,
            },
        }
    }
}
