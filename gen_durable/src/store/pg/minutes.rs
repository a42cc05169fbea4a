//! The per-minute rollup of finished instances (`gd_minutes`, schema.sql), written by the
//! collector: what the dashboard's charts over hours and days read, since a week's
//! finished rows are far too many to read for a page.

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;

use crate::model::error::Result;

/// Minutes one pass rolls at most: a pass that is behind reads no more than this many
/// minutes of finished rows, and the collector runs again at once.
pub(crate) const MINUTES_PER_PASS: i64 = 10;

/// How long the rollup is kept.
pub(crate) const KEPT_DAYS: i64 = 31;

/// Rolls up the minutes after the last one rolled (the newest `'*'` row; on the first
/// roll, the first minute a row finished in; at most a day back) that ended more than a minute before `$1` — a step's commit stamps `finished_at`
/// with its transaction's clock, so a commit still in flight may belong to the last
/// minute — and at most `$2` of them. Reads those minutes' finished rows through the
/// collector's index `gd_instances_finished`, so its cost is the rows that finished in
/// them. Writes a row per (minute, queue) with rows and a `'*'` row per minute, even an
/// empty one; several collectors at once write the same rows, and the second's are
/// dropped (`ON CONFLICT DO NOTHING`). Deletes the minutes older than `$3` days. Returns
/// the minutes it rolled, and whether more are due.
const ROLL: &str = r#"/* gd:collect */
WITH t AS (SELECT date_trunc('minute', coalesce($1, now())) AS minute),
b AS (
    SELECT (SELECT max(minute) FROM gd_minutes WHERE queue = '*') + interval '1 minute' AS lo,
           t.minute - interval '1 minute' AS top
      FROM t
), w AS (
    SELECT greatest(coalesce(b.lo,
                             (SELECT date_trunc('minute', min(finished_at)) FROM gd_instances
                               WHERE status IN ('done', 'failed')),
                             b.top),
                    t.minute - interval '1 day') AS lo,
           b.top
      FROM b, t
), span AS (
    SELECT lo, greatest(lo, least(lo + $2 * interval '1 minute', top)) AS hi, top FROM w
), f AS (
    SELECT date_trunc('minute', i.finished_at) AS minute, i.queue, i.status,
           CASE WHEN i.finished_at - i.inserted_at < interval '1 millisecond' THEN 1
                ELSE least(32, 2 + floor(log(2, (extract(epoch FROM i.finished_at - i.inserted_at)
                                                  * 1000)::numeric))::int)
           END AS slot
      FROM gd_instances i, span
     WHERE i.status IN ('done', 'failed') AND i.finished_at >= span.lo AND i.finished_at < span.hi
), cells AS (
    SELECT minute, coalesce(queue, '*') AS queue, slot,
           count(*) FILTER (WHERE status = 'done') AS done,
           count(*) FILTER (WHERE status = 'failed') AS failed
      FROM f
     GROUP BY GROUPING SETS ((minute, queue, slot), (minute, slot))
), rolled AS (
    -- Each (minute, queue)'s slots gathered once, then laid out in 32 places.
    SELECT k.minute, k.queue, k.done, k.failed,
           ARRAY(SELECT coalesce(k.counts[array_position(k.slots, g)], 0)
                   FROM generate_series(1, 32) g ORDER BY g) AS took_ms
      FROM (SELECT minute, queue, sum(done)::int8 AS done, sum(failed)::int8 AS failed,
                   array_agg(slot) AS slots, array_agg(done + failed) AS counts
              FROM cells
             GROUP BY minute, queue) k
    UNION ALL
    SELECT m, '*', 0, 0, array_fill(0::int8, ARRAY[32])
      FROM span, generate_series(span.lo, span.hi - interval '1 minute', interval '1 minute') m
     WHERE NOT EXISTS (SELECT 1 FROM cells c WHERE c.minute = m)
), written AS (
    INSERT INTO gd_minutes (minute, queue, done, failed, took_ms)
    SELECT minute, queue, done, failed, took_ms FROM rolled
    ON CONFLICT (queue, minute) DO NOTHING
    RETURNING queue
), forgotten AS (
    DELETE FROM gd_minutes WHERE minute < (SELECT minute FROM t) - $3 * interval '1 day'
)
SELECT (SELECT count(*) FROM rolled WHERE queue = '*') AS minutes,
       (SELECT hi < top FROM span) AS behind
"#;

/// What one roll did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::FromRow)]
pub(crate) struct Rolled {
    /// Minutes rolled.
    pub(crate) minutes: i64,
    /// More minutes are due: the pass stopped at [`MINUTES_PER_PASS`].
    pub(crate) behind: bool,
}

