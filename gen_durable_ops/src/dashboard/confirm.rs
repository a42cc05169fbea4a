//! `/instances/{id}/confirm?action=…`: what an action on one instance will do, and the
//! button that does it. The instance page's and the timeline's action forms lead here
//! (a GET: nothing is written); the confirmation posts to the action's route with the
//! page's CSRF token, as those forms did before. Scripts post to the routes directly.

use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::Extension;
use maud::{html, Markup};
use serde::Deserialize;
use serde_json::Value;

use super::auth::{self, Csrf};
use super::error::DashboardError;
use super::layout::{self, Page};
use super::AppState;
use crate::cli::table;
use crate::store::admin;

/// The action asked for, with the fields its form carries.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Params {
    #[serde(default)]
    action: String,
    step: Option<String>,
    entry: Option<String>,
    name: Option<String>,
    payload: Option<String>,
    dedup_key: Option<String>,
}

pub(crate) async fn page(
    State(state): State<AppState>,
    Extension(csrf): Extension<Csrf>,
    headers: HeaderMap,
    Path(id): Path<i64>,
    Query(p): Query<Params>,
) -> Result<Page, DashboardError> {
    if state.token.is_none() {
        return Err(DashboardError::ReadOnly);
    }
    if !auth::is_operator(&state, &headers) {
        return Err(DashboardError::NotSignedIn);
    }
    let found = admin::inspect(&state.pool, id, 1)
        .await?
        .ok_or(DashboardError::NotFound(id))?;
    let row = found.row.as_object().cloned().unwrap_or_default();
    let get = |k: &str| table::cell(row.get(k).unwrap_or(&Value::Null));
    let live_children: i64 = found
        .children_by_status
        .as_object()
        .map(|by| {
            by.iter()
                .filter(|(s, _)| !matches!(s.as_str(), "done" | "failed"))
                .filter_map(|(_, n)| n.as_i64())
                .sum()
        })
        .unwrap_or(0);
    let (verb, what): (&str, Markup) = match p.action.as_str() {
        "cancel" => (
            "Cancel",
            html! {
                "It fails with \"cancelled\", and so do its live children ("
                (live_children) ") and theirs. A step running now ends first."
            },
        ),
        "retry" => (
            "Retry",
            html! { "It becomes runnable again at step " code { (get("step")) } ", its attempts counted afresh." },
        ),
        "restart" => match (given(&p.entry), given(&p.step)) {
            (Some(entry), _) => (
                "Restart from a history entry",
                html! { "It becomes runnable at the step history entry " (entry) " ran, in the state that step began with; its attempts counted afresh, nothing awaited." },
            ),
            (None, Some(step)) => (
                "Restart",
                html! { "It becomes runnable now at step " code { (step) } ", in its last committed state; its attempts counted afresh, nothing awaited." },
            ),
            (None, None) => {
                return Err(DashboardError::BadRequest(
                    "restart needs a step or a history entry".into(),
                ))
            }
        },
        "signal" => (
            "Signal",
            html! {
                "It receives signal " code { (given(&p.name).unwrap_or("")) }
                " with payload " code { (given(&p.payload).unwrap_or("null")) }
                @if let Some(d) = given(&p.dedup_key) { " (dedup key " code { (d) } ")" }
                "; it wakes if it awaits that name."
            },
        ),
        "fork" => (
            "Fork",
            html! { "A new instance starts at the step history entry " (given(&p.entry).unwrap_or("")) " ran, in the state that step began with. This one is not touched." },
        ),
        other => {
            return Err(DashboardError::BadRequest(format!(
                "no action {other:?}: cancel, retry, restart, signal or fork"
            )))
        }
    };
    let hidden = [
        ("step", &p.step),
        ("entry", &p.entry),
        ("name", &p.name),
        ("payload", &p.payload),
        ("dedup_key", &p.dedup_key),
    ];
    let body = html! {
        h1 { "Confirm: " (verb) " instance " (layout::instance_link(id)) }
        p { (get("fsm")) " v" (get("fsm_version")) ", at step " code { (get("step")) } ", " (layout::status(&get("status"))) }
        p id="confirm-what" { (what) }
        form method="post" action=(format!("/instances/{id}/{}", p.action)) {
            input type="hidden" name="csrf" value=(csrf.0);
            @for (k, v) in hidden {
                @if let Some(v) = v { input type="hidden" name=(k) value=(v); }
            }
            button type="submit" id="confirm" { "Confirm: " (verb) }
            " "
            a id="back" href=(format!("/instances/{id}")) { "Back to the instance" }
        }
    };
    Ok(Page::new("Confirm", body).viewer(Some(csrf.0.as_str()), true))
}

/// A form field, trimmed; `None` when absent or blank.
fn given(v: &Option<String>) -> Option<&str> {
    v.as_deref().map(str::trim).filter(|s| !s.is_empty())
}
