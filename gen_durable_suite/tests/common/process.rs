//! Spawning `gd_worker` processes for the reliability suite.
#![allow(dead_code)]

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

/// Where Debian's `faketime` package puts the preload library.
pub const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// A running worker process.
pub struct Worker {
    pub child: Child,
    pub node: String,
    pub lines: Lines<BufReader<ChildStdout>>,
}

/// The URL of a test database.
pub fn url_of(db: &gen_durable_testkit::TestDb) -> String {
    let base = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| gen_durable_testkit::pg::DEFAULT_DATABASE_URL.to_string());
    let (server, _) = base.rsplit_once('/').expect("a URL with a database");
    format!("{server}/{}", db.name())
}

impl Worker {
    /// Starts a worker on `url` and waits for its `ready` line.
    pub async fn start(url: &str, node: &str, args: &[&str], failpoints: Option<&str>) -> Worker {
        Self::start_with(None, url, node, args, failpoints).await
    }

    /// Starts a worker whose wall clock is skewed by `offset` (faketime syntax, e.g.
    /// `+10m`); its monotonic clock, which timers use, is left alone.
    pub async fn start_skewed(offset: &str, url: &str, node: &str, args: &[&str]) -> Worker {
        Self::start_with(Some(offset), url, node, args, None).await
    }

    async fn start_with(
        skew: Option<&str>,
        url: &str,
        node: &str,
        args: &[&str],
        failpoints: Option<&str>,
    ) -> Worker {
        let exe = env!("CARGO_BIN_EXE_gd_worker");
        let mut cmd = Command::new(exe);
        if let Some(offset) = skew {
            // libfaketime preloaded into the worker itself (not the `faketime` wrapper,
            // which would fork and leave the worker behind when the test kills it).
            assert!(
                std::path::Path::new(LIBFAKETIME).exists(),
                "this test needs libfaketime ({LIBFAKETIME}): apt-get install faketime; .ci/run installs it"
            );
            cmd.env("LD_PRELOAD", LIBFAKETIME)
                .env("FAKETIME", offset)
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        }
        cmd.arg("--database-url")
            .arg(url)
            .arg("--node")
            .arg(node)
            .args(args);
        cmd.stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        if let Some(f) = failpoints {
            cmd.env("FAILPOINTS", f);
        }
        let mut child = cmd.spawn().expect("spawn gd_worker");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let ready = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("worker ready in time")
            .expect("read worker output")
            .expect("worker printed a line");
        assert_eq!(ready, format!("ready {node}"));
        Worker {
            child,
            node: node.to_string(),
            lines,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id().expect("running")
    }

    /// SIGKILL: a crash.
    pub async fn kill(mut self) {
        self.child.start_kill().unwrap();
        self.child.wait().await.unwrap();
    }

    /// Sends a signal by name (STOP, CONT, TERM).
    pub fn signal(&self, sig: &str) {
        let ok = std::process::Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.pid().to_string())
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{sig} failed");
    }

    /// Reads output lines until one starts with `prefix`, or `secs` pass.
    pub async fn wait_line(&mut self, prefix: &str, secs: u64) -> String {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
        loop {
            let line = tokio::time::timeout_at(deadline, self.lines.next_line())
                .await
                .unwrap_or_else(|_| panic!("no line starting with {prefix:?} within {secs}s"))
                .expect("read worker output");
            match line {
                Some(l) if l.starts_with(prefix) => return l,
                Some(_) => continue,
                None => panic!("worker exited before printing {prefix:?}"),
            }
        }
    }
}
