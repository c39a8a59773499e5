//! The time arithmetic of Redlock, each rule in one place: the drift
//! allowance, the validity left after a round, the conversion of a ttl to
//! `PX` milliseconds and its validation ([`checked_ttl`]), the instant a lock
//! ends and the latest instant its keys can live, the delay between
//! attempts, the retry budget ([`retry_budget`]), the holder's expiry a
//! waiter sleeps until ([`holder_expiry`]), the watchdog's renewal interval
//! ([`renew_interval`]), the reconnection backoff ([`next_backoff`]), the
//! waiting registrations' lease ([`LEASE`]) and the hand-off check's delay
//! ([`HANDOFF_CHECK`]), the fencing write's limit ([`WRITE_LIMIT`],
//! [`may_trust`]), and the rounding of timers ([`alarm`]).
//!
//! All of it is checked or saturating: no `Instant + Duration` in this crate
//! may panic, whatever the caller passed (`Duration::MAX` included).

use std::time::{Duration, Instant};

use crate::protocol::error::Error;
use crate::protocol::quorum::quorum;

/// The largest ttl sent to Redis. Redis rejects a `PX` whose deadline
/// (now + ttl, in milliseconds since the epoch) overflows a signed 64-bit
/// integer; half of `i64::MAX` milliseconds (about 146 million years) stays
/// clear of that for any wall clock.
pub const MAX_TTL: Duration = Duration::from_millis(i64::MAX as u64 / 2);

/// The fixed part of the drift allowance: Redis expires keys with
/// millisecond resolution, so two milliseconds cover the rounding on the node
/// and on the client.
pub(crate) const DRIFT_FLOOR: Duration = Duration::from_millis(2);

/// Thirty years: what "never" means for a timer. Tokio does the same for its
/// far-future instants.
const FAR: Duration = Duration::from_secs(86_400 * 365 * 30);

/// `at + d`, saturating: an instant that cannot be represented is taken as
/// "never" (thirty years on, or `at` itself if even that overflows).
pub(crate) fn after(at: Instant, d: Duration) -> Instant {
    at.checked_add(d)
        .or_else(|| at.checked_add(FAR))
        .unwrap_or(at)
}

/// The clock drift allowance for a ttl: `ttl × drift_factor + 2 ms`.
///
/// `drift_factor` is validated by the builder to be finite and in `[0, 1)`,
/// and `ttl` by [`Ttl::new`] to be at most [`MAX_TTL`], so this cannot
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

    /// The instant a lock whose round started at `start` ends:
    /// `start + ttl − drift`. Validity at any later instant is the time left
    /// until it.
    pub(crate) fn expires_at(&self, start: Instant) -> Instant {
        // `ttl > drift` is checked in `new`.
        after(start, self.duration - self.drift)
    }

    /// The latest instant a key set by a round that started at `start` can
    /// still exist on a node whose clock runs at our rate: `start + ttl`.
    pub(crate) fn key_expiry(&self, start: Instant) -> Instant {
        after(start, self.duration)
    }
}

/// The pause before the next attempt: `retry_delay` plus a random jitter of
/// up to `retry_jitter`, so that contending clients spread out.
pub(crate) fn retry_delay(retry_delay: Duration, retry_jitter: Duration) -> Duration {
    retry_delay.saturating_add(jitter(retry_jitter))
}

/// A uniformly random duration in `[0, up_to]`, at microsecond resolution.
pub(crate) fn jitter(up_to: Duration) -> Duration {
    use rand::RngExt;
    let micros = u64::try_from(up_to.as_micros()).unwrap_or(u64::MAX);
    if micros == 0 {
        return Duration::ZERO;
    }
    Duration::from_micros(rand::rng().random_range(0..=micros))
}

/// How many more rounds one attempt makes when the round was a split vote
/// (contenders shared the nodes and none reached a quorum).
pub(crate) const SPLIT_VOTE_ROUNDS: u32 = 6;

/// The random pause before the `n`-th extra round after a split vote
/// (`n` from 0): uniform in `[0, 5 ms × 2ⁿ]`, so at most 315 ms over all
/// [`SPLIT_VOTE_ROUNDS`]. Contenders that started together spread out, and
/// the first to come back takes every node.
pub(crate) fn split_vote_pause(n: u32) -> Duration {
    jitter(Duration::from_millis(5) * 2u32.saturating_pow(n.min(16)))
}

/// The instant to wake up for `at` (a lock's `expires_at`): a millisecond early, because Tokio's
/// timer fires on the first millisecond tick at or after the instant asked
/// for, and a lock must never be reported held after its `expires_at`.
pub(crate) fn alarm(at: Instant) -> Instant {
    at.checked_sub(Duration::from_millis(1)).unwrap_or(at)
}

