//! The quorum round and the arithmetic of Redlock, each rule in one place:
//! the quorum size, the drift allowance, the validity left after a round, the
//! conversion of a ttl to `PX` milliseconds, and the delay between attempts.

use std::future::Future;
use std::time::{Duration, Instant};

use futures::stream::{FuturesUnordered, StreamExt};
use redis::Value;
use redis::aio::ConnectionManager;

use crate::error::{Error, NodeError, NodeFailure};
use crate::node::Node;

/// The largest ttl sent to Redis. Redis rejects a `PX` whose deadline
/// (now + ttl, in milliseconds since the epoch) overflows a signed 64-bit
/// integer; half of `i64::MAX` milliseconds (about 146 million years) stays
/// clear of that for any wall clock, and of `Instant` overflow.
pub const MAX_TTL: Duration = Duration::from_millis(i64::MAX as u64 / 2);

/// The fixed part of the drift allowance: Redis expires keys with
/// millisecond resolution, so two milliseconds cover the rounding on the node
/// and on the client.
pub(crate) const DRIFT_FLOOR: Duration = Duration::from_millis(2);

/// How many of `nodes` nodes must agree: a strict majority, `nodes / 2 + 1`.
pub(crate) const fn quorum(nodes: usize) -> usize {
    nodes / 2 + 1
}

/// The clock drift allowance for a ttl: `ttl × drift_factor + 2 ms`.
///
/// `drift_factor` is validated by the builder to be finite and in `[0, 1)`,
/// and `ttl` by [`ttl_millis`] to be at most [`MAX_TTL`], so this cannot
/// overflow.
pub(crate) fn drift(ttl: Duration, drift_factor: f64) -> Duration {
    ttl.mul_f64(drift_factor) + DRIFT_FLOOR
}

/// Validity left after a round that started `elapsed` ago:
/// `ttl − elapsed − drift`, or `None` when nothing is left.
pub(crate) fn validity(ttl: Duration, elapsed: Duration, drift: Duration) -> Option<Duration> {
    ttl.checked_sub(elapsed)?
        .checked_sub(drift)
        .filter(|v| !v.is_zero())
}

/// A ttl checked and converted to whole milliseconds for `PX`/`PEXPIRE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ttl {
    /// The ttl the keys really get, rounded up to a whole millisecond so that
    /// a key never lives shorter than the validity computed from it.
    pub(crate) duration: Duration,
    /// The same in milliseconds.
    pub(crate) millis: u64,
    /// The drift allowance for it.
    pub(crate) drift: Duration,
}

impl Ttl {
    /// Validates a ttl: not zero, not above [`MAX_TTL`], and longer than its
    /// drift allowance.
    pub(crate) fn new(ttl: Duration, drift_factor: f64) -> Result<Self, Error> {
        if ttl.is_zero() {
            return Err(Error::ZeroTtl);
        }
        if ttl > MAX_TTL {
            return Err(Error::TtlTooLarge { ttl, max: MAX_TTL });
        }
        // Round up: the sub-millisecond rest would otherwise be lost.
        let millis = ttl.as_nanos().div_ceil(1_000_000) as u64;
        let duration = Duration::from_millis(millis);
        let drift = drift(duration, drift_factor);
        if duration <= drift {
            return Err(Error::TtlNotAboveDrift { ttl, drift });
        }
        Ok(Ttl {
            duration,
            millis,
            drift,
        })
    }

    /// The deadline of a lock whose round started at `start`:
    /// `start + ttl − drift`. Validity at any later instant is the time left
    /// until this deadline.
    pub(crate) fn deadline(&self, start: Instant) -> Instant {
        // `ttl > drift` is checked in `new`; `Instant + MAX_TTL` does not
        // overflow on the platforms Tokio supports, and saturating at the
        // start instead would only shorten the validity.
        start
            .checked_add(self.duration - self.drift)
            .unwrap_or(start)
    }
}

impl Ttl {
    /// The latest instant a key set by a round that started at `start` can
    /// still exist on a node whose clock runs at our rate: `start + ttl`.
    pub(crate) fn key_expiry(&self, start: Instant) -> Instant {
        start
            .checked_add(self.duration)
            .unwrap_or_else(|| self.deadline(start))
    }
}

