//! Distributed locks on a majority of independent Redis masters: the
//! Redlock algorithm, built to be correct under faults and fast when a node
//! is slow.
//!
//! A lock is a Redis key with an expiry, set on N independent Redis masters.
//! It gives **mutual exclusion** while its validity lasts (a quorum of
//! `N/2 + 1` nodes agreed), **no deadlock** (a crashed holder's keys expire)
//! and **identifiability** (only the holder of the 160-bit random token can
//! release or extend it).
//!
//! ```no_run
//! use std::time::Duration;
//! use redlock_quorum::{Error, Redlock};
//!
//! # async fn run() -> Result<(), Error> {
//! let redlock = Redlock::new([
//!     "redis://127.0.0.1:7001/",
//!     "redis://127.0.0.1:7002/",
//!     "redis://127.0.0.1:7003/",
//!     "redis://127.0.0.1:7004/",
//!     "redis://127.0.0.1:7005/",
//! ])?;
//!
//! let lock = redlock.lock("nightly-report", Duration::from_secs(10)).await?;
//! // ... the work, finished well within lock.validity() ...
//! redlock.unlock(&lock).await?;
//! # Ok(())
//! # }
//! ```
//!
//! For work that may outlast a fixed ttl, [`Redlock::acquire`] returns a
//! [`LockGuard`] that renews the lock in the background, and
//! [`Redlock::with_lock`] runs a future under such a guard and cancels it
//! when the lock is lost. How long to wait for another holder is chosen per
//! call: [`Redlock::lock`] and [`Redlock::acquire`] retry (`retry_count`
//! times), [`Redlock::try_lock`] and [`Redlock::try_acquire`] make one
//! attempt, [`Redlock::lock_within`] and [`Redlock::acquire_within`] retry
//! for a given time. [`Redlock::verify`] asks the nodes whether a lock is
//! still held, and [`Redlock::adopt`] rebuilds a lock handed over by another
//! process from its resource and token. Every acquisition call takes one
//! resource name or several ([`Resources`]): a set is taken all or nothing,
//! in one round (one Lua script per node), without deadlock.
//!
//! # The algorithm
//! - Acquire: one `SET key token NX PX ttl GET` per node, sent to all nodes
//!   at once; the round is timed on the monotonic clock from before the
//!   first request. The lock is granted as soon as a quorum set the key,
//!   with a validity of `ttl − elapsed − drift`
//!   (`drift = ttl × drift_factor + 2 ms`); the round stops listening as
//!   soon as its outcome is certain. Where the key was not set, `GET` tells
//!   which value holds it, so a conflict (another holder has, or may have, a
//!   quorum) is told apart from a split vote (contenders shared the nodes
//!   and none can have one). A failed attempt is released on every node that
//!   may hold its key.
//! - Split votes: the next attempt settles one; the last attempt (the only
//!   one of [`Redlock::try_lock`]) settles it itself with up to 6 more
//!   rounds after random pauses (at most 315 ms in all), so that among
//!   contenders that start together exactly one wins.
//! - Extend: a Lua script that checks the token before `PEXPIRE`. Where our
//!   key is missing (a node that restarted empty, or was down at the
//!   grant), the renewal sets it again: the lock heals. Such a node does not
//!   count towards that round's quorum.
//! - Release: a Lua script that deletes the key only where it holds our
//!   token, sent to every node, on each node after that node's `SET` of the
//!   grant settled (a `SET` still in flight cannot land after the release).
//!   Nodes that could not be reached are owed the release: one worker task
//!   per node retries them in the background until the keys would have
//!   expired ([`Redlock::pending_releases`] counts them).
//! - Waiting: a refused attempt sleeps until the holder's release is
//!   published, its keys expire, or the timed retry (`retry_delay`,
//!   `retry_jitter`) is due, whichever is first; how releases are
//!   published, who is woken and the releaser's hand-off check are in
//!   `docs/waiting.md` at the top of the repository.
//! - Scripts run by `EVALSHA`, loaded again when the node answers
//!   `NOSCRIPT` (a cluster node's master is sent the script with `EVAL`).
//!
//! # Failures
//! - A node that timed out, could not be reached, or answered `BUSY`,
//!   `LOADING`, `TRYAGAIN`, `MASTERDOWN` or `CLUSTERDOWN` says nothing about
//!   the key ([`NodeError::is_transient`]): acquisitions retry it (as
//!   [`Error::NoQuorum`]) and the watchdog keeps renewing.
//! - Errors that retrying cannot fix (`WRONGTYPE`, `READONLY`, `NOPERM`, a
//!   failed authentication, a script error) fail the call at once with
//!   [`Error::Redis`] when they leave no quorum possible.
//! - [`Error::NotHeld`], and a guard's [`LossReason::TakenOver`], only when
//!   a quorum answered that the key is not ours.
//! - Each node has one multiplexed connection per Tokio runtime, made on
//!   first use within the connect timeout, and made again after it broke or
//!   failed (with a backoff from 25 ms to 1 s). Its server identity (`run_id`)
//!   is learned on the first connection: two entries of the node list on one
//!   server (two host names, or two databases) make every call fail with
//!   [`Error::DuplicateNode`].
//!
//! # Tracing
//! With the `tracing` feature (on by default), operations run in `debug`
//! spans (`lock`, `extend`, `unlock`, `renewal`) and the crate emits events:
//! node failures, retries and split votes at `debug`; a lost lock, an even
//! node count and a node without AOF persistence at `warn`; one server named
//! twice at `error`. The default `info` level is quiet on the happy path.
//! Tokens and passwords are never recorded.
//!
//! # What a lock with an expiry cannot promise
//! - A holder that pauses (GC, swapping, a stopped VM) past its validity
//!   still believes it holds the lock while another client already does.
//!   Check [`Lock::validity`] before each step that needs the lock, and make
//!   the protected resource reject stale writers where correctness depends
//!   on it: [`Redlock::fencing_token`] gives a number that grows with every
//!   holder, for the resource to compare.
//! - A node that restarts without persistence forgets the keys it held; if
//!   it rejoins before the largest ttl has passed, a second client can gain a
//!   quorum while the first still holds its lock. Run the nodes with
//!   `appendfsync always` (and, to count only what reached the disk,
//!   [`RedlockBuilder::durability`]), restart them only after the largest
//!   ttl, or turn on [`RedlockBuilder::restart_guard`], which keeps a node
//!   whose data is younger than the largest ttl out of every quorum. The
//!   guard detects a node that lost all its data, not one that reloaded an
//!   older snapshot (RDB, or the last second of an `everysec` AOF): use it
//!   with nodes that keep every write or start empty.
//!   (Healing renewals put a guard's key back on such a node, but only at the
//!   next renewal.)
//! - Fencing tokens never repeat or go down while fewer than half the nodes
//!   lose their data between two successive tokens; when a token cannot be
//!   proven larger than every earlier one, [`Redlock::fencing_token`] fails
//!   closed with [`Error::FencingUnproven`].
//! - Validity assumes the nodes' clocks run at about the same rate as ours
//!   (the drift factor), not that they agree on the time.
//! - The nodes must be Redis 7.0 or later, or Valkey: `SET` with both `NX`
//!   and `GET` is refused by older servers, and that error is not retried.
//!
//! The map of the modules and of the main flows is in `ARCHITECTURE.md` at
//! the top of the repository.

