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
use crate::quorum::{self, Refusal, Until};
use crate::redlock::Redlock;
use crate::scripts;

impl Redlock {
    /// A fencing token for a held lock: a number larger than any token given
    /// to an earlier holder of the same resource (through this crate, on the
    /// same nodes). Pass it with every write to the protected resource and
    /// have the resource reject a write whose token is lower than one it has
    /// already seen: that stops a holder that was paused past its validity,
    /// which no lock with an expiry can stop by itself.
    ///
    /// The counter is kept in the key `<lock key>:fence` on every node,
    /// without expiry. Ask for the token once per acquisition, right after
    /// it; two calls for the same lock may return the same number.
    ///
    /// # Errors
    /// [`Error::NotHeld`] when the lock's validity has run out or a quorum
    /// says it is not ours; [`Error::NoQuorum`] or [`Error::Redis`] when too
    /// few nodes answered.
    ///
    /// # Cancel safety
    /// Cancel-safe: dropping the future leaves the counters as they were or
    /// raised, never lowered; ask again.
    pub async fn fencing_token(&self, lock: &Lock) -> Result<u64, Error> {
        let fence_key = format!("{}:fence", lock.key);
        let not_held = || Error::NotHeld {
            resource: lock.resource.clone(),
        };
        if !lock.is_valid() {
            return Err(not_held());
        }
        let nodes = &self.inner.nodes;
        let node_timeout = self.inner.config.node_timeout;

        let read = quorum::round(
            nodes,
            node_timeout,
            Until::QuorumOrImpossible,
            |mut conn| {
                let mut call = scripts::FENCE_READ.key(&lock.key);
                call.key(&fence_key).arg(&lock.token);
                async move { call.invoke_async(&mut conn).await }
            },
            quorum::accept_fence,
        )
        .await;
        if read.quorum_at.is_none() {
            return Err(read.into_error(&lock.resource, nodes.len(), Refusal::NotHeld));
        }
        let highest = read.highest.unwrap_or(0);
        let token = u64::try_from(highest).unwrap_or(0) + 1;

        let write = quorum::round(
            nodes,
            node_timeout,
            Until::QuorumOrImpossible,
            |mut conn| {
                let mut call = scripts::FENCE_WRITE.key(&lock.key);
                call.key(&fence_key).arg(&lock.token).arg(token);
                async move { call.invoke_async(&mut conn).await }
            },
            quorum::accept_script,
        )
        .await;
        if write.quorum_at.is_none() {
            return Err(write.into_error(&lock.resource, nodes.len(), Refusal::NotHeld));
        }
        // Both rounds found the lock ours on a quorum; it must still be valid
        // now for the number to belong to this holder's tenure.
        if !lock.is_valid() {
            return Err(not_held());
        }
        Ok(token)
    }
}
