//! `gen_durable/sql/` says what the migrations build: one database migrated by
//! `gen_durable::migrate_schema`, one built by loading the `sql/` files in their order, and their
//! catalogs compared object by object (tables and columns, constraints, indexes, triggers,
//! types, sequences, views, and every function's whole definition).
//!
//! When they disagree the test prints each object that differs, as a line diff of its
//! definition (`-` the migrations, `+` sql/): edit `sql/` and the migration together
//! (`gen_durable/sql/README.md`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use gen_durable_testkit::TestDb;
use sqlx::PgPool;

/// The files of `gen_durable/sql/`, in the order they load (as its README lists them).
const FILES: [&str; 8] = [
    "schema.sql",
    "lease.sql",
    "commit.sql",
    "claim.sql",
    "handoff.sql",
    "rate_limit.sql",
    "log.sql",
    "history.sql",
];

/// The catalog queries: each returns (key, definition) rows of one kind of object in
/// schema `public`, leaving out sqlx's own bookkeeping table.
const CATALOG: [(&str, &str); 9] = [
    (
        "table",
        "SELECT c.relname, c.relkind::text || ' ' || coalesce(
                    (SELECT string_agg(o, ', ' ORDER BY o) FROM unnest(c.reloptions) o), '')
           FROM pg_class c
          WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
            AND c.relname <> '_sqlx_migrations'",
    ),
    (
        "columns of",
        "SELECT c.relname, string_agg(
                    format('%s %s%s%s%s%s', a.attname, format_type(a.atttypid, a.atttypmod),
                           CASE WHEN a.attnotnull THEN ' NOT NULL' ELSE '' END,
                           CASE a.attidentity WHEN 'a' THEN ' IDENTITY ALWAYS'
                                              WHEN 'd' THEN ' IDENTITY BY DEFAULT' ELSE '' END,
                           CASE a.attgenerated WHEN 's' THEN ' GENERATED' ELSE '' END,
                           coalesce(' DEFAULT ' || pg_get_expr(d.adbin, d.adrelid), '')),
                    E'\\n' ORDER BY a.attnum)
           FROM pg_class c
           JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
           LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
          WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
            AND c.relname <> '_sqlx_migrations'
          GROUP BY c.relname",
    ),
    (
        "constraint",
        "SELECT conrelid::regclass::text || '.' || conname, pg_get_constraintdef(oid)
           FROM pg_constraint
          WHERE connamespace = 'public'::regnamespace
            AND conrelid::regclass::text <> '_sqlx_migrations'",
    ),
    (
        "index",
        "SELECT indexname, indexdef FROM pg_indexes
          WHERE schemaname = 'public' AND tablename <> '_sqlx_migrations'",
    ),
    (
        "trigger",
        "SELECT tgrelid::regclass::text || '.' || tgname, pg_get_triggerdef(oid, true)
           FROM pg_trigger WHERE NOT tgisinternal",
    ),
    (
        "type",
        "SELECT t.typname, t.typtype::text || coalesce(' ' || (
                    SELECT string_agg(e.enumlabel, ', ' ORDER BY e.enumsortorder)
                      FROM pg_enum e WHERE e.enumtypid = t.oid), '')
           FROM pg_type t
          WHERE t.typnamespace = 'public'::regnamespace AND t.typtype IN ('e', 'd', 'r', 'm')",
    ),
    (
        "sequence",
        "SELECT sequencename, format('%s start %s by %s min %s max %s cache %s cycle %s',
                    data_type, start_value, increment_by, min_value, max_value, cache_size, cycle)
           FROM pg_sequences
          WHERE schemaname = 'public' AND sequencename NOT LIKE '\\_sqlx%'",
    ),
    (
        "view",
        "SELECT viewname, definition FROM pg_views WHERE schemaname = 'public'",
    ),
    (
        "function",
        "SELECT p.oid::regprocedure::text, pg_get_functiondef(p.oid)
           FROM pg_proc p
          WHERE p.pronamespace = 'public'::regnamespace",
    ),
];

