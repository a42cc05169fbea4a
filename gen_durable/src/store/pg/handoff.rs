//! The hand-off of a gate key's slots: in the transaction of a group commit that ended
//! gated rows, each slot they held is claimed at once for the next runnable row of the
//! same queue, gate and key (`gd_handoff` in `gen_durable/sql/handoff.sql`, whose comments
//! explain why it is safe without the gate's lock). The rows come back as a claim's do, for the committing node's pickers.

use chrono::{DateTime, Utc};
use sqlx::postgres::PgArguments;
use sqlx::query::Query;
use sqlx::{FromRow, PgExecutor, Postgres, Row};

use crate::model::error::Result;
use crate::store::pg::claim::Claimed;

/// Claims into the slots freed by `$6` (rows whose outcome this transaction committed,
/// each with its queue, gate, key and slot as claimed: `$7` to `$10`, the slot NULL where
/// the claim did not say).
pub(super) const HANDOFF: &str =
    "/* gd:handoff */ SELECT * FROM gd_handoff($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)";

/// One row of a gate key that ended in the commit, freeing its slot.
#[derive(Debug, Clone)]
pub(crate) struct Freed {
    pub(crate) id: i64,
    pub(crate) queue: String,
    pub(crate) gate: String,
    pub(crate) key: String,
    /// The slot it held, if its claim said (else the hand-off reads it).
    pub(crate) slot: Option<i16>,
}

/// What the hand-off needs of the node.
#[derive(Debug)]
pub(crate) struct HandoffParams<'a> {
    pub(crate) names: &'a [String],
    pub(crate) versions: &'a [i32],
    pub(crate) node: &'a str,
    pub(crate) lease_ttl_ms: i64,
    pub(crate) now: Option<DateTime<Utc>>,
}

/// Claims a row into each slot `freed` held, of its key, and returns them with their queue.
pub(crate) async fn handoff<'e>(
    db: impl PgExecutor<'e>,
    p: &HandoffParams<'_>,
    freed: &[Freed],
) -> Result<Vec<(String, Claimed)>> {
    let query = sqlx::query(HANDOFF)
        .bind(p.names)
        .bind(p.versions)
        .bind(p.node)
        .bind(p.lease_ttl_ms)
        .bind(p.now);
    let rows = bind_freed(query, freed).fetch_all(db).await?;
    rows.iter()
        .map(|r| Ok((r.try_get("queue")?, Claimed::from_row(r)?)))
        .collect()
}

/// Binds the rows of `freed` as the statements' five parallel arrays: ids, queues,
/// gates, keys and slots.
pub(super) fn bind_freed<'q>(
    query: Query<'q, Postgres, PgArguments>,
    freed: &'q [Freed],
) -> Query<'q, Postgres, PgArguments> {
    query
        .bind(freed.iter().map(|f| f.id).collect::<Vec<_>>())
        .bind(freed.iter().map(|f| f.queue.as_str()).collect::<Vec<_>>())
        .bind(freed.iter().map(|f| f.gate.as_str()).collect::<Vec<_>>())
        .bind(freed.iter().map(|f| f.key.as_str()).collect::<Vec<_>>())
        .bind(freed.iter().map(|f| f.slot).collect::<Vec<_>>())
}

#[cfg(test)]
mod tests {
    use super::*;
    use gen_durable_testkit::TestDb;
    use sqlx::PgConnection;

