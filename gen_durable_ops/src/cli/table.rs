//! Plain-text tables and the small formatting helpers the human output shares.

use std::fmt::Write as _;

use chrono::{DateTime, Utc};
use serde_json::Value;

/// A table with a header row; columns whose cells are all numbers are right-aligned.
#[derive(Debug)]
pub(crate) struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub(crate) fn new<I, S>(headers: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Table {
            headers: headers.into_iter().map(Into::into).collect(),
            rows: Vec::new(),
        }
    }

    pub(crate) fn row(&mut self, cells: Vec<String>) {
        debug_assert_eq!(cells.len(), self.headers.len());
        self.rows.push(cells);
    }

    pub(crate) fn render(&self) -> String {
        let n = self.headers.len();
        let width = |i: usize| {
            self.rows
                .iter()
                .map(|r| r[i].chars().count())
                .chain([self.headers[i].chars().count()])
                .max()
                .unwrap_or(0)
        };
        let widths: Vec<usize> = (0..n).map(width).collect();
        let numeric: Vec<bool> = (0..n)
            .map(|i| {
                !self.rows.is_empty()
                    && self
                        .rows
                        .iter()
                        .all(|r| r[i].is_empty() || r[i].parse::<f64>().is_ok())
            })
            .collect();
        let mut out = String::new();
        for cells in std::iter::once(&self.headers).chain(&self.rows) {
            let mut line = String::new();
            for (i, cell) in cells.iter().enumerate() {
                if i > 0 {
                    line.push_str("  ");
                }
                let pad = widths[i] - cell.chars().count();
                if numeric[i] {
                    line.extend(std::iter::repeat_n(' ', pad));
                    line.push_str(cell);
                } else {
                    line.push_str(cell);
                    if i + 1 < n {
                        line.extend(std::iter::repeat_n(' ', pad));
                    }
                }
            }
            let _ = writeln!(out, "{}", line.trim_end());
        }
        out
    }
}

/// `2026-11-30 09:41:39 UTC`, to the second: operators compare these by eye.
pub(crate) fn time(t: &DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

/// A stored timestamp as `to_jsonb` writes it, reformatted like [`time`].
pub(crate) fn json_time(v: &Value) -> Option<String> {
    let s = v.as_str()?;
    DateTime::parse_from_rfc3339(s)
        .map(|t| time(&t.with_timezone(&Utc)))
        .ok()
        .or_else(|| Some(s.to_string()))
}

/// A span of seconds as an operator reads it: `850ms`, `4.2s`, `3m 12s`, `2h 5m`, `3d 4h`.
pub(crate) fn span(secs: f64) -> String {
    let secs = secs.max(0.0);
    if secs < 1.0 {
        return format!("{}ms", (secs * 1000.0).round() as u64);
    }
    if secs < 60.0 {
        return format!("{secs:.1}s");
    }
    let s = secs.round() as u64;
    let (d, h, m, s) = (s / 86_400, s % 86_400 / 3_600, s % 3_600 / 60, s % 60);
    match (d, h, m) {
        (0, 0, m) => format!("{m}m {s}s"),
        (0, h, m) => format!("{h}h {m}m"),
        (d, h, _) => format!("{d}d {h}h"),
    }
}

/// Tokens per second, as a rate an operator reads.
pub(crate) fn rate(per_second: f64) -> String {
    if per_second >= 1.0 {
        format!("{}/s", number(per_second))
    } else {
        format!("1 every {}", span(1.0 / per_second))
    }
}

/// A token count: at most two decimals, none when whole.
pub(crate) fn number(x: f64) -> String {
    let s = format!("{x:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".to_string()
    } else {
        s.to_string()
    }
}

/// A row's `attempt` (earlier runs of its step, 0 on the first) as people count runs:
/// from 1, as the history and `explain` do.
pub(crate) fn attempt(v: &Value) -> String {
    match v.as_i64() {
        Some(n) => (n + 1).to_string(),
        None => cell(v),
    }
}

/// A JSON value on one line; strings without their quotes; null as `-`.
pub(crate) fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_rates_read_as_an_operator_writes_them() {
        assert_eq!(number(3.0), "3");
        assert_eq!(number(-2.5), "-2.5");
        assert_eq!(number(1.0 / 3.0), "0.33");
        assert_eq!(number(-0.001), "0");
        assert_eq!(rate(10.0), "10/s");
        assert_eq!(rate(100.0 / 60.0), "1.67/s");
        assert!(
            rate(1.0 / 60.0).starts_with("1 every "),
            "{}",
            rate(1.0 / 60.0)
        );
    }

    #[test]
    fn spans() {
        assert_eq!(span(0.25), "250ms");
        assert_eq!(span(4.21), "4.2s");
        assert_eq!(span(192.0), "3m 12s");
        assert_eq!(span(7_500.0), "2h 5m");
        assert_eq!(span(273_600.0), "3d 4h");
    }

    #[test]
    fn tables_align() {
        let mut t = Table::new(["queue", "count"]);
        t.row(vec!["checkout".into(), "3".into()]);
        t.row(vec!["a".into(), "120".into()]);
        assert_eq!(
            t.render(),
            "queue     count\ncheckout      3\na           120\n"
        );
    }
}
