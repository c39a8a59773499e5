//! The `Redlock` manager: acquisition, extension, release and the remote
//! check, on a quorum.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::api::address::NodeAddress;

use crate::api::builder::{Config, RedlockBuilder};
use crate::engine::counters::{Counters, Ended};
use crate::engine::lock::{Lock, new_token};
use crate::engine::node::Node;
use crate::engine::release::{Cleanup, Retries, release_everywhere, release_on, release_with};
use crate::engine::round::{self, InFlight, Round, Until};
use crate::engine::wait::{self, Pttls, Registration, Waits};
use crate::protocol::error::{Error, NodeError};
use crate::protocol::generation::Generation;
use crate::protocol::request;
use crate::protocol::tally::{Ask, Outcome, Tally, quorum};
use crate::protocol::timing::{self, Ttl};
use crate::trace::{self, InSpan};

/// How long a release of an [adopted](Redlock::adopt) lock is retried on
/// nodes that could not be reached: its ttl is not known here.
const ADOPTED_RETRY_WINDOW: Duration = Duration::from_secs(60);

/// A distributed lock manager over N independent Redis masters.
///
/// Cheap to clone (an `Arc` inside); clones share one long-lived,
/// multiplexed connection per node, made on first use and made again when
/// it breaks, when it failed (with a backoff), or when the manager is used
/// on another Tokio runtime than the one that made it.
///
/// See the [crate documentation](crate) for the algorithm and its limits.
///
/// # Examples
/// ```no_run
/// use std::time::Duration;
/// use redlock_quorum::{Error, Redlock};
///
/// # async fn run() -> Result<(), Error> {
/// let redlock = Redlock::new([
///     "redis://10.0.0.1:6379/",
///     "redis://10.0.0.2:6379/",
///     "redis://10.0.0.3:6379/",
/// ])?;
/// let lock = redlock.lock("stock:42", Duration::from_secs(5)).await?;
/// // ... decrement the stock, within lock.validity() ...
/// redlock.unlock(&lock).await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Redlock {
    pub(crate) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) nodes: Vec<Arc<Node>>,
    pub(crate) config: Config,
    /// Admission for the watchdogs' renewals; see `renew_concurrency`.
    pub(crate) renewals: tokio::sync::Semaphore,
    /// Releases owed to nodes that could not be reached.
    pub(crate) retries: Retries,
    /// Set once a round found two entries of the node list on one server.
    pub(crate) misconfigured: OnceLock<Error>,
    /// Set once every node was tried once; see [`Inner::warm_up`].
    pub(crate) warmed: tokio::sync::OnceCell<()>,
    /// What the manager did; see [`Redlock::stats`].
    pub(crate) stats: Counters,
    /// The generation markers and the restart guard.
    pub(crate) generation: Generation,
    /// The waiters and the release subscriptions; see [`wait`].
    pub(crate) waits: Waits,
}

impl Inner {
    /// Remembers a configuration error; every later call fails with it.
    fn misconfigure(&self, error: Error) {
        if self.misconfigured.get().is_none() {
            trace::error!(%error, "the node list names one server twice; every call will fail");
            let _ = self.misconfigured.set(error);
        }
    }

    /// Before the first round of a manager, connects to every node at once
    /// and waits until each connected or failed (each bounded by the connect
    /// timeout). A cold start then costs one parallel connect instead of
    /// counting against the node timeout, and every node's identity is known
    /// before anything is counted: a server named twice is refused at the
    /// first call, not at some later one.
    ///
    /// # Cancel safety
    /// Cancel-safe: a dropped warm-up is started again by the next round.
    pub(crate) async fn warm_up(&self) {
        self.warmed
            .get_or_init(|| async {
                let made =
                    futures::future::join_all(self.nodes.iter().map(|n| n.connection())).await;
                for (index, made) in made.into_iter().enumerate() {
                    let node = &self.nodes[index];
                    match made {
                        Err(NodeError::SameServer {
                            other_index,
                            other_node,
                        }) => self.misconfigure(Error::DuplicateNode {
                            index,
                            node: node.label().to_owned(),
                            first: other_index,
                            first_node: other_node,
                        }),
                        Ok(_) if node.persistent() == Some(false) => {
                            trace::warning!(
                                node = node.label(),
                                "the node runs without AOF persistence: if it restarts, it forgets \
                                 the locks it held; run it with appendonly yes and appendfsync \
                                 always, or delay its restarts past the largest ttl"
                            );
                        }
                        _ => {}
                    }
                }
            })
            .await;
    }
}

