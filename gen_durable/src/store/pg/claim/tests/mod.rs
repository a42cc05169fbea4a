//! The claim against a real database: what it claims, hands back and defers
//! ([`picks`]), and the plans its functions keep ([`plans`]).

mod picks;
mod plans;

use super::*;

/// A claim of `demand` rows of queue `q`, FSM `F` v1, by `node`, with a 30 s lease, at
/// the database's now.
pub(super) fn claim_params(node: &'static str, demand: i64, flow: bool) -> ClaimParams<'static> {
    static NAMES: std::sync::LazyLock<[String; 1]> = std::sync::LazyLock::new(|| ["F".to_string()]);
    ClaimParams {
        queue: "q",
        names: &NAMES[..],
        versions: &[1],
        demand,
        node,
        lease_ttl_ms: 30_000,
        now: None,
        flow,
    }
}

/// The plan `gd_claim` reuses, as `EXPLAIN ANALYZE` of a claim of `batch` rows of
/// queue `q`, FSM `F` v1, by node `n1`, at the database's now.
pub(super) async fn plan(conn: &mut sqlx::PgConnection, batch: i64) -> String {
    plan_of(conn, "gd_claim", batch).await
}

/// As [`plan`], of claim function `function`: its statement prepared and explained
/// under the function's settings, in a transaction rolled back after (EXPLAIN ANALYZE
/// executes the claim).
///
/// The settings are the function's own, read from the catalog, on top of
/// `jit_above_cost = 0`: a plan the function would let JIT compile shows its `JIT:`
/// section (printed with the costs), which every plan test then sees.
pub(super) async fn plan_of(conn: &mut sqlx::PgConnection, function: &str, batch: i64) -> String {
    let mut tx = sqlx::Connection::begin(conn).await.unwrap();
    sqlx::query(
        "SELECT set_config('jit_above_cost', '0', true),
                (SELECT count(set_config(split_part(c, '=', 1),
                                         substr(c, strpos(c, '=') + 1), true))
                   FROM pg_proc, unnest(proconfig) c
                  WHERE proname = $1)",
    )
    .bind(function)
    .execute(&mut *tx)
    .await
    .unwrap();
    let prepare = format!(
        "PREPARE explained(text, text[], int4[], int8, text, int8, timestamptz) AS {};",
        body(function)
    );
    sqlx::raw_sql(&prepare).execute(&mut *tx).await.unwrap();
    let lines: Vec<String> = sqlx::query_scalar(&format!(
        "EXPLAIN (ANALYZE, TIMING OFF)
         EXECUTE explained('q', '{{F}}', '{{1}}', {batch}, 'n1', 30000, NULL)"
    ))
    .fetch_all(&mut *tx)
    .await
    .unwrap();
    tx.rollback().await.unwrap();
    sqlx::raw_sql("DEALLOCATE explained")
        .execute(&mut *conn)
        .await
        .unwrap();
    // Each node as `COSTS OFF` prints it: the estimates cut out.
    lines
        .iter()
        .map(|l| match l.find("  (cost=") {
            Some(from) => match l[from..].find(')') {
                Some(len) => format!("{}{}", &l[..from], &l[from + len + 1..]),
                None => l.clone(),
            },
            None => l.clone(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}
