//! Cancelling or retrying every instance a [`Filter`] matches: `Client::cancel_where`,
//! `Client::retry_where`.
//!
//! Batches of at most [`BULK_BATCH`] ids are read by id, without locks, then acted on by
//! the single-row statements of `cancel` / `retry` (which take an id array) in a short
//! transaction of their own: each row gets exactly what `Client::cancel` / `retry` would
//! give it, and the engine, whose statements skip locked rows rather than wait, is never
//! held for longer than one batch.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::model::error::{Error, Result};
use crate::model::validate;
use crate::store::pg::bulk::{matching_count, matching_ids, FilterParams};
use crate::store::pg::control::{self, Reruns};
use crate::store::pg::millis;
use crate::{Client, Status};

/// The most instances one transaction of a bulk action takes.
pub const BULK_BATCH: i64 = 500;

/// Which instances a bulk action takes: every condition set must hold. A filter must
/// name a queue or an FSM (or both), so that no typo cancels a whole database.
///
/// ```
/// use std::time::Duration;
/// use gen_durable::{Filter, Status};
/// let stuck = Filter::new()
///     .with_queue("checkout")
///     .with_fsm("Checkout")
///     .with_statuses([Status::AwaitingSignal])
///     .with_older_than(Duration::from_secs(3600));
/// # let _ = stuck;
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// Only this queue.
    pub queue: Option<String>,
    /// Only this FSM (its stored name).
    pub fsm: Option<String>,
    /// Only this version of the FSM (needs `fsm`).
    pub version: Option<i32>,
    /// Only these statuses; empty: every status the action takes (cancel: the live
    /// ones; retry: `failed`, the only one it takes).
    pub statuses: Vec<Status>,
    /// Only rows last updated before this instant.
    pub updated_before: Option<DateTime<Utc>>,
    /// Only rows last updated after this instant.
    pub updated_after: Option<DateTime<Utc>>,
    /// Only rows last updated longer ago than this, by the database's clock (the
    /// client's clock in tests).
    pub older_than: Option<Duration>,
    /// Only rows whose correlation key starts with this (`%` and `_` are plain characters).
    pub key_prefix: Option<String>,
    /// Only rows with exactly this correlation key.
    pub key: Option<String>,
    /// Only rows inserted at or after this instant.
    pub inserted_since: Option<DateTime<Utc>>,
    /// Only rows inserted before this instant.
    pub inserted_until: Option<DateTime<Utc>>,
    /// Only rows whose last error contains this text, ASCII letters in any case (no
    /// pattern characters; other letters as written).
    pub error_contains: Option<String>,
    /// Only the children of this instance.
    pub parent: Option<i64>,
}

impl Filter {
    /// A filter with no condition yet: set a queue or an FSM before using it.
    pub fn new() -> Self {
        Self::default()
    }

