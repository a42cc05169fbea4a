//! The checks a value passes before it reaches SQL: what PostgreSQL would reject, or
//! would accept and then fail on later. A rejected value is an [`Error::InvalidInput`]
//! for the caller of an insert or a signal, and a failed instance for a step's outcome
//! (see `runtime`): either way nothing of it is written, and no statement that carries
//! other rows with it can fail because of it.
//!
//! - **NUL characters.** `jsonb` cannot hold `\u0000` in a string (or a key) and `text`
//!   cannot hold a NUL byte; serde_json writes both happily.
//! - **Keys** (`partition_key`, `unique_key`, a signal's `dedup_key`, a queue name) are
//!   indexed by B-trees, whose entries are capped near 2.7 kB: a longer key is accepted by
//!   an insert and fails a later claim of its whole queue.
//! - **Delays and instants**: `now() + delay` overflows PostgreSQL's timestamp range
//!   (about 294,000 years) for a delay such as `Duration::MAX`.
//! - **Uniqueness scopes** a row could leave and re-enter (see [`scope`]).

use std::time::Duration;

use chrono::{DateTime, Datelike, Utc};
use serde_json::Value;

use crate::model::error::{Error, Result};
use crate::model::insert::NewInstance;
use crate::model::target::Target;
use crate::Status;

/// The longest key (partition, unique, dedup, queue), in bytes: well inside a B-tree
/// entry, and far above any key worth writing.
pub const MAX_KEY_BYTES: usize = 1024;

/// The longest delay (`schedule_in`, `Step::replay`, an await timeout): 10,000 years.
pub const MAX_DELAY: Duration = Duration::from_secs(10_000 * 365 * 24 * 3600);

fn invalid(what: &'static str, reason: String) -> Error {
    Error::InvalidInput { what, reason }
}

/// Where in `v` a string or key holds a NUL character, as a path (`state.items[2].name`):
/// only computed for the error.
fn nul_path(v: &Value, path: &mut String) -> bool {
    match v {
        Value::String(s) => s.contains('\0'),
        Value::Array(items) => items.iter().enumerate().any(|(i, item)| {
            let len = path.len();
            path.push_str(&format!("[{i}]"));
            let found = nul_path(item, path);
            if !found {
                path.truncate(len);
            }
            found
        }),
        Value::Object(map) => map.iter().any(|(k, item)| {
            let len = path.len();
            path.push('.');
            path.push_str(&k.replace('\0', "\\u0000"));
            let found = k.contains('\0') || nul_path(item, path);
            if !found {
                path.truncate(len);
            }
            found
        }),
        _ => false,
    }
}

/// Whether any string or key of `v` holds a NUL character (no allocation: this runs on
/// every step's state).
fn has_nul(v: &Value) -> bool {
    match v {
        Value::String(s) => s.contains('\0'),
        Value::Array(items) => items.iter().any(has_nul),
        Value::Object(map) => map
            .iter()
            .any(|(k, item)| k.contains('\0') || has_nul(item)),
        _ => false,
    }
}

/// A JSON value PostgreSQL's `jsonb` can store: no NUL character in any string or key.
pub(crate) fn json(what: &'static str, v: &Value) -> Result<()> {
    if !has_nul(v) {
        return Ok(());
    }
    let mut path = what.replace(' ', "_");
    if nul_path(v, &mut path) {
        return Err(invalid(
            what,
            format!(
                "{path} holds a NUL character (\\u0000), which PostgreSQL's jsonb cannot store"
            ),
        ));
    }
    Ok(())
}

/// Text PostgreSQL can store: no NUL byte.
pub(crate) fn text(what: &'static str, s: &str) -> Result<()> {
    if s.contains('\0') {
        return Err(invalid(
            what,
            "holds a NUL character, which PostgreSQL's text cannot store".into(),
        ));
    }
    Ok(())
}

/// A key: text of at most [`MAX_KEY_BYTES`].
pub(crate) fn key(what: &'static str, s: &str) -> Result<()> {
    if s.len() > MAX_KEY_BYTES {
        return Err(invalid(
            what,
            format!(
                "is {} bytes; keys are at most {MAX_KEY_BYTES} bytes (they are indexed)",
                s.len()
            ),
        ));
    }
    text(what, s)
}

/// A correlation key, at insert or as a target: a key, and not empty (an empty key
/// could only ever name every keyless caller's mistake).
pub(crate) fn correlation_key(k: &str) -> Result<()> {
    if k.is_empty() {
        return Err(invalid("correlation_key", "is empty".into()));
    }
    key("correlation_key", k)
}

/// A target: an id names itself; a key must be one a row could hold (the client's and
/// the testkit's check).
#[doc(hidden)]
pub fn check_target(t: &Target) -> Result<()> {
    match t {
        Target::Id(_) => Ok(()),
        Target::Key(k) => correlation_key(k),
    }
}

/// A delay of at most [`MAX_DELAY`].
pub(crate) fn delay(what: &'static str, d: Duration) -> Result<()> {
    if d > MAX_DELAY {
        return Err(invalid(
            what,
            format!(
                "{} s is out of range (at most {} s, 10,000 years)",
                d.as_secs(),
                MAX_DELAY.as_secs()
            ),
        ));
    }
    Ok(())
}