#[tokio::test]
async fn the_sql_folder_builds_the_database_the_migrations_build() {
    let migrated = TestDb::new().await;
    let loaded = TestDb::new().await;
    sqlx::raw_sql("DROP SCHEMA public CASCADE; CREATE SCHEMA public;")
        .execute(loaded.pool())
        .await
        .unwrap();
    for file in FILES {
        let text = std::fs::read_to_string(sql_dir().join(file))
            .unwrap_or_else(|e| panic!("gen_durable/sql/{file}: {e}"));
        sqlx::raw_sql(&text)
            .execute(loaded.pool())
            .await
            .unwrap_or_else(|e| panic!("loading gen_durable/sql/{file}: {e}"));
    }

    let (want, got) = (catalog(migrated.pool()).await, catalog(loaded.pool()).await);
    assert!(
        want.keys().any(|k| k.starts_with("function gd_claim(")),
        "the catalog query sees the functions: {:?}",
        want.keys().collect::<Vec<_>>()
    );
    let report = differences(&want, &got);
    assert!(
        report.is_empty(),
        "gen_durable/sql/ and gen_durable/migrations/ build different databases \
         (- migrations, + sql/):\n{report}"
    );
    migrated.close().await;
    loaded.close().await;
}

/// Every `.sql` file of the folder is in [`FILES`], so none is left out of the comparison.
#[test]
fn every_file_of_the_sql_folder_is_loaded() {
    let mut found: Vec<String> = std::fs::read_dir(sql_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".sql"))
        .collect();
    found.sort();
    let mut listed: Vec<String> = FILES.iter().map(|f| f.to_string()).collect();
    listed.sort();
    assert_eq!(
        found, listed,
        "add the new file to FILES and to sql/README.md"
    );
}

fn sql_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../gen_durable/sql")
}

/// Every object of the database, as "kind name" → its definition.
async fn catalog(pool: &PgPool) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (kind, query) in CATALOG {
        let rows: Vec<(String, String)> = sqlx::query_as(query)
            .fetch_all(pool)
            .await
            .unwrap_or_else(|e| panic!("catalog query for {kind}: {e}"));
        for (name, definition) in rows {
            out.insert(format!("{kind} {name}"), definition);
        }
    }
    out
}

/// What differs between the two catalogs, one paragraph per object; empty when they agree.
fn differences(want: &BTreeMap<String, String>, got: &BTreeMap<String, String>) -> String {
    let mut report = String::new();
    for (key, definition) in want {
        match got.get(key) {
            None => report += &format!("\n{key}: only in the migrations\n{definition}\n"),
            Some(other) if other != definition => {
                report += &format!("\n{key}: differs\n{}", line_diff(definition, other));
            }
            Some(_) => {}
        }
    }
    for (key, definition) in got {
        if !want.contains_key(key) {
            report += &format!("\n{key}: only in sql/\n{definition}\n");
        }
    }
    report
}

/// The lines that differ between `a` and `b` (a longest-common-subsequence diff), each
/// with its line number in `a` or `b` and two lines of context before it.
fn line_diff(a: &str, b: &str) -> String {
    let (a, b): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
    // common[i][j]: the length of the longest common subsequence of a[i..] and b[j..].
    let mut common = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            common[i][j] = if a[i] == b[j] {
                common[i + 1][j + 1] + 1
            } else {
                common[i + 1][j].max(common[i][j + 1])
            };
        }
    }
    let (mut i, mut j, mut out) = (0, 0, String::new());
    let mut last_shown = None;
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            (i, j) = (i + 1, j + 1);
            continue;
        }
        let from = i.saturating_sub(2);
        for (k, line) in a.iter().enumerate().take(i).skip(from) {
            if last_shown.is_none_or(|s| k > s) {
                out += &format!("  {:>4} {line}\n", k + 1);
            }
        }
        if i < a.len() && (j == b.len() || common[i + 1][j] >= common[i][j + 1]) {
            out += &format!("- {:>4} {}\n", i + 1, a[i]);
            i += 1;
        } else {
            out += &format!("+ {:>4} {}\n", j + 1, b[j]);
            j += 1;
        }
        last_shown = Some(i.saturating_sub(1));
    }
    out
}
