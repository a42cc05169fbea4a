//! `--before-drain` / `--after-drain`: a shell command run around the timed part of a drain.
//!
//! A profiler needs to know where the drain starts and ends: its backlog is inserted by
//! the same process just before, and its rows are checked just after. The before hook
//! runs once the backlog is inserted and vacuumed, before the engine starts; the after
//! hook once every instance is done, while the engine and its connections are still up
//! (so their server processes can still be found). Each runs to completion with
//! `sh -c`, with `GD_BENCH_PID` (this process) and `GD_BENCH_N` (the backlog) in its
//! environment, and a hook that fails fails the run. `gen_durable_bench/profile/profile.sh`
//! uses them to reset and read the server's statistics and to start and stop `perf`.

use std::process::Command;

use crate::BoxError;

/// Runs `cmd` (if any) for a drain of `n` instances; `stage` names it in errors.
pub(crate) fn run(cmd: Option<&str>, stage: &str, n: usize) -> Result<(), BoxError> {
    let Some(cmd) = cmd else { return Ok(()) };
    // The engine may be running: keep its tasks off this blocked thread.
    let status = tokio::task::block_in_place(|| {
        Command::new("sh")
            .arg("-c")
            .arg(cmd)
            .env("GD_BENCH_PID", std::process::id().to_string())
            .env("GD_BENCH_N", n.to_string())
            .status()
    })
    .map_err(|e| format!("--{stage} {cmd:?}: {e}"))?;
    if !status.success() {
        return Err(format!("--{stage} {cmd:?} failed ({status})").into());
    }
    Ok(())
}