mod api;
mod engine;
mod protocol;
mod trace;

pub use crate::api::address::{NodeAddress, split_node_list};
pub use crate::api::builder::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_DRIFT_FACTOR, DEFAULT_NODE_TIMEOUT, DEFAULT_RENEW_CONCURRENCY,
    DEFAULT_RETRY_COUNT, DEFAULT_RETRY_DELAY, DEFAULT_RETRY_JITTER, RedlockBuilder,
};
pub use crate::api::guard::{LockGuard, LockWatch};
pub use crate::api::redlock::Redlock;
pub use crate::api::resources::Resources;
pub use crate::api::stats::Stats;
pub use crate::engine::health::{Health, HealthWarning, NodeHealth};
pub use crate::engine::lock::Lock;
#[cfg(feature = "tls")]
pub use crate::engine::tls::TlsConfig;
pub use crate::protocol::durability::Durability;
pub use crate::protocol::error::{Error, LossReason, NodeError, NodeFailure};
pub use crate::protocol::error_kind::ErrorKind;
pub use crate::protocol::keys::MAX_RESOURCES;
pub use crate::protocol::timing::MAX_TTL;

/// The README's examples, compiled as doctests so that they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// The examples of `docs/multi-resource.md` (several resources at once),
/// compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/multi-resource.md")]
struct MultiResourceDocDoctests;

/// The examples of `docs/operations.md` (TLS), compiled as doctests when
/// the `tls` feature is on.
#[cfg(all(doctest, feature = "tls"))]
#[doc = include_str!("../docs/operations.md")]
struct OperationsDocDoctests;

/// The examples of `docs/restart-guard.md` (the restart guard), compiled
/// as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/restart-guard.md")]
struct RestartGuardDocDoctests;

/// The examples of `docs/watchdog.md` (long work under a renewing guard),
/// compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/watchdog.md")]
struct WatchdogDocDoctests;
