//! Why a guarded lock is no longer held.

use std::fmt;
use std::time::Duration;

/// Why a guarded lock is no longer held.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossReason {
    /// Renewal did not reach a quorum before the validity ran out (nodes
    /// down, paused or partitioned away, or this process did not run in
    /// time). `last_error` is the last renewal failure, whenever a renewal
    /// failed.
    Expired {
        /// The last renewal error, as text.
        last_error: Option<String>,
    },
    /// A quorum of nodes answered that the key no longer holds our token:
    /// it expired there and another client took it, or the nodes lost it.
    TakenOver,
    /// The builder's `max_hold` limit was reached; renewal stopped.
    MaxHold {
        /// The limit that was reached.
        limit: Duration,
    },
    /// The guard released the lock.
    Released,
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LossReason::Expired { last_error: None } => {
                f.write_str("the validity ran out before a renewal succeeded")
            }
            LossReason::Expired {
                last_error: Some(e),
            } => write!(f, "the validity ran out before a renewal succeeded ({e})"),
            LossReason::TakenOver => f.write_str("a quorum of nodes no longer holds our token"),
            LossReason::MaxHold { limit } => {
                write!(f, "the maximum hold time of {limit:?} was reached")
            }
            LossReason::Released => f.write_str("the lock was released"),
        }
    }
}