/// An instant PostgreSQL's `timestamptz` can hold (from 4713 BC; chrono's upper end is
/// below PostgreSQL's).
pub(crate) fn instant(what: &'static str, t: DateTime<Utc>) -> Result<()> {
    if t.year() < -4712 {
        return Err(invalid(
            what,
            format!("{t} is out of range (PostgreSQL's timestamps start in 4713 BC)"),
        ));
    }
    Ok(())
}

/// A uniqueness scope a row can never re-enter once it has left it: every live status
/// (plus, optionally, `done` and/or `failed`), or none. A scope that leaves a live status
/// out lets a row leave it and come back while another row took the key meanwhile — and
/// the engine statement that brings it back (a group commit, a reap, a delivery, a claim,
/// each carrying many rows) would fail on the unique index. The one way back into a
/// scope is `retry` of a failed row, which reports the conflict as [`Error::Duplicate`].
pub(crate) fn scope(scope: &[Status]) -> Result<()> {
    if scope.is_empty() || Status::NON_TERMINAL.iter().all(|s| scope.contains(s)) {
        return Ok(());
    }
    let missing: Vec<&str> = Status::NON_TERMINAL
        .iter()
        .filter(|s| !scope.contains(s))
        .map(|s| s.as_str())
        .collect();
    Err(invalid(
        "unique_scope",
        format!(
            "it leaves out {}: a scope must hold every live status (runnable, executing, \
             awaiting_signal, awaiting_children), optionally with done and/or failed, or be \
             empty, so that a row cannot leave it and come back while another row holds the key",
            missing.join(", ")
        ),
    ))
}

/// A signal name: 1 to 255 bytes, no NUL, and not holding the unit separator (awaited
/// names are stored joined by it).
pub(crate) fn signal_name(name: &str) -> Result<()> {
    let len = name.len();
    if !(1..=255).contains(&len) {
        return Err(Error::InvalidSignalName { len });
    }
    text("signal name", name)?;
    if name.contains('\u{1f}') {
        return Err(invalid(
            "signal name",
            "holds the unit separator U+001F, which gen_durable reserves".into(),
        ));
    }
    Ok(())
}

/// Every check of a signal before it is delivered (the client's and the testkit's):
/// its name, its payload's size and characters, its dedup key.
#[doc(hidden)]
pub fn check_signal(
    name: &str,
    payload: &Value,
    dedup_key: Option<&str>,
    max_payload: usize,
) -> Result<()> {
    signal_name(name)?;
    let size = serde_json::to_vec(payload)?.len();
    if size > max_payload {
        return Err(Error::PayloadTooLarge {
            size,
            limit: max_payload,
        });
    }
    json("signal payload", payload)?;
    if let Some(k) = dedup_key {
        key("dedup_key", k)?;
    }
    Ok(())
}

impl NewInstance {
    /// Every check of a row before it is inserted.
    pub(crate) fn validate(&self) -> Result<()> {
        json("state", &self.state)?;
        key("queue", &self.queue)?;
        text("step", &self.step)?;
        if let Some(k) = &self.partition_key {
            key("partition_key", k)?;
        }
        if let Some(g) = &self.gate {
            crate::model::gate::gate_name(g)?;
        }
        if let Some((name, k)) = &self.rate_limit {
            crate::model::gate::gate_name(name)?;
            key("rate limit key", k)?;
        }
        crate::model::rate_limit::weight(self.rate_weight)?;
        if let Some(k) = &self.unique_key {
            correlation_key(k)?;
        }
        if let Some(s) = &self.unique_scope {
            scope(s)?;
        }
        if let Some(t) = self.eligible_at {
            instant("eligible_at", t)?;
        }
        if let Some(d) = self.delay {
            delay("schedule_in", d)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn nul_is_found_with_its_path() {
        let v = json!({"a": [1, {"b": "x\u{0}y"}]});
        let e = json("state", &v).unwrap_err().to_string();
        assert!(e.contains("state.a[1].b"), "{e}");
        assert!(json("state", &json!({"a": "fine", "k": [null, 1.5]})).is_ok());
        let key = json!({"k\u{0}": 1});
        assert!(json("state", &key).is_err());
    }

    #[test]
    fn scopes_a_row_cannot_re_enter() {
        assert!(scope(&Status::NON_TERMINAL).is_ok());
        assert!(scope(&[]).is_ok());
        let mut all = Status::NON_TERMINAL.to_vec();
        all.push(Status::Done);
        assert!(scope(&all).is_ok());
        let e = scope(&[Status::Runnable]).unwrap_err().to_string();
        assert!(
            e.contains("executing, awaiting_signal, awaiting_children"),
            "{e}"
        );
    }

    #[test]
    fn keys_and_delays_have_limits() {
        assert!(key("partition_key", &"k".repeat(MAX_KEY_BYTES)).is_ok());
        assert!(key("partition_key", &"k".repeat(MAX_KEY_BYTES + 1)).is_err());
        assert!(delay("schedule_in", MAX_DELAY).is_ok());
        assert!(delay("schedule_in", Duration::MAX).is_err());
    }
}
