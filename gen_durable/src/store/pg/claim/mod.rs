//! Claiming runnable rows: the pick.
//!
//! One statement claims a batch of a queue's runnable rows and returns each with its inbox
//! and children: the body of a claim function of `gen_durable/sql/claim.sql`, whose
//! comments explain its shape (the pick index, the partitions, the gates' slots, the rate
//! limits' buckets, the plan it keeps). This module holds the statements that call those
//! functions ([`statement`]), the rows they return ([`rows`]), and [`claim`], which runs
//! one and reads its result.

mod rows;
mod statement;
#[cfg(test)]
mod tests;

use sqlx::types::Json;
use sqlx::{FromRow, PgExecutor, Row};

use crate::model::error::Result;

pub(crate) use rows::{ClaimParams, Claimed, Contended, Pick, Throttled};
pub(crate) use statement::{body, CLAIM, CLAIM_PLAIN};

/// Runs the claim. Its result has one row per claimed row — or, when it claimed none but
/// rows of the queue wait for reserved tokens, one row of NULLs — and every row carries
/// the pick's summary (an empty pick returns no row, as an idle queue's polls do).
pub(crate) async fn claim<'e>(db: impl PgExecutor<'e>, p: &ClaimParams<'_>) -> Result<Pick> {
    let statement = if p.flow { CLAIM } else { CLAIM_PLAIN };
    let rows = sqlx::query(statement)
        .bind(p.queue)
        .bind(p.names)
        .bind(p.versions)
        .bind(p.demand)
        .bind(p.node)
        .bind(p.lease_ttl_ms)
        .bind(p.now)
        .fetch_all(db)
        .await?;
    let mut pick = Pick::default();
    if let Some(first) = rows.first() {
        pick.contended = first.try_get::<Json<Vec<Contended>>, _>("contended")?.0;
        pick.throttled = first.try_get::<Json<Vec<Throttled>>, _>("throttled")?.0;
        pick.next_due = first.try_get("next_due")?;
        pick.now = Some(first.try_get("now")?);
        let flow: bool = first.try_get("flow")?;
        (pick.flow, pick.switch) = (Some(flow), flow != p.flow);
    }
    for row in &rows {
        if row.try_get::<Option<i64>, _>("id")?.is_some() {
            pick.rows.push(Claimed::from_row(row)?);
        }
    }
    Ok(pick)
}
