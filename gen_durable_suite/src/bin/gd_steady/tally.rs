//! The node's running tally, shared by the producer, the event handler and the reporter:
//! each instance's insert time until it finishes, and its latency once it has.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::hist::Hist;

/// What the node has seen, shared by the producer, the event handler and the reporter.
#[derive(Default)]
pub(crate) struct Tally {
    /// Insert call start of each instance not finished yet.
    pub(crate) open: HashMap<i64, Instant>,
    /// Instances that finished before the producer registered them (a race, rare).
    pub(crate) early: HashMap<i64, Instant>,
    /// Inserted in the current report interval, and in all.
    pub(crate) offered: u64,
    pub(crate) inserted: u64,
    /// Latencies of the instances finished in the current report interval.
    pub(crate) interval: Hist,
    /// Latencies of those finished in the first and in the last window.
    pub(crate) first: Hist,
    pub(crate) last: Hist,
    pub(crate) completed: u64,
    pub(crate) failed: u64,
}

pub(crate) struct Shared {
    pub(crate) t0: Instant,
    pub(crate) window: Duration,
    /// The first window starts after it.
    pub(crate) warmup: Duration,
    pub(crate) end: Duration,
    pub(crate) tally: Mutex<Tally>,
    pub(crate) insert_errors: AtomicU64,
    pub(crate) signal_errors: AtomicU64,
    pub(crate) collected: AtomicU64,
}

impl Shared {
    pub(crate) fn tally(&self) -> std::sync::MutexGuard<'_, Tally> {
        self.tally.lock().expect("tally")
    }

    /// An instance committed `done` (or `failed`) at `at`.
    pub(crate) fn finished(&self, id: i64, failed: bool, at: Instant) {
        let mut t = self.tally();
        match t.open.remove(&id) {
            Some(start) => self.record(&mut t, at - start, at, failed),
            None => {
                t.early.insert(id, at);
            }
        }
    }

    fn record(&self, t: &mut Tally, latency: Duration, at: Instant, failed: bool) {
        if failed {
            t.failed += 1;
            return;
        }
        let us = latency.as_micros().min(u32::MAX as u128) as u32;
        let when = at - self.t0;
        t.completed += 1;
        t.interval.add(us);
        if when >= self.warmup && when < self.warmup + self.window {
            t.first.add(us);
        }
        if when >= self.end.saturating_sub(self.window) && when < self.end {
            t.last.add(us);
        }
    }

    /// The producer's batch, inserted by a call started at `start`.
    pub(crate) fn inserted(&self, ids: &[i64], start: Instant) {
        let mut t = self.tally();
        t.offered += ids.len() as u64;
        t.inserted += ids.len() as u64;
        for &id in ids {
            match t.early.remove(&id) {
                Some(at) => self.record(&mut t, at - start, at, false),
                None => {
                    t.open.insert(id, start);
                }
            }
        }
    }
}
