//! `gd_proto`: storage v2, phase 1. Each candidate design's claim + commit cycle, run as
//! SQL against PostgreSQL in the same run as graphile-worker's own statements (the anchor),
//! and what each writes and spends per step.
//!
//! ```sh
//! bash gen_durable_bench/peers/graphile.sh --install-only   # graphile-worker, for the anchor
//! cargo run --release -p gen_durable_bench --bin gd_proto -- --n 100000 --rounds 3
//! cargo run --release -p gen_durable_bench --bin gd_proto -- --candidate abc --steps 5
//! ```
//!
//! Every round runs every candidate once (interleaved), each in a fresh database
//! `gd_proto` on `DATABASE_URL`'s server: its schema, `--n` instances seeded, `VACUUM
//! ANALYZE`, `CHECKPOINT`; then `--clients` connections each loop claim (batch
//! `--batch`) → commit until every instance has run `--steps` steps, each commit checked
//! to have written every outcome (the fence held); then its retention (`gc`). One JSON
//! line per run; after the last round, a table of medians (see `report.rs`).
//!
//! The candidates are the files of `gen_durable_bench/proto/candidates/` (the format is in
//! `candidate.rs`); `graphile` is graphile-worker 0.17.3's schema (its own migrations) and
//! the statements its worker pool sends (`proto/graphile_sql.mjs` takes them from the
//! installed package), single-step only.

mod candidate;
mod counters;
mod graphile;
mod report;
mod run;

use clap::Parser;

/// Storage v2 prototypes: each candidate's claim + commit cycle as SQL, side by side.
#[derive(Debug, Parser)]
#[command(name = "gd_proto")]
pub(crate) struct Args {
    /// Instances per run.
    #[arg(long, default_value_t = 100_000)]
    pub(crate) n: i64,
    /// Steps each instance runs (`next` × (steps − 1), then `done`).
    #[arg(long, default_value_t = 1)]
    pub(crate) steps: u32,
    /// Connections claiming and committing at once.
    #[arg(long, default_value_t = 4)]
    pub(crate) clients: usize,
    /// Rows per claim.
    #[arg(long, default_value_t = 100)]
    pub(crate) batch: i64,
    /// Rounds; each runs every candidate once, in turn.
    #[arg(long, default_value_t = 3)]
    pub(crate) rounds: usize,
    /// Candidates (repeatable; default: graphile and every file in proto/candidates).
    #[arg(long = "candidate")]
    pub(crate) candidates: Vec<String>,
    /// Every file in proto/candidates, without graphile (which needs node).
    #[arg(long, conflicts_with = "candidates")]
    pub(crate) candidate_files: bool,
    /// The server (its `postgres` database); the harness creates `gd_proto` on it.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://root@127.0.0.1:5432/postgres"
    )]
    pub(crate) database_url: String,
    /// Skip the retention phase.
    #[arg(long)]
    pub(crate) no_gc: bool,
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let args = Args::parse();
    if let Err(e) = run::main(&args).await {
        eprintln!("gd_proto: {e}");
        std::process::exit(1);
    }
}
