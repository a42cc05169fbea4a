//! Running the `gen_durable` binary against a test database, and making rows for it to see.
#![allow(dead_code)]

use std::process::Command;

use gen_durable_testkit::pg::DEFAULT_DATABASE_URL;
use gen_durable_testkit::TestDb;
use serde_json::Value;
use sqlx::PgPool;

/// What one run of the binary did.
#[derive(Debug)]
pub(crate) struct Run {
    pub(crate) code: i32,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

impl Run {
    /// The stdout as JSON (the command ran with `--json`).
    pub(crate) fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{}", self.stdout))
    }

    /// The stderr as JSON (a failed `--json` command).
    pub(crate) fn json_error(&self) -> Value {
        serde_json::from_str(&self.stderr)
            .unwrap_or_else(|e| panic!("stderr is not JSON ({e}):\n{}", self.stderr))
    }

    /// Asserts the exit code, showing both streams if it differs.
    #[track_caller]
    pub(crate) fn expect(self, code: i32) -> Run {
        assert_eq!(
            self.code, code,
            "exit code\n--- stdout\n{}\n--- stderr\n{}",
            self.stdout, self.stderr
        );
        self
    }
}

/// Runs `gen_durable ARGS` with no `DATABASE_URL` in its environment (nor this tree's
/// default, which `cargo test` passes on from `.cargo/config.toml`).
pub(crate) fn gd(args: &[&str]) -> Run {
    gd_with_env(args, &[])
}

/// [`gd`] with `env` set.
pub(crate) fn gd_with_env(args: &[&str], env: &[(&str, &str)]) -> Run {
    let out = Command::new(env!("CARGO_BIN_EXE_gen_durable"))
        .args(args)
        .env_remove("DATABASE_URL")
        .env_remove("GEN_DURABLE_CLI_DEFAULT_URL")
        .env("NO_COLOR", "1")
        .envs(env.iter().copied())
        .output()
        .expect("run the gen_durable binary");
    Run {
        code: out.status.code().expect("exited normally, not by a signal"),
        stdout: String::from_utf8(out.stdout).expect("utf-8 stdout"),
        stderr: String::from_utf8(out.stderr).expect("utf-8 stderr"),
    }
}

/// Runs `gen_durable --database-url URL ARGS` against `db`.
pub(crate) fn gd_on(db: &TestDb, args: &[&str]) -> Run {
    let url = url_of(db.name());
    let mut all = vec!["--database-url", url.as_str()];
    all.extend_from_slice(args);
    gd(&all)
}

/// The URL of database `name` on the test server: `DATABASE_URL` with its path replaced.
pub(crate) fn url_of(name: &str) -> String {
    let server = std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_DATABASE_URL.into());
    let (base, query) = match server.split_once('?') {
        Some((b, q)) => (b, format!("?{q}")),
        None => (server.as_str(), String::new()),
    };
    let authority_start = base.find("://").map_or(0, |i| i + 3);
    let path_start = base[authority_start..]
        .find('/')
        .map_or(base.len(), |i| authority_start + i);
    format!("{}/{name}{query}", &base[..path_start])
}

/// A row of `gd_instances` to insert directly, with the columns the CLI shows.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub(crate) fsm: &'static str,
    pub(crate) version: i32,
    pub(crate) step: &'static str,
    pub(crate) queue: &'static str,
    pub(crate) status: &'static str,
    pub(crate) parent: Option<i64>,
    /// Seconds before now() of `updated_at` (and of `eligible_at`).
    pub(crate) age_secs: i64,
    pub(crate) last_error: Option<&'static str>,
}

impl Row {
    pub(crate) fn new(fsm: &'static str, queue: &'static str, status: &'static str) -> Row {
        Row {
            fsm,
            version: 1,
            step: "run",
            queue,
            status,
            parent: None,
            age_secs: 0,
            last_error: None,
        }
    }
    pub(crate) fn version(mut self, v: i32) -> Row {
        self.version = v;
        self
    }
    pub(crate) fn step(mut self, s: &'static str) -> Row {
        self.step = s;
        self
    }
    pub(crate) fn parent(mut self, id: i64) -> Row {
        self.parent = Some(id);
        self
    }
    pub(crate) fn age_secs(mut self, s: i64) -> Row {
        self.age_secs = s;
        self
    }
    pub(crate) fn error(mut self, e: &'static str) -> Row {
        self.last_error = Some(e);
        self
    }

    /// Inserts it as is (statuses included, bypassing the engine); returns its id.
    pub(crate) async fn insert(self, pool: &PgPool) -> i64 {
        sqlx::query_scalar(
            "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, status, parent_id,
                                       last_error, eligible_at, updated_at)
             VALUES ($1, $2, $3, '{}', $4, $5::gd_status, $6, $7,
                     now() - $8 * interval '1 second', now() - $8 * interval '1 second')
             RETURNING id",
        )
        .bind(self.fsm)
        .bind(self.version)
        .bind(self.step)
        .bind(self.queue)
        .bind(self.status)
        .bind(self.parent)
        .bind(self.last_error)
        .bind(self.age_secs as f64)
        .fetch_one(pool)
        .await
        .expect("insert a row")
    }
}

/// Simulates a node's announce: it last announced `seen_secs_ago` seconds ago.
pub(crate) async fn node(
    pool: &PgPool,
    id: &str,
    queues: &[&str],
    fsms: &[&str],
    seen_secs_ago: i64,
) {
    sqlx::query(
        "INSERT INTO gd_nodes (node_id, queues, fsms, last_seen_at)
         VALUES ($1, $2, $3, now() - $4 * interval '1 second')",
    )
    .bind(id)
    .bind(queues)
    .bind(fsms)
    .bind(seen_secs_ago as f64)
    .execute(pool)
    .await
    .expect("insert a node");
}

/// The status of instance `id`, or None if it is gone.
pub(crate) async fn status_of(pool: &PgPool, id: i64) -> Option<String> {
    sqlx::query_scalar("SELECT status::text FROM gd_instances WHERE id = $1")
        .bind(id)
        .fetch_optional(pool)
        .await
        .expect("read a status")
}
