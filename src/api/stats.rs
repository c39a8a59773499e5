//! [`Stats`]: a snapshot of the manager's counters (kept by
//! [`crate::engine::counters`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::engine::Inner;

/// A snapshot of a manager's counters since it was built; see
/// [`Redlock::stats`](crate::Redlock::stats).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Acquisition rounds sent (one call makes one or more).
    pub attempts: u64,
    /// Acquisition calls that got the lock.
    pub grants: u64,
    /// Acquisition calls that ended with `Conflict`.
    pub conflicts: u64,
    /// Acquisition calls that ended with `NoQuorum`.
    pub no_quorum: u64,
    /// Acquisition calls that ended with another error.
    pub errors: u64,
    /// Renewals by guards that succeeded.
    pub renewals: u64,
    /// Guards that lost their lock (released ones not counted).
    pub losses: u64,
    /// Releases owed to nodes that could not be reached, now.
    pub pending_releases: usize,
    /// Per node (by address, in the order given): how often a request of
    /// a round (an acquisition, a release, an extension, a verification,
    /// a fencing step) failed there for a reason other than a refusal (a
    /// timeout, an error, a connection that failed, a reply that made no
    /// sense), whether it failed before the call returned or after (a node
    /// slower than the quorum counts too). Each request counts once; the
    /// background retries of owed releases do not count. A lock on one
    /// resource taken with `try_lock`, `lock` or `lock_within` from a task
    /// on a multi-thread runtime keeps its requests to the nodes slower
    /// than the quorum until it is next used (released, extended,
    /// verified, fenced) or dropped: a failure of one of those counts then
    /// (a guard's, from `acquire`, counts at once, and so does a lock's
    /// taken from `block_on` or on a current-thread runtime, or while a
    /// node's connection was being made).
    pub node_failures: Vec<(String, u64)>,
    /// The median acquire latency of granted calls (an upper bound, within
    /// 19 %), if any.
    pub acquire_p50: Option<Duration>,
    /// The 99th percentile, likewise.
    pub acquire_p99: Option<Duration>,
}

impl Stats {
    /// The snapshot of a manager's counters.
    pub(crate) fn of(inner: &Inner) -> Stats {
        let c = &inner.stats;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Stats {
            attempts: c.total(|s| &s.attempts),
            grants: c.total(|s| &s.grants),
            conflicts: c.total(|s| &s.conflicts),
            no_quorum: c.total(|s| &s.no_quorum),
            errors: c.total(|s| &s.errors),
            renewals: load(&c.renewals),
            losses: load(&c.losses),
            pending_releases: inner.retries.owed(),
            node_failures: inner
                .nodes
                .iter()
                .map(|n| (n.label().to_owned(), load(&n.failures)))
                .collect(),
            acquire_p50: c.quantile(0.5),
            acquire_p99: c.quantile(0.99),
        }
    }
}
