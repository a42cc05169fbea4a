//! Inserting instances: one statement for one row or twenty thousand.

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;

use crate::model::error::Result;
use crate::model::insert::NewInstance;
use crate::store::pg::millis;

/// The batch insert, with `$tail` between the rows and `RETURNING` (see [`INSERT`]).
macro_rules! insert {
    ($tail:literal) => {
        concat!(
            r#"/* gd:insert */
WITH input AS (
    SELECT *
    FROM unnest($1::text[], $2::int4[], $3::text[], $4::jsonb[], $5::text[], $6::int2[],
                $7::text[], $8::text[], $9::text[], $10::timestamptz[], $11::int8[], $12::int4[],
                $14::int8[], $16::text[], $17::text[], $18::text[], $19::float8[])
         WITH ORDINALITY AS t(fsm, fsm_version, step, state, queue, priority, partition_key,
                              unique_key, unique_scope, eligible_at, delay_ms, max_reaps,
                              parent_id, gate, rate_limit, rate_key, rate_weight, ord)
), ins AS (
    INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, priority, partition_key,
                              unique_key, unique_scope, eligible_at, max_reaps, parent_id,
                              inserted_at, updated_at, gate, rate_limit, rate_key,
                              rate_weight, rate_step, ready_seq)
    SELECT fsm, fsm_version, step, state, queue, priority, partition_key, unique_key,
           string_to_array(unique_scope, ',')::gd_status[],
           coalesce(eligible_at,
                    coalesce($13, statement_timestamp()) + coalesce(delay_ms, 0) * interval '1 millisecond'),
           max_reaps, parent_id, coalesce($13, statement_timestamp()), coalesce($13, statement_timestamp()),
           gate, rate_limit, rate_key,
           CASE WHEN rate_limit IS NOT NULL THEN gd_rate_weight(rate_limit, rate_weight) END,
           CASE WHEN rate_limit IS NOT NULL THEN step END,
           CASE WHEN partition_key IS NULL AND gate IS NULL AND rate_limit IS NULL THEN 0 END
    FROM input"#,
            $tail,
            r#"
    RETURNING id, parent_id, queue, eligible_at, ready_seq
), pending AS (
    INSERT INTO gd_appends (ids)
    SELECT array_agg(id) FROM ins WHERE ready_seq = 0 HAVING count(*) > 0
)
SELECT coalesce(array_agg(id ORDER BY id), '{}') AS ids,
       coalesce(array_agg(parent_id ORDER BY id), '{}') AS parents,
       (SELECT count(pg_notify('gd_wake', q))
          FROM (SELECT DISTINCT queue AS q FROM ins
                 WHERE eligible_at <= coalesce($13, statement_timestamp()) AND queue = ANY ($15::text[])) d) AS notified
FROM ins
"#
        )
    };
}

/// Inserts rows from parallel arrays (`unnest`), so the statement has a fixed number of
/// binds whatever the batch size. Rows are inserted in unique-key order so that two
/// concurrent batches take index locks in the same order and cannot deadlock. A row
/// whose key is occupied (by a stored row or an earlier row of the same batch) is
/// dropped by `ON CONFLICT … DO NOTHING` on the partial unique index over
/// `unique_guard`. One `pg_notify` per distinct queue of the rows that are runnable now,
/// among the queues in `$15` (the caller's [`crate::store::notify::Notifier`] coalesces them).
/// Times count from the statement's start, not its transaction's: children inserted by a
/// step's own transaction, or rows by a caller's long one, are delayed from when they
/// are inserted. Plain rows (no key, gate or limit) are inserted with `ready_seq` 0 and
/// their ids left in `gd_appends`, whose trigger appends them to the log in one call as
/// the transaction commits (log.sql): a caller's long transaction holds no lane's append
/// lock.
pub(super) const INSERT: &str = insert!(
    "
    ORDER BY unique_key NULLS LAST, ord
    ON CONFLICT (unique_guard) WHERE unique_guard IS NOT NULL DO NOTHING"
);

/// [`INSERT`] for a batch in which no row has a unique key: nothing can conflict, so no
/// sort and no `ON CONFLICT`, whose speculative insertion costs each row a WAL record
/// of its own: 15% less server time for a batch of 20,000 (gen_durable_bench/results/PERFORMANCE-log.md, "The latest run").
pub(super) const INSERT_FRESH: &str = insert!("");

