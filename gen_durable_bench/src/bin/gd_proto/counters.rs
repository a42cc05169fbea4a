//! What a run writes and spends, read before and after it: the WAL position, the WAL
//! records by kind (`pg_walinspect`), the tables' tuple counters, and the CPU time of the
//! server's processes (`/proc`, so the server must run on this machine).

use std::collections::BTreeMap;

use serde_json::{json, Value};
use sqlx::{PgPool, Row};

/// Clock ticks per second of `/proc/<pid>/stat` (`getconf CLK_TCK`; 100 on Linux).
const TICKS: f64 = 100.0;

/// CPU seconds of process `pid` (user + system; with its reaped children's when `children`).
fn cpu_of(pid: u32, children: bool) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command (which may hold spaces) in parentheses.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let n = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // Field 14 utime, 15 stime, 16 cutime, 17 cstime (1-based, counting pid and comm).
    let own = n(11) + n(12);
    Some((if children { own + n(13) + n(14) } else { own }) / TICKS)
}

/// CPU seconds of every `postgres` process, the backends that exited included (the
/// postmaster reaps them, so their time is in its children's time).
pub(crate) fn server_cpu() -> f64 {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return 0.0;
    };
    let mut total = 0.0;
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(comm) = std::fs::read_to_string(format!("/proc/{pid}/comm")) else {
            continue;
        };
        if comm.trim() != "postgres" {
            continue;
        }
        let parent_is_postgres = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                let rest = s[s.rfind(')')? + 2..].to_string();
                rest.split_whitespace().nth(1)?.parse::<u32>().ok()
            })
            .and_then(|ppid| std::fs::read_to_string(format!("/proc/{ppid}/comm")).ok())
            .is_some_and(|c| c.trim() == "postgres");
        // The postmaster (no postgres parent) carries its exited children's time.
        total += cpu_of(pid, !parent_is_postgres).unwrap_or(0.0);
    }
    total
}

/// CPU seconds of the backends `pids` (the harness's own connections).
pub(crate) fn backends_cpu(pids: &[u32]) -> f64 {
    pids.iter().filter_map(|&p| cpu_of(p, false)).sum()
}

/// The tuple counters of `tables`, summed: inserted, updated, of which HOT, deleted.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub(crate) struct Tuples {
    pub(crate) ins: i64,
    pub(crate) upd: i64,
    pub(crate) hot: i64,
    pub(crate) del: i64,
}

pub(crate) async fn tuples(pool: &PgPool, tables: &[String]) -> sqlx::Result<Tuples> {
    let row = sqlx::query(
        "SELECT coalesce(sum(n_tup_ins), 0)::int8, coalesce(sum(n_tup_upd), 0)::int8,
                coalesce(sum(n_tup_hot_upd), 0)::int8, coalesce(sum(n_tup_del), 0)::int8
           FROM pg_stat_user_tables WHERE relname = ANY ($1)",
    )
    .bind(tables)
    .fetch_one(pool)
    .await?;
    Ok(Tuples {
        ins: row.get(0),
        upd: row.get(1),
        hot: row.get(2),
        del: row.get(3),
    })
}

/// The tuple counters once every backend that wrote has reported them: read until two
/// reads a short while apart agree (backends report on exit and at most once a second).
pub(crate) async fn settled_tuples(pool: &PgPool, tables: &[String]) -> sqlx::Result<Tuples> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let mut last = tuples(pool, tables).await?;
    loop {
        tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
        let now = tuples(pool, tables).await?;
        if now == last || std::time::Instant::now() > deadline {
            return Ok(now);
        }
        last = now;
    }
}

/// The WAL insert position, in bytes.
pub(crate) async fn wal_lsn(pool: &PgPool) -> sqlx::Result<i64> {
    sqlx::query_scalar("SELECT (pg_current_wal_insert_lsn() - '0/0')::int8")
        .fetch_one(pool)
        .await
}

/// The WAL between `from` and the flushed position, by record kind: `{kind: [count, bytes]}`
/// (bytes with full-page images).
pub(crate) async fn wal_records(
    pool: &PgPool,
    from: i64,
) -> sqlx::Result<BTreeMap<String, (i64, i64)>> {
    let rows = sqlx::query(
        r#"SELECT "resource_manager/record_type", count::int8, combined_size::int8
             FROM pg_get_wal_stats(('0/0'::pg_lsn + $1::numeric), pg_current_wal_flush_lsn(), true)
            WHERE count > 0"#,
    )
    .bind(from)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            (
                r.get::<String, _>(0),
                (r.get::<i64, _>(1), r.get::<i64, _>(2)),
            )
        })
        .collect())
}

/// Heap tuples and B-tree entries written to the WAL, from [`wal_records`]: `(heap, index,
/// full-page-image bytes)`. Heap: inserts, updates (HOT or not), deletes, locks, and the
/// rows of multi-inserts are counted as records. Index: leaf inserts and posting-list inserts.
pub(crate) fn wal_writes(records: &BTreeMap<String, (i64, i64)>) -> Value {
    let count = |kinds: &[&str]| -> i64 {
        kinds
            .iter()
            .map(|k| records.get(*k).map_or(0, |(c, _)| *c))
            .sum()
    };
    json!({
        "heap_insert": count(&["Heap/INSERT", "Heap/INSERT+INIT", "Heap2/MULTI_INSERT", "Heap2/MULTI_INSERT+INIT"]),
        "heap_update": count(&["Heap/UPDATE", "Heap/UPDATE+INIT"]),
        "heap_hot_update": count(&["Heap/HOT_UPDATE", "Heap/HOT_UPDATE+INIT"]),
        "heap_delete": count(&["Heap/DELETE"]),
        "heap_lock": count(&["Heap/LOCK"]),
        "index_insert": count(&["Btree/INSERT_LEAF", "Btree/INSERT_POST"]),
        "index_split": count(&["Btree/SPLIT_L", "Btree/SPLIT_R"]),
    })
}

/// Bytes of `tables` with their indexes and TOAST.
pub(crate) async fn size(pool: &PgPool, tables: &[String]) -> sqlx::Result<i64> {
    sqlx::query_scalar(
        "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::int8 FROM pg_class c
          WHERE c.relname = ANY ($1) AND c.relkind IN ('r', 'p')",
    )
    .bind(tables)
    .fetch_one(pool)
    .await
}
