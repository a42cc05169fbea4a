//! The anchor: graphile-worker's own schema and statements (see `proto/graphile_sql.mjs`).

use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// graphile-worker's statements, taken from the installed package, its schema installed
/// into `url` by its own migrations.
#[derive(Debug, Clone)]
pub(crate) struct Graphile {
    pub(crate) version: String,
    /// Fetches a batch: `$1` the worker (text), `$2` the task ids (int4[]).
    pub(crate) get_jobs: String,
    /// Completes a batch: `$1` the job ids (int8[]).
    pub(crate) complete_jobs: String,
}

/// Installs graphile-worker's schema into `url` and returns its statements for `batch`.
pub(crate) fn setup(url: &str, batch: i64) -> Result<Graphile, String> {
    let peer_dir = std::env::var("GD_PEER_DIR").unwrap_or_else(|_| {
        format!(
            "{}/gd-peer-graphile",
            std::env::var("TMPDIR").unwrap_or_else(|_| "/tmp".into())
        )
    });
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("proto/graphile_sql.mjs");
    let out = Command::new("node")
        .arg(&script)
        .env("GD_PEER_DIR", &peer_dir)
        .env("DATABASE_URL", url)
        .env("BATCH", batch.to_string())
        .output()
        .map_err(|e| {
            format!(
                "node {}: {e} (node ≥ 18 is needed for the anchor)",
                script.display()
            )
        })?;
    if !out.status.success() {
        return Err(format!(
            "graphile_sql.mjs failed (install graphile-worker with `bash gen_durable_bench/peers/graphile.sh --install-only`): {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let v: Value = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
    let text = |k: &str| {
        v[k].as_str()
            .map(str::to_string)
            .ok_or(format!("graphile_sql.mjs gave no {k}"))
    };
    Ok(Graphile {
        version: text("version")?,
        get_jobs: text("get_jobs")?,
        complete_jobs: text("complete_jobs")?,
    })
}

/// Seeds `$1` no-op jobs of task `noop` (as `add_jobs` would, without its notification).
pub(crate) const SEED: &str = r#"
WITH t AS (INSERT INTO graphile_worker._private_tasks (identifier) VALUES ('noop')
           ON CONFLICT (identifier) DO UPDATE SET identifier = excluded.identifier
           RETURNING id)
INSERT INTO graphile_worker._private_jobs (task_id, payload)
SELECT t.id, '{}'::json FROM t, generate_series(1, $1)"#;

/// The id of task `noop`.
pub(crate) const TASK_IDS: &str =
    "SELECT array_agg(id) FROM graphile_worker._private_tasks WHERE identifier = 'noop'";

/// The tables whose writes are counted.
pub(crate) const TABLES: [&str; 1] = ["_private_jobs"];