    /// Only instances of queue `queue`.
    pub fn with_queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = Some(queue.into());
        self
    }

    /// Only instances of FSM `fsm`.
    pub fn with_fsm(mut self, fsm: impl Into<String>) -> Self {
        self.fsm = Some(fsm.into());
        self
    }

    /// Only instances of this version of the FSM.
    pub fn with_version(mut self, version: i32) -> Self {
        self.version = Some(version);
        self
    }

    /// Only instances in one of `statuses`.
    pub fn with_statuses(mut self, statuses: impl IntoIterator<Item = Status>) -> Self {
        self.statuses = statuses.into_iter().collect();
        self
    }

    /// Only instances last updated before `at`.
    pub fn with_updated_before(mut self, at: DateTime<Utc>) -> Self {
        self.updated_before = Some(at);
        self
    }

    /// Only instances last updated after `at`.
    pub fn with_updated_after(mut self, at: DateTime<Utc>) -> Self {
        self.updated_after = Some(at);
        self
    }

    /// Only instances last updated longer than `age` ago.
    pub fn with_older_than(mut self, age: Duration) -> Self {
        self.older_than = Some(age);
        self
    }

    /// Only instances whose correlation key starts with `prefix`.
    pub fn with_key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = Some(prefix.into());
        self
    }

    /// Only instances with exactly the correlation key `key`.
    pub fn with_key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Only instances inserted at or after `at`.
    pub fn with_inserted_since(mut self, at: DateTime<Utc>) -> Self {
        self.inserted_since = Some(at);
        self
    }

    /// Only instances inserted before `at`.
    pub fn with_inserted_until(mut self, at: DateTime<Utc>) -> Self {
        self.inserted_until = Some(at);
        self
    }

    /// Only instances whose last error contains `text`, ASCII letters in any case.
    pub fn with_error_containing(mut self, text: impl Into<String>) -> Self {
        self.error_contains = Some(text.into());
        self
    }

    /// Only the children of instance `parent`.
    pub fn with_parent(mut self, parent: i64) -> Self {
        self.parent = Some(parent);
        self
    }

    /// The statuses an action that takes `allowed` statuses acts on (all of them when the
    /// filter names none), or the [`Error::InvalidInput`] saying what is wrong with the
    /// filter: the checks both engines make before anything is read.
    fn checked(&self, action: &'static str, allowed: &'static [Status]) -> Result<Vec<Status>> {
        let bad = |reason: String| Error::InvalidInput {
            what: "filter",
            reason,
        };
        if self.queue.is_none() && self.fsm.is_none() {
            return Err(bad(format!(
                "names neither a queue nor an FSM: a bulk {action} needs at least one"
            )));
        }
        if self.version.is_some() && self.fsm.is_none() {
            return Err(bad("sets a version without an FSM".into()));
        }
        for (what, v) in [
            ("queue", &self.queue),
            ("fsm", &self.fsm),
            ("key_prefix", &self.key_prefix),
            ("key", &self.key),
            ("error_contains", &self.error_contains),
        ] {
            if let Some(v) = v {
                validate::key(what, v)?;
            }
        }
        if let Some(age) = self.older_than {
            validate::delay("older_than", age)?;
        }
        if let Some(s) = self.statuses.iter().find(|s| !allowed.contains(s)) {
            let allowed: Vec<String> = allowed.iter().map(Status::to_string).collect();
            return Err(bad(format!(
                "status {s} is not one a {action} takes (it takes {})",
                allowed.join(", ")
            )));
        }
        Ok(if self.statuses.is_empty() {
            allowed.to_vec()
        } else {
            self.statuses.clone()
        })
    }

    /// The statement's parameters for `action` (see [`Filter::checked`]).
    fn params(&self, action: BulkAction, now: Option<DateTime<Utc>>) -> Result<FilterParams<'_>> {
        let statuses = self.checked(action.name(), action.takes())?;
        Ok(FilterParams {
            queue: self.queue.as_deref(),
            fsm: self.fsm.as_deref(),
            version: self.version,
            statuses: statuses.iter().map(Status::to_string).collect(),
            updated_before: self.updated_before,
            updated_after: self.updated_after,
            older_than_ms: self.older_than.map(millis),
            key_prefix: self.key_prefix.as_deref(),
            key: self.key.as_deref(),
            inserted_since: self.inserted_since,
            inserted_until: self.inserted_until,
            error_contains: self.error_contains.as_deref(),
            parent: self.parent,
            now,
        })
    }

    /// The filter checked for `action` as `Client::cancel_where` / `retry_where` check it,
    /// as a predicate on a row at `now` — for an engine that has no SQL (the testkit).
    #[doc(hidden)]
    pub fn matcher(&self, action: BulkAction, now: DateTime<Utc>) -> Result<FilterMatch> {
        let statuses = self.checked(action.name(), action.takes())?;
        // The statement compares with `now - older_than` built from whole milliseconds.
        let older = self
            .older_than
            .map(|age| now - chrono::Duration::milliseconds(millis(age)));
        Ok(FilterMatch {
            filter: self.clone(),
            statuses,
            older,
        })
    }
}

