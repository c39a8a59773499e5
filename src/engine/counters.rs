//! Counters of what a manager did, always on and cheap (a relaxed atomic
//! add per event), read with [`Redlock::stats`](crate::Redlock::stats).
//! The counters of every call (attempts, outcomes, the latency histogram)
//! are kept in a few shards, each on cache lines of its own, and a thread
//! adds to its own shard: counters that every worker thread adds to on
//! every call would move their cache line between cores each time (2-7 %
//! of scenario 5's throughput on two workers, measured against
//! `stats(false)` by turns). Reading sums the shards. With the `metrics` feature
//! the same events also go to the `metrics` crate's facade, so that a
//! Prometheus (or any other) exporter sees them.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// Shards of the per-call counters: threads are given shards in turn, so
/// the first eight threads that count (a runtime's workers, say) each
/// have their own.
const SHARDS: usize = 8;

/// The counters one thread adds to on every call, apart from other
/// threads' (128-byte aligned: two cache lines, as adjacent lines are
/// fetched together).
#[derive(Debug)]
#[repr(align(128))]
pub(crate) struct Shard {
    pub(crate) attempts: AtomicU64,
    pub(crate) grants: AtomicU64,
    pub(crate) conflicts: AtomicU64,
    pub(crate) no_quorum: AtomicU64,
    pub(crate) errors: AtomicU64,
    latency: [AtomicU64; BUCKETS],
}

impl Shard {
    fn new() -> Self {
        Shard {
            attempts: AtomicU64::new(0),
            grants: AtomicU64::new(0),
            conflicts: AtomicU64::new(0),
            no_quorum: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            latency: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

/// This thread's shard index, given in turn at its first count.
fn shard_index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static INDEX: usize = NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS;
    }
    INDEX.with(|i| *i)
}

/// Acquire-latency histogram buckets: bucket `b` holds latencies below
/// `2^(b/4)` microseconds (four buckets per doubling, up to about 4.5 hours).
const BUCKETS: usize = 4 * 34;

/// The live counters of one manager.
#[derive(Debug)]
pub(crate) struct Counters {
    /// `RedlockBuilder::stats(false)` turns the counting off.
    pub(crate) enabled: bool,
    /// The per-call counters, by thread ([`shard_index`]).
    shards: Box<[Shard]>,
    pub(crate) renewals: AtomicU64,
    pub(crate) losses: AtomicU64,
}

/// What an acquisition call ended with.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Ended {
    Granted(Duration),
    Conflict,
    NoQuorum,
    Error,
}

impl Counters {
    pub(crate) fn new(enabled: bool) -> Self {
        Counters {
            enabled,
            // No shards when nothing is counted.
            shards: (0..if enabled { SHARDS } else { 0 })
                .map(|_| Shard::new())
                .collect(),
            renewals: AtomicU64::new(0),
            losses: AtomicU64::new(0),
        }
    }

    /// This thread's shard (only where `enabled`: there are none otherwise).
    fn shard(&self) -> &Shard {
        debug_assert!(self.enabled, "no shards: counting is off");
        &self.shards[shard_index()]
    }

    /// The sum of one per-call counter over the shards.
    pub(crate) fn total(&self, counter: impl Fn(&Shard) -> &AtomicU64) -> u64 {
        self.shards
            .iter()
            .map(|s| counter(s).load(Ordering::Relaxed))
            .sum()
    }

    /// One acquisition round sent.
    pub(crate) fn attempt(&self) {
        if self.enabled {
            self.shard().attempts.fetch_add(1, Ordering::Relaxed);
        }
        #[cfg(feature = "metrics")]
        metrics::counter!("redlock_attempts_total").increment(1);
    }

