//! Fencing tokens: a number that grows with every holder of a resource, for
//! the protected storage to reject writes from a holder that outlived its
//! lock (a paused process, say).
//!
//! The number lives in one counter key per node, shared by every resource
//! (see [`scripts`] for the key), and is made in two quorum rounds, each
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

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::engine::acquire::Redlock;
use crate::engine::lock::Lock;
use crate::engine::round::{self, Round, Until};
use crate::protocol::error::Error;
use crate::protocol::request;
use crate::protocol::scripts;
use crate::protocol::tally::{Ask, Outcome, Reply, quorum};

/// How many times a fencing read is made before it fails unproven, when
/// nodes that did not answer left it unproven.
const FENCE_READS: u32 = 3;

/// A token is issued only when its write reached a quorum within this long
/// of the write round's start; a slower write fails with
/// [`Error::NoQuorum`]. It bounds how long after a node took a token (and
/// then, perhaps, lost its data) that token can still be issued; see the
/// module docs.
pub(crate) const WRITE_LIMIT: Duration = Duration::from_secs(2);

/// Whether a node whose marker was `age` milliseconds old when a read that
/// took `read` answered may have its counter trusted by the write made from
/// that read: born at least `WRITE_LIMIT` before the read began, with a
/// factor of two for the node's clock against ours.
fn may_trust(age: i64, read: Duration) -> bool {
    u64::try_from(age).is_ok_and(|age| Duration::from_millis(age) >= 2 * (WRITE_LIMIT + read))
}

