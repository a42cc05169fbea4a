//! `/instances/{id}`: one instance — where it is (state, step, attempt, last error,
//! awaits and deadline), its inbox, its parent, its children as a tree, the explain line,
//! its history as a timeline, and, for a signed-in operator, the actions its status allows. The row, inbox and
//! child counts are `inspect`'s statement; the tree is the dashboard's.

use std::collections::BTreeMap;

use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::Extension;
use maud::{html, Markup};
use serde::Deserialize;
use serde_json::Value;

use super::auth::{self, Csrf};
use super::error::DashboardError;
use super::explain::explain_line;
use super::layout::{self, Page};
use super::live::Live;
use super::timeline;
use super::AppState;
use crate::cli::table;
use crate::store::admin;
use crate::store::dashboard::{self, TreeRow};

/// How deep the children tree goes (children are level 1).
pub(crate) const TREE_DEPTH: i32 = 4;
/// The most descendants the tree shows.
pub(crate) const TREE_LIMIT: i64 = 200;

/// The row's fields shown at the top, in the order an operator reads them.
const SUMMARY: &[&str] = &[
    "status",
    "step",
    "attempt",
    "last_error",
    "awaits",
    "await_deadline",
    "queue",
    "priority",
    "eligible_at",
    "partition_key",
    "unique_key",
    "children_pending",
    "locked_by",
    "lease_expires_at",
    "cancel_requested",
    "reaps",
    "inserted_at",
    "updated_at",
];

const TIME_FIELDS: &[&str] = &[
    "eligible_at",
    "await_deadline",
    "lease_expires_at",
    "inserted_at",
    "updated_at",
];

/// `?did=…`: what the action that led here did.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Params {
    did: Option<String>,
}

/// What the page says first: what the action that led here did, or why it was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Notice {
    None,
    /// `?did=…` after an action.
    Did(String),
    /// The engine refused an action on this instance (or its form did not parse): why.
    Refused(String),
}

pub(crate) async fn page(
    State(state): State<AppState>,
    Extension(csrf): Extension<Csrf>,
    headers: HeaderMap,
    reload: Live,
    Path(id): Path<String>,
    Query(params): Query<Params>,
) -> Result<Page, DashboardError> {
    let id: i64 = id
        .parse()
        .map_err(|_| DashboardError::BadRequest(format!("{id:?} is not an instance id")))?;
    let notice = params.did.map_or(Notice::None, Notice::Did);
    Ok(render(&state, &csrf, &headers, id, notice)
        .await?
        .live(reload))
}

/// Instance `id`'s page, `notice` at its top.
pub(crate) async fn render(
    state: &AppState,
    csrf: &Csrf,
    headers: &HeaderMap,
    id: i64,
    notice: Notice,
) -> Result<Page, DashboardError> {
    // One clock for the page's relative times and its timeline: the database's.
    let now = admin::db_now(&state.pool, None).await?;
    let found = admin::inspect(&state.pool, id, admin::INSPECT_LIST_LIMIT)
        .await?
        .ok_or(DashboardError::NotFound(id))?;
    let tree = dashboard::tree(&state.pool, id, TREE_DEPTH, TREE_LIMIT).await?;
    let explain = explain_line(&state.pool, id).await;
    let history = gen_durable::Client::new(state.pool.clone())
        .history(id, None, timeline::SHOWN)
        .await?;
    let row = found.row.as_object().cloned().unwrap_or_default();
    let get = |k: &str| row.get(k).cloned().unwrap_or(Value::Null);
    let status = get("status").as_str().unwrap_or_default().to_string();
    let live = !matches!(status.as_str(), "done" | "failed");
    let operator = auth::is_operator(state, headers);
    let by_status = found
        .children_by_status
        .as_object()
        .cloned()
        .unwrap_or_default();
    let children_total: i64 = by_status.values().filter_map(Value::as_i64).sum();
    let inbox = found.inbox.as_array().cloned().unwrap_or_default();
    // The restart form's choices: the version's steps, as a live node announces them.
    let steps = if operator && status != "executing" {
        let fsm = get("fsm");
        let version = get("fsm_version").as_i64().unwrap_or_default();
        dashboard::version_steps(&state.pool, fsm.as_str().unwrap_or_default(), version).await?
    } else {
        Vec::new()
    };

    let body = html! {
        h1 { "Instance #" (id) " · " (table::cell(&get("fsm"))) " v" (table::cell(&get("fsm_version"))) " " (layout::status(&status)) }
        @match &notice {
            Notice::Did(did) => p.notice id="notice" { (did_text(did)) },
            Notice::Refused(why) => p.error id="refused" { "Refused: " (why) },
            Notice::None => {},
        }
        @if let Some(line) = &explain {
            p id="explain" { strong { "Why: " } (line) }
        }
        p {
            @match get("parent_id").as_i64() {
                Some(p) => { "Parent: " a id="parent" href=(format!("/instances/{p}")) { "#" (p) } }
                None => span.note { "No parent." },
            }
        }
        dl id="summary" {
            @for k in SUMMARY {
                @let v = get(k);
                dt { (k) }
                dd data-field=(k) {
                    @if TIME_FIELDS.contains(k) && !v.is_null() {
                        (layout::json_when(now, &v))
                    } @else if *k == "attempt" {
                        (table::attempt(&v))
                    } @else if *k == "last_error" && !v.is_null() {
                        span.error { (table::cell(&v)) }
                    } @else {
                        (table::cell(&v))
                    }
                }
            }
        }
        @if operator {
            (actions(id, &status, live, &get("step"), &steps))
        }
        h2 { "State" }
        pre id="state" { (pretty(&get("state"))) }
        h2 { "Timeline" }
        (timeline::timeline(id, &history.entries, history.next.is_some(), now, operator))
        @if !get("result").is_null() {
            h2 { "Result" }
            pre id="result" { (pretty(&get("result"))) }
        }
        h2 { "Inbox (" (found.inbox_total) ")" }
        @if inbox.is_empty() {
            p id="inbox" { "Empty." }
        } @else {
            table id="inbox" {
                tr { th { "id" } th { "name" } th { "dedup key" } th { "inserted" } th { "payload" } }
                @for s in &inbox {
                    tr {
                        td { (table::cell(&s["id"])) }
                        td { (table::cell(&s["name"])) }
                        td { (table::cell(&s["dedup_key"])) }
                        td { (layout::json_when(now, &s["inserted_at"])) }
                        td { code { (layout::clip(&s["payload"].to_string(), 200)) } }
                    }
                }
            }
            @if (inbox.len() as i64) < found.inbox_total {
                p.note { "The first " (inbox.len()) " shown." }
            }
        }
        h2 { "Children (" (children_total) ")" }
        @if children_total > 0 {
            p id="children-by-status" {
                @for (s, n) in &by_status { (layout::status(s)) " " (table::cell(n)) " " }
            }
            div id="children" { (subtree(id, &tree)) }
            @if tree.len() as i64 >= TREE_LIMIT {
                p.note { "The first " (TREE_LIMIT) " descendants shown, " (TREE_DEPTH) " levels deep at most." }
            }
        } @else {
            p id="children" { "None." }
        }
    };
    Ok(Page::new(&format!("Instance {id}"), body)
        .viewer(operator.then_some(csrf.0.as_str()), state.token.is_some()))
}

