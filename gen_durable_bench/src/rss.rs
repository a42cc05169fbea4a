//! Resident memory while a scenario runs: `VmRSS` of `/proc/<pid>/status`, sampled.
//!
//! [`RssSampler::start`] reads this process's `VmRSS` every 10 ms on a tokio task until
//! [`RssSampler::finish`], which adds `rss_start_mb`, `rss_peak_mb` and `rss_end_mb` to
//! a scenario's JSON fields. It also resets the kernel's high-water mark (`VmHWM`, by
//! writing `5` to `/proc/self/clear_refs`) at the start, so that a spike shorter than
//! a sampling tick still counts in the peak. Linux only: elsewhere the fields are null.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Map, Value};
use tokio::task::JoinHandle;

/// How often the sampler reads `VmRSS`.
const TICK: Duration = Duration::from_millis(10);

/// Samples this process's resident set until [`finish`](Self::finish).
#[derive(Debug)]
pub(crate) struct RssSampler {
    start_kb: Option<u64>,
    peak_kb: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    task: JoinHandle<()>,
}

impl RssSampler {
    /// Resets the high-water mark and starts sampling now.
    pub(crate) fn start() -> Self {
        // Best effort: without it the peak is the sampled one alone.
        let _ = std::fs::write("/proc/self/clear_refs", "5");
        let start_kb = status_kb("self", "VmRSS");
        let peak_kb = Arc::new(AtomicU64::new(start_kb.unwrap_or(0)));
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn({
            let (peak_kb, stop) = (peak_kb.clone(), stop.clone());
            async move {
                let mut tick = tokio::time::interval(TICK);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                while !stop.load(Ordering::Relaxed) {
                    tick.tick().await;
                    if let Some(kb) = status_kb("self", "VmRSS") {
                        peak_kb.fetch_max(kb, Ordering::Relaxed);
                    }
                }
            }
        });
        RssSampler {
            start_kb,
            peak_kb,
            stop,
            task,
        }
    }

    /// Stops sampling and adds `rss_start_mb`, `rss_peak_mb` (the larger of the sampled
    /// peak and `VmHWM`) and `rss_end_mb` to `extra`.
    pub(crate) async fn finish(self, extra: &mut Map<String, Value>) {
        let end_kb = status_kb("self", "VmRSS");
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.task.await;
        let sampled = self.peak_kb.load(Ordering::Relaxed);
        let hwm = status_kb("self", "VmHWM").unwrap_or(0);
        let peak_kb = end_kb.map(|e| sampled.max(hwm).max(e));
        extra.insert("rss_start_mb".into(), mb(self.start_kb));
        extra.insert("rss_peak_mb".into(), mb(peak_kb));
        extra.insert("rss_end_mb".into(), mb(end_kb));
    }
}

/// A `kB` field (`VmRSS`, `VmHWM`) of `/proc/<pid>/status`; `pid` may be `self`.
pub(crate) fn status_kb(pid: &str, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_kb(&status, field)
}

fn parse_kb(status: &str, field: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Kibibytes as mebibytes with one decimal, for the JSON line.
pub(crate) fn mb(kb: Option<u64>) -> Value {
    json!(kb.map(|k| (k as f64 / 1024.0 * 10.0).round() / 10.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_field_in_kib() {
        let status = "Name:\tx\nVmHWM:\t   20480 kB\nVmRSS:\t   10240 kB\n";
        assert_eq!(parse_kb(status, "VmRSS"), Some(10240));
        assert_eq!(parse_kb(status, "VmHWM"), Some(20480));
        assert_eq!(parse_kb(status, "VmSwap"), None);
        assert_eq!(mb(Some(10240)), json!(10.0));
    }

    #[test]
    fn this_process_has_a_resident_set() {
        if cfg!(target_os = "linux") {
            assert!(status_kb("self", "VmRSS").unwrap_or(0) > 0);
        }
    }
}
