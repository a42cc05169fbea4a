//! `/instances`: the instance list, filtered by queue, FSM, status, correlation key and
//! insert time, newest first, paginated by keyset (`?after=ID`: the rows below ID), never
//! by OFFSET. Each page reads at most [`WINDOW`] rows (see `store::pg::dashboard::PAGE`).

use axum::extract::{Query, RawQuery, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use chrono::{DateTime, NaiveDateTime, Utc};
use maud::html;
use serde::Deserialize;

use super::actions::redirect;
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
    /// Read from the raw query ([`statuses`]): the form's checkboxes repeat the key.
    #[serde(skip)]
    status: Vec<String>,
    key: Option<String>,
    /// Only this instance's children.
    parent: Option<String>,
    /// Text its last error contains (any case).
    error: Option<String>,
    /// Go straight to this instance's page.
    id: Option<String>,
    /// A JSON path predicate over `{"state": …, "result": …}`: `$.state.order == 42`.
    path: Option<String>,
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
pub(crate) fn parse_time(field: &str, v: &str) -> Result<DateTime<Utc>, DashboardError> {
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
        let status = self.status.clone();
        if let Some(s) = status
            .iter()
            .find(|s| !Status::ALL.iter().any(|a| a.as_str() == s.as_str()))
        {
            return Err(DashboardError::BadRequest(format!("unknown status {s:?}")));
        }
        let parent = given(&self.parent)
            .map(|p| {
                p.parse().map_err(|_| {
                    DashboardError::BadRequest(format!("parent {p:?} is not an instance id"))
                })
            })
            .transpose()?;
        Ok(ListFilter {
            queue: given(&self.queue),
            fsm: given(&self.fsm),
            status,
            key: given(&self.key),
            parent,
            error: given(&self.error),
            path: given(&self.path),
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
            ("key", &self.key),
            ("parent", &self.parent),
            ("error", &self.error),
            ("path", &self.path),
            ("since", &self.since),
            ("until", &self.until),
        ] {
            if let Some(v) = given(v) {
                q.push_str(&format!("&{k}={}", urlencode(&v)));
            }
        }
        if !self.status.is_empty() {
            q.push_str(&format!("&status={}", self.status.join(",")));
        }
        q
    }
}

pub(crate) async fn page(
    State(state): State<AppState>,
    Extension(csrf): Extension<Csrf>,
    headers: HeaderMap,
    live: Live,
    Query(mut params): Query<Params>,
    RawQuery(raw): RawQuery,
) -> Result<Response, DashboardError> {
    params.status = statuses(raw.as_deref());
    if let Some(id) = given(&params.id) {
        let id: i64 = id
            .parse()
            .map_err(|_| DashboardError::BadRequest(format!("{id:?} is not an instance id")))?;
        return Ok(redirect(&format!("/instances/{id}")));
    }
    // A queue or FSM named in another case is the one in use of that name, so that the
    // list and the bulk form act on the same rows.
    let (queues, fsms) = dashboard::names(&state.pool).await?;
    params.queue = given(&params.queue).map(|q| in_use(q, &queues));
    params.fsm = given(&params.fsm).map(|f| in_use(f, &fsms));
    let filter = params.filter()?;
    if let Some(path) = &filter.path {
        dashboard::check_path(&state.pool, path)
            .await?
            .map_err(|why| {
                DashboardError::BadRequest(format!("path {path:?} is not a JSON path: {why}"))
            })?;
    }
    let before = params.cursor()?;
    let now = admin::db_now(&state.pool, None).await?;
    let rows = dashboard::page(&state.pool, &filter, before, WINDOW, PAGE_SIZE).await?;
    // A full page goes on below its last row. A short one without a key has read its
    // whole window: it goes on below the window, if any row is left there.
    let next = if rows.len() as i64 == PAGE_SIZE {
        rows.last().map(|r| r.id)
    } else if filter.key.is_none() && filter.parent.is_none() {
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
    // The filter a bulk action cannot take (the in-memory kit has no JSON path): with it
    // on, the form would act on more rows than the list shows.
    let failed_only = filter.status == ["failed"];
    let narrower = filter.path.is_some();
    let operator = auth::is_operator(&state, &headers);
    // This page again, for the way back from an action on its selected rows.
    let this_page = match &raw {
        Some(q) if !q.is_empty() => format!("/instances?{q}"),
        _ => "/instances".to_string(),
    };
    let body = html! {
        h1 { "Instances" }
        form.filters method="get" action="/instances" {
            label { "queue " input name="queue" list="queues" value=(v(&params.queue)) size="10"; }
            datalist id="queues" { @for q in &queues { option value=(q) {} } }
            label { "FSM " input name="fsm" list="fsms" value=(v(&params.fsm)) size="12"; }
            datalist id="fsms" { @for f in &fsms { option value=(f) {} } }
            span { "status "
                @for s in Status::ALL {
                    label.status-pick {
                        input type="checkbox" name="status" value=(s.as_str()) checked[filter.status.iter().any(|f| f == s.as_str())];
                        (s.as_str()) " "
                    }
                }
            }
            label { "key " input name="key" value=(v(&params.key)) size="14"; }
            label { "error contains " input name="error" value=(v(&params.error)) size="14"; }
            label { "children of #" input name="parent" value=(v(&params.parent)) size="8"; }
            label { "state/result " input name="path" value=(v(&params.path)) size="22" placeholder="$.state.order == 42"; }
            label { "inserted since " input type="datetime-local" name="since" value=(v(&params.since)); }
            label { "until " input type="datetime-local" name="until" value=(v(&params.until)); }
            button type="submit" { "Filter" }
            " " a href="/instances" { "clear" }
        }
        form.filters method="get" action="/instances" {
            label { "Instance #" input name="id" size="10" required; }
            button type="submit" id="go" { "Open" }
        }
        @if let Some(p) = filter.parent {
            p id="parent-of" { "The children of " (layout::instance_link(p)) "." }
        }
        @if operator && (params.queue.is_some() || params.fsm.is_some()) && narrower {
            p.note id="bulk-narrower" {
                "Bulk actions take every filter but state/result: clear it to act on every instance the others match, or tick the rows to act on."
            }
        }
        @if operator && (params.queue.is_some() || params.fsm.is_some()) && !narrower {
            form.bulk method="post" action="/bulk" id="bulk" {
                input type="hidden" name="csrf" value=(csrf.0);
                input type="hidden" name="queue" value=(v(&params.queue));
                input type="hidden" name="fsm" value=(v(&params.fsm));
                input type="hidden" name="status" value=(filter.status.join(","));
                input type="hidden" name="key" value=(v(&params.key));
                input type="hidden" name="parent" value=(v(&params.parent));
                input type="hidden" name="error" value=(v(&params.error));
                input type="hidden" name="since" value=(v(&params.since));
                input type="hidden" name="until" value=(v(&params.until));
                "Every instance this filter matches (not only this page): "
                select name="action" {
                    // On a list of failed instances, retrying them is the likely intent.
                    option value="cancel" selected[!failed_only] { "cancel" }
                    option value="retry" selected[failed_only] { "retry (failed ones)" }
                }
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
                    @if operator { th { "select" } }
                    th { "id" } th { "FSM" } th { "step" } th { "status" } th { "queue" }
                    th { "attempt" } th { "key" } th { "parent" } th { "inserted" } th { "updated" } th { "last error" }
                }
                @for r in &rows {
                    tr data-id=(r.id) {
                        @if operator {
                            td { input type="checkbox" name="id" value=(r.id) form="selected" aria-label=(format!("select #{}", r.id)); }
                        }
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
        @if operator && !rows.is_empty() {
            form.bulk method="post" action="/selected" id="selected" {
                input type="hidden" name="csrf" value=(csrf.0);
                input type="hidden" name="back" value=(this_page);
                input type="hidden" name="preview" value="1";
                "The selected rows: "
                select name="action" {
                    option value="cancel" selected[!failed_only] { "cancel" }
                    option value="retry" selected[failed_only] { "retry" }
                }
                " "
                button type="submit" id="selected-preview" { "Preview" }
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
        .viewer(operator.then_some(csrf.0.as_str()), state.token.is_some())
        .into_response())
}

/// The statuses a query asks for: every `status=` (the form's checkboxes repeat it), each
/// possibly a comma-separated list (the links' form).
fn statuses(query: Option<&str>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for value in query
        .unwrap_or_default()
        .split('&')
        .filter_map(|p| p.strip_prefix("status="))
    {
        // A status is a plain word; the one escape a browser writes here is the comma's.
        let value = value.replace("%2C", ",").replace("%2c", ",");
        for s in value.split(',').filter(|s| !s.is_empty()) {
            if !out.iter().any(|o| o == s) {
                out.push(s.to_string());
            }
        }
    }
    out
}

/// `name` as it is in use in `known` when only its case differs; as given otherwise.
fn in_use(name: String, known: &[String]) -> String {
    if known.contains(&name) {
        return name;
    }
    let mut same = known.iter().filter(|k| k.eq_ignore_ascii_case(&name));
    match (same.next(), same.next()) {
        (Some(one), None) => one.clone(),
        _ => name,
    }
}
