//! Times and counts as an explanation writes them: `2026-12-02 14:00:00 UTC (in 3 min)`,
//! `≥10,000`.

use chrono::{DateTime, Utc};

use super::Count;

/// `2026-12-02 14:00:00 UTC (in 3 min)`, relative to `now`.
pub(super) fn at(t: DateTime<Utc>, now: DateTime<Utc>) -> String {
    format!(
        "{} ({})",
        t.format("%Y-%m-%d %H:%M:%S UTC"),
        relative(t, now)
    )
}

/// `in 3 min`, `12 s ago`, `now`: the largest whole unit, rounded down.
pub(super) fn relative(t: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let ms = (t - now).num_milliseconds();
    let span = span(ms.unsigned_abs() / 1000);
    match ms {
        ..=-1000 => format!("{span} ago"),
        1000.. => format!("in {span}"),
        _ => "now".to_string(),
    }
}

fn span(secs: u64) -> String {
    match secs {
        0..60 => format!("{secs} s"),
        60..3_600 => format!("{} min", secs / 60),
        3_600..86_400 => format!("{} h", secs / 3_600),
        _ => format!("{} d", secs / 86_400),
    }
}

/// `1,234`, or `≥10,000` for a capped count.
pub(super) fn count(c: Count) -> String {
    let digits = c.n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(ch);
    }
    if c.capped {
        format!("≥{out}")
    } else {
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn times_and_counts_read_as_english() {
        let now = Utc.with_ymd_and_hms(2026, 12, 2, 13, 57, 0).unwrap();
        let t = Utc.with_ymd_and_hms(2026, 12, 2, 14, 0, 0).unwrap();
        assert_eq!(at(t, now), "2026-12-02 14:00:00 UTC (in 3 min)");
        assert_eq!(relative(now, t), "3 min ago");
        assert_eq!(relative(now, now), "now");
        assert_eq!(
            relative(now + chrono::Duration::seconds(45), now),
            "in 45 s"
        );
        assert_eq!(relative(now + chrono::Duration::days(3), now), "in 3 d");
        assert_eq!(count(Count::bounded(7)), "7");
        assert_eq!(count(Count::bounded(1234)), "1,234");
        assert_eq!(count(Count::bounded(10_000)), "≥10,000");
    }
}
