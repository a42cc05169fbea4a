//! Counting the SQL statements gen_durable sends to Postgres, by kind: what the
//! statement-count test asserts and what the benchmark harness reports.
//!
//! sqlx 0.8 emits one `tracing` event (target `sqlx::query`) per statement it executes
//! on a connection whose options log statements (the default of a parsed URL). A
//! [`StatementLog`] is a `tracing` subscriber that listens to those events only and
//! records each statement's [`kind`](classify) and row counts, in order. Pools whose
//! statements must not be counted are built with `disable_statement_logging()`
//! ([`TestDb`](crate::TestDb)'s pool is). sqlx does not log the `BEGIN` it queues when a
//! transaction starts, nor its pool's ping before an acquire.
//!
//! The log also keeps the server's notices (target `sqlx::postgres::notice`), which is
//! how the harness reads `auto_explain` plans of the statements inside a function.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use tracing::field::{Field, Visit};
use tracing::span;
use tracing::subscriber::Interest;
use tracing::{Event, Metadata, Subscriber};

/// The kinds a marker may name, in the engine's statements of `gen_durable/src/store/pg`
/// (and its setup, the CLI's reads, and its `BEGIN`):
///
/// - `claim`: the pick; `handoff`: a group commit's claim of the rows that take the gate
///   slots it freed; `fence`: the lock of a batch that spawns children; `apply`: the
///   group commit (`gd_commit_outcomes`); `insert`: inserting instances; `signal`: a
///   delivery; `wait`: a wait's reads and its client's probe; `notify`: a bare
///   wake-up of a queue;
/// - `heartbeat`: lease extension; `reap`: the reaper (and its list of expired rows);
///   `release`: rows a draining worker gives back; `await_timeouts`: await deadlines
///   (and the next one); `announce`: a node's announce and forget; `collect`: the
///   collector's (and the CLI's `gc`) delete of terminal rows;
/// - `cancel`: the statements of a cancel (of one instance or a batch); `retry`: a retry
///   or a restart at a named step (and the restart's read of the steps); `pause`: pausing,
///   resuming and listing paused queues;
/// - `setup`: the engine's start; `begin`: the engine's `BEGIN` at READ COMMITTED (sqlx
///   does not log it); `admin`: the CLI's reads (status, inspect, schema state);
/// - `explain`: `Client::explain`'s read of one instance and its evidence.
/// - `history`: `Client::history`'s read of an instance's entries.
/// - `dashboard`: the web dashboard's own reads (`gen_durable_ops`).
pub const MARKED_KINDS: &[&str] = &[
    "advance",
    "claim",
    "handoff",
    "gate",
    "rate_limit",
    "fence",
    "apply",
    "insert",
    "signal",
    "wait",
    "notify",
    "heartbeat",
    "reap",
    "release",
    "await_timeouts",
    "announce",
    "collect",
    "cancel",
    "retry",
    "setup",
    "begin",
    "admin",
    "schedule",
    "migrate",
    "explain",
    "history",
    "dashboard",
    "pause",
];

/// The literal each `const NAME: &str = …;` of a Rust source starts with: (name, text).
/// What the statement-marker tests of the crates that write SQL scan their files with; a
/// constant built by a macro (`deliver!(…)`) is left out, for its caller to check by value.
pub fn sql_constants(src: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = src;
    while let Some(at) = rest.find("const ") {
        rest = &rest[at + "const ".len()..];
        let Some((name, after)) = rest.split_once(": &str =") else {
            continue;
        };
        if !name.chars().all(|c| c.is_ascii_uppercase() || c == '_') {
            continue;
        }
        let after = after.trim_start();
        let macro_call = after
            .split_once('!')
            .is_some_and(|(name, _)| name.chars().all(|c| c.is_ascii_lowercase() || c == '_'));
        if macro_call {
            // Built by a macro (`deliver!(…)`): its caller checks it by value.
            continue;
        }
        let text = if let Some(raw) = after.strip_prefix("r#\"") {
            raw.split_once("\"#").map(|(t, _)| t)
        } else if let Some(plain) = after.strip_prefix('"') {
            plain.split_once('"').map(|(t, _)| t)
        } else {
            None
        };
        out.push((name.to_string(), text.unwrap_or_default().to_string()));
    }
    out
}

