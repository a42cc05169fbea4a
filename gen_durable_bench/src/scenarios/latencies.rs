//! A drain's step latencies as a histogram of fixed size, so the tracker's memory does not
//! grow with the backlog (a `Vec<f64>` took 8 bytes a step: 2.4 MB at 300,000, which
//! showed in `rss_peak_mb`).
//!
//! Buckets grow geometrically by 0.5% from 1 µs, so a percentile is within ±0.25% of the
//! sample it stands for (the bucket's geometric middle), up to ~20 minutes; 4,200 counters,
//! 34 KB, whatever the number of samples.

use serde::{Deserialize, Serialize};

/// The lower bound of bucket 0, in ms.
const MIN_MS: f64 = 0.001;
/// Each bucket's upper bound over its lower bound.
const GROWTH: f64 = 1.005;
const BUCKETS: usize = 4_200;

/// Latency samples in ms.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(super) struct Latencies {
    /// Samples per bucket; empty until the first sample.
    counts: Vec<u64>,
    n: u64,
}

impl Latencies {
    /// One sample of `ms` milliseconds.
    pub(super) fn record(&mut self, ms: f64) {
        if self.counts.is_empty() {
            self.counts = vec![0; BUCKETS];
        }
        self.counts[bucket(ms)] += 1;
        self.n += 1;
    }

    /// Adds `other`'s samples to these.
    pub(super) fn merge(&mut self, other: &Latencies) {
        if other.counts.is_empty() {
            return;
        }
        if self.counts.is_empty() {
            self.counts = vec![0; BUCKETS];
        }
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.n += other.n;
    }

    /// The sample of rank `round((n - 1) * p)` in sorted order (as
    /// [`percentile`](super::percentile) picks it), to the bucket's resolution.
    pub(super) fn percentile(&self, p: f64) -> Option<f64> {
        if self.n == 0 {
            return None;
        }
        let rank = ((self.n - 1) as f64 * p).round() as u64;
        let mut seen = 0;
        for (b, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen > rank {
                return Some(MIN_MS * GROWTH.powf(b as f64 + 0.5));
            }
        }
        None
    }
}

fn bucket(ms: f64) -> usize {
    if ms.is_nan() || ms <= MIN_MS {
        return 0;
    }
    (((ms / MIN_MS).ln() / GROWTH.ln()).floor() as usize).min(BUCKETS - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_within_a_quarter_percent_of_the_exact_ones() {
        let samples: Vec<f64> = (1..=10_000).map(|i| 0.05 + i as f64 * 0.013).collect();
        let mut h = Latencies::default();
        for s in &samples {
            h.record(*s);
        }
        for p in [0.0, 0.5, 0.99, 1.0] {
            let mut v = samples.clone();
            let exact = super::super::percentile(&mut v, p).expect("samples");
            let got = h.percentile(p).expect("samples");
            assert!((got / exact - 1.0).abs() < 0.0026, "p{p}: {got} vs {exact}");
        }
    }

    #[test]
    fn merged_histograms_count_both() {
        let (mut a, mut b) = (Latencies::default(), Latencies::default());
        a.record(1.0);
        b.record(3.0);
        b.record(3.0);
        a.merge(&b);
        a.merge(&Latencies::default());
        assert!((a.percentile(0.5).expect("samples") / 3.0 - 1.0).abs() < 0.0026);
        assert!((a.percentile(0.0).expect("samples") - 1.0).abs() < 0.0026);
        assert_eq!(Latencies::default().percentile(0.5), None);
    }
}