impl Redlock {
    /// A fencing token for a held lock: a number larger than any token given
    /// to an earlier holder of the same resource (through this crate, on the
    /// same nodes). Pass it with every write to the protected resource and
    /// have the resource reject a write whose token is lower than one it has
    /// already seen: that stops a holder that was paused past its validity,
    /// which no lock with an expiry can stop by itself.
    ///
    /// The counter is one key per node, shared by every resource, without
    /// expiry: the key prefix, the byte `0xFF` and `counter` (no resource's
    /// lock key can ever be that key, since resource names are UTF-8). No
    /// key is left per resource. Tokens are therefore larger than every
    /// earlier token of *every* resource on the same nodes and key prefix,
    /// and two holders of different resources may get the same number: only
    /// a resource's own tokens are to be compared. Ask for the token once
    /// per acquisition, right after it; two calls for the same lock may
    /// return the same number.
    ///
    /// For a lock on several resources (see
    /// [`lock_many`](Redlock::lock_many)) the token comes from the same
    /// counter: larger than any token given before on any of them, and
    /// smaller than any given later on any of them.
    ///
    /// Versions before this one kept a counter per resource (the lock key,
    /// `0xFF`, `fence`). Where such a key is still there, the read takes it
    /// as a floor, so the first token after an upgrade is larger than the
    /// resource's last one (as long as a node that holds it keeps its data),
    /// and the write deletes it once the node's counter holds as much.
    ///
    /// # Examples
    /// ```no_run
    /// use std::time::Duration;
    /// use redlock_quorum::{Error, Redlock};
    ///
    /// # async fn run(redlock: Redlock) -> Result<(), Error> {
    /// let lock = redlock.lock("invoice:7", Duration::from_secs(10)).await?;
    /// let token = redlock.fencing_token(&lock).await?;
    /// // UPDATE invoices SET ..., fence = $token WHERE id = 7 AND fence < $token
    /// # let _ = token;
    /// redlock.unlock(&lock).await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Never a repeat
    /// Each node's counter is tagged with the node's data generation (see
    /// [`RedlockBuilder::restart_guard`](crate::RedlockBuilder::restart_guard)
    /// for the marker). A counter that is missing, bare, or was written
    /// before the node lost its data, is *untrusted*. With `n` nodes, a
    /// quorum `q` and `f = n − q`, the number read is used only when at
    /// least `q` nodes answered with the lock ours, at least `q` counters
    /// were read, and `min(untrusted, f) + silent < q` (`silent` = the nodes
    /// whose counter was not read: no answer, or too young under the
    /// restart guard; a node where the lock is not ours still has its
    /// counter read). Then some node of the last token's write quorum that
    /// kept its data (or was trusted again since, see below) was read, and
    /// the new token is larger than every earlier one, as long as fewer
    /// than half the nodes lost their data since the last token. Otherwise
    /// the call fails closed with [`Error::FencingUnproven`].
    ///
    /// In practice, with a quorum of nodes answering and trusted, a token is
    /// made, for a resource never used before too. Every node must answer
    /// for the very first tokens on a brand-new set of nodes (until the
    /// nodes' markers are a few seconds old and a token trusts them) and
    /// while too many nodes are untrusted after losing their data (a read
    /// left unproven by nodes that did not answer is made up to three
    /// times). A node that lost its data is trusted again by the first
    /// token made at least `2 × (2 s + the read's duration)` after its new
    /// marker was made: a token is issued only when its write reached a
    /// quorum within 2 s, so every token the node took before it lost its
    /// data was issued before that read began, and that read saw it.
    /// Assumed: node clocks run at most twice as fast as ours and do not
    /// jump forward.
    ///
    /// # Errors
    /// [`Error::NotHeld`] when the lock's validity has run out or a quorum
    /// says it is not ours; [`Error::FencingUnproven`] when the number
    /// cannot be proven larger than every earlier token (above);
    /// [`Error::NoQuorum`] or [`Error::Redis`] when too few nodes answered,
    /// or the write took more than 2 s to reach a quorum.
    ///
    /// # Cancel safety
    /// Cancel-safe: dropping the future leaves the counters as they were or
    /// raised (and some older per-resource counters deleted where the
    /// node's counter holds as much); ask again.
    pub async fn fencing_token(&self, lock: &Lock) -> Result<u64, Error> {
        self.configured()?;
        let not_held = || Error::NotHeld {
            resource: lock.label().into_owned(),
        };
        if !lock.is_valid() {
            return Err(not_held());
        }
        let generation = &self.inner.generation;
        let prefix = &self.inner.config.key_prefix;
        let mut reads = 0;
        // The nodes read with an untrusted counter: their generation and
        // the marker's age.
        let seen = Mutex::new(Vec::new());
        let (tally, read_time) = loop {
            seen.lock().unwrap_or_else(|e| e.into_inner()).clear();
            let read = request::fence_request(generation, prefix, lock, None);
            let reader = generation.reader(scripts::read_fence);
            let started = Instant::now();
            let Round { tally, .. } = round::round(
                &self.inner,
                None,
                Ask::Fence,
                Until::Decided,
                read,
                &lock.in_flight,
                |value: &redis::Value| {
                    let reply = reader(value)?;
                    if matches!(
                        reply,
                        Reply::Untrusted(_) | Reply::Foreign { trusted: false, .. }
                    ) && let Some(seen_here) = scripts::fence_generation(value)
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
                nodes: self.node_count(),
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

        let write = request::fence_request(generation, prefix, lock, Some((token, &trust)))
            .durable(self.inner.config.durability);
        // The write waits for every node (each bounded by the timeouts), not
        // only a quorum: a counter that a slower node never got (an unlock
        // that overtook it finds the lock gone) is one more untrusted
        // counter for the next holder's read to prove around.
        let started = Instant::now();
        let Round { tally, .. } = round::round(
            &self.inner,
            None,
            Ask::Owned,
            Until::AllNodes,
            write,
            &lock.in_flight,
            generation.reader(scripts::read_flag),
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
                required: quorum(self.node_count()),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_counter_is_trusted_only_from_a_read_well_after_its_generation() {
        let read = Duration::from_millis(10);
        assert!(!may_trust(-1, read));
        assert!(!may_trust(0, read));
        assert!(!may_trust(4_019, read));
        assert!(may_trust(4_020, read));
        assert!(!may_trust(5_000, Duration::from_millis(600)));
        assert!(may_trust(6_000, Duration::from_secs(1)));
    }
}
