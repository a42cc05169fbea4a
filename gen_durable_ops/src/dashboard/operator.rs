//! The operator actions beyond one instance's cancel, retry and signal: restart from a
//! named step or a history entry, fork from a history entry, pause and resume a queue, and cancel or retry every instance a filter
//! matches — each through the library's `Client`, as the CLI does them. Authorized like
//! every action (`auth::authorize`: token, then CSRF); a bulk action can be previewed
//! (a dry run: the count, nothing written) before it is confirmed.

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Form};
use maud::html;
use serde::Deserialize;

use super::actions::{back_to, on_instance, redirect, refused};
use super::auth::{authorize, Csrf};
use super::error::DashboardError;
use super::instances::parse_time;
use super::layout::Page;
use super::overview::urlencode;
use super::AppState;
use gen_durable::{Filter, Status};

/// The restart form: a step, or a history entry to start again from (its step and the
/// state it began with).
#[derive(Debug, Deserialize)]
pub(crate) struct RestartForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    step: String,
    #[serde(default)]
    entry: String,
}

/// The fork form: the history entry to start a new instance from.
#[derive(Debug, Deserialize)]
pub(crate) struct ForkForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    entry: String,
}

/// A form's history entry.
fn entry_of(raw: &str) -> Result<i64, DashboardError> {
    raw.trim().parse().map_err(|_| {
        DashboardError::BadRequest(format!("entry {raw:?} is not a history entry's id"))
    })
}

pub(crate) async fn restart(
    State(state): State<AppState>,
    Extension(page_csrf): Extension<Csrf>,
    Path(id): Path<i64>,
    headers: HeaderMap,
    Form(form): Form<RestartForm>,
) -> Result<Response, DashboardError> {
    let gd = authorize(&state, &headers, &form.csrf)?;
    let done = async {
        if form.entry.trim().is_empty() {
            gd.restart(id, form.step.trim()).await
        } else {
            gd.restart_from(id, entry_of(&form.entry)?).await
        }
        .map_err(refused)?;
        Ok(back_to(id, "restarted"))
    }
    .await;
    on_instance(&state, &page_csrf, &headers, id, done).await
}

/// Forks instance `id` from a history entry; shows the new instance.
pub(crate) async fn fork(
    State(state): State<AppState>,
    Extension(page_csrf): Extension<Csrf>,
    Path(id): Path<i64>,
    headers: HeaderMap,
    Form(form): Form<ForkForm>,
) -> Result<Response, DashboardError> {
    let gd = authorize(&state, &headers, &form.csrf)?;
    let done = async {
        let fork = gd.fork(id, entry_of(&form.entry)?).await.map_err(refused)?;
        Ok(back_to(fork, "forked"))
    }
    .await;
    on_instance(&state, &page_csrf, &headers, id, done).await
}

/// The pause form (resume needs only the CSRF token).
#[derive(Debug, Deserialize)]
pub(crate) struct PauseForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    reason: String,
}

pub(crate) async fn pause(
    State(state): State<AppState>,
    Path(queue): Path<String>,
    headers: HeaderMap,
    Form(form): Form<PauseForm>,
) -> Result<Response, DashboardError> {
    let gd = authorize(&state, &headers, &form.csrf)?;
    let reason = Some(form.reason.trim()).filter(|r| !r.is_empty());
    gd.pause_queue(&queue, reason).await.map_err(refused)?;
    Ok(redirect(&format!(
        "/?did=paused&queue={}",
        urlencode(&queue)
    )))
}

pub(crate) async fn resume(
    State(state): State<AppState>,
    Path(queue): Path<String>,
    headers: HeaderMap,
    Form(form): Form<PauseForm>,
) -> Result<Response, DashboardError> {
    authorize(&state, &headers, &form.csrf)?
        .resume_queue(&queue)
        .await
        .map_err(refused)?;
    Ok(redirect(&format!(
        "/?did=resumed&queue={}",
        urlencode(&queue)
    )))
}

/// The bulk form: the instances page's filter, the action, and whether to preview it.
#[derive(Debug, Deserialize)]
pub(crate) struct BulkForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    queue: String,
    #[serde(default)]
    fsm: String,
    #[serde(default)]
    status: String,
    /// The list's other filters, as its query string gives them.
    #[serde(default)]
    key: String,
    #[serde(default)]
    parent: String,
    #[serde(default)]
    error: String,
    #[serde(default)]
    since: String,
    #[serde(default)]
    until: String,
    /// `cancel` or `retry`.
    #[serde(default)]
    action: String,
    /// Present: a dry run.
    #[serde(default)]
    preview: Option<String>,
}