/// Rolls up the minutes due at `now` (the database's clock when `None`), at most
/// [`MINUTES_PER_PASS`], and forgets those older than [`KEPT_DAYS`].
pub(crate) async fn roll<'e>(
    db: impl PgExecutor<'e>,
    now: Option<DateTime<Utc>>,
) -> Result<Rolled> {
    Ok(sqlx::query_as(ROLL)
        .bind(now)
        .bind(MINUTES_PER_PASS)
        .bind(KEPT_DAYS)
        .fetch_one(db)
        .await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (minute, queue, done, failed, took_ms) of every rolled row.
    type Row = (DateTime<Utc>, String, i64, i64, Vec<i64>);

    fn at(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    /// The histogram with `n` at each (1-based) slot given.
    fn took(slots: &[(usize, i64)]) -> Vec<i64> {
        let mut h = vec![0; 32];
        for (slot, n) in slots {
            h[slot - 1] = *n;
        }
        h
    }

    #[tokio::test]
    async fn minutes_roll_up_once_by_queue_and_in_all_with_how_long_rows_took() {
        let db = gen_durable_testkit::TestDb::new().await;
        let pool = db.pool();
        // Finished rows: two in queue a's 11:55 (under 1 ms; 70 s: 2^16 ≤ 70,000 < 2^17 ms,
        // slot 18), one in b's 11:57 (3 ms: slot 3), one at 11:59:30 (too recent at
        // 12:00:30: its minute has not been over for a minute), and a runnable row.
        sqlx::raw_sql(
            "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, status,
                                       inserted_at, updated_at)
             VALUES ('F', 1, 's', '{}', 'a', 'done', '2026-12-01 11:55:00+00', '2026-12-01 11:55:00.0004+00'),
                    ('F', 1, 's', '{}', 'a', 'failed', '2026-12-01 11:54:00+00', '2026-12-01 11:55:10+00'),
                    ('F', 1, 's', '{}', 'b', 'done', '2026-12-01 11:57:20+00', '2026-12-01 11:57:20.003+00'),
                    ('F', 1, 's', '{}', 'b', 'done', '2026-12-01 11:59:00+00', '2026-12-01 11:59:30+00'),
                    ('F', 1, 's', '{}', 'b', 'runnable', '2026-12-01 11:56:00+00', '2026-12-01 11:56:00+00')",
        )
        .execute(pool)
        .await
        .unwrap();
        let rows = || async {
            sqlx::query_as::<_, Row>(
                "SELECT minute, queue, done, failed, took_ms FROM gd_minutes ORDER BY minute, queue",
            )
            .fetch_all(pool)
            .await
            .unwrap()
        };

        // From the first finished row's minute to the last that has been over a minute.
        let r = roll(pool, Some(at("2026-12-01T12:00:30Z"))).await.unwrap();
        assert_eq!(
            r,
            Rolled {
                minutes: 4,
                behind: false
            }
        );
        let got = rows().await;
        let want: Vec<Row> = vec![
            (
                at("2026-12-01T11:55:00Z"),
                "*".into(),
                1,
                1,
                took(&[(1, 1), (18, 1)]),
            ),
            (
                at("2026-12-01T11:55:00Z"),
                "a".into(),
                1,
                1,
                took(&[(1, 1), (18, 1)]),
            ),
            (at("2026-12-01T11:56:00Z"), "*".into(), 0, 0, took(&[])),
            (
                at("2026-12-01T11:57:00Z"),
                "*".into(),
                1,
                0,
                took(&[(3, 1)]),
            ),
            (
                at("2026-12-01T11:57:00Z"),
                "b".into(),
                1,
                0,
                took(&[(3, 1)]),
            ),
            (at("2026-12-01T11:58:00Z"), "*".into(), 0, 0, took(&[])),
        ];
        assert_eq!(got, want);

        // Again at the same time: nothing new. A minute later: 11:59, with its row.
        let r = roll(pool, Some(at("2026-12-01T12:00:59Z"))).await.unwrap();
        assert_eq!(
            r,
            Rolled {
                minutes: 0,
                behind: false
            }
        );
        assert_eq!(rows().await.len(), 6);
        let r = roll(pool, Some(at("2026-12-01T12:01:05Z"))).await.unwrap();
        assert_eq!(
            r,
            Rolled {
                minutes: 1,
                behind: false
            }
        );
        let got = rows().await;
        assert_eq!(got.len(), 8);
        assert_eq!(
            got[6],
            (
                at("2026-12-01T11:59:00Z"),
                "*".into(),
                1,
                0,
                took(&[(16, 1)])
            )
        );

        // An hour later, a pass rolls at most MINUTES_PER_PASS minutes and says it is behind.
        let r = roll(pool, Some(at("2026-12-01T13:01:05Z"))).await.unwrap();
        assert_eq!(
            r,
            Rolled {
                minutes: MINUTES_PER_PASS,
                behind: true
            }
        );
        // And minutes older than KEPT_DAYS are forgotten.
        let later = at("2026-12-01T13:01:05Z") + chrono::Duration::days(KEPT_DAYS + 1);
        roll(pool, Some(later)).await.unwrap();
        let left: i64 =
            sqlx::query_scalar("SELECT count(*) FROM gd_minutes WHERE minute < '2026-12-02+00'")
                .fetch_one(pool)
                .await
                .unwrap();
        assert_eq!(left, 0);
        db.close().await;
    }
}