/// Validates a ttl: [`Ttl::new`], and at most the restart guard's
/// `max_ttl` (`guard`) when the guard is on.
pub(crate) fn checked_ttl(
    ttl: Duration,
    drift_factor: f64,
    guard: Option<Duration>,
) -> Result<Ttl, Error> {
    let checked = Ttl::new(ttl, drift_factor)?;
    match guard {
        Some(max_ttl) if ttl > max_ttl => Err(Error::TtlAboveRestartGuard { ttl, max_ttl }),
        _ => Ok(checked),
    }
}

/// The watchdog's renewal interval for a ttl: the configured one
/// (`configured`), or ttl / 3.
pub(crate) fn renew_interval(
    ttl: Duration,
    drift_factor: f64,
    configured: Option<Duration>,
) -> Result<Duration, Error> {
    let checked = Ttl::new(ttl, drift_factor)?;
    let usable = checked.duration - checked.drift;
    match configured {
        None => {
            let interval = checked.duration / 3;
            if interval.is_zero() || interval >= usable {
                return Err(Error::TtlTooShortToRenew {
                    ttl,
                    drift: checked.drift,
                });
            }
            Ok(interval)
        }
        Some(interval) if interval >= usable => Err(Error::InvalidSetting {
            setting: "renew_interval",
            reason: "must be shorter than the ttl minus the drift allowance",
        }),
        Some(interval) => Ok(interval),
    }
}

/// How long an acquisition keeps trying.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Patience {
    /// This many retries after the first attempt.
    Retries(u32),
    /// Retries while the next attempt would start before this instant.
    Until(Instant),
}

/// The retry budget of an acquisition that started at `started`: how many
/// timed retries it may make, and the latest instant an attempt may start.
///
/// `retry_count` bounds the timed retries (those no release woke), and
/// the time slept in all to what that many pauses could take at most: a
/// waiter woken by releases it keeps losing gives up no later than a
/// poller would have. `lock_within` gives up at its deadline, and starts no
/// attempt later than a node timeout before it.
pub(crate) fn retry_budget(
    patience: Patience,
    started: Instant,
    retry_delay: Duration,
    retry_jitter: Duration,
    node_timeout: Duration,
) -> (u32, Instant) {
    match patience {
        Patience::Retries(n) => (
            n,
            after(
                started,
                retry_delay.saturating_add(retry_jitter).saturating_mul(n),
            ),
        ),
        Patience::Until(give_up_at) => (
            u32::MAX,
            give_up_at.checked_sub(node_timeout).unwrap_or(started),
        ),
    }
}

/// How long until enough of the refusing nodes' keys have expired that,
/// with the nodes that did not refuse, a quorum is free: the k-th smallest
/// ttl, plus a millisecond for the node's rounding. Nodes that did not
/// refuse are taken as free (waking early costs one round; waking late is
/// what must not happen). `None` when that key has no expiry.
pub(crate) fn holder_expiry(pttls: &[Option<u64>], nodes: usize) -> Option<Duration> {
    let mut sorted = pttls.to_vec();
    sorted.sort_by_key(|p| p.unwrap_or(u64::MAX));
    let free = nodes.saturating_sub(sorted.len());
    let more = quorum(nodes).saturating_sub(free).max(1);
    let ms = sorted.get(more - 1).copied().flatten()?;
    Some(Duration::from_millis(ms.saturating_add(1)))
}

/// The first pause before a node whose connection failed is tried again.
pub(crate) const FIRST_BACKOFF: Duration = Duration::from_millis(25);
/// The longest pause before a node whose connection failed is tried again.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// The pause after `backoff` when a reconnection failed again: twice as
/// long, at most [`MAX_BACKOFF`].
pub(crate) fn next_backoff(backoff: Duration) -> Duration {
    (backoff * 2).min(MAX_BACKOFF)
}

/// How long a manager's registration in a key's waiting hash lasts unless
/// its link renews it (every third of it): a manager that dies is named as
/// a successor for at most this long.
pub(crate) const LEASE: Duration = Duration::from_secs(6);

/// How long after a release that named a successor its releaser checks
/// that the successor took the lock: where the key is still free and
/// managers still wait, the release is published again for every manager
/// ([`HANDOFF_CHECK`](crate::protocol::scripts::HANDOFF_CHECK)). A named manager that cannot take the lock
/// (its process stopped, or its waiters could not use the release) delays
/// the others by about this much.
pub(crate) const HANDOFF_CHECK: Duration = Duration::from_millis(200);