/// The pause before the next attempt: `retry_delay` plus a random jitter of
/// up to `retry_jitter`, so that contending clients spread out.
pub(crate) fn retry_delay(retry_delay: Duration, retry_jitter: Duration) -> Duration {
    use rand::RngExt;
    let jitter_micros = u64::try_from(retry_jitter.as_micros()).unwrap_or(u64::MAX);
    let jitter = if jitter_micros == 0 {
        0
    } else {
        rand::rng().random_range(0..=jitter_micros)
    };
    retry_delay.saturating_add(Duration::from_micros(jitter))
}

/// How a round waits for its nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Until {
    /// Stop as soon as a quorum agreed, or as soon as a quorum is impossible.
    QuorumOrImpossible,
    /// Wait for every node (each still bounded by the node timeout).
    AllNodes,
}

/// What a round found.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    /// Nodes that agreed.
    pub(crate) granted: usize,
    /// Nodes that answered no (key held elsewhere, or not ours).
    pub(crate) refused: usize,
    /// Nodes that were unreachable or timed out.
    pub(crate) unreachable: usize,
    /// Nodes that answered with an error or a reply that makes no sense.
    pub(crate) errors: usize,
    /// What each node that did not agree said.
    pub(crate) failures: Vec<NodeFailure>,
    /// The positions of the nodes that were unreachable or timed out: what
    /// they hold is unknown.
    pub(crate) unanswered: Vec<usize>,
    /// When the quorum was reached, if it was.
    pub(crate) quorum_at: Option<Instant>,
    /// The highest integer reply of the nodes that agreed (the fencing read
    /// uses it).
    pub(crate) highest: Option<i64>,
}

impl Tally {
    fn record(&mut self, index: usize, node: &Node, cause: NodeError) {
        match cause {
            NodeError::Held => self.refused += 1,
            NodeError::Timeout | NodeError::Unreachable(_) => {
                self.unreachable += 1;
                self.unanswered.push(index);
            }
            NodeError::Reply(_) | NodeError::UnexpectedReply(_) => self.errors += 1,
        }
        self.failures.push(NodeFailure {
            node: node.label().to_owned(),
            cause,
        });
    }

    fn failed(&self) -> usize {
        self.refused + self.unreachable + self.errors
    }

    /// The error for a round that did not reach a quorum, named after what
    /// prevented it:
    /// - enough nodes answered sanely that a quorum was possible, so refusals
    ///   decided it: [`Error::Conflict`] (or `NotHeld` for extend/unlock,
    ///   which the caller maps);
    /// - enough nodes were reachable, so error replies decided it:
    ///   [`Error::Redis`];
    /// - otherwise too few nodes were reachable: [`Error::NoQuorum`].
    pub(crate) fn into_error(self, resource: &str, nodes: usize, refusal: Refusal) -> Error {
        let required = quorum(nodes);
        let resource = resource.to_owned();
        if nodes - self.unreachable - self.errors >= required {
            match refusal {
                Refusal::Conflict => Error::Conflict {
                    resource,
                    held: self.refused,
                    required,
                    nodes,
                },
                Refusal::NotHeld => Error::NotHeld { resource },
            }
        } else if nodes - self.unreachable >= required {
            Error::Redis {
                resource,
                granted: self.granted,
                required,
                failures: self.failures,
            }
        } else {
            Error::NoQuorum {
                resource,
                granted: self.granted,
                required,
                failures: self.failures,
            }
        }
    }
}

/// What a "no" from the nodes means for the operation.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Refusal {
    /// Acquisition: someone else holds the key.
    Conflict,
    /// Extend or unlock: the key is not ours any more.
    NotHeld,
}

