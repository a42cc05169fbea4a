//! Delivering a signal: store it, and wake the instance only on a name match.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::PgExecutor;

use crate::model::answers::DeliveryFound;
use crate::model::error::Result;
use crate::model::target::Target;
use crate::Status;

/// A delivery in one statement, its `target` row chosen by `$where` (`$1` is the id or
/// the key). `target` locks the instance row first, so delivery serializes with any
/// outcome commit on the same row (those lock it in their first statement): either the
/// commit sees this signal when it decides to park, or this statement sees the parked
/// row — never neither, so no wake-up is lost. Under READ COMMITTED a locking read
/// returns the newest row version, which is why `wake` decides from `target`'s columns
/// rather than from its own (older) snapshot. A redelivery with the same `dedup_key`
/// inserts nothing and wakes nothing.
macro_rules! deliver {
    ($where:literal) => {
        concat!(
            "/* gd:signal */
WITH target AS (
    SELECT id, status, awaits, queue FROM gd_instances WHERE ",
            $where,
            " FOR NO KEY UPDATE
), ins AS (
    INSERT INTO gd_signals (target_id, name, payload, dedup_key, inserted_at)
    SELECT id, $2, $3, $4, coalesce($5, now()) FROM target
    WHERE status NOT IN ('done', 'failed')
    ON CONFLICT (target_id, dedup_key) DO NOTHING
    RETURNING id
), wake AS (
    UPDATE gd_instances i
       SET status = 'runnable', eligible_at = coalesce($5, now()), await_deadline = NULL,
           updated_at = coalesce($5, now())
      FROM target t
     WHERE i.id = t.id AND t.status = 'awaiting_signal' AND $2 = ANY (t.awaits)
       AND EXISTS (SELECT 1 FROM ins)
    RETURNING i.queue
)
SELECT (SELECT id FROM target) AS id,
       (SELECT status::text FROM target) AS status,
       (SELECT id FROM ins) AS signal_id,
       (SELECT count(pg_notify('gd_wake', queue)) FROM wake) AS woke
"
        )
    };
}

/// A delivery to instance `$1`.
pub(super) const DELIVER: &str = deliver!("id = $1");

/// A delivery to the one row holding correlation key `$1` — live, or terminal if its
/// scope includes that status — found through the unique index on `unique_guard`. The
/// lock re-checks the guard on the newest row version, so a holder that finished (and
/// freed the key) since the statement's snapshot is not taken: the caller gets
/// `KeyNotFound`, never a signal stored on a row that will not read it.
pub(super) const DELIVER_BY_KEY: &str = deliver!("unique_guard = $1");

/// Delivers one signal to `target` in one statement; what it found is turned into the
/// caller's answer in `answers`.
pub(crate) async fn deliver<'e>(
    db: impl PgExecutor<'e>,
    target: &Target,
    name: &str,
    payload: &Value,
    dedup_key: Option<&str>,
    now: Option<DateTime<Utc>>,
) -> Result<DeliveryFound> {
    let query = match target {
        Target::Id(id) => sqlx::query_as(DELIVER).bind(id),
        Target::Key(key) => sqlx::query_as(DELIVER_BY_KEY).bind(key),
    };
    let (id, status, signal_id, woke): (Option<i64>, Option<Status>, Option<i64>, i64) = query
        .bind(name)
        .bind(payload)
        .bind(dedup_key)
        .bind(now)
        .fetch_one(db)
        .await?;
    Ok(DeliveryFound {
        id,
        status,
        signal_id,
        woke: woke > 0,
    })
}

/// A bare wake-up for one queue, outside any other statement: the trailing edge of a
/// coalesced burst (see `crate::store::notify`).
const NOTIFY_QUEUE: &str = "/* gd:notify */ SELECT pg_notify('gd_wake', $1)";

pub(crate) async fn notify_queue<'e>(db: impl PgExecutor<'e>, queue: &str) -> Result<()> {
    sqlx::query(NOTIFY_QUEUE).bind(queue).execute(db).await?;
    Ok(())
}
