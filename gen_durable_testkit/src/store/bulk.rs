//! Cancelling or retrying every instance a filter matches, on the in-memory table:
//! `TestKit::cancel_where` / `retry_where` as `Client::cancel_where` / `retry_where` run
//! them — batches of at most `BULK_BATCH` matching ids read by id above the last batch's
//! (MATCHING_IDS; MATCHING_COUNT for a dry run), each acted on by the single-row cancel
//! or retry. The filter is checked and matched by `gen_durable::backend::FilterMatch`, the same
//! conditions as the statement's.
//!
//! No step runs while the kit's caller holds it, so a matched row cannot change between
//! its batch's read and its action: a cancel skips nothing and flags no executing row.

use chrono::{DateTime, Utc};
use gen_durable::backend::{CancelFound, FilterMatch, FilterRow, RetryFound};
use gen_durable::{BulkReport, BULK_BATCH};

use super::{Row, Store};

impl Store {
    /// Whether `m` matches row `r`.
    fn matched(m: &FilterMatch, r: &Row) -> bool {
        m.matches(FilterRow {
            queue: &r.queue,
            fsm: &r.fsm,
            version: r.version,
            status: r.status,
            inserted_at: r.inserted_at,
            updated_at: r.updated_at,
            unique_key: r.unique_key.as_deref(),
            last_error: r.last_error.as_deref(),
            parent_id: r.parent_id,
        })
    }

    /// MATCHING_IDS: up to `BULK_BATCH` ids above `after` that `m` matches, ascending.
    fn matching(&self, m: &FilterMatch, after: i64) -> Vec<i64> {
        self.rows
            .range(after + 1..)
            .map(|(_, r)| r)
            .filter(|r| Self::matched(m, r))
            .take(BULK_BATCH as usize)
            .map(|r| r.id)
            .collect()
    }

    /// MATCHING_COUNT: a dry run's report.
    pub(crate) fn dry_run(&self, m: &FilterMatch) -> BulkReport {
        let matched = self.rows.values().filter(|r| Self::matched(m, r)).count();
        BulkReport {
            matched: matched as u64,
            dry_run: true,
            ..BulkReport::default()
        }
    }

    /// The bulk loop both actions share: the batches of matching ids, each id handed to
    /// `act` with the report to count it in.
    fn each_batch(
        &mut self,
        m: &FilterMatch,
        mut act: impl FnMut(&mut Self, i64, &mut BulkReport),
    ) -> BulkReport {
        let mut report = BulkReport::default();
        let mut after = 0;
        loop {
            let ids = self.matching(m, after);
            let Some(&last) = ids.last() else { break };
            after = last;
            report.matched += ids.len() as u64;
            report.batches += 1;
            for id in ids {
                act(self, id, &mut report);
            }
        }
        report
    }

    /// Cancels every live row `m` matches with its live descendants, batch by batch; a
    /// row a previous batch already failed (a descendant of an earlier match) no longer
    /// matches.
    pub(crate) fn cancel_where(&mut self, m: &FilterMatch, now: DateTime<Utc>) -> BulkReport {
        self.each_batch(m, |store, id, report| match store.cancel(id, now) {
            CancelFound::Cancelled { failed, flagged } => {
                report.changed += failed as u64;
                report.after_current_step += flagged as u64;
            }
            // A descendant of a row cancelled earlier in this batch: the SQL locks the
            // batch's roots first and counts it live, and fails it once.
            CancelFound::Finished(_) | CancelFound::NotFound => {}
        })
    }

    /// Retries every failed row `m` matches, batch by batch; one whose parent moved on or
    /// whose key another row holds is skipped, as `retry` refuses it.
    pub(crate) fn retry_where(&mut self, m: &FilterMatch, now: DateTime<Utc>) -> BulkReport {
        self.each_batch(m, |store, id, report| match store.retry(id, now) {
            RetryFound::Retried => report.changed += 1,
            _ => report.skipped += 1,
        })
    }
}