/// Panics unless every SQL constant of every `.rs` file under `dir` (test files aside:
/// `tests.rs` and `tests/`) opens with a known `/* gd:KIND */` marker ([`classify`] does
/// not call it `other`); returns how many it checked, so a caller can tell that the scan
/// found its statements. A new statement file is covered without being listed; `not_sql`
/// names the `&str` constants there that are not statements (a channel name, an error code).
pub fn assert_marked(dir: &std::path::Path, not_sql: &[&str]) -> usize {
    let mut seen = 0;
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.unwrap().path();
        let name = path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        if path.is_dir() {
            if name != "tests" {
                seen += assert_marked(&path, not_sql);
            }
            continue;
        }
        if !name.ends_with(".rs") || name == "tests.rs" {
            continue;
        }
        let src = std::fs::read_to_string(&path).unwrap();
        for (constant, sql) in sql_constants(&src) {
            if not_sql.contains(&constant.as_str()) {
                continue;
            }
            let file = path.display();
            assert!(
                sql.starts_with("/* gd:"),
                "{file}: {constant} does not start with its /* gd:KIND */ marker"
            );
            assert_ne!(
                classify(&sql),
                "other",
                "{file}: {constant}: an unknown marker"
            );
            seen += 1;
        }
    }
    seen
}

/// The kind of a statement, from the marker comment every statement of gen_durable starts
/// with: `/* gd:claim */ WITH picked AS MATERIALIZED …` is a `claim`. The kind is one of
/// [`MARKED_KINDS`]; a marker naming anything else is `other`.
///
/// A statement without a marker is one sqlx sends itself: `begin`, `commit` or `rollback`
/// (a transaction's), `listen` (`LISTEN`/`UNLISTEN` of a `PgListener`) or `type_lookup`
/// (a custom type such as `gd_status` resolved from `pg_catalog` once per connection).
/// Anything else is `other`: not the engine's, or a new statement without its marker.
pub fn classify(sql: &str) -> &'static str {
    let s = sql.trim_start();
    if let Some(rest) = s.strip_prefix("/* gd:") {
        let name = rest.split_once("*/").map_or("", |(name, _)| name.trim());
        return MARKED_KINDS
            .iter()
            .find(|k| **k == name)
            .copied()
            .unwrap_or("other");
    }
    if s.contains("pg_catalog.") || s.starts_with("SELECT $1::regtype") {
        "type_lookup"
    } else if s.starts_with("BEGIN") {
        "begin"
    } else if s.starts_with("COMMIT") {
        "commit"
    } else if s.starts_with("ROLLBACK") {
        "rollback"
    } else if s.starts_with("LISTEN") || s.starts_with("UNLISTEN") {
        "listen"
    } else {
        "other"
    }
}

/// One statement executed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Statement {
    /// Its [kind](classify).
    pub kind: &'static str,
    /// Rows it returned.
    pub rows_returned: u64,
    /// Rows it wrote.
    pub rows_affected: u64,
}

/// Statements of one kind, added up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KindCount {
    /// How many.
    pub statements: u64,
    /// Rows they returned.
    pub rows_returned: u64,
    /// Rows they wrote.
    pub rows_affected: u64,
}

/// Adds `statements` up by kind.
pub fn by_kind(statements: &[Statement]) -> BTreeMap<&'static str, KindCount> {
    let mut map: BTreeMap<&'static str, KindCount> = BTreeMap::new();
    for s in statements {
        let t = map.entry(s.kind).or_default();
        t.statements += 1;
        t.rows_returned += s.rows_returned;
        t.rows_affected += s.rows_affected;
    }
    map
}

/// A `tracing` subscriber that records the statements sqlx logs, in order. Install it
/// globally (a benchmark) or for one thread with `tracing::subscriber::set_default` and
/// a current-thread runtime (a test).
#[derive(Debug, Clone, Default)]
pub struct StatementLog {
    seen: Arc<Mutex<Vec<Statement>>>,
    /// The text of the first statement of each kind (the exact SQL sent).
    texts: Arc<Mutex<BTreeMap<&'static str, String>>>,
    notices: Arc<Mutex<Vec<String>>>,
}

impl StatementLog {
    /// A new, empty log.
    pub fn new() -> Self {
        Self::default()
    }

    /// The statements recorded so far; the log starts again from empty.
    pub fn take(&self) -> Vec<Statement> {
        std::mem::take(&mut *self.seen.lock().expect("statement log"))
    }

    /// The server's notices received so far; the list starts again from empty.
    pub fn take_notices(&self) -> Vec<String> {
        std::mem::take(&mut *self.notices.lock().expect("notices"))
    }

    /// The SQL of the first statement seen of `kind`.
    pub fn text(&self, kind: &str) -> Option<String> {
        self.texts
            .lock()
            .expect("statement texts")
            .get(kind)
            .cloned()
    }
}

#[derive(Default)]
struct Fields {
    message: String,
    summary: String,
    statement: String,
    rows_returned: u64,
    rows_affected: u64,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "message" => self.message = value.to_string(),
            "summary" => self.summary = value.to_string(),
            "db.statement" => self.statement = value.to_string(),
            _ => {}
        }
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        match field.name() {
            "rows_returned" => self.rows_returned = value,
            "rows_affected" => self.rows_affected = value,
            _ => {}
        }
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        // These normally arrive as &str; take them either way.
        if matches!(field.name(), "message" | "summary" | "db.statement") {
            self.record_str(field, &format!("{value:?}"));
        }
    }
}