/// Inserts `rows` and returns the ids actually inserted, ascending. Duplicates by
/// unique key are dropped, not errors.
pub(crate) async fn insert_rows<'e>(
    db: impl PgExecutor<'e>,
    rows: &[NewInstance],
    notify: &[String],
    now: Option<DateTime<Utc>>,
) -> Result<Vec<i64>> {
    let parents = vec![None; rows.len()];
    Ok(insert_with_parents(db, rows, &parents, notify, now)
        .await?
        .0)
}

/// Inserts `rows`, row `i` as a child of `parents[i]`; returns the inserted ids and,
/// in the same order, their parents.
pub(crate) async fn insert_with_parents<'e>(
    db: impl PgExecutor<'e>,
    rows: &[NewInstance],
    parents: &[Option<i64>],
    notify: &[String],
    now: Option<DateTime<Utc>>,
) -> Result<(Vec<i64>, Vec<Option<i64>>)> {
    let n = rows.len();
    let mut fsm = Vec::with_capacity(n);
    let mut version = Vec::with_capacity(n);
    let mut step = Vec::with_capacity(n);
    let mut state = Vec::with_capacity(n);
    let mut queue = Vec::with_capacity(n);
    let mut priority = Vec::with_capacity(n);
    let mut partition = Vec::with_capacity(n);
    let mut ukey = Vec::with_capacity(n);
    let mut uscope = Vec::with_capacity(n);
    let mut eligible = Vec::with_capacity(n);
    let mut delay = Vec::with_capacity(n);
    let mut max_reaps = Vec::with_capacity(n);
    let mut gate = Vec::with_capacity(n);
    let mut rate_limit = Vec::with_capacity(n);
    let mut rate_key = Vec::with_capacity(n);
    let mut rate_weight = Vec::with_capacity(n);
    for r in rows {
        fsm.push(r.fsm.as_str());
        version.push(r.version);
        step.push(r.step.as_str());
        state.push(&r.state);
        queue.push(r.queue.as_str());
        priority.push(r.priority);
        partition.push(r.partition_key.as_deref());
        ukey.push(r.unique_key.as_deref());
        uscope.push(
            r.unique_scope
                .as_ref()
                .map(|s| s.iter().map(|st| st.as_str()).collect::<Vec<_>>().join(",")),
        );
        eligible.push(r.eligible_at);
        delay.push(r.delay.map(millis));
        max_reaps.push(r.max_reaps);
        gate.push(r.gate.as_deref());
        rate_limit.push(r.rate_limit.as_ref().map(|(l, _)| l.as_str()));
        rate_key.push(r.rate_limit.as_ref().map(|(_, k)| k.as_str()));
        rate_weight.push(r.rate_weight);
    }
    let sql = if ukey.iter().any(Option::is_some) {
        INSERT
    } else {
        INSERT_FRESH
    };
    // A weight is read only beside its limit.
    if rate_limit.iter().all(Option::is_none) {
        rate_weight.clear();
    }
    let parents = if parents.iter().all(Option::is_none) {
        &[]
    } else {
        parents
    };
    let (ids, parent_ids): (Vec<i64>, Vec<Option<i64>>) = sqlx::query_as(sql)
        .bind(fsm)
        .bind(version)
        .bind(step)
        .bind(state)
        .bind(queue)
        .bind(priority)
        .bind(sparse(partition))
        .bind(sparse(ukey))
        .bind(sparse(uscope))
        .bind(sparse(eligible))
        .bind(sparse(delay))
        .bind(max_reaps)
        .bind(now)
        .bind(parents)
        .bind(notify)
        .bind(sparse(gate))
        .bind(sparse(rate_limit))
        .bind(sparse(rate_key))
        .bind(rate_weight)
        .fetch_one(db)
        .await
        .map_err(gate_error)?;
    Ok((ids, parent_ids))
}

/// An optional column of a batch, or no array at all when every row's value is NULL:
/// `unnest` pads a shorter array with NULLs, and an empty array is neither encoded nor
/// decoded element by element (most columns of most batches are all NULL).
fn sparse<T>(column: Vec<Option<T>>) -> Vec<Option<T>> {
    if column.iter().all(Option::is_none) {
        Vec::new()
    } else {
        column
    }
}

