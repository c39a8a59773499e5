//! Fencing tokens: a number that grows with every holder of a resource, for
//! the protected storage to reject writes from a holder that outlived its
//! lock (a paused process, say).
//!
//! The number lives in one counter key per node, shared by every resource
//! (see [`keys`](crate::protocol::keys) for the key), and is made in two quorum rounds, each
//! allowed only where the lock still holds our token: read the counters and
//! take the largest plus one, then raise the counters of a quorum to it.
//! Any later holder's read quorum meets this write quorum in at least one
//! node, so it sees this number and goes above it. (The classic
//! quorum-register construction; it needs the nodes to keep their counters
//! across restarts, as Redlock needs them to keep their locks, or the
//! generation markers to tell which did not.) Tokens of different resources
//! may be equal; only a resource's own tokens are compared.
//!
//! # Trusted counters (issue 21)
//! A counter is *trusted* when it was written in the node's current
//! generation by a write allowed to trust it. The write stores the larger
//! of the stored number and the new one, and tags it with the node's
//! generation only if it was trusted already, or if the read that made the
//! number began well after the node's generation was born: its marker at
//! least `2 × (WRITE_LIMIT + the read's duration)` old. Otherwise the number
//! is stored bare (untrusted). A token is issued only if its write reached a
//! quorum within [`WRITE_LIMIT`] of the write's start. So every token that a
//! node took before it lost its data was issued before such a read began,
//! the read (proven, below) saw it, and the number the write trusts on the
//! restarted node is larger. Without the age rule, a write for another
//! resource, made from a read that began before an earlier token was
//! issued, could trust a restarted node with a number below that token (the
//! model in `model/` finds this schedule).

use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::engine::Inner;
use crate::engine::lock::Lock;
use crate::engine::round::{self, Round, Until};
use crate::protocol::error::Error;
use crate::protocol::quorum::{Ask, Outcome, Reply, quorum};
use crate::protocol::request::{fence, read_flag};
use crate::protocol::timing::{WRITE_LIMIT, may_trust};

/// How many times a fencing read is made before it fails unproven, when
/// nodes that did not answer left it unproven.
const FENCE_READS: u32 = 3;

impl Inner {
    pub(crate) async fn fencing_token(self: &Arc<Self>, lock: &Lock) -> Result<u64, Error> {
        self.configured()?;
        let not_held = || Error::NotHeld {
            resource: lock.label().into_owned(),
        };
        if !lock.is_valid() {
            return Err(not_held());
        }
        let generation = &self.generation;
        let prefix = &self.config.key_prefix;
        let mut reads = 0;
        // The nodes read with an untrusted counter: their generation and
        // the marker's age.
        let seen = Mutex::new(Vec::new());
        let (tally, read_time) = loop {
            seen.lock().unwrap_or_else(|e| e.into_inner()).clear();
            let read = fence::request(generation, prefix, &lock.key_list(), &lock.token, None);
            let reader = generation.reader(fence::read);
            let started = Instant::now();
            let after = self.extensions.behind(&lock.token, &lock.in_flight);
            let Round { tally, .. } = round::round(
                self,
                None,
                Ask::Fence,
                Until::Decided,
                read,
                &after,
                |value: &redis::Value| {
                    let reply = reader(value)?;
                    if matches!(
                        reply,
                        Reply::Untrusted(_) | Reply::Foreign { trusted: false, .. }
                    ) && let Some(seen_here) = fence::generation(value)
                    {
                        seen.lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push(seen_here);
                    }
                    Ok(reply)
                },
            )
            .await;
            let read_time = started.elapsed();
            self.note(&tally);
            reads += 1;
            // A read left unproven by nodes that did not answer in time (a
            // slow node, a fresh connection) is asked again, a few times,
            // while the lock is valid.
            let silent = tally.unknown > 0;
            if tally.outcome() == Outcome::Quorum
                && !tally.proven()
                && silent
                && reads < FENCE_READS
                && lock.is_valid()
            {
                continue;
            }
            break (tally, read_time);
        };
        if tally.outcome() != Outcome::Quorum {
            return Err(tally.into_error(&lock.label()));
        }
        if !tally.proven() {
            return Err(Error::FencingUnproven {
                resource: lock.label().into_owned(),
                answered: tally.read,
                untrusted: tally.untrusted,
                nodes: self.nodes.len(),
                failures: tally.failures,
            });
        }
        let highest = tally.highest.unwrap_or(0);
        let token = u64::try_from(highest).unwrap_or(0) + 1;
        // The untrusted counters this write may trust: see the module docs.
        let trust: Vec<Vec<u8>> = seen
            .into_inner()
            .unwrap_or_else(|e| e.into_inner())
            .into_iter()
            .filter(|(_, age)| may_trust(*age, read_time))
            .map(|(generation, _)| generation)
            .collect();

        let write = fence::request(
            generation,
            prefix,
            &lock.key_list(),
            &lock.token,
            Some((token, &trust)),
        )
        .durable(self.config.durability);
        // The write waits for every node (each bounded by the timeouts), not
        // only a quorum: a counter that a slower node never got (an unlock
        // that overtook it finds the lock gone) is one more untrusted
        // counter for the next holder's read to prove around.
        let started = Instant::now();
        let after = self.extensions.behind(&lock.token, &lock.in_flight);
        let Round { tally, .. } = round::round(
            self,
            None,
            Ask::Owned,
            Until::AllNodes,
            write,
            &after,
            generation.reader(read_flag),
        )
        .await;
        if tally.outcome() != Outcome::Quorum {
            return Err(tally.into_error(&lock.label()));
        }
        // A token whose write quorum came late is not issued: see
        // `WRITE_LIMIT`.
        if tally
            .quorum_at
            .is_none_or(|at| at.saturating_duration_since(started) > WRITE_LIMIT)
        {
            return Err(Error::NoQuorum {
                resource: lock.label().into_owned(),
                granted: tally.granted,
                required: quorum(self.nodes.len()),
                failures: tally.failures,
            });
        }
        // Both rounds found the lock ours on a quorum; it must still be valid
        // now for the number to belong to this holder's tenure.
        if !lock.is_valid() {
            return Err(not_held());
        }
        Ok(token)
    }
}