impl BulkForm {
    fn filter(&self) -> Result<Filter, DashboardError> {
        let mut f = Filter::new();
        if !self.queue.trim().is_empty() {
            f = f.with_queue(self.queue.trim());
        }
        if !self.fsm.trim().is_empty() {
            f = f.with_fsm(self.fsm.trim());
        }
        // The list's statuses, comma-separated.
        let statuses = self
            .status
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| {
                s.parse::<Status>()
                    .map_err(|_| DashboardError::BadRequest(format!("no status {s:?}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if !statuses.is_empty() {
            f = f.with_statuses(statuses);
        }
        if let Some(key) = given(&self.key) {
            f = f.with_key(key);
        }
        if let Some(p) = given(&self.parent) {
            let parent = p.parse().map_err(|_| {
                DashboardError::BadRequest(format!("parent {p:?} is not an instance id"))
            })?;
            f = f.with_parent(parent);
        }
        if let Some(text) = given(&self.error) {
            f = f.with_error_containing(text);
        }
        if let Some(v) = given(&self.since) {
            f = f.with_inserted_since(parse_time("since", v)?);
        }
        if let Some(v) = given(&self.until) {
            f = f.with_inserted_until(parse_time("until", v)?);
        }
        Ok(f)
    }

    /// The filter's fields, by their names in the list's query string.
    fn fields(&self) -> [(&'static str, &String); 8] {
        [
            ("queue", &self.queue),
            ("fsm", &self.fsm),
            ("status", &self.status),
            ("key", &self.key),
            ("parent", &self.parent),
            ("error", &self.error),
            ("since", &self.since),
            ("until", &self.until),
        ]
    }

    /// The filter's fields as the list's query string (the way back to it).
    fn query(&self) -> String {
        self.fields()
            .iter()
            .filter(|(_, v)| !v.trim().is_empty())
            .map(|(k, v)| format!("{k}={}", urlencode(v.trim())))
            .collect::<Vec<_>>()
            .join("&")
    }

    /// The filter's fields as hidden inputs (the confirmation carries the previewed filter).
    fn hidden(&self) -> maud::Markup {
        html! {
            @for (k, v) in self.fields() {
                input type="hidden" name=(k) value=(v);
            }
        }
    }
}

/// A form field, trimmed, unless empty.
fn given(v: &str) -> Option<&str> {
    Some(v.trim()).filter(|v| !v.is_empty())
}

pub(crate) async fn bulk(
    State(state): State<AppState>,
    headers: HeaderMap,
    Form(form): Form<BulkForm>,
) -> Result<Response, DashboardError> {
    let gd = authorize(&state, &headers, &form.csrf)?;
    let filter = form.filter()?;
    let dry_run = form.preview.is_some();
    let report = match form.action.as_str() {
        "cancel" => gd.cancel_where(&filter, dry_run).await,
        "retry" => gd.retry_where(&filter, dry_run).await,
        other => {
            return Err(DashboardError::BadRequest(format!(
                "no bulk action {other:?}: cancel or retry"
            )))
        }
    }
    .map_err(refused)?;
    let back = format!("/instances?{}", form.query());
    let verb = if form.action == "cancel" {
        "cancel"
    } else {
        "retry"
    };
    let body = html! {
        h1 { "Bulk " (verb) }
        @if dry_run {
            p id="bulk-report" {
                (report.matched) " instance(s) match; " (verb) " would change them. Nothing was written."
            }
            form method="post" action="/bulk" {
                input type="hidden" name="csrf" value=(form.csrf);
                (form.hidden())
                input type="hidden" name="action" value=(form.action);
                button type="submit" id="bulk-confirm" { "Confirm: " (verb) " " (report.matched) }
            }
        } @else {
            p id="bulk-report" {
                (report.matched) " matched, " (report.changed) " changed, "
                (report.after_current_step) " after their current step, "
                (report.skipped) " skipped (" (report.batches) " batch(es))."
            }
        }
        p { a href=(back) { "Back to the instances" } }
    };
    Ok(Page::new("Bulk action", body)
        .viewer(Some(form.csrf.as_str()), true)
        .into_response())
}