/// One row: the same insert as [`INSERT`] with scalar binds instead of `unnest` arrays,
/// no sort and no aggregate, since single inserts are the hot path of many callers.
/// Returns no row when the unique key is occupied.
pub(super) const INSERT_ONE: &str = r#"/* gd:insert */
WITH ins AS (
    INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, priority, partition_key,
                              unique_key, unique_scope, eligible_at, max_reaps,
                              inserted_at, updated_at, gate, rate_limit, rate_key,
                              rate_weight, rate_step, ready_seq)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, string_to_array($9, ',')::gd_status[],
            coalesce($10, coalesce($13, statement_timestamp()) + coalesce($11, 0) * interval '1 millisecond'),
            $12, coalesce($13, statement_timestamp()), coalesce($13, statement_timestamp()), $15,
            $16, $17, CASE WHEN $16::text IS NOT NULL THEN gd_rate_weight($16, $18) END,
            CASE WHEN $16::text IS NOT NULL THEN $3 END,
            CASE WHEN $7::text IS NULL AND $15::text IS NULL AND $16::text IS NULL THEN 0 END)
    ON CONFLICT (unique_guard) WHERE unique_guard IS NOT NULL DO NOTHING
    RETURNING id, queue, eligible_at, ready_seq
), pending AS (
    INSERT INTO gd_appends (ids) SELECT ARRAY[id] FROM ins WHERE ready_seq = 0
)
SELECT id,
       (SELECT count(pg_notify('gd_wake', queue)) FROM ins
         WHERE $14 AND eligible_at <= coalesce($13, statement_timestamp())) AS notified
  FROM ins
"#;

/// Inserts one row; `None` when its unique key is occupied. `notify`: whether this
/// statement sends the queue's wake-up itself.
pub(crate) async fn insert_one<'e>(
    db: impl PgExecutor<'e>,
    r: &NewInstance,
    notify: bool,
    now: Option<DateTime<Utc>>,
) -> Result<Option<i64>> {
    let scope = r
        .unique_scope
        .as_ref()
        .map(|s| s.iter().map(|st| st.as_str()).collect::<Vec<_>>().join(","));
    let row: Option<(i64, i64)> = sqlx::query_as(INSERT_ONE)
        .bind(&r.fsm)
        .bind(r.version)
        .bind(&r.step)
        .bind(&r.state)
        .bind(&r.queue)
        .bind(r.priority)
        .bind(r.partition_key.as_deref())
        .bind(r.unique_key.as_deref())
        .bind(scope)
        .bind(r.eligible_at)
        .bind(r.delay.map(millis))
        .bind(r.max_reaps)
        .bind(now)
        .bind(notify)
        .bind(r.gate.as_deref())
        .bind(r.rate_limit.as_ref().map(|(l, _)| l.as_str()))
        .bind(r.rate_limit.as_ref().map(|(_, k)| k.as_str()))
        .bind(r.rate_weight)
        .fetch_optional(db)
        .await
        .map_err(gate_error)?;
    Ok(row.map(|(id, _)| id))
}

/// An insert that named an undeclared gate or rate limit fails on the check of its
/// reference (a trigger since migration 0025, raising what the foreign keys of 0011 and
/// 0012 did): that is `Error::UnknownGate` / `UnknownRateLimit`, named from
/// the error's detail, `Key (gate)=(stripe) is not present in table "gd_gates".`. A weight
/// above its limit's burst fails the row's check (`gd_rate_weight` negates it).
pub(crate) fn gate_error(e: sqlx::Error) -> crate::Error {
    if let sqlx::Error::Database(db) = &e {
        let named = |column: &str| {
            db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
                .and_then(|e| e.detail())
                .and_then(|d| d.strip_prefix(&format!("Key ({column})=(")))
                .and_then(|d| d.rfind(") is not present").map(|end| d[..end].to_string()))
                .unwrap_or_default()
        };
        match db.constraint() {
            Some("gd_instances_gate_fk") => {
                return crate::Error::UnknownGate {
                    name: named("gate"),
                }
            }
            Some("gd_instances_rate_limit_fk") => {
                return crate::Error::UnknownRateLimit {
                    name: named("rate_limit"),
                }
            }
            Some("gd_instances_rate") => {
                return crate::Error::InvalidInput {
                    what: "rate limit weight",
                    reason: "exceeds its rate limit's burst, so its tokens could never all be \
                             there at once"
                        .into(),
                }
            }
            _ => {}
        }
    }
    crate::Error::Database(e)
}

