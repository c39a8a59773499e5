//! The time arithmetic of Redlock, each rule in one place: the drift
//! allowance, the validity left after a round, the conversion of a ttl to
//! `PX` milliseconds, the instant a lock ends and the latest instant its keys
//! can live, the delay between attempts, and the rounding of timers.
//!
//! All of it is checked or saturating: no `Instant + Duration` in this crate
//! may panic, whatever the caller passed (`Duration::MAX` included).

use std::time::{Duration, Instant};

use crate::protocol::error::Error;

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
pub(crate) fn alarm(at: Instant) -> tokio::time::Instant {
    at.checked_sub(Duration::from_millis(1))
        .unwrap_or(at)
        .into()
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
        assert_eq!(Instant::from(alarm(now)), now - MS);
    }
}
