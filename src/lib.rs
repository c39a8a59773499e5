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
//! when the lock is lost.
//!
//! # The algorithm
//! - Acquire: one `SET key token NX PX ttl` per node, sent to all nodes at
//!   once; the round is timed on the monotonic clock from before the first
//!   request. The lock is granted as soon as a quorum answered `OK`, with a
//!   validity of `ttl − elapsed − drift` (`drift = ttl × drift_factor + 2 ms`);
//!   the attempt gives up as soon as a quorum is impossible. Each request is
//!   bounded by the node timeout. A failed attempt is released on every node.
//! - Release and extend: Lua scripts that compare the token before they
//!   delete or `PEXPIRE` the key, run by `EVALSHA` with a fallback when the
//!   node has lost its script cache.
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
//!   `appendfsync always`, or restart them only after the largest ttl.
//! - Validity assumes the nodes' clocks run at about the same rate as ours
//!   (the drift factor), not that they agree on the time.
//!
//! # Layout
//! - `redlock`: the [`Redlock`] manager: acquire, extend, unlock.
//! - `builder`: the [`RedlockBuilder`], its settings and defaults.
//! - `release`: the release round, its background retry, and the cleanup of
//!   cancelled attempts.
//! - `lock`: the [`Lock`] handle and its token.
//! - `quorum`: the quorum rule, validity arithmetic, retry delay and the
//!   parallel round itself.
//! - `guard`: the renewing [`LockGuard`], its [`LockWatch`] view, and the
//!   [`LossReason`]s.
//! - `watchdog`: [`Redlock::acquire`], [`Redlock::with_lock`] and the
//!   renewal task behind a guard.
//! - `fence`: [`Redlock::fencing_token`], numbers that grow with every holder.
//! - `scripts`: the release, extend and fencing Lua scripts.
//! - `node`: one node's lazily made, long-lived connection.
//! - `error`: the [`Error`] enum and the per-node [`NodeFailure`]s.
#![deny(missing_docs, missing_debug_implementations)]
#![warn(rust_2018_idioms, unreachable_pub)]

mod address;
mod builder;
mod error;
mod fence;
mod guard;
mod lock;
mod node;
mod redlock;
mod release;
mod round;
mod scripts;
mod tally;
mod timing;
mod watchdog;

pub use crate::address::NodeAddress;
pub use crate::builder::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_DRIFT_FACTOR, DEFAULT_NODE_TIMEOUT, DEFAULT_RENEW_CONCURRENCY,
    DEFAULT_RETRY_COUNT, DEFAULT_RETRY_DELAY, DEFAULT_RETRY_JITTER, RedlockBuilder,
};
pub use crate::error::{Error, LossReason, NodeError, NodeFailure};
pub use crate::guard::{LockGuard, LockWatch};
pub use crate::lock::Lock;
pub use crate::redlock::Redlock;
pub use crate::timing::MAX_TTL;

/// The README's examples, compiled as doctests so that they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
