//! `POST /selected`: cancel or retry the instances ticked on the list — a preview that
//! writes nothing and names them, then the action on each, through `Client::cancel` /
//! `Client::retry` as on the instance's page, with what it did to each (a refusal is that
//! row's answer, not the page's).

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Form;
use maud::html;

use super::auth::authorize;
use super::error::DashboardError;
use super::layout::{self, Page};
use super::AppState;
use gen_durable::Error;

/// The most instances one selection takes: a list page shows 50.
pub(crate) const MOST: usize = 500;

/// What a selection form carries: its token, the action, the ticked ids, whether it is
/// the preview, and the list to go back to.
#[derive(Debug, Default)]
struct Selection {
    csrf: String,
    action: String,
    ids: Vec<i64>,
    preview: bool,
    back: String,
}

impl Selection {
    /// The form's fields; `id` repeats, one per ticked row. Stops at the first id past
    /// [`MOST`].
    fn parse(fields: Vec<(String, String)>) -> Result<Self, DashboardError> {
        let mut s = Selection::default();
        let mut seen = std::collections::HashSet::new();
        for (name, value) in fields {
            match name.as_str() {
                "csrf" => s.csrf = value,
                "action" => s.action = value,
                "preview" => s.preview = true,
                // Back to the list it came from, and nowhere else.
                "back" if value.starts_with("/instances") => s.back = value,
                "id" => {
                    let id = value.trim().parse().map_err(|_| {
                        DashboardError::BadRequest(format!("{value:?} is not an instance id"))
                    })?;
                    if seen.insert(id) {
                        s.ids.push(id);
                    }
                    if s.ids.len() > MOST {
                        return Err(DashboardError::BadRequest(format!(
                            "more than {MOST} instances are selected; one action takes at \
                             most {MOST} (a bulk action by filter takes any number)"
                        )));
                    }
                }
                _ => {}
            }
        }
        if s.ids.is_empty() {
            return Err(DashboardError::BadRequest(
                "no instance is selected: tick the rows to act on".into(),
            ));
        }
        if !matches!(s.action.as_str(), "cancel" | "retry") {
            return Err(DashboardError::BadRequest(format!(
                "no action {:?} on selected instances: cancel or retry",
                s.action
            )));
        }
        if s.back.is_empty() {
            s.back = "/instances".into();
        }
        Ok(s)
    }
}

pub(crate) async fn act(
    State(state): State<AppState>,
    headers: HeaderMap,
    Form(fields): Form<Vec<(String, String)>>,
) -> Result<Response, DashboardError> {
    // Authorized before the ids are read, as every action is.
    let csrf = fields
        .iter()
        .find(|(name, _)| name == "csrf")
        .map_or("", |(_, v)| v.as_str());
    let gd = authorize(&state, &headers, csrf)?;
    let s = Selection::parse(fields)?;
    let n = s.ids.len();
    let body = if s.preview {
        html! {
            h1 { "Selected instances: " (s.action) }
            p id="selected-report" {
                (n) " instance(s) selected: "
                @for id in &s.ids { (layout::instance_link(*id)) " " }
                "Nothing was written."
            }
            p.note {
                @if s.action == "cancel" {
                    "Cancel fails each live one (and its live children) at once, or after its current step if it is executing; a finished one is refused."
                } @else {
                    "Retry puts each failed one back where its failed step began; any other is refused."
                }
            }
            form method="post" action="/selected" {
                input type="hidden" name="csrf" value=(s.csrf);
                input type="hidden" name="action" value=(s.action);
                input type="hidden" name="back" value=(s.back);
                @for id in &s.ids { input type="hidden" name="id" value=(id); }
                button type="submit" id="selected-confirm" { "Confirm: " (s.action) " " (n) }
            }
            p { a href=(s.back) { "Back to the instances" } }
        }
    } else {
        let mut outcomes = Vec::with_capacity(n);
        for id in &s.ids {
            let said = if s.action == "cancel" {
                gd.cancel(*id).await.map(|c| {
                    if c.after_current_step > 0 {
                        "fails after its current step".to_string()
                    } else {
                        format!("cancelled ({} failed at once)", c.failed)
                    }
                })
            } else {
                gd.retry(*id).await.map(|()| "retried".to_string())
            };
            let said = match said {
                Ok(done) => done,
                Err(e @ Error::Database(_)) => return Err(DashboardError::Database(e)),
                Err(refusal) => format!("refused: {refusal}"),
            };
            outcomes.push((*id, said));
        }
        html! {
            h1 { "Selected instances: " (s.action) }
            p id="selected-report" { (n) " instance(s):" }
            table id="selected" {
                tr { th { "instance" } th { "what was done" } }
                @for (id, said) in &outcomes {
                    tr data-id=(id) { td { (layout::instance_link(*id)) } td { (said) } }
                }
            }
            p { a href=(s.back) { "Back to the instances" } }
        }
    };
    Ok(Page::new("Selected instances", body)
        .viewer(Some(s.csrf.as_str()), true)
        .into_response())
}
