//! Extension: the round that renews a lock (healing the nodes where its
//! key is missing), the re-check of the lock's validity when the round
//! ends, and the release of what a failed extension set again. See
//! [`Redlock::extend`](crate::Redlock::extend).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::engine::Inner;
use crate::engine::lock::Lock;
use crate::engine::release::release_on;
use crate::engine::round::{self, Round, Until};
use crate::protocol::durability::Durability;
use crate::protocol::error::Error;
use crate::protocol::quorum::{Ask, Outcome};
use crate::protocol::request::extend;
use crate::trace::{self, InSpan};

impl Inner {
    pub(crate) async fn extend(
        self: &Arc<Self>,
        lock: &Lock,
        ttl: Duration,
    ) -> Result<Lock, Error> {
        let span = trace::span!("extend", resource = %lock.label(), ?ttl);
        self.extend_inner(lock, ttl).in_span(span).await
    }

    pub(crate) async fn extend_inner(
        self: &Arc<Self>,
        lock: &Lock,
        ttl: Duration,
    ) -> Result<Lock, Error> {
        self.configured()?;
        let ttl = self.ttl(ttl)?;
        if !lock.adopted && !lock.is_valid() {
            return Err(Error::NotHeld {
                resource: lock.label().into_owned(),
            });
        }
        let request = extend::request(&self.generation, &lock.key_list(), &lock.token, ttl.millis)
            .durable(self.config.durability);
        let start = Instant::now();
        let after = self.extensions.behind(&lock.token, &lock.in_flight);
        // Not sent after a wait past the round's deadline or the lock's
        // expiry: its heal would set the keys again after the lock lapsed,
        // or after a release that stopped waiting for it.
        let send_by = round::SendBy::Deadline((!lock.adopted).then_some(lock.expires_at));
        let (Round { tally, in_flight }, leftover) = round::round_keeping(
            self,
            None,
            Ask::Owned,
            Until::Decided,
            request,
            &after,
            send_by,
            extend::read(&self.generation),
        )
        .await;
        if let Some(leftover) = leftover {
            self.finishers.finish(leftover);
        }
        // Every handle of the lock goes behind this round from now on, not
        // only the one returned (see `Extensions`).
        self.extensions.record(&lock.token, &in_flight);
        let in_flight = after.and(&in_flight);
        let outcome = tally.outcome();
        let mut healed = tally.healed.clone();
        if self.config.durability != Durability::Memory {
            // A node that healed the key and then did not confirm it (or
            // could not) is not in `healed`: its reply was the confirmation
            // error. Such nodes may hold a key set again by this extension.
            healed.extend(tally.wrote.iter().chain(&tally.unanswered));
            healed.sort_unstable();
            healed.dedup();
        }
        let granted = self.grant(
            || lock.held.clone(),
            || lock.token.clone(),
            ttl,
            start,
            tally,
        );
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
                self,
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
                        self,
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
}
