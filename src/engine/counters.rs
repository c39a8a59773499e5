//! Counters of what a manager did, always on and cheap (a relaxed atomic
//! add per event), read with [`Redlock::stats`](crate::Redlock::stats). With the `metrics` feature
//! the same events also go to the `metrics` crate's facade, so that a
//! Prometheus (or any other) exporter sees them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Acquire-latency histogram buckets: bucket `b` holds latencies below
/// `2^(b/4)` microseconds (four buckets per doubling, up to about 4.5 hours).
const BUCKETS: usize = 4 * 34;

/// The live counters of one manager.
#[derive(Debug)]
pub(crate) struct Counters {
    /// `RedlockBuilder::stats(false)` turns the counting off.
    pub(crate) enabled: bool,
    pub(crate) attempts: AtomicU64,
    pub(crate) grants: AtomicU64,
    pub(crate) conflicts: AtomicU64,
    pub(crate) no_quorum: AtomicU64,
    pub(crate) errors: AtomicU64,
    pub(crate) renewals: AtomicU64,
    pub(crate) losses: AtomicU64,
    pub(crate) node_failures: Box<[AtomicU64]>,
    pub(crate) latency: Box<[AtomicU64]>,
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
    pub(crate) fn new(nodes: usize, enabled: bool) -> Self {
        Counters {
            enabled,
            attempts: AtomicU64::new(0),
            grants: AtomicU64::new(0),
            conflicts: AtomicU64::new(0),
            no_quorum: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            renewals: AtomicU64::new(0),
            losses: AtomicU64::new(0),
            node_failures: (0..nodes).map(|_| AtomicU64::new(0)).collect(),
            latency: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// One acquisition round sent.
    pub(crate) fn attempt(&self) {
        if self.enabled {
            self.attempts.fetch_add(1, Ordering::Relaxed);
        }
        #[cfg(feature = "metrics")]
        metrics::counter!("redlock_attempts_total").increment(1);
    }

    /// One acquisition call ended.
    pub(crate) fn ended(&self, ended: Ended) {
        let counter = match ended {
            Ended::Granted(latency) => {
                if self.enabled {
                    self.latency[bucket(latency)].fetch_add(1, Ordering::Relaxed);
                }
                #[cfg(feature = "metrics")]
                metrics::histogram!("redlock_acquire_seconds").record(latency.as_secs_f64());
                &self.grants
            }
            Ended::Conflict => &self.conflicts,
            Ended::NoQuorum => &self.no_quorum,
            Ended::Error => &self.errors,
        };
        if self.enabled {
            counter.fetch_add(1, Ordering::Relaxed);
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

    /// Node `index` did not agree in a round (for any reason but a refusal).
    pub(crate) fn node_failed(&self, index: usize, _label: &str) {
        if self.enabled {
            self.node_failures[index].fetch_add(1, Ordering::Relaxed);
        }
        #[cfg(feature = "metrics")]
        metrics::counter!("redlock_node_failures_total", "node" => _label.to_owned()).increment(1);
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
        let counts: Vec<u64> = self
            .latency
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
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
    fn quantiles_follow_the_counts() {
        let c = Counters::new(1, true);
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