// Sends one request per node, all at once, each bounded by `node_timeout`,
/// and counts the answers.
///
/// `request` makes a node's request from its connection; `accept` reads its
/// reply: `Ok(true)` agreed, `Ok(false)` refused, `Err` a reply that makes no
/// sense. With [`Until::QuorumOrImpossible`] the round returns as soon as the
/// outcome is decided. The requests still pending then are finished by a
/// spawned task when the round reached a quorum (so that the slower nodes get
/// the write too, as other Redlock clients do), and dropped when it did not
/// (the caller releases everywhere next; a request already written to a
/// node's socket still runs there, before the release queued behind it).
///
/// # Cancel safety
/// Dropping the future drops the pending requests; see above.
pub(crate) async fn round<R, Fut>(
    nodes: &[Node],
    node_timeout: Duration,
    until: Until,
    request: R,
    accept: fn(&Value) -> Result<bool, String>,
) -> Tally
where
    R: Fn(ConnectionManager) -> Fut,
    Fut: Future<Output = redis::RedisResult<Value>> + Send + 'static,
{
    let required = quorum(nodes.len());
    let mut pending: FuturesUnordered<_> = nodes
        .iter()
        .enumerate()
        .map(|(index, node)| {
            let fut = node.connection().map(&request);
            async move {
                let outcome = match fut {
                    Err(e) => Err(NodeError::from_redis(e)),
                    Ok(fut) => match tokio::time::timeout(node_timeout, fut).await {
                        Err(_) => Err(NodeError::Timeout),
                        Ok(Err(e)) => Err(NodeError::from_redis(e)),
                        Ok(Ok(value)) => match accept(&value) {
                            Ok(true) => Ok(match value {
                                Value::Int(n) => Some(n),
                                _ => None,
                            }),
                            Ok(false) => Err(NodeError::Held),
                            Err(text) => Err(NodeError::UnexpectedReply(text)),
                        },
                    },
                };
                (index, outcome)
            }
        })
        .collect();

    let mut tally = Tally::default();
    while let Some((index, outcome)) = pending.next().await {
        match outcome {
            Ok(number) => {
                tally.granted += 1;
                tally.highest = tally.highest.max(number);
                if tally.granted == required {
                    tally.quorum_at = Some(Instant::now());
                }
            }
            Err(cause) => tally.record(index, &nodes[index], cause),
        }
        if until == Until::QuorumOrImpossible
            && (tally.granted >= required || nodes.len() - tally.failed() < required)
        {
            break;
        }
    }
    if tally.quorum_at.is_some() && !pending.is_empty() {
        // Each is bounded by the node timeout, so the task ends soon.
        tokio::spawn(async move { while pending.next().await.is_some() {} });
    }
    tally
}

/// Reads the reply of `SET … NX PX`: `OK` agreed, nil refused.
pub(crate) fn accept_set(value: &Value) -> Result<bool, String> {
    match value {
        Value::Okay => Ok(true),
        Value::SimpleString(s) if s == "OK" => Ok(true),
        Value::Nil => Ok(false),
        other => Err(format!("{other:?}")),
    }
}

/// Reads the reply of the fencing read: the counter (0 or more) where the
/// lock is ours, -1 where it is not.
pub(crate) fn accept_fence(value: &Value) -> Result<bool, String> {
    match value {
        Value::Int(n) if *n >= 0 => Ok(true),
        Value::Int(-1) => Ok(false),
        other => Err(format!("{other:?}")),
    }
}