    /// One acquisition call ended.
    pub(crate) fn ended(&self, ended: Ended) {
        if self.enabled {
            let shard = self.shard();
            let counter = match ended {
                Ended::Granted(latency) => {
                    shard.latency[bucket(latency)].fetch_add(1, Ordering::Relaxed);
                    &shard.grants
                }
                Ended::Conflict => &shard.conflicts,
                Ended::NoQuorum => &shard.no_quorum,
                Ended::Error => &shard.errors,
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
        #[cfg(feature = "metrics")]
        if let Ended::Granted(latency) = ended {
            metrics::histogram!("redlock_acquire_seconds").record(latency.as_secs_f64());
        }
        #[cfg(feature = "metrics")]
        {
            let outcome = match ended {
                Ended::Granted(_) => "granted",
                Ended::Conflict => "conflict",
                Ended::NoQuorum => "no_quorum",
                Ended::Error => "error",
            };
            metrics::counter!("redlock_acquisitions_total", "outcome" => outcome).increment(1);
        }
    }

    /// A guard renewed its lock.
    pub(crate) fn renewed(&self) {
        if self.enabled {
            self.renewals.fetch_add(1, Ordering::Relaxed);
        }
        #[cfg(feature = "metrics")]
        metrics::counter!("redlock_renewals_total").increment(1);
    }

    /// A guard lost its lock (not a release).
    pub(crate) fn lost(&self) {
        if self.enabled {
            self.losses.fetch_add(1, Ordering::Relaxed);
        }
        #[cfg(feature = "metrics")]
        metrics::counter!("redlock_losses_total").increment(1);
    }

    /// The acquire latency below which `q` of the grants came (upper bound
    /// of the histogram bucket), if any grant was counted.
    pub(crate) fn quantile(&self, q: f64) -> Option<Duration> {
        let counts: Vec<u64> = (0..BUCKETS)
            .map(|b| self.total(|s| &s.latency[b]))
            .collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = ((total as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (b, n) in counts.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Some(upper(b));
            }
        }
        Some(upper(BUCKETS - 1))
    }
}

/// The bucket of a latency: `floor(4 × log2(µs))`, clamped.
fn bucket(latency: Duration) -> usize {
    let micros = latency.as_micros().max(1) as f64;
    ((micros.log2() * 4.0).floor() as usize).min(BUCKETS - 1)
}

/// The upper bound of a bucket.
fn upper(bucket: usize) -> Duration {
    Duration::from_secs_f64(2f64.powf((bucket + 1) as f64 / 4.0) / 1e6)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_bound_their_latencies_within_a_fifth() {
        for micros in [1u64, 2, 3, 100, 150, 1_000, 123_456, 10_000_000] {
            let d = Duration::from_micros(micros);
            let up = upper(bucket(d));
            assert!(up >= d, "{d:?} above its bucket's bound {up:?}");
            assert!(
                up.as_secs_f64() <= d.as_secs_f64() * 1.19 + 1e-6,
                "{d:?}: {up:?}"
            );
        }
        assert_eq!(bucket(Duration::MAX), BUCKETS - 1);
    }

    #[test]
    fn counts_from_many_threads_add_up_across_the_shards() {
        let c = Counters::new(true);
        // More threads than shards: some share one.
        std::thread::scope(|s| {
            for t in 0..(SHARDS as u64 + 4) {
                let c = &c;
                s.spawn(move || {
                    for _ in 0..1000 {
                        c.attempt();
                        c.ended(Ended::Granted(Duration::from_micros(100 + t)));
                    }
                    c.ended(Ended::Conflict);
                });
            }
        });
        let threads = SHARDS as u64 + 4;
        assert_eq!(c.total(|s| &s.attempts), threads * 1000);
        assert_eq!(c.total(|s| &s.grants), threads * 1000);
        assert_eq!(c.total(|s| &s.conflicts), threads);
        let p50 = c.quantile(0.5).unwrap();
        assert!(p50 >= Duration::from_micros(100) && p50 < Duration::from_micros(140));
        // Counting off: nothing counted, nothing kept.
        let off = Counters::new(false);
        off.attempt();
        off.ended(Ended::Granted(Duration::from_micros(100)));
        assert_eq!(off.total(|s| &s.attempts), 0);
        assert_eq!(off.quantile(0.5), None);
    }

    #[test]
    fn quantiles_follow_the_counts() {
        let c = Counters::new(true);
        assert_eq!(c.quantile(0.5), None);
        for _ in 0..98 {
            c.ended(Ended::Granted(Duration::from_micros(100)));
        }
        for _ in 0..2 {
            c.ended(Ended::Granted(Duration::from_millis(50)));
        }
        let p50 = c.quantile(0.5).unwrap();
        let p99 = c.quantile(0.99).unwrap();
        assert!(p50 >= Duration::from_micros(100) && p50 < Duration::from_micros(120));
        assert!(p99 >= Duration::from_millis(50) && p99 < Duration::from_millis(60));
    }
}
