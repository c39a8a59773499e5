//! Latency samples and their percentiles and CDF, in milliseconds.

use std::time::Duration;

#[derive(Debug, Clone, Default)]
pub(crate) struct Samples(pub(crate) Vec<Duration>);

impl Samples {
    pub(crate) fn push(&mut self, d: Duration) {
        self.0.push(d);
    }
    pub(crate) fn pct(&self, p: f64) -> f64 {
        if self.0.is_empty() {
            return f64::NAN;
        }
        let mut v = self.0.clone();
        v.sort();
        let i = ((v.len() as f64 - 1.0) * p).round() as usize;
        ms(v[i])
    }
    pub(crate) fn p50(&self) -> f64 {
        self.pct(0.5)
    }
    pub(crate) fn p99(&self) -> f64 {
        self.pct(0.99)
    }
    pub(crate) fn cdf(&self) -> Vec<(f64, f64)> {
        let mut v: Vec<f64> = self.0.iter().map(|d| ms(*d)).collect();
        v.sort_by(f64::total_cmp);
        let n = v.len() as f64;
        v.iter()
            .enumerate()
            .map(|(i, x)| (*x, (i + 1) as f64 / n))
            .collect()
    }
}

pub(crate) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