/// How long an acquisition keeps trying.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Patience {
    /// This many retries after the first attempt.
    Retries(u32),
    /// Retries while the next attempt would start before this instant.
    Until(Instant),
}

impl Redlock {
    /// A builder over the given nodes, with the defaults documented on each
    /// setting. Each node is a URL such as `"redis://127.0.0.1:7001/"` or
    /// `"redis://:password@host:6379/0"`, or a [`redis::ConnectionInfo`]
    /// (see [`NodeAddress`]).
    pub fn builder<I>(nodes: I) -> RedlockBuilder
    where
        I: IntoIterator,
        I::Item: NodeAddress,
    {
        RedlockBuilder::new(nodes)
    }

    /// A manager over the given nodes with the default settings; the same
    /// as `Redlock::builder(nodes).build()`.
    ///
    /// # Errors
    /// As [`RedlockBuilder::build`].
    pub fn new<I>(nodes: I) -> Result<Self, Error>
    where
        I: IntoIterator,
        I::Item: NodeAddress,
    {
        Self::builder(nodes).build()
    }

    /// How many nodes the manager locks on.
    pub fn node_count(&self) -> usize {
        self.inner.nodes.len()
    }

    /// How many nodes must agree: `node_count() / 2 + 1`.
    pub fn quorum(&self) -> usize {
        quorum(self.inner.nodes.len())
    }

    /// The nodes' addresses, without credentials, in the order given.
    pub fn nodes(&self) -> impl Iterator<Item = &str> {
        self.inner.nodes.iter().map(|n| n.label())
    }

    /// How many releases are still owed to nodes that could not be reached,
    /// over all nodes (see [`unlock`](Redlock::unlock)).
    pub fn pending_releases(&self) -> usize {
        self.inner.retries.owed()
    }

    /// Acquires `resource` for `ttl`, waiting for another holder to let go.
    ///
    /// Waiting is event-driven: a refused attempt learns the holder's
    /// remaining ttl in the same round, subscribes to the key's release
    /// channel on every node, tries once more, and then sleeps until the
    /// holder's release is published, its keys expire, or the timed retry
    /// (`retry_delay` plus random jitter) is due, whichever comes first. The
    /// timed retry is the fallback where a release cannot be notified (pub/sub
    /// denied, a node down, a broken subscription); see the README's
    /// "Waiting for a held lock". It gives up after `retry_count` timed
    /// retries, or once it slept as long as that many pauses could take.
    /// Within one manager, waiters of a resource are woken one per release,
    /// in the order they started waiting; across managers there is no order.
    ///
    /// Each attempt sends `SET key token NX PX ttl GET` to every node at
    /// once, grants as soon as a quorum agreed, and stops listening as soon
    /// as the outcome is certain; a failed attempt is released on every
    /// node. When contenders that started together shared the nodes so that
    /// none can have a quorum (a split vote), the next attempt settles it.
    /// The last attempt settles it itself: when no other holder is known to
    /// have a quorum (a split vote, or too few answers to tell), it releases
    /// and tries again after a few random milliseconds, up to 6 more rounds
    /// with at most 315 ms of pauses, so that among contenders that start
    /// together exactly one wins.
    ///
    /// # Errors
    /// The last attempt's error: [`Error::Conflict`], [`Error::NoQuorum`] or
    /// [`Error::ValidityExpired`]; at once, errors that retrying cannot fix:
    /// [`Error::Redis`] (a key of the wrong type or a read-only node on too
    /// many nodes), [`Error::DuplicateNode`]; the argument errors
    /// [`Error::EmptyResource`], [`Error::ZeroTtl`],
    /// [`Error::TtlNotAboveDrift`], [`Error::TtlTooLarge`] before anything is
    /// sent.
    ///
    /// # Cancel safety
    /// Dropping the future at any await point leaves no key of ours behind
    /// longer than needed: the attempt under way is released on every node by
    /// a task spawned on the current Tokio runtime. A waiter dropped while it
    /// waits leaves its place at once (a wake-up it had is passed to the next
    /// waiter), and its key's release channel is unsubscribed when no other
    /// waiter of this manager needs it.
    pub async fn lock(&self, resource: &str, ttl: Duration) -> Result<Lock, Error> {
        let patience = Patience::Retries(self.inner.config.retry_count);
        self.lock_patiently(&[resource], ttl, patience).await
    }

