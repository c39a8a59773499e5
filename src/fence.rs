//! Fencing tokens: a number that grows with every holder of a resource, for
//! the protected storage to reject writes from a holder that outlived its
//! lock (a paused process, say).
//!
//! The number lives in a counter key beside the lock key on every node and
//! is made in two quorum rounds, each allowed only where the lock still holds
//! our token: read the counters of a quorum and take the largest plus one,
//! then raise the counters of a quorum to it. Any later holder's read quorum
//! meets this write quorum in at least one node, so it sees this number and
//! goes above it. (The classic quorum-register construction; it needs the
//! nodes to keep their counters across restarts, as Redlock needs them to
//! keep their locks.)

use crate::error::Error;
use crate::lock::Lock;
use crate::multi;
use crate::redlock::Redlock;
use crate::round::{self, Round, Until};
use crate::scripts;
use crate::tally::{Ask, Outcome};

/// How many times a fencing read is made before it fails unproven, when
/// nodes that did not answer left it unproven.
const FENCE_READS: u32 = 3;

impl Redlock {
    /// A fencing token for a held lock: a number larger than any token given
    /// to an earlier holder of the same resource (through this crate, on the
    /// same nodes). Pass it with every write to the protected resource and
    /// have the resource reject a write whose token is lower than one it has
    /// already seen: that stops a holder that was paused past its validity,
    /// which no lock with an expiry can stop by itself.
    ///
    /// The counter is kept on every node, without expiry, in the key made of
    /// the lock key, the byte `0xFF` and `fence`: no resource's lock key can
    /// ever be that key, since resource names are UTF-8. Ask for the token
    /// once per acquisition, right after it; two calls for the same lock may
    /// return the same number.
    ///
    /// For a lock on several resources (see
    /// [`lock_many`](Redlock::lock_many)) the token is the largest of the
    /// resources' counters plus one, written back to every resource's
    /// counter: larger than any token given before on any of them, and
    /// smaller than any given later on any of them.
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
    /// for the marker). A counter that is missing, or was written before the
    /// node lost its data, is *untrusted*. With `n` nodes, a quorum `q` and
    /// `f = n − q`, the number read is used only when at least `q` nodes
    /// answered with the lock ours, at least `q` counters were read, and
    /// `min(untrusted, f) + silent < q` (`silent` = the nodes whose counter
    /// was not read: no answer, or too young under the restart guard; a
    /// node where the lock is not ours still has its counter read). Then some node that kept its data holds the
    /// last token, and the new one is larger than every earlier one, as long
    /// as fewer than half the nodes lost their data since the last token.
    /// Otherwise the call fails closed with [`Error::FencingUnproven`]. In
    /// practice: the first token of a resource, and the first after a node
    /// lost its data, need every node to answer (a read left unproven by
    /// nodes that did not answer is made up to three times). The write
    /// re-synchronises a node that lost its data.
    ///
    /// # Errors
    /// [`Error::NotHeld`] when the lock's validity has run out or a quorum
    /// says it is not ours; [`Error::FencingUnproven`] when the number
    /// cannot be proven larger than every earlier token (above);
    /// [`Error::NoQuorum`] or [`Error::Redis`] when too few nodes answered.
    ///
    /// # Cancel safety
    /// Cancel-safe: dropping the future leaves the counters as they were or
    /// raised (a counter from an earlier generation of its node may be set
    /// outright, lower or higher: it was not trusted); ask again.
    pub async fn fencing_token(&self, lock: &Lock) -> Result<u64, Error> {
        self.configured()?;
        let not_held = || Error::NotHeld {
            resource: lock.label().into_owned(),
        };
        if !lock.is_valid() {
            return Err(not_held());
        }
        let generation = &self.inner.generation;
        let mut reads = 0;
        let tally = loop {
            let read = multi::fence_request(generation, lock, None);
            let Round { tally, .. } = round::round(
                &self.inner,
                None,
                Ask::Fence,
                Until::Decided,
                read,
                &lock.in_flight,
                generation.reader(scripts::read_fence),
            )
            .await;
            self.note(&tally);
            reads += 1;
            // A read left unproven by nodes that did not answer in time (a
            // slow node, a fresh connection) is asked again, a few times,
            // while the lock is valid: the first token of a resource needs
            // every node.
            let silent = tally.unknown > 0;
            if tally.outcome() == Outcome::Quorum
                && !tally.proven()
                && silent
                && reads < FENCE_READS
                && lock.is_valid()
            {
                continue;
            }
            break tally;
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

        let write = multi::fence_request(generation, lock, Some(token))
            .durable(self.inner.config.durability);
        // The write waits for every node (each bounded by the timeouts), not
        // only a quorum: a counter that a slower node never got (an unlock
        // that overtook it finds the lock gone) is one more untrusted
        // counter for the next holder's read to prove around.
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
        // Both rounds found the lock ours on a quorum; it must still be valid
        // now for the number to belong to this holder's tenure.
        if !lock.is_valid() {
            return Err(not_held());
        }
        Ok(token)
    }
}