const NOTICE: &str = "sqlx::postgres::notice";

fn is_query(meta: &Metadata<'_>) -> bool {
    meta.target() == "sqlx::query"
}

fn listens(meta: &Metadata<'_>) -> bool {
    is_query(meta) || meta.target() == NOTICE
}

impl Subscriber for StatementLog {
    fn register_callsite(&self, meta: &'static Metadata<'static>) -> Interest {
        if listens(meta) {
            Interest::always()
        } else {
            Interest::never()
        }
    }
    fn enabled(&self, meta: &Metadata<'_>) -> bool {
        listens(meta)
    }
    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::TRACE)
    }
    fn new_span(&self, _: &span::Attributes<'_>) -> span::Id {
        span::Id::from_u64(1)
    }
    fn record(&self, _: &span::Id, _: &span::Record<'_>) {}
    fn record_follows_from(&self, _: &span::Id, _: &span::Id) {}
    fn event(&self, event: &Event<'_>) {
        if !listens(event.metadata()) {
            return;
        }
        let mut f = Fields::default();
        event.record(&mut f);
        if !is_query(event.metadata()) {
            self.notices.lock().expect("notices").push(f.message);
            return;
        }
        // sqlx puts the whole text in `db.statement` only when the summary shortens it.
        let text = if f.statement.trim().is_empty() {
            &f.summary
        } else {
            &f.statement
        };
        let kind = classify(text);
        self.seen.lock().expect("statement log").push(Statement {
            kind,
            rows_returned: f.rows_returned,
            rows_affected: f.rows_affected,
        });
        self.texts
            .lock()
            .expect("statement texts")
            .entry(kind)
            .or_insert_with(|| text.trim().to_string());
    }
    fn enter(&self, _: &span::Id) {}
    fn exit(&self, _: &span::Id) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_engines_statements_are_told_apart_by_their_marker() {
        assert_eq!(
            classify("/* gd:claim */\nWITH picked AS MATERIALIZED (SELECT 1)"),
            "claim"
        );
        // As sqlx logs a long statement: its text after two newlines.
        assert_eq!(
            classify("\n\n/* gd:apply */\nSELECT committed FROM gd_commit_outcomes($1)\n"),
            "apply"
        );
        // Or only the summary, its first four words.
        assert_eq!(classify("/* gd:notify */ SELECT …"), "notify");
        // The marker decides, not the text after it.
        assert_eq!(
            classify("/* gd:retry */ WITH locked AS MATERIALIZED"),
            "retry"
        );
        for kind in MARKED_KINDS {
            assert_eq!(classify(&format!("/* gd:{kind} */ SELECT 1")), *kind);
            assert_eq!(classify(&format!("  /* gd:{kind} */\nSELECT 1")), *kind);
        }
        assert_eq!(classify("/* gd:nonsense */ SELECT 1"), "other");
        assert_eq!(
            classify("/* gd:claim SELECT 1"),
            "other",
            "an unclosed marker"
        );
        assert_eq!(classify("/* claim */ SELECT 1"), "other");
    }

    #[test]
    fn unmarked_statements_are_sqlxs_own_or_other() {
        assert_eq!(classify("BEGIN"), "begin");
        assert_eq!(classify("COMMIT"), "commit");
        assert_eq!(classify("ROLLBACK"), "rollback");
        assert_eq!(classify(r#"LISTEN "gd_wake""#), "listen");
        assert_eq!(classify("UNLISTEN *"), "listen");
        assert_eq!(
            classify("SELECT enumlabel\nFROM pg_catalog.pg_enum\nWHERE enumtypid = $1"),
            "type_lookup"
        );
        assert_eq!(classify("SELECT $1::regtype::oid"), "type_lookup");
        // The engine's text without its marker is no longer recognized by fragments.
        assert_eq!(classify("WITH picked AS MATERIALIZED (SELECT 1)"), "other");
        assert_eq!(classify("SELECT pg_notify('gd_wake', $1)"), "other");
        assert_eq!(classify("SELECT 42"), "other");
    }

    #[test]
    fn statements_add_up_by_kind() {
        let s = |kind, rows_returned| Statement {
            kind,
            rows_returned,
            rows_affected: 0,
        };
        let t = by_kind(&[s("claim", 3), s("apply", 1), s("claim", 2)]);
        assert_eq!(t["claim"].statements, 2);
        assert_eq!(t["claim"].rows_returned, 5);
        assert_eq!(t["apply"].statements, 1);
    }
}