    /// Rows of gate `g` (K = 3): key `k` runs three (slots 0, 1, 2, claimed by node `n`)
    /// and has four waiting in queue `q`, then one in queue `other`, one of a version the
    /// node does not run, and key `k2` one. Returns the ids of the three running.
    async fn setup(c: &mut PgConnection) -> Vec<i64> {
        sqlx::raw_sql(
            "INSERT INTO gd_gates (name, size) VALUES ('g', 3);
             INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, gate, partition_key,
                                       status, locked_by, lease_epoch, gate_slot,
                                       lease_expires_at)
             SELECT 'F', 1, 's', '{}', 'q', 'g', 'k', 'executing', 'n', 1, s - 1,
                    now() + interval '1 minute'
               FROM generate_series(1, 3) s;
             INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, gate, partition_key)
             SELECT 'F', 1, 's', '{}', 'q', 'g', 'k' FROM generate_series(1, 4);
             INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, gate, partition_key)
             VALUES ('F', 1, 's', '{}', 'other', 'g', 'k'), ('F', 2, 's', '{}', 'q', 'g', 'k'),
                    ('F', 1, 's', '{}', 'q', 'g', 'k2');",
        )
        .execute(&mut *c)
        .await
        .unwrap();
        sqlx::query_scalar(
            "SELECT id FROM gd_instances WHERE status = 'executing' ORDER BY gate_slot",
        )
        .fetch_all(&mut *c)
        .await
        .unwrap()
    }

    /// Ends `ids` as a commit does (out of `executing`, their slots left as they were),
    /// then hands their slots on, each named as the engine names it (the slot its claim
    /// returned); returns the rows claimed, as (id, slot).
    async fn end_and_hand_off(c: &mut PgConnection, ids: &[i64]) -> Vec<(i64, i16)> {
        let freed: Vec<Freed> = sqlx::query_as(
            "SELECT id, gate_slot FROM gd_instances WHERE id = ANY ($1) ORDER BY id",
        )
        .bind(ids)
        .fetch_all(&mut *c)
        .await
        .unwrap()
        .into_iter()
        .map(|(id, slot)| freed(id, slot))
        .collect();
        end(c, ids).await;
        hand_off(c, &freed).await
    }

    /// Ends `ids` as a commit does: out of `executing`, their slots left as they were.
    async fn end(c: &mut PgConnection, ids: &[i64]) {
        sqlx::query(
            "UPDATE gd_instances SET status = 'done', locked_by = NULL WHERE id = ANY ($1)",
        )
        .bind(ids)
        .execute(&mut *c)
        .await
        .unwrap();
    }

    /// Row `id` of key `k` of gate `g` in queue `q`, ended holding `slot` (None: unknown).
    fn freed(id: i64, slot: Option<i16>) -> Freed {
        Freed {
            id,
            queue: "q".into(),
            gate: "g".into(),
            key: "k".into(),
            slot,
        }
    }

    /// Hands on the slots of `freed`; returns the rows claimed, as (id, slot), each slot
    /// as the hand-off returned it and as the row holds it.
    async fn hand_off(c: &mut PgConnection, freed: &[Freed]) -> Vec<(i64, i16)> {
        let rows = handoff(&mut *c, &params(), freed).await.unwrap();
        let mut out = Vec::new();
        for (queue, row) in rows {
            assert_eq!(queue, "q");
            assert!(row.lease_epoch > 0, "a claim bumps the epoch");
            let slot: i16 = sqlx::query_scalar(
                "SELECT gate_slot FROM gd_instances
                  WHERE id = $1 AND status = 'executing' AND locked_by = 'n'",
            )
            .bind(row.id)
            .fetch_one(&mut *c)
            .await
            .unwrap();
            assert_eq!(row.gate_slot, Some(slot), "the slot returned is the row's");
            out.push((row.id, slot));
        }
        out
    }

    static NAMES: std::sync::LazyLock<[String; 1]> = std::sync::LazyLock::new(|| ["F".to_string()]);

    /// Node `n`, which runs `F` version 1.
    fn params() -> HandoffParams<'static> {
        HandoffParams {
            names: &*NAMES,
            versions: &[1],
            node: "n",
            lease_ttl_ms: 60_000,
            now: None,
        }
    }

    async fn executing(c: &mut PgConnection) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM gd_instances WHERE status = 'executing'")
            .fetch_one(&mut *c)
            .await
            .unwrap()
    }

    /// Each slot freed goes to the next runnable row of the same queue, gate and key, in
    /// pick order, and no further: the key runs as many as before. A row of another
    /// queue, of a version the node does not run, or of another key is not taken.
    #[tokio::test]
    async fn each_freed_slot_goes_to_the_next_row_of_its_key_and_no_further() {
        let db = TestDb::new().await;
        let mut c = db.pool().acquire().await.unwrap();
        let running = setup(&mut c).await;
        let waiting: Vec<i64> = sqlx::query_scalar(
            "SELECT id FROM gd_instances
              WHERE status = 'runnable' AND queue = 'q' AND fsm_version = 1 AND partition_key = 'k'
              ORDER BY id",
        )
        .fetch_all(&mut *c)
        .await
        .unwrap();
        let handed = end_and_hand_off(&mut c, &running[1..]).await;
        assert_eq!(handed, [(waiting[0], 1), (waiting[1], 2)]);
        assert_eq!(executing(&mut c).await, 3);

        // The last two rows of the key take the next two slots; then nothing is left.
        let handed = end_and_hand_off(&mut c, &[running[0], waiting[0], waiting[1]]).await;
        let ids: Vec<i64> = handed.iter().map(|h| h.0).collect();
        assert_eq!(ids, waiting[2..]);
        let untouched: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM gd_instances WHERE status = 'runnable' AND lease_epoch = 0",
        )
        .fetch_one(&mut *c)
        .await
        .unwrap();
        assert_eq!(untouched, 3, "the other queue's, version's and key's rows");
        drop(c);
        db.close().await;
    }

    /// The slot the engine names is the one handed on: the row is not read for it (here,
    /// the gate made larger, the engine says slot 3, free, of a row whose column says 1).
    /// A slot the engine does not know (a row the claim took) is read from the row, which
    /// must have ended: a row still running hands nothing on. A slot named wrongly cannot
    /// admit a row: the slot index refuses it.
    #[tokio::test]
    async fn the_slot_the_engine_names_is_handed_on_and_an_unknown_one_is_read() {
        let db = TestDb::new().await;
        let mut c = db.pool().acquire().await.unwrap();
        let running = setup(&mut c).await;
        sqlx::query("UPDATE gd_gates SET size = 4")
            .execute(&mut *c)
            .await
            .unwrap();
        end(&mut c, &running[1..2]).await;
        let handed = hand_off(&mut c, &[freed(running[1], Some(3))]).await;
        assert_eq!(handed.iter().map(|h| h.1).collect::<Vec<_>>(), [3]);

        end(&mut c, &running[2..]).await;
        let handed = hand_off(&mut c, &[freed(running[2], None)]).await;
        assert_eq!(
            handed.iter().map(|h| h.1).collect::<Vec<_>>(),
            [2],
            "its own column"
        );
        assert_eq!(
            hand_off(&mut c, &[freed(running[0], None)]).await,
            [],
            "still running"
        );

        // A slot named wrongly, one a running row holds, is refused by the slot index:
        // the engine then commits without the hand-off.
        end(&mut c, &[handed[0].0]).await;
        let err = handoff(&mut *c, &params(), &[freed(handed[0].0, Some(0))])
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains("gd_instances_gate_executing"),
            "{err}"
        );
        drop(c);
        db.close().await;
    }

    /// What a node of the version before migration 0027 calls (a rolling deploy) still
    /// works (migration 0028): `gd_handoff` without slots reads each ended row's, and
    /// `gd_commit_handoff` without slots commits and hands on.
    #[tokio::test]
    async fn the_hand_off_of_the_version_before_still_answers() {
        let db = TestDb::new().await;
        let mut c = db.pool().acquire().await.unwrap();
        let running = setup(&mut c).await;
        end(&mut c, &running[..1]).await;
        let handed: Vec<(i64, String)> = sqlx::query_as(
            "SELECT id, queue FROM gd_handoff('{F}', '{1}', 'n', 60000, NULL, $1, '{q}',
                                             '{g}', '{k}')",
        )
        .bind(&running[..1])
        .fetch_all(&mut *c)
        .await
        .unwrap();
        assert_eq!(handed.len(), 1);
        let slot: i16 = sqlx::query_scalar("SELECT gate_slot FROM gd_instances WHERE id = $1")
            .bind(handed[0].0)
            .fetch_one(&mut *c)
            .await
            .unwrap();
        assert_eq!(slot, 0, "the slot the ended row held");

        let rows: Vec<(Option<Vec<i64>>, Option<i64>)> = sqlx::query_as(
            "SELECT committed, id
               FROM gd_commit_handoff('n', $1, '{1}', '{done}', '{s}', '{NULL}', '{NULL}',
                    '{NULL}', '{NULL}', '{NULL}', '{NULL}', '{f}', '{}', '{}', '{}', NULL,
                    '{NULL}', '{NULL}', '{NULL}', '{NULL}', '{NULL}', '{NULL}', '{F}', '{1}',
                    60000, $1, '{q}', '{g}', '{k}')",
        )
        .bind(&running[1..2])
        .fetch_all(&mut *c)
        .await
        .unwrap();
        assert_eq!(
            rows.len(),
            2,
            "the commit's row, then the one row handed on"
        );
        assert_eq!(rows[0].0.as_deref(), Some(&running[1..2]));
        assert!(rows[1].1.is_some());
        drop(c);
        db.close().await;
    }

    /// Priorities first: a freed slot is not handed to the key's next row while a row of
    /// a higher priority that a claim would take waits in the queue (here an ungated
    /// row); the picker's claim takes that row, and the slot stays free for the claim to
    /// count. Rows a claim would skip do not hold the hand-off back: one of a K = 1 key
    /// that runs, one of a full gate key.
    #[tokio::test]
    async fn no_slot_is_handed_over_a_higher_priority_row_a_claim_would_take() {
        let db = TestDb::new().await;
        let mut c = db.pool().acquire().await.unwrap();
        let running = setup(&mut c).await;
        sqlx::raw_sql(
            "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, priority, partition_key)
             VALUES ('F', 1, 's', '{}', 'q', -1, 'p');",
        )
        .execute(&mut *c)
        .await
        .unwrap();
        assert_eq!(end_and_hand_off(&mut c, &running[..1]).await, []);

        // Its key runs elsewhere: a claim would skip it, and so does the hand-off.
        sqlx::raw_sql(
            "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, partition_key,
                                       status, locked_by, lease_epoch)
             VALUES ('F', 1, 's', '{}', 'other', 'p', 'executing', 'm', 1);",
        )
        .execute(&mut *c)
        .await
        .unwrap();
        assert_eq!(end_and_hand_off(&mut c, &running[1..2]).await.len(), 1);

        // A row of a full gate key ahead does not hold it back either.
        sqlx::raw_sql(
            "INSERT INTO gd_gates (name, size) VALUES ('g2', 1);
             INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, gate, partition_key,
                                       status, locked_by, lease_epoch, gate_slot)
             VALUES ('F', 1, 's', '{}', 'other', 'g2', 'x', 'executing', 'm', 1, 0);
             INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, priority, gate,
                                       partition_key)
             VALUES ('F', 1, 's', '{}', 'q', -2, 'g2', 'x');",
        )
        .execute(&mut *c)
        .await
        .unwrap();
        assert_eq!(end_and_hand_off(&mut c, &running[2..]).await.len(), 1);
        drop(c);
        db.close().await;
    }

    /// A gate made smaller while its rows run hands no slot on while a running row of the
    /// key holds a slot at or above its new size (migration 0020; the claim, which counts,
    /// admits the key's rows once fewer than the new size run). A row
    /// that still runs (ahead, under the same claim) frees nothing, and a paused queue
    /// takes nothing.
    #[tokio::test]
    async fn a_smaller_gate_a_running_row_and_a_paused_queue_hand_nothing_on() {
        let db = TestDb::new().await;
        let mut c = db.pool().acquire().await.unwrap();
        let running = setup(&mut c).await;
        sqlx::query("UPDATE gd_gates SET size = 2")
            .execute(&mut *c)
            .await
            .unwrap();
        assert_eq!(
            end_and_hand_off(&mut c, &running[..1]).await,
            [],
            "slot 2, at the new size, still runs"
        );
        let handed = end_and_hand_off(&mut c, &running[2..]).await;
        assert_eq!(handed, [], "slot 2 is beyond the new size");
        assert_eq!(executing(&mut c).await, 1);
        let handed = end_and_hand_off(&mut c, &running[1..2]).await;
        assert_eq!(handed.len(), 1, "slot 1 is below it, and one runs");
        assert_eq!(handed[0].1, 1);
        let running: Vec<i64> = vec![handed[0].0];

        let still = freed(running[0], None);
        let rows = handoff(&mut *c, &params(), &[still]).await.unwrap();
        assert!(rows.is_empty(), "a running row holds its slot");

        sqlx::query("INSERT INTO gd_queue_pauses (queue) VALUES ('q')")
            .execute(&mut *c)
            .await
            .unwrap();
        assert_eq!(end_and_hand_off(&mut c, &running[..1]).await, []);
        sqlx::query("DELETE FROM gd_queue_pauses")
            .execute(&mut *c)
            .await
            .unwrap();
        assert_eq!(executing(&mut c).await, 0);
        drop(c);
        db.close().await;
    }
}