/// Reads the reply of the unlock and extend scripts: 1 agreed, 0 refused.
pub(crate) fn accept_script(value: &Value) -> Result<bool, String> {
    match value {
        Value::Int(1) => Ok(true),
        Value::Int(0) => Ok(false),
        other => Err(format!("{other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn quorum_is_a_strict_majority() {
        let expected = [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3), (6, 4), (7, 4)];
        for (n, q) in expected {
            assert_eq!(quorum(n), q, "quorum({n})");
            assert!(2 * quorum(n) > n, "two quorums of {n} must intersect");
        }
    }

    #[test]
    fn drift_is_factor_times_ttl_plus_two_ms() {
        assert_eq!(drift(Duration::from_secs(10), 0.01), 102 * MS);
        assert_eq!(drift(Duration::from_secs(10), 0.0), 2 * MS);
        assert_eq!(drift(MAX_TTL, 0.01), MAX_TTL.mul_f64(0.01) + 2 * MS);
    }

    #[test]
    fn validity_subtracts_elapsed_and_drift() {
        let ttl = Duration::from_secs(1);
        let d = drift(ttl, 0.01);
        assert_eq!(validity(ttl, 5 * MS, d), Some(983 * MS));
        // exactly nothing left is no validity
        assert_eq!(validity(ttl, 988 * MS, d), None);
        assert_eq!(validity(ttl, 2 * ttl, d), None);
        assert_eq!(validity(ttl, Duration::MAX, d), None);
    }

    #[test]
    fn ttl_near_zero() {
        assert!(matches!(
            Ttl::new(Duration::ZERO, 0.01),
            Err(Error::ZeroTtl)
        ));
        // 1 ns rounds up to 1 ms, which is below the 2 ms drift floor
        assert!(matches!(
            Ttl::new(Duration::from_nanos(1), 0.01),
            Err(Error::TtlNotAboveDrift { .. })
        ));
        assert!(matches!(
            Ttl::new(2 * MS, 0.0),
            Err(Error::TtlNotAboveDrift { .. })
        ));
        let t = Ttl::new(3 * MS, 0.0).unwrap();
        assert_eq!((t.millis, t.drift), (3, 2 * MS));
    }

    #[test]
    fn ttl_rounds_up_to_whole_milliseconds() {
        let t = Ttl::new(Duration::from_micros(10_001), 0.01).unwrap();
        assert_eq!(t.millis, 11);
        assert_eq!(t.duration, 11 * MS);
    }

    #[test]
    fn ttl_near_the_millisecond_overflow() {
        assert!(Ttl::new(MAX_TTL, 0.01).is_ok());
        assert!(matches!(
            Ttl::new(MAX_TTL + MS, 0.01),
            Err(Error::TtlTooLarge { .. })
        ));
        assert!(matches!(
            Ttl::new(Duration::from_millis(u64::MAX), 0.01),
            Err(Error::TtlTooLarge { .. })
        ));
        assert!(matches!(
            Ttl::new(Duration::MAX, 0.99),
            Err(Error::TtlTooLarge { .. })
        ));
        let t = Ttl::new(MAX_TTL, 0.01).unwrap();
        assert_eq!(t.millis, i64::MAX as u64 / 2);
        let now = Instant::now();
        assert!(t.deadline(now) > now);
    }

    #[test]
    fn deadline_is_start_plus_ttl_minus_drift() {
        let t = Ttl::new(Duration::from_secs(1), 0.01).unwrap();
        let start = Instant::now();
        assert_eq!(t.deadline(start) - start, 988 * MS);
    }

    #[test]
    fn retry_delay_stays_within_jitter() {
        for _ in 0..1000 {
            let d = retry_delay(200 * MS, 100 * MS);
            assert!(d >= 200 * MS && d <= 300 * MS, "{d:?}");
        }
        assert_eq!(retry_delay(200 * MS, Duration::ZERO), 200 * MS);
        assert_eq!(
            retry_delay(Duration::MAX, Duration::MAX),
            Duration::MAX,
            "saturates instead of overflowing"
        );
    }

    #[test]
    fn retry_delay_is_not_constant() {
        let draws: std::collections::HashSet<_> =
            (0..100).map(|_| retry_delay(MS, 100 * MS)).collect();
        assert!(draws.len() > 10, "jitter should spread the delays");
    }

    #[test]
    fn replies_are_read_strictly() {
        assert_eq!(accept_set(&Value::Okay), Ok(true));
        assert_eq!(accept_set(&Value::Nil), Ok(false));
        assert!(accept_set(&Value::Int(1)).is_err());
        assert_eq!(accept_script(&Value::Int(1)), Ok(true));
        assert_eq!(accept_script(&Value::Int(0)), Ok(false));
        assert!(accept_script(&Value::Int(2)).is_err());
        assert!(accept_script(&Value::Nil).is_err());
    }

    fn tally(granted: usize, refused: usize, unreachable: usize, errors: usize) -> Tally {
        Tally {
            granted,
            refused,
            unreachable,
            errors,
            ..Tally::default()
        }
    }

    #[test]
    fn failed_round_is_named_after_its_cause() {
        let e = tally(1, 4, 0, 0).into_error("r", 5, Refusal::Conflict);
        assert!(matches!(
            e,
            Error::Conflict {
                held: 4,
                required: 3,
                ..
            }
        ));
        let e = tally(2, 1, 2, 0).into_error("r", 5, Refusal::Conflict);
        assert!(matches!(e, Error::Conflict { .. }), "{e}");
        let e = tally(2, 0, 3, 0).into_error("r", 5, Refusal::Conflict);
        assert!(matches!(e, Error::NoQuorum { granted: 2, .. }), "{e}");
        let e = tally(2, 0, 0, 3).into_error("r", 5, Refusal::Conflict);
        assert!(matches!(e, Error::Redis { .. }), "{e}");
        let e = tally(0, 5, 0, 0).into_error("r", 5, Refusal::NotHeld);
        assert!(matches!(e, Error::NotHeld { .. }), "{e}");
    }
}
