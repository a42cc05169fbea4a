//! Counts the statements sqlx sends, by kind, from its `sqlx::query` tracing events.
//!
//! sqlx 0.8 emits one event (target `sqlx::query`) per executed statement on every
//! connection whose options log statements (the default of a parsed URL: DEBUG, and
//! WARN for statements slower than 1 s). Pools that must not be counted are built with
//! `disable_statement_logging()`. Only the counting happens here: no formatting, no I/O.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use tracing::field::{Field, Visit};
use tracing::span;
use tracing::subscriber::Interest;
use tracing::{Event, Metadata, Subscriber};

/// What one kind of statement added up to.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub(crate) struct Tally {
    pub(crate) statements: u64,
    pub(crate) rows_returned: u64,
    pub(crate) rows_affected: u64,
}

/// Statement counts by kind, shared with the subscriber.
#[derive(Debug, Clone, Default)]
pub(crate) struct Counts {
    tallies: Arc<Mutex<BTreeMap<&'static str, Tally>>>,
    /// The text of the first statement seen of each kind (the exact SQL the engine sends).
    texts: Arc<Mutex<BTreeMap<&'static str, String>>>,
}

impl Counts {
    /// Takes the counts so far and starts again from zero.
    pub(crate) fn take(&self) -> BTreeMap<&'static str, Tally> {
        std::mem::take(&mut *self.tallies.lock().expect("counts"))
    }

    /// The SQL of a statement kind seen so far (e.g. "claim", "apply").
    pub(crate) fn text(&self, kind: &str) -> Option<String> {
        self.texts.lock().expect("texts").get(kind).cloned()
    }
}

/// The kind of a statement, from markers in its text that the engine's statements carry.
pub(crate) fn classify(sql: &str) -> &'static str {
    let s = sql.trim_start();
    if s.contains("WITH picked AS MATERIALIZED") {
        "claim"
    } else if s.contains("FOR NO KEY UPDATE OF i") && s.contains("AS f(id, epoch)") {
        "fence"
    } else if s.starts_with("WITH o AS") {
        "apply"
    } else if s.contains("INSERT INTO gd_instances") {
        "insert"
    } else if s.contains("INSERT INTO gd_signals") {
        "signal"
    } else if s.contains("SET lease_expires_at = coalesce($4") {
        "heartbeat"
    } else if s.contains("WITH expired AS MATERIALIZED") {
        "reap"
    } else if s.contains("WITH due AS MATERIALIZED") || s.contains("min(await_deadline)") {
        "await_timeouts"
    } else if s.contains("gd_nodes") {
        "announce"
    } else if s.starts_with("SELECT pg_notify(") {
        "notify"
    } else if s.contains("pg_catalog.pg_type") || s.contains("enumlabel") {
        // sqlx resolving a custom type (gd_status) once per new connection.
        "type_lookup"
    } else if s.eq_ignore_ascii_case("BEGIN") || s.starts_with("BEGIN") {
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

/// A `tracing` subscriber that only listens to `sqlx::query`.
#[derive(Debug, Clone, Default)]
pub(crate) struct StatementCounter {
    pub(crate) counts: Counts,
}

#[derive(Default)]
struct Fields {
    summary: String,
    statement: String,
    rows_returned: u64,
    rows_affected: u64,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
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
        // `summary` and `db.statement` arrive as &str normally; take them either way.
        if matches!(field.name(), "summary" | "db.statement") {
            self.record_str(field, &format!("{value:?}"));
        }
    }
}

fn is_query(meta: &Metadata<'_>) -> bool {
    meta.target() == "sqlx::query"
}

impl Subscriber for StatementCounter {
    fn register_callsite(&self, meta: &'static Metadata<'static>) -> Interest {
        if is_query(meta) {
            Interest::always()
        } else {
            Interest::never()
        }
    }
    fn enabled(&self, meta: &Metadata<'_>) -> bool {
        is_query(meta)
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
        if !is_query(event.metadata()) {
            return;
        }
        let mut f = Fields::default();
        event.record(&mut f);
        // sqlx puts the whole text in `db.statement` only when the summary shortens it.
        let text = if f.statement.trim().is_empty() {
            &f.summary
        } else {
            &f.statement
        };
        let kind = classify(text);
        {
            let mut map = self.counts.tallies.lock().expect("counts");
            let t = map.entry(kind).or_default();
            t.statements += 1;
            t.rows_returned += f.rows_returned;
            t.rows_affected += f.rows_affected;
        }
        let mut texts = self.counts.texts.lock().expect("texts");
        if !texts.contains_key(kind) {
            texts.insert(kind, text.trim().to_string());
        }
    }
    fn enter(&self, _: &span::Id) {}
    fn exit(&self, _: &span::Id) {}
}