#[cfg(test)]
mod tests {
    use gen_durable_testkit::TestDb;

    /// The references to gates and rate limits are checked only for rows that name one
    /// (migration 0025). A foreign key queued a check for every row inserted, a NULL column
    /// included: in `insert_all`'s batches of rows without either, 8% of its rate.
    #[tokio::test]
    async fn only_the_rows_that_name_a_gate_or_a_limit_are_checked() {
        let db = TestDb::new().await;
        let mut tx = db.pool().begin().await.unwrap();
        sqlx::query("INSERT INTO gd_gates (name, size) VALUES ('g', 1)")
            .execute(&mut *tx)
            .await
            .unwrap();
        let plan: Vec<String> = sqlx::query_scalar(
            "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF)
             INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, gate, partition_key)
             SELECT 'F', 1, 's', '{}', 'q', CASE WHEN s <= 3 THEN 'g' END,
                    CASE WHEN s <= 3 THEN 'k' END
               FROM generate_series(1, 100) s",
        )
        .fetch_all(&mut *tx)
        .await
        .unwrap();
        let checks: Vec<&str> = plan
            .iter()
            .filter(|l| l.starts_with("Trigger"))
            .map(|l| l.as_str())
            .collect();
        assert_eq!(checks.len(), 1, "{plan:#?}");
        assert!(
            checks[0].starts_with("Trigger gd_instances_references_on_insert:")
                && checks[0].ends_with("calls=3"),
            "{plan:#?}"
        );
        drop(tx);
        db.close().await;
    }

    /// A gate named by an insert not yet committed cannot be deleted: the insert holds the
    /// gate's row `FOR KEY SHARE`, the delete waits for it, then sees the row and fails as
    /// the foreign key did. In a REPEATABLE READ transaction, whose snapshot would not see
    /// that row, the delete is refused.
    #[tokio::test]
    async fn a_gate_cannot_be_deleted_from_under_an_insert_that_names_it() {
        let db = TestDb::new().await;
        let p = db.pool();
        sqlx::query("INSERT INTO gd_gates (name, size) VALUES ('g', 1), ('idle', 1)")
            .execute(p)
            .await
            .unwrap();
        let mut inserting = p.begin().await.unwrap();
        let e = sqlx::query(
            "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, gate, partition_key)
             VALUES ('F', 1, 's', '{}', 'q', 'g', 'k')",
        )
        .execute(&mut *inserting)
        .await;
        assert!(e.is_ok(), "{e:?}");
        let mut deleting = p.acquire().await.unwrap();
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut *deleting)
            .await
            .unwrap();
        let delete = tokio::spawn(async move {
            sqlx::query("DELETE FROM gd_gates WHERE name = 'g'")
                .execute(&mut *deleting)
                .await
        });
        crate::store::pg::until_waiting_on_a_lock(p, pid, "the delete").await;
        inserting.commit().await.unwrap();
        let e = delete.await.unwrap().unwrap_err();
        let db_error = e.as_database_error().expect("a database error");
        assert_eq!(db_error.constraint(), Some("gd_instances_gate_fk"), "{e}");

        let mut rr = p.begin().await.unwrap();
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            .execute(&mut *rr)
            .await
            .unwrap();
        let e = sqlx::query("DELETE FROM gd_gates WHERE name = 'idle'")
            .execute(&mut *rr)
            .await
            .unwrap_err();
        assert_eq!(
            e.as_database_error().and_then(|d| d.code()).as_deref(),
            Some("55000"),
            "{e}"
        );
        drop(rr);
        let gates: i64 = sqlx::query_scalar("SELECT count(*) FROM gd_gates")
            .fetch_one(p)
            .await
            .unwrap();
        assert_eq!(gates, 2, "neither gate was deleted");
        db.close().await;
    }
}
