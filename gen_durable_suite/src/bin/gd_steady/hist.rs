//! The latency histogram the tally records into and the reports read quantiles from.

/// A latency histogram of fixed size (so that recording allocates nothing): exact below
/// 128 µs, then 64 buckets per power of two (±1.6%).
#[derive(Clone)]
pub(crate) struct Hist {
    counts: Vec<u64>,
    pub(crate) n: u64,
}

const BUCKETS: usize = 128 + 25 * 64;

impl Default for Hist {
    fn default() -> Self {
        Hist {
            counts: vec![0; BUCKETS],
            n: 0,
        }
    }
}

impl Hist {
    fn index(us: u32) -> usize {
        if us < 128 {
            return us as usize;
        }
        let e = 31 - us.leading_zeros(); // 7..=31
        let m = us >> (e - 6); // 64..128
        128 + (e as usize - 7) * 64 + (m as usize - 64)
    }

    /// The largest value of bucket `i`, µs.
    fn upper(i: usize) -> u64 {
        if i < 128 {
            return i as u64;
        }
        let (e, m) = (7 + (i - 128) / 64, 64 + (i - 128) % 64);
        (((m + 1) as u64) << (e - 6)) - 1
    }

    pub(crate) fn add(&mut self, us: u32) {
        self.counts[Self::index(us)] += 1;
        self.n += 1;
    }

    /// The `p`-quantile (0..=1), ms.
    pub(crate) fn quantile_ms(&self, p: f64) -> f64 {
        if self.n == 0 {
            return 0.0;
        }
        let rank = ((p * self.n as f64).ceil() as u64).clamp(1, self.n);
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Self::upper(i) as f64 / 1000.0;
            }
        }
        0.0
    }
}
