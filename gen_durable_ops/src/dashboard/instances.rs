//! `/instances`: the instance list, filtered by queue, FSM, status, correlation key and
//! insert time, newest first, paginated by keyset (`?after=ID`: the rows below ID), never
//! by OFFSET. Each page reads at most [`WINDOW`] rows (see `store::pg::dashboard::PAGE`).

use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::Extension;
use chrono::{DateTime, NaiveDateTime, Utc};
use maud::html;
use serde::Deserialize;

use super::auth::{self, Csrf};
use super::error::DashboardError;
use super::layout::{self, Page};
use super::live::Live;
use super::overview::urlencode;
use super::AppState;
use crate::store::admin;
use crate::store::dashboard::{self, ListFilter};
use gen_durable::Status;

/// Rows per page.
pub(crate) const PAGE_SIZE: i64 = 50;
/// The most rows one page reads to find its matches, in id order below the cursor.
pub(crate) const WINDOW: i64 = 10_000;

/// The query string; empty fields are "any".
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Params {
    queue: Option<String>,
    fsm: Option<String>,
    status: Option<String>,
    key: Option<String>,
    /// Inserted at or after (`2026-12-02T10:00`, UTC, or RFC 3339).
    since: Option<String>,
    /// Inserted before.
    until: Option<String>,
    /// The keyset cursor: show rows with a lower id.
    after: Option<String>,
}

