//! Which instances finished, and how many times each: the exactly-once check's record.
//!
//! One bit per id (ids come from the table's sequence, restarted for every scenario, so
//! they are dense from 1), and a map only for the ids finished more than once (none, in a
//! correct run): 37 KB for a drain of 300,000 instead of the ~9 MB a hash map of every id
//! took, so the harness's own memory does not hide the engine's in `rss_peak_mb`. Ids
//! outside the bitmap's range (negative, or past [`DENSE_MAX`]) go to the map.

use std::collections::BTreeMap;

/// Ids from 0 to this are kept as bits (an 8 MB bitmap at most).
const DENSE_MAX: i64 = 1 << 26;

/// The ids done, each with its count.
#[derive(Debug, Default)]
pub(super) struct DoneIds {
    /// Bit `id` set: `id` done at least once.
    bits: Vec<u64>,
    /// Distinct ids done.
    len: usize,
    /// The count of every id done more than once, and of every id outside the bitmap.
    counts: BTreeMap<i64, u32>,
}

impl DoneIds {
    /// `id` done `times` more times.
    pub(super) fn add(&mut self, id: i64, times: u32) {
        if times == 0 {
            return;
        }
        if !(0..=DENSE_MAX).contains(&id) {
            let c = self.counts.entry(id).or_default();
            self.len += usize::from(*c == 0);
            *c += times;
            return;
        }
        let (word, bit) = ((id / 64) as usize, 1u64 << (id % 64));
        if word >= self.bits.len() {
            self.bits.resize(word + 1, 0);
        }
        if self.bits[word] & bit == 0 {
            self.bits[word] |= bit;
            self.len += 1;
            if times > 1 {
                self.counts.insert(id, times);
            }
        } else {
            *self.counts.entry(id).or_insert(1) += times;
        }
    }

    /// Distinct ids done.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Every id done, with how many times, in id order within each part.
    pub(super) fn iter(&self) -> impl Iterator<Item = (i64, u32)> + '_ {
        let dense = self.bits.iter().enumerate().flat_map(move |(w, &word)| {
            (0..64)
                .filter(move |b| word & (1u64 << b) != 0)
                .map(move |b| {
                    let id = w as i64 * 64 + b;
                    (id, self.counts.get(&id).copied().unwrap_or(1))
                })
        });
        let sparse = self
            .counts
            .iter()
            .filter(|(id, _)| !(0..=DENSE_MAX).contains(*id))
            .map(|(id, n)| (*id, *n));
        dense.chain(sparse)
    }

    /// Ids done other than exactly once.
    pub(super) fn not_once(&self) -> impl Iterator<Item = (i64, u32)> + '_ {
        self.counts
            .iter()
            .filter(|(_, n)| **n != 1)
            .map(|(id, n)| (*id, *n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_each_id_and_finds_the_repeats() {
        let mut d = DoneIds::default();
        for id in [1, 2, 3, 200, -5, DENSE_MAX + 1] {
            d.add(id, 1);
        }
        d.add(2, 1);
        d.add(-5, 2);
        d.add(7, 3);
        assert_eq!(d.len(), 7);
        let all: Vec<_> = d.iter().collect();
        assert_eq!(
            all,
            [
                (1, 1),
                (2, 2),
                (3, 1),
                (7, 3),
                (200, 1),
                (-5, 3),
                (DENSE_MAX + 1, 1)
            ]
        );
        let twice: Vec<_> = d.not_once().collect();
        assert_eq!(twice, [(-5, 3), (2, 2), (7, 3)]);
    }
}
