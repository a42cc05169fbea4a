//! The tables' statistics at the end of the run: `pg_stat_user_tables` of `gd_instances`
//! and `gd_signals`, and `pgstattuple`/`pgstatindex` when the extension is available.

use std::time::Duration;

use gen_durable::prelude::json;
use sqlx::{PgPool, Row};

/// The end-of-run table statistics, as the summary prints them.
pub(crate) struct TableStats {
    /// `pg_stat_user_tables` of each table, by name.
    pub(crate) tables: serde_json::Map<String, serde_json::Value>,
    /// `pgstattuple` of each table and `pgstatindex` of their btree indexes (empty
    /// without the extension).
    pub(crate) bloat: serde_json::Map<String, serde_json::Value>,
    /// HOT updates / updates of `gd_instances`.
    pub(crate) hot_ratio: f64,
}

/// Reads them, a second after the node stopped.
pub(crate) async fn collect(stats: &PgPool, pgstattuple: bool) -> Result<TableStats, sqlx::Error> {
    // Final table statistics (the engine's and the client's backends have exited, so
    // their counters are flushed).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let table_stats = sqlx::query(
        "SELECT relname::text AS rel, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del, n_live_tup,
                n_dead_tup, vacuum_count, autovacuum_count
           FROM pg_stat_user_tables WHERE relname IN ('gd_instances', 'gd_signals') ORDER BY relname",
    )
    .fetch_all(stats)
    .await?;
    let mut tables = serde_json::Map::new();
    let mut hot_ratio = 0.0;
    for r in &table_stats {
        let rel: String = r.try_get("rel")?;
        let upd: i64 = r.try_get("n_tup_upd")?;
        let hot: i64 = r.try_get("n_tup_hot_upd")?;
        if rel == "gd_instances" {
            hot_ratio = hot as f64 / (upd.max(1)) as f64;
        }
        tables.insert(
            rel,
            json!({
                "n_tup_ins": r.try_get::<i64, _>("n_tup_ins")?,
                "n_tup_upd": upd, "n_tup_hot_upd": hot,
                "hot_ratio": hot as f64 / (upd.max(1)) as f64,
                "n_tup_del": r.try_get::<i64, _>("n_tup_del")?,
                "n_live_tup": r.try_get::<i64, _>("n_live_tup")?,
                "n_dead_tup": r.try_get::<i64, _>("n_dead_tup")?,
                "vacuum_count": r.try_get::<i64, _>("vacuum_count")?,
                "autovacuum_count": r.try_get::<i64, _>("autovacuum_count")?,
            }),
        );
    }
    let mut bloat = serde_json::Map::new();
    if pgstattuple {
        for rel in ["gd_instances", "gd_signals"] {
            let r = sqlx::query(
                "SELECT table_len, tuple_percent, dead_tuple_percent, free_percent FROM pgstattuple($1::text::regclass)",
            )
            .bind(rel)
            .fetch_one(stats)
            .await?;
            bloat.insert(
                rel.into(),
                json!({
                    "table_len": r.try_get::<i64, _>("table_len")?,
                    "tuple_percent": r.try_get::<f64, _>("tuple_percent")?,
                    "dead_tuple_percent": r.try_get::<f64, _>("dead_tuple_percent")?,
                    "free_percent": r.try_get::<f64, _>("free_percent")?,
                }),
            );
        }
        let idx = sqlx::query(
            "SELECT c.relname::text AS name, pg_relation_size(c.oid) AS size,
                    (pgstatindex(c.oid::regclass)).avg_leaf_density AS density
               FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
               JOIN pg_am a ON a.oid = c.relam AND a.amname = 'btree'
              WHERE i.indrelid IN ('gd_instances'::regclass, 'gd_signals'::regclass) ORDER BY 1",
        )
        .fetch_all(stats)
        .await?;
        let mut indexes = serde_json::Map::new();
        for r in idx {
            indexes.insert(
                r.try_get("name")?,
                json!({ "size": r.try_get::<i64, _>("size")?,
                        "avg_leaf_density": r.try_get::<f64, _>("density")? }),
            );
        }
        bloat.insert("indexes".into(), serde_json::Value::Object(indexes));
    }
    Ok(TableStats {
        tables,
        bloat,
        hot_ratio,
    })
}