    /// Acquires `resource` for `ttl`, waiting at most about `wait` for
    /// another holder to let go: waits as [`lock`](Redlock::lock) does
    /// (woken by the release, the holder's expiry or the timed retry), and
    /// starts no attempt later than a node timeout before `wait` is up. `Duration::ZERO` makes one attempt, as
    /// [`try_lock`](Redlock::try_lock). The last attempt may end up to one
    /// round (bounded by the timeouts) after `wait`.
    ///
    /// # Examples
    /// ```no_run
    /// use std::time::Duration;
    /// use redlock_quorum::{Error, Redlock};
    ///
    /// # async fn run(redlock: Redlock) -> Result<(), Error> {
    /// // Wait up to two seconds for the current holder, not longer.
    /// let ttl = Duration::from_secs(10);
    /// match redlock.lock_within("report", ttl, Duration::from_secs(2)).await {
    ///     Ok(lock) => {
    ///         // ... the work, within lock.validity() ...
    ///         redlock.unlock(&lock).await?;
    ///     }
    ///     Err(Error::Conflict { .. }) => eprintln!("still busy after 2 s"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`lock`](Redlock::lock).
    ///
    /// # Cancel safety
    /// As [`lock`](Redlock::lock).
    pub async fn lock_within(
        &self,
        resource: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Lock, Error> {
        let patience = Patience::Until(timing::after(Instant::now(), wait));
        self.lock_patiently(&[resource], ttl, patience).await
    }

    /// Acquires `resource` for `ttl` with one attempt: it does not wait for
    /// another holder. It does settle a split vote (see
    /// [`lock`](Redlock::lock)): among contenders that start together,
    /// exactly one gets the lock and the others get [`Error::Conflict`].
    ///
    /// # Errors
    /// As [`lock`](Redlock::lock), without the retries.
    ///
    /// # Cancel safety
    /// As [`lock`](Redlock::lock): dropping the future leaves no key behind.
    pub async fn try_lock(&self, resource: &str, ttl: Duration) -> Result<Lock, Error> {
        self.lock_patiently(&[resource], ttl, Patience::Retries(0))
            .await
    }

    /// Acquisition of one resource or several with the given patience; see
    /// [`lock`](Redlock::lock) and [`lock_many`](Redlock::lock_many).
    pub(crate) async fn lock_patiently(
        &self,
        resources: &[&str],
        ttl: Duration,
        patience: Patience,
    ) -> Result<Lock, Error> {
        #[cfg(feature = "tracing")]
        let resource = &*request::label(resources);
        let span = trace::span!("lock", resource, ?ttl);
        let counted = async {
            let started = Instant::now();
            let result = self.lock_retrying(resources, ttl, patience).await;
            self.inner.stats.ended(match &result {
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
    /// or the timed retry is due, whichever comes first (see [`wait`]).
    async fn lock_retrying(
        &self,
        resources: &[&str],
        ttl: Duration,
        patience: Patience,
    ) -> Result<Lock, Error> {
        let ttl = self.check(resources, ttl)?;
        let config = &self.inner.config;
        let started = Instant::now();
        // `retry_count` bounds the timed retries (those no release woke),
        // and the time slept in all to what that many pauses could take at
        // most: a waiter woken by releases it keeps losing gives up no
        // later than a poller would have. `lock_within` gives up at its
        // deadline, and starts no attempt later than a node timeout before
        // it.
        let (retry_count, last_start) = match patience {
            Patience::Retries(n) => (
                n,
                timing::after(
                    started,
                    config
                        .retry_delay
                        .saturating_add(config.retry_jitter)
                        .saturating_mul(n),
                ),
            ),
            Patience::Until(give_up_at) => (
                u32::MAX,
                give_up_at
                    .checked_sub(config.node_timeout)
                    .unwrap_or(started),
            ),
        };
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
            let outcome = match self
                .attempt(resources, ttl, split_rounds, learn)
                .in_span(span)
                .await
            {
                Ok(lock) => {
                    if let Some(waiter) = waiter {
                        waiter.granted();
                    }
                    return Ok(lock);
                }
                Err((e, outcome)) if !last && is_retryable(&e) => {
                    trace::debug!(attempt = retries, error = %e, "attempt failed; waiting");
                    outcome
                }
                Err((e, _)) => return Err(e),
            };
            // Subscribe, then try: a release between the refusal and the
            // subscription is not slept through.
            let Some(waiter) = waiter.as_mut() else {
                let keys: Vec<String> = resources.iter().map(|r| self.key(r)).collect();
                waiter = Some(
                    self.inner
                        .waits
                        .register(&keys, config.connect_timeout)
                        .await,
                );
                continue;
            };
            let now = Instant::now();
            let pause = timing::after(
                now,
                timing::retry_delay(config.retry_delay, config.retry_jitter),
            );
            let expiry = pttls
                .holder_expiry(self.node_count())
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
                    let notified = waiter.subscribed_on() >= self.quorum();
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

    /// Extends a held lock to `ttl` from now on a quorum, checking ownership
    /// on every node. Returns the lock with a fresh validity measured from
    /// the start of the extension.
    ///
    /// Where our key is missing (a node that restarted empty, or was down
    /// when the lock was taken), the extension sets it again with our token:
    /// the lock regains its redundancy. Such a node does not count towards
    /// this round's quorum, which only nodes that still held our token make.
    ///
    /// A failed extension deletes no key that was ours before it: where the
    /// key is still ours it keeps its previous or extended expiry. When a
    /// quorum answered that the key is not ours, the keys this extension set
    /// again are released.
    ///
    /// The lock's validity is checked again when the round ends: an
    /// extension that ends after the lock passed in expired fails with
    /// [`Error::NotHeld`], whatever the nodes answered, because another
    /// client may have held the resource in between. The lock is over then,
    /// and the extension releases the keys of its token on every node, so
    /// that the keys it renewed do not keep others out for a fresh ttl. (An
    /// [adopted](Redlock::adopt) lock has no validity of its own and is not
    /// checked.)
    ///
    /// # Errors
    /// [`Error::NotHeld`] when the lock's validity has already run out,
    /// before the extension or while it ran, or a quorum answered that the
    /// key is not ours; [`Error::NoQuorum`] when
    /// too few nodes answered for either (a paused or partitioned node: the
    /// lock may still be ours, try again); [`Error::Redis`];
    /// [`Error::ValidityExpired`] when the quorum came too late; the ttl
    /// errors as for `lock`.
    ///
    /// # Cancel safety
    /// Cancel-safe: dropping the future leaves each node extended, healed,
    /// released (after the lock expired) or as it was, and the lock passed
    /// in stays valid until its own `expires_at`.
    pub async fn extend(&self, lock: &Lock, ttl: Duration) -> Result<Lock, Error> {
        let span = trace::span!("extend", resource = %lock.label(), ?ttl);
        self.extend_inner(lock, ttl).in_span(span).await
    }

    async fn extend_inner(&self, lock: &Lock, ttl: Duration) -> Result<Lock, Error> {
        self.configured()?;
        let ttl = self.ttl(ttl)?;
        if !lock.adopted && !lock.is_valid() {
            return Err(Error::NotHeld {
                resource: lock.label().into_owned(),
            });
        }
        let request = request::extend_request(&self.inner.generation, lock, ttl.millis)
            .durable(self.inner.config.durability);
        let start = Instant::now();
        let Round { tally, in_flight } = round::round(
            &self.inner,
            None,
            Ask::Owned,
            Until::Decided,
            request,
            &lock.in_flight,
            request::read_extend(&self.inner.generation),
        )
        .await;
        let in_flight = lock.in_flight.and(&in_flight);
        let outcome = tally.outcome();
        let mut healed = tally.healed.clone();
        if self.inner.config.durability != crate::api::builder::Durability::Memory {
            // A node that healed the key and then did not confirm it (or
            // could not) is not in `healed`: its reply was the confirmation
            // error. Such nodes may hold a key set again by this extension.
            healed.extend(tally.wrote.iter().chain(&tally.unanswered));
            healed.sort_unstable();
            healed.dedup();
        }
        let granted = self.grant(&lock.resource, &lock.key, &lock.token, ttl, start, tally);
        // The re-check at the grant: a round that ends after the lock's
        // validity ran out must not bring the lock back. Between its
        // `expires_at` and now another client may have taken the resource,
        // used it and released it, while some of our keys lived on (a node
        // clock running slow, a request that landed late, or keys this
        // round set again); a quorum of "ours" now says nothing about the
        // time in between. The lock is over: every key this round renewed
        // or set again would only keep others out for a fresh ttl, so the
        // keys of our token are released on every node (token-checked, and
        // after the round's requests still in flight on each node).
        // An adopted lock has no validity of its own to outlive.
        if !lock.adopted && !lock.is_valid() {
            release_on(
                &self.inner,
                None,
                &lock.key_list(),
                &lock.token,
                ttl.key_expiry(start).max(lock.key_expiry),
                &in_flight,
            )
            .await;
            return Err(Error::NotHeld {
                resource: lock.label().into_owned(),
            });
        }
        match granted {
            Ok(mut extended) => {
                extended.in_flight = in_flight;
                extended.rest = lock.rest.clone();
                Ok(extended)
            }
            Err(failed) => {
                if outcome == Outcome::Refused && !healed.is_empty() {
                    // Not ours on a quorum: the keys this extension set
                    // again would only keep others out. Keys that were
                    // ours before are left to expire, as after any failed
                    // extension (with a durability confirmation, nodes
                    // that did not confirm are released too: the lock is
                    // not ours any more, so that costs nothing).
                    release_on(
                        &self.inner,
                        Some(&healed),
                        &lock.key_list(),
                        &lock.token,
                        ttl.key_expiry(start),
                        &in_flight,
                    )
                    .await;
                }
                Err(failed.into_error(&lock.label()))
            }
        }
    }

    /// Releases the lock on every node where it still holds our token,
    /// waiting for every node (each bounded by the timeouts). On each node,
    /// the release is sent after the requests that granted the lock there
    /// settled, so a `SET` that was still in flight when
    /// [`lock`](Redlock::lock) returned cannot land after it. Returns how
    /// many nodes released it.
    ///
    /// Nodes that could not be reached are retried in the background, one
    /// task per node however many locks are owed to it, until the keys
    /// would have expired anyway or the manager is dropped.
    ///
    /// # Errors
    /// [`Error::NotHeld`] when a quorum answered that the key was not ours
    /// and none released it (the lock expired, or changed hands);
    /// [`Error::NoQuorum`] or [`Error::Redis`] when so many nodes failed or
    /// did not answer that the lock may still be in force on a quorum of
    /// them (it then ends with its ttl).
    ///
    /// # Cancel safety
    /// Dropping the future may leave the keys on nodes that had not been
    /// written to yet; they expire with the lock's ttl.
    pub async fn unlock(&self, lock: &Lock) -> Result<usize, Error> {
        let span = trace::span!("unlock", resource = %lock.label());
        let tally = release_everywhere(
            &self.inner,
            &lock.key_list(),
            &lock.token,
            lock.key_expiry,
            &lock.in_flight,
        )
        .in_span(span)
        .await;
        self.note(&tally);
        tally.into_released(&lock.label())
    }

    /// Asks the nodes whether the lock is still held: whether a quorum holds
    /// its token right now. Changes nothing. This is the remote view; the
    /// local one is [`Lock::validity`], which a holder must still respect
    /// (a quorum may hold the keys a little past the validity, by design).
    ///
    /// # Examples
    /// ```no_run
    /// use std::time::Duration;
    /// use redlock_quorum::{Error, Redlock};
    ///
    /// # async fn migrate() {}
    /// # async fn run(redlock: Redlock) -> Result<(), Error> {
    /// let lock = redlock.lock("migration", Duration::from_secs(30)).await?;
    /// migrate().await;
    /// // Before the step that cannot be undone: still ours, locally and on
    /// // a quorum of the nodes?
    /// if lock.is_valid() && redlock.verify(&lock).await? {
    ///     // ... commit ...
    /// }
    /// redlock.unlock(&lock).await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`Error::NoQuorum`] or [`Error::Redis`] when too few nodes answered
    /// to tell either way.
    ///
    /// # Cancel safety
    /// Cancel-safe: it only reads.
    pub async fn verify(&self, lock: &Lock) -> Result<bool, Error> {
        self.configured()?;
        let request = request::check_request(&self.inner.generation, lock);
        let Round { tally, .. } = round::round(
            &self.inner,
            None,
            Ask::Owned,
            Until::Decided,
            request,
            &lock.in_flight,
            request::read_check(&self.inner.generation),
        )
        .await;
        self.note(&tally);
        match tally.outcome() {
            Outcome::Quorum => Ok(true),
            Outcome::Refused => Ok(false),
            _ => Err(tally.into_error(&lock.label())),
        }
    }

    /// Rebuilds a lock from its resource and token, handed over by the
    /// process that acquired it (redsync's `WithValue`): for
    /// [`unlock`](Redlock::unlock), [`extend`](Redlock::extend) and
    /// [`verify`](Redlock::verify) only. Its validity is unknown here
    /// ([`Lock::validity`] is zero until it is extended), and a release to
    /// an unreachable node is retried for a minute at most.
    ///
    /// Whoever passes the token on is responsible for the handover: both
    /// processes can release or extend the lock, and nothing tells either
    /// that the other did. Extend it first to learn its validity.
    ///
    /// # Examples
    /// ```no_run
    /// use std::time::Duration;
    /// use redlock_quorum::{Error, Redlock};
    ///
    /// # async fn run(redlock: Redlock, token: String) -> Result<(), Error> {
    /// // The process that took the lock handed over the resource name and
    /// // `lock.token()` (over a channel as private as the token deserves).
    /// let adopted = redlock.adopt("import:7", &token)?;
    /// // Extending it gives it a validity here; `NotHeld` if it was lost.
    /// let lock = redlock.extend(&adopted, Duration::from_secs(30)).await?;
    /// // ... finish the import within lock.validity() ...
    /// redlock.unlock(&lock).await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`Error::EmptyResource`], or [`Error::InvalidSetting`] for an empty
    /// token.
    pub fn adopt(&self, resource: &str, token: &str) -> Result<Lock, Error> {
        if resource.is_empty() {
            return Err(Error::EmptyResource);
        }
        if token.is_empty() {
            return Err(Error::InvalidSetting {
                setting: "token",
                reason: "an adopted lock needs the token its holder gave it",
            });
        }
        let now = Instant::now();
        Ok(Lock {
            resource: resource.to_owned(),
            key: self.key(resource),
            rest: Vec::new(),
            token: token.to_owned(),
            started_at: now,
            expires_at: now,
            key_expiry: timing::after(now, ADOPTED_RETRY_WINDOW),
            in_flight: InFlight::default(),
            adopted: true,
        })
    }

    /// The Redis key of a resource.
    fn key(&self, resource: &str) -> String {
        format!("{}{resource}", self.inner.config.key_prefix)
    }

    /// Fails with the configuration error a round found, if any.
    pub(crate) fn configured(&self) -> Result<(), Error> {
        match self.inner.misconfigured.get() {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// Remembers a configuration error a round found.
    pub(crate) fn note(&self, tally: &Tally) {
        if let Some(error) = tally.same_server_error() {
            self.inner.misconfigure(error);
        }
    }

    /// Validates the arguments of an acquisition.
    fn check(&self, resources: &[&str], ttl: Duration) -> Result<Ttl, Error> {
        self.configured()?;
        request::check_resources(resources)?;
        self.ttl(ttl)
    }

    /// Validates a ttl, including against the restart guard's `max_ttl`.
    fn ttl(&self, ttl: Duration) -> Result<Ttl, Error> {
        let checked = Ttl::new(ttl, self.inner.config.drift_factor)?;
        match self.inner.generation.guard {
            Some(max_ttl) if ttl > max_ttl => Err(Error::TtlAboveRestartGuard { ttl, max_ttl }),
            _ => Ok(checked),
        }
    }

    /// One acquisition attempt: a round, and up to `split_rounds` more after
    /// a split vote; see [`lock`](Redlock::lock). With `learn`, a refused
    /// round of one key also reads the holder's remaining ttl.
    async fn attempt(
        &self,
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
                    tokio::time::sleep(timing::split_vote_pause(split)).await;
                    split += 1;
                }
                Err(failed) => return Err(failed),
            }
        }
    }

    /// One acquisition round, released everywhere when it fails.
    async fn round_once(
        &self,
        resources: &[&str],
        ttl: Ttl,
        learn: Option<&Pttls>,
    ) -> Result<Lock, (Error, Outcome)> {
        let inner = &self.inner;
        let keys: Vec<String> = resources.iter().map(|r| self.key(r)).collect();
        let token = new_token().map_err(|e| (e, Outcome::Errors))?;
        // Cancellation safety: until the attempt has either been granted or
        // released, this guard releases it from a spawned task if the future
        // is dropped.
        let mut cleanup = Cleanup {
            inner: Some((inner.clone(), keys.clone(), token.clone())),
            key_expiry: ttl.key_expiry(Instant::now()),
        };
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
        let plain = inner.generation.guard.is_none()
            && inner.config.durability == crate::api::builder::Durability::Memory;
        let (request, pipelined) = match (learn, keys.as_slice(), plain) {
            (Some(_), [key], true) => (wait::acquire_request(key, &token, ttl.millis), true),
            _ => (
                request::acquire_request(&inner.generation, &keys, &token, ttl.millis)
                    .durable(inner.config.durability),
                false,
            ),
        };
        let unused = Pttls::default();
        let pttls = learn.unwrap_or(&unused);
        let read_set = request::read_acquire(&inner.generation, &token, keys.len() > 1);
        let read = |value: &redis::Value| {
            if pipelined {
                wait::read_acquire(pttls, &read_set)(value)
            } else {
                read_set(value)
            }
        };
        let Round { tally, in_flight } = round::round(
            inner,
            None,
            Ask::Acquire,
            Until::Decided,
            request,
            &InFlight::default(),
            read,
        )
        .await;
        self.note(&tally);
        let outcome = tally.outcome();
        match self.grant(resources[0], &keys[0], &token, ttl, start, tally) {
            Ok(mut lock) => {
                cleanup.disarm();
                lock.in_flight = in_flight;
                lock.rest = resources[1..]
                    .iter()
                    .map(|r| (*r).to_owned())
                    .zip(keys[1..].iter().cloned())
                    .collect();
                Ok(lock)
            }
            Err(failed) => {
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
                release_with(
                    inner,
                    Some(&maybe_ours),
                    &keys,
                    &token,
                    ttl.key_expiry(start),
                    &in_flight,
                    matches!(failed, Failed::Round(_)),
                )
                .await;
                cleanup.disarm();
                Err((failed.into_error(&request::label(resources)), outcome))
            }
        }
    }

    /// Turns a round into a lock when a quorum agreed with validity left.
    fn grant(
        &self,
        resource: &str,
        key: &str,
        token: &str,
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
                agreed: (0..self.node_count()).collect(),
                unanswered: Vec::new(),
            });
        }
        Ok(Lock {
            resource: resource.to_owned(),
            key: key.to_owned(),
            rest: Vec::new(),
            token: token.to_owned(),
            started_at: start,
            expires_at: ttl.expires_at(start),
            key_expiry: ttl.key_expiry(start),
            in_flight: InFlight::default(),
            adopted: false,
        })
    }
}

/// Why a round did not produce a lock.
enum Failed {
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

    fn into_error(self, resource: &str) -> Error {
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

/// Whether `lock` tries again after this error: contention and nodes that
/// did not answer may pass; a misconfiguration or a wrong key type will not.
fn is_retryable(e: &Error) -> bool {
    matches!(
        e,
        Error::Conflict { .. } | Error::NoQuorum { .. } | Error::ValidityExpired { .. }
    )
}