/// Which bulk action a filter is for: what it takes, and its name in errors.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BulkAction {
    /// `cancel_where`: the live statuses.
    Cancel,
    /// `retry_where`: `failed` only.
    Retry,
}

impl BulkAction {
    fn name(self) -> &'static str {
        match self {
            BulkAction::Cancel => "cancel",
            BulkAction::Retry => "retry",
        }
    }

    fn takes(self) -> &'static [Status] {
        match self {
            BulkAction::Cancel => &LIVE,
            BulkAction::Retry => &[Status::Failed],
        }
    }
}

/// A checked [`Filter`] as a predicate on one row: exactly the conditions of the
/// statement `store::pg::bulk` runs (a NULL key never matches a prefix).
#[doc(hidden)]
#[derive(Debug, Clone)]
pub struct FilterMatch {
    filter: Filter,
    statuses: Vec<Status>,
    /// `now - older_than`.
    older: Option<DateTime<Utc>>,
}

/// The columns of a row a [`FilterMatch`] reads.
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub struct FilterRow<'a> {
    /// `queue`.
    pub queue: &'a str,
    /// `fsm`.
    pub fsm: &'a str,
    /// `fsm_version`.
    pub version: i32,
    /// `status`.
    pub status: Status,
    /// `inserted_at`.
    pub inserted_at: DateTime<Utc>,
    /// `updated_at`.
    pub updated_at: DateTime<Utc>,
    /// `unique_key`, the correlation key.
    pub unique_key: Option<&'a str>,
    /// `last_error`.
    pub last_error: Option<&'a str>,
    /// `parent_id`.
    pub parent_id: Option<i64>,
}

impl FilterMatch {
    /// Whether a row matches (a NULL column never matches a condition on it).
    pub fn matches(&self, r: FilterRow<'_>) -> bool {
        let f = &self.filter;
        f.queue.as_deref().is_none_or(|q| q == r.queue)
            && f.fsm.as_deref().is_none_or(|n| n == r.fsm)
            && f.version.is_none_or(|v| v == r.version)
            && self.statuses.contains(&r.status)
            && f.updated_before.is_none_or(|t| r.updated_at < t)
            && f.updated_after.is_none_or(|t| r.updated_at > t)
            && self.older.is_none_or(|t| r.updated_at < t)
            && f.key_prefix
                .as_deref()
                .is_none_or(|p| r.unique_key.is_some_and(|k| k.starts_with(p)))
            && f.key.as_deref().is_none_or(|k| r.unique_key == Some(k))
            && f.inserted_since.is_none_or(|t| r.inserted_at >= t)
            && f.inserted_until.is_none_or(|t| r.inserted_at < t)
            && f.error_contains.as_deref().is_none_or(|text| {
                r.last_error
                    .is_some_and(|e| e.to_ascii_lowercase().contains(&text.to_ascii_lowercase()))
            })
            && f.parent.is_none_or(|p| r.parent_id == Some(p))
    }
}

/// What a bulk action did (or, for a dry run, would take).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct BulkReport {
    /// Instances the filter matched (a dry run: the count it would take).
    pub matched: u64,
    /// Instances changed: for a cancel, failed at once — the matched ones and their live
    /// descendants; for a retry, retried.
    pub changed: u64,
    /// Executing instances flagged to fail after their current step (cancel only).
    pub after_current_step: u64,
    /// Matched instances left as they were: finished (cancel) or no longer failed (retry)
    /// by the time their batch ran, a child whose parent no longer waits for it, or a
    /// unique key another instance now holds (retry).
    pub skipped: u64,
    /// Transactions run (0 for a dry run).
    pub batches: u64,
    /// Nothing was written: `matched` is a count.
    pub dry_run: bool,
}

/// The statuses a cancel takes.
const LIVE: [Status; 4] = [
    Status::Runnable,
    Status::Executing,
    Status::AwaitingSignal,
    Status::AwaitingChildren,
];