fn did_text(did: &str) -> &'static str {
    match did {
        "cancelled" => "Cancelled: it and its live children failed with \"cancelled\" (a running step ends first).",
        "retried" => "Retried: runnable again at the step it failed in.",
        "signalled" => "Signal delivered.",
        "forked" => "Forked: this instance started from a past step of another (its timeline says which).",
        "restarted" => "Restarted: runnable now at the step asked for (its step above), its attempts counted afresh.",
        _ => "Done.",
    }
}

/// `v` pretty-printed, cut at [`layout::MAX_JSON_SHOWN`] characters (the CLI's `inspect
/// --json` prints it all).
fn pretty(v: &Value) -> String {
    let s = serde_json::to_string_pretty(v).unwrap_or_default();
    let cut = layout::clip(&s, layout::MAX_JSON_SHOWN);
    if cut.len() < s.len() {
        format!("{cut}\n(cut: `gen_durable inspect --json` shows it all)")
    } else {
        s
    }
}

/// The children of `parent` among `rows` as nested lists, each a link to its page.
fn subtree(parent: i64, rows: &[TreeRow]) -> Markup {
    let mut by_parent: BTreeMap<i64, Vec<&TreeRow>> = BTreeMap::new();
    for r in rows {
        if let Some(p) = r.parent_id {
            by_parent.entry(p).or_default().push(r);
        }
    }
    level(parent, &by_parent)
}

fn level(parent: i64, by_parent: &BTreeMap<i64, Vec<&TreeRow>>) -> Markup {
    html! {
        @if let Some(children) = by_parent.get(&parent) {
            ul.tree {
                @for c in children {
                    li data-id=(c.id) {
                        a.child href=(format!("/instances/{}", c.id)) { "#" (c.id) }
                        " " (c.fsm) " v" (c.fsm_version) " · " (c.step) " " (layout::status(&c.status))
                        (level(c.id, by_parent))
                    }
                }
            }
        }
    }
}

/// The forms of the actions `status` allows. Restart-from-step, bulk actions and
/// pause/resume (being built apart) add their forms here and their routes in
/// `actions::routes`.
fn actions(id: i64, status: &str, live: bool, step: &Value, steps: &[String]) -> Markup {
    let current = step.as_str().unwrap_or_default();
    let confirm = format!("/instances/{id}/confirm");
    html! {
        h2 { "Actions" }
        p.note { "Each action shows what it will do, and asks to confirm it." }
        div.actions {
            @if live {
                form method="get" action=(confirm) {
                    input type="hidden" name="action" value="cancel";
                    button type="submit" id="cancel" { "Cancel" }
                }
                form method="get" action=(confirm) {
                    input type="hidden" name="action" value="signal";
                    input name="name" placeholder="signal name" required;
                    input name="payload" placeholder="JSON payload" value="null";
                    input name="dedup_key" placeholder="dedup key (optional)";
                    button type="submit" id="signal" { "Signal" }
                }
            }
            @if status == "failed" {
                form method="get" action=(confirm) {
                    input type="hidden" name="action" value="retry";
                    button type="submit" id="retry" { "Retry" }
                }
            }
            @if status != "executing" {
                form method="get" action=(confirm) {
                    input type="hidden" name="action" value="restart";
                    @if steps.is_empty() {
                        input name="step" placeholder="step name" required;
                    } @else {
                        select name="step" id="restart-step" {
                            @for s in steps {
                                option value=(s) selected[s == current] { (s) }
                            }
                        }
                    }
                    button type="submit" id="restart" { "Restart from step" }
                }
            }
        }
    }
}