fn given(v: &Option<String>) -> Option<String> {
    v.as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

/// `2026-12-02T10:00` (as a `datetime-local` input sends it, read as UTC), with seconds,
/// or RFC 3339.
fn parse_time(field: &str, v: &str) -> Result<DateTime<Utc>, DashboardError> {
    if let Ok(t) = DateTime::parse_from_rfc3339(v) {
        return Ok(t.with_timezone(&Utc));
    }
    ["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S"]
        .iter()
        .find_map(|f| NaiveDateTime::parse_from_str(v, f).ok())
        .map(|t| t.and_utc())
        .ok_or_else(|| {
            DashboardError::BadRequest(format!(
                "{field} {v:?} is not a time: write 2026-12-02T10:00 (UTC) or RFC 3339"
            ))
        })
}

impl Params {
    fn filter(&self) -> Result<ListFilter, DashboardError> {
        let status = given(&self.status);
        if let Some(s) = &status {
            if !Status::ALL.iter().any(|a| a.as_str() == s) {
                return Err(DashboardError::BadRequest(format!("unknown status {s:?}")));
            }
        }
        Ok(ListFilter {
            queue: given(&self.queue),
            fsm: given(&self.fsm),
            status,
            key: given(&self.key),
            since: given(&self.since)
                .map(|v| parse_time("since", &v))
                .transpose()?,
            until: given(&self.until)
                .map(|v| parse_time("until", &v))
                .transpose()?,
        })
    }

    fn cursor(&self) -> Result<i64, DashboardError> {
        match given(&self.after) {
            None => Ok(i64::MAX),
            Some(a) => a
                .parse()
                .map_err(|_| DashboardError::BadRequest(format!("after {a:?} is not an id"))),
        }
    }

    /// This page's query string with another cursor.
    fn with_after(&self, after: i64) -> String {
        let mut q = format!("after={after}");
        for (k, v) in [
            ("queue", &self.queue),
            ("fsm", &self.fsm),
            ("status", &self.status),
            ("key", &self.key),
            ("since", &self.since),
            ("until", &self.until),
        ] {
            if let Some(v) = given(v) {
                q.push_str(&format!("&{k}={}", urlencode(&v)));
            }
        }
        q
    }
}

pub(crate) async fn page(
    State(state): State<AppState>,
    Extension(csrf): Extension<Csrf>,
    headers: HeaderMap,
    live: Live,
    Query(params): Query<Params>,
) -> Result<Page, DashboardError> {
    let filter = params.filter()?;
    let before = params.cursor()?;
    let now = admin::db_now(&state.pool, None).await?;
    let rows = dashboard::page(&state.pool, &filter, before, WINDOW, PAGE_SIZE).await?;
    // A full page goes on below its last row. A short one without a key has read its
    // whole window: it goes on below the window, if any row is left there.
    let next = if rows.len() as i64 == PAGE_SIZE {
        rows.last().map(|r| r.id)
    } else if filter.key.is_none() {
        match dashboard::window_end(&state.pool, before, WINDOW).await? {
            Some(end) => dashboard::window_end(&state.pool, end, 1)
                .await?
                .map(|_| end),
            None => None,
        }
    } else {
        None
    };
    let v = |o: &Option<String>| o.clone().unwrap_or_default();
    let operator = auth::is_operator(&state, &headers);
    let body = html! {
        h1 { "Instances" }
        form.filters method="get" action="/instances" {
            label { "queue " input name="queue" value=(v(&params.queue)) size="10"; }
            label { "FSM " input name="fsm" value=(v(&params.fsm)) size="12"; }
            label { "status "
                select name="status" {
                    option value="" { "any" }
                    @for s in Status::ALL {
                        option value=(s.as_str()) selected[filter.status.as_deref() == Some(s.as_str())] { (s.as_str()) }
                    }
                }
            }
            label { "key " input name="key" value=(v(&params.key)) size="14"; }
            label { "inserted since " input type="datetime-local" name="since" value=(v(&params.since)); }
            label { "until " input type="datetime-local" name="until" value=(v(&params.until)); }
            button type="submit" { "Filter" }
            " " a href="/instances" { "clear" }
        }
        @if operator && (params.queue.is_some() || params.fsm.is_some()) {
            form.bulk method="post" action="/bulk" id="bulk" {
                input type="hidden" name="csrf" value=(csrf.0);
                input type="hidden" name="queue" value=(v(&params.queue));
                input type="hidden" name="fsm" value=(v(&params.fsm));
                input type="hidden" name="status" value=(filter.status.clone().unwrap_or_default());
                "Every instance of this queue/FSM/status (key and times aside): "
                select name="action" { option value="cancel" { "cancel" } option value="retry" { "retry (failed ones)" } }
                " "
                button type="submit" name="preview" value="1" id="bulk-preview" { "Preview (count)" }
            }
        }
        p.note {
            "Times are UTC. Newest first. "
            @if filter.key.is_none() {
                "Each page looks at up to " (WINDOW) " rows below "
                @if before == i64::MAX { "the newest" } @else { "#" (before) }
                "."
            }
        }
        @if rows.is_empty() {
            p id="empty" { "No instance matches here." }
        } @else {
            table id="instances" {
                tr {
                    th { "id" } th { "FSM" } th { "step" } th { "status" } th { "queue" }
                    th { "attempt" } th { "key" } th { "parent" } th { "inserted" } th { "updated" } th { "last error" }
                }
                @for r in &rows {
                    tr data-id=(r.id) {
                        td { (layout::instance_link(r.id)) }
                        td { (r.fsm) " v" (r.fsm_version) }
                        td { (r.step) }
                        td { (layout::status(&r.status)) }
                        td { (r.queue) }
                        td.n { (r.attempt + 1) }
                        td { (r.unique_key.as_deref().unwrap_or("")) }
                        td { @if let Some(p) = r.parent_id { (layout::instance_link(p)) } }
                        td { (layout::when(now, r.inserted_at)) }
                        td { (layout::when(now, r.updated_at)) }
                        td { (layout::clip(r.last_error.as_deref().unwrap_or(""), 80)) }
                    }
                }
            }
        }
        p {
            @if before != i64::MAX {
                a href="/instances" { "« newest" } " "
            }
            @if let Some(n) = next {
                a id="older" href=(format!("/instances?{}", params.with_after(n))) { "older »" }
            }
        }
    };
    Ok(Page::new("Instances", body)
        .live(live)
        .viewer(operator.then_some(csrf.0.as_str()), state.token.is_some()))
}