/// How long a release of an [adopted](crate::Redlock::adopt) lock is retried on
/// nodes that could not be reached: its ttl is not known here.
pub(crate) const ADOPTED_RETRY_WINDOW: Duration = Duration::from_secs(60);

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
pub(crate) fn may_trust(age: i64, read: Duration) -> bool {
    u64::try_from(age).is_ok_and(|age| Duration::from_millis(age) >= 2 * (WRITE_LIMIT + read))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

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
        assert!(t.expires_at(now) > now);
        assert!(t.key_expiry(now) >= t.expires_at(now));
    }

    #[test]
    fn expires_at_is_start_plus_ttl_minus_drift_and_keys_live_ttl() {
        let t = Ttl::new(Duration::from_secs(1), 0.01).unwrap();
        let start = Instant::now();
        assert_eq!(t.expires_at(start) - start, 988 * MS);
        assert_eq!(t.key_expiry(start) - start, 1000 * MS);
    }

    #[test]
    fn after_never_panics() {
        let now = Instant::now();
        assert_eq!(after(now, MS), now + MS);
        let never = after(now, Duration::MAX);
        assert!(never > now + Duration::from_secs(86_400 * 365));
        // "never" is thirty years of 365 days, not one year and a bit
        assert_eq!(never - now, Duration::from_secs(946_080_000));
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
    fn split_vote_pauses_double_and_stay_bounded() {
        let mut total = Duration::ZERO;
        for n in 0..SPLIT_VOTE_ROUNDS {
            let bound = 5 * MS * 2u32.pow(n);
            for _ in 0..200 {
                assert!(split_vote_pause(n) <= bound);
            }
            total += bound;
        }
        assert_eq!(total, 315 * MS);
        assert!(split_vote_pause(u32::MAX) <= 5 * MS * 65_536);
    }

    #[test]
    fn split_vote_pauses_use_their_whole_range() {
        // Each draw lands in the upper half of [0, bound] with probability
        // 1/2, so 200 draws all missing it has probability 2^-200.
        for n in 0..SPLIT_VOTE_ROUNDS {
            let bound = 5 * MS * 2u32.pow(n);
            let longest = (0..200).map(|_| split_vote_pause(n)).max().unwrap();
            assert!(longest > bound / 2, "n = {n}: longest {longest:?}");
        }
    }

    #[test]
    fn alarm_is_a_millisecond_early() {
        let now = Instant::now() + Duration::from_secs(1);
        assert_eq!(alarm(now), now - MS);
    }

    #[test]
    fn expiry_waits_for_a_quorum_of_refusing_nodes() {
        let ms = |n| Some(Duration::from_millis(n));
        // 5 nodes, all refused: the third key to expire frees a quorum.
        assert_eq!(
            holder_expiry(&[Some(50), Some(10), Some(30), Some(20), Some(40)], 5),
            ms(31)
        );
        // 2 nodes did not refuse (taken as free): the first expiry suffices.
        assert_eq!(holder_expiry(&[Some(50), Some(10), Some(30)], 5), ms(11));
        // A key without expiry among those needed: unknown.
        assert_eq!(
            holder_expiry(&[None, None, None, Some(1), Some(2)], 5),
            None
        );
        assert_eq!(
            holder_expiry(&[None, Some(1), Some(2), None, None], 5),
            None
        );
        assert_eq!(holder_expiry(&[None, Some(1), Some(2)], 5), ms(2));
        // Gone already.
        assert_eq!(holder_expiry(&[Some(0)], 1), ms(1));
        assert_eq!(holder_expiry(&[], 3), None);
    }

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

    #[test]
    fn the_backoff_doubles_up_to_a_second() {
        assert_eq!(next_backoff(FIRST_BACKOFF), 2 * FIRST_BACKOFF);
        assert_eq!(next_backoff(Duration::from_millis(800)), MAX_BACKOFF);
        assert_eq!(next_backoff(MAX_BACKOFF), MAX_BACKOFF);
    }

    #[test]
    fn the_ttl_is_checked_against_the_restart_guard() {
        let s = Duration::from_secs(1);
        assert!(checked_ttl(s, 0.01, None).is_ok());
        assert!(checked_ttl(s, 0.01, Some(s)).is_ok());
        assert!(matches!(
            checked_ttl(2 * s, 0.01, Some(s)),
            Err(Error::TtlAboveRestartGuard { .. })
        ));
        assert!(matches!(
            checked_ttl(Duration::ZERO, 0.01, None),
            Err(Error::ZeroTtl)
        ));
    }

    #[test]
    fn the_renewal_interval_is_a_third_or_the_setting() {
        let s = Duration::from_secs(3);
        assert_eq!(renew_interval(s, 0.01, None).unwrap(), s / 3);
        assert_eq!(renew_interval(s, 0.01, Some(2 * MS)).unwrap(), 2 * MS);
        assert!(matches!(
            renew_interval(s, 0.01, Some(s)),
            Err(Error::InvalidSetting { .. })
        ));
        assert!(matches!(
            renew_interval(3 * MS, 0.0, None),
            Err(Error::TtlTooShortToRenew { .. })
        ));
    }

    #[test]
    fn the_retry_budget() {
        let now = Instant::now();
        let (n, last) = retry_budget(Patience::Retries(3), now, 10 * MS, 5 * MS, MS);
        assert_eq!((n, last), (3, now + 45 * MS));
        let until = now + 100 * MS;
        let (n, last) = retry_budget(Patience::Until(until), now, MS, MS, 50 * MS);
        assert_eq!((n, last), (u32::MAX, now + 50 * MS));
    }
}
