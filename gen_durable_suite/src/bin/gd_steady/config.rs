//! The run's settings: the command-line flags and their defaults (see the crate doc).

use gen_durable_suite::worker::Args;

/// The flags, parsed, with their defaults applied.
pub(crate) struct Config {
    /// `--capacity-probe`: a closed loop measuring saturation, no check.
    pub(crate) probe: bool,
    pub(crate) rate: u64,
    pub(crate) seconds: u64,
    pub(crate) report_secs: u64,
    pub(crate) window_secs: u64,
    /// `--warmup-secs`: the first window starts after it (default 0).
    pub(crate) warmup_secs: u64,
    pub(crate) retention: u64,
    pub(crate) collector_secs: u64,
    pub(crate) concurrency: usize,
    pub(crate) prefetch: usize,
    pub(crate) engine_pool: u32,
    pub(crate) client_pool: u32,
    pub(crate) signal_concurrency: usize,
    pub(crate) probe_inflight: usize,
    pub(crate) probe_skip_secs: f64,
    pub(crate) tolerance: f64,
    pub(crate) max_p99_ms: f64,
    pub(crate) max_p99_ratio: Option<f64>,
    pub(crate) size_factor: f64,
    pub(crate) rss_factor: f64,
    pub(crate) rss_slack: f64,
    /// `--vacuum-secs` as given: resolved by [`Config::vacuum_secs`] once the server's
    /// autovacuum setting is known.
    vacuum_secs: Option<String>,
}

impl Config {
    /// Reads the flags; `--rate`, `--seconds` and `--report-secs` must be positive.
    pub(crate) fn from_args(args: &Args) -> Result<Config, Box<dyn std::error::Error>> {
        let probe = args.str("capacity-probe").is_some();
        let rate = args.num("rate", 200);
        let seconds = args.num("seconds", if probe { 40 } else { 1800 });
        let report_secs = args.num(
            "report-secs",
            if probe {
                5
            } else if seconds <= 300 {
                10
            } else {
                60
            },
        );
        let window_secs = args
            .num(
                "window-secs",
                if seconds >= 1800 { 300 } else { seconds / 4 },
            )
            .max(1);
        let float = |k: &str| args.str(k).and_then(|v| v.parse::<f64>().ok());
        let cfg = Config {
            probe,
            rate,
            seconds,
            report_secs,
            window_secs,
            warmup_secs: args.num("warmup-secs", 0),
            retention: args.num("retention-secs", 30),
            collector_secs: args.num("collector-secs", 5),
            concurrency: args.num("concurrency", 32) as usize,
            prefetch: args.num("prefetch", 32) as usize,
            engine_pool: args.num("pool", 10) as u32,
            client_pool: args.num("client-pool", 10) as u32,
            signal_concurrency: args.num("signal-concurrency", 16) as usize,
            probe_inflight: args.num("probe-inflight", 2000) as usize,
            probe_skip_secs: args.num("probe-skip-secs", 10) as f64,
            tolerance: float("tolerance").unwrap_or(0.10),
            max_p99_ms: args.num("max-p99-ms", 2000) as f64,
            max_p99_ratio: float("max-p99-ratio"),
            size_factor: float("size-factor").unwrap_or(1.5),
            rss_factor: float("rss-factor").unwrap_or(1.25),
            rss_slack: args.num("rss-slack-mib", 8) as f64,
            vacuum_secs: args.str("vacuum-secs").map(str::to_string),
        };
        if rate == 0 || seconds == 0 || report_secs == 0 {
            return Err("--rate, --seconds and --report-secs must be positive".into());
        }
        if cfg.warmup_secs + 2 * cfg.window_secs > seconds {
            return Err("--warmup-secs + 2 × --window-secs must fit in --seconds".into());
        }
        Ok(cfg)
    }

    /// The vacuum stand-in's interval, s (0: none): `--vacuum-secs`, else 60 when the
    /// server's `autovacuum` is `off`, else none.
    pub(crate) fn vacuum_secs(&self, autovacuum: &str) -> Result<u64, std::num::ParseIntError> {
        match self.vacuum_secs.as_deref() {
            Some(v) => v.parse::<u64>(),
            None if autovacuum == "off" => Ok(60),
            None => Ok(0),
        }
    }
}