impl Client {
    /// Cancels every instance `filter` matches (by default in any live status), as
    /// [`Client::cancel`] cancels one — live children with it, executing ones after their
    /// current step — in transactions of at most [`BULK_BATCH`] instances. `dry_run`:
    /// counts the matches and writes nothing. A filter that names neither a queue nor an
    /// FSM, or a terminal status, is [`Error::InvalidInput`] (nothing written).
    pub async fn cancel_where(&self, filter: &Filter, dry_run: bool) -> Result<BulkReport> {
        let now = self.clock().now_param();
        let p = filter.params(BulkAction::Cancel, now)?;
        if dry_run {
            return self.dry_run(&p).await;
        }
        let mut report = BulkReport::default();
        let mut after = 0;
        loop {
            let ids = matching_ids(self.pooler().pool(self.pool()), &p, after, BULK_BATCH).await?;
            let Some(&last) = ids.last() else { break };
            after = last;
            let mut tx = self.pool().begin().await?;
            let b =
                control::cancel_many(self.pooler().on(&mut *tx), &ids, self.actor(), now).await?;
            tx.commit().await?;
            let live = b.roots.iter().filter(|(_, st)| !st.is_terminal()).count();
            report.matched += ids.len() as u64;
            report.changed += b.failed as u64;
            report.after_current_step += b.flagged as u64;
            report.skipped += (ids.len() - live) as u64;
            report.batches += 1;
            for id in ids {
                crate::client::wait::wake(id);
            }
        }
        Ok(report)
    }

    /// Retries every failed instance `filter` matches, as [`Client::retry`] retries one,
    /// in transactions of at most [`BULK_BATCH`] instances. A child whose parent no longer
    /// waits for it, or an instance whose unique key another now holds, is skipped and
    /// counted in `skipped`. `dry_run`: counts the matches and writes nothing. A filter
    /// that names neither a queue nor an FSM, or a status other than `failed`, is
    /// [`Error::InvalidInput`] (nothing written).
    pub async fn retry_where(&self, filter: &Filter, dry_run: bool) -> Result<BulkReport> {
        let now = self.clock().now_param();
        let p = filter.params(BulkAction::Retry, now)?;
        if dry_run {
            return self.dry_run(&p).await;
        }
        let mut report = BulkReport::default();
        let mut after = 0;
        loop {
            let ids = matching_ids(self.pooler().pool(self.pool()), &p, after, BULK_BATCH).await?;
            let Some(&last) = ids.last() else { break };
            after = last;
            report.matched += ids.len() as u64;
            let retried = match self.retry_batch(&ids, now).await? {
                Some(n) => n,
                // One row's key is held by another: that statement changed nothing. The
                // batch goes again one row at a time, so the others are retried.
                None => {
                    let mut n = 0;
                    for id in &ids {
                        n += self.retry_batch(&[*id], now).await?.unwrap_or(0);
                    }
                    n
                }
            };
            report.changed += retried;
            report.skipped += ids.len() as u64 - retried;
            report.batches += 1;
        }
        Ok(report)
    }

    /// Retries `ids` in one transaction: how many were retried, or `None` (nothing
    /// changed) if one of them came back into its key's scope while another row holds it.
    async fn retry_batch(&self, ids: &[i64], now: Option<DateTime<Utc>>) -> Result<Option<u64>> {
        let mut tx = self.pool().begin().await?;
        let found =
            control::rerun(self.pooler().on(&mut *tx), ids, None, self.actor(), now).await?;
        match found {
            Reruns::KeyTaken => {
                tx.rollback().await?;
                Ok(None)
            }
            Reruns::Found(rows) => {
                tx.commit().await?;
                Ok(Some(rows.iter().filter(|r| r.go).count() as u64))
            }
        }
    }

    async fn dry_run(&self, p: &FilterParams<'_>) -> Result<BulkReport> {
        let n = matching_count(self.pooler().pool(self.pool()), p).await?;
        Ok(BulkReport {
            matched: n as u64,
            dry_run: true,
            ..BulkReport::default()
        })
    }
}
