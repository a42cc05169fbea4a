//! `/fsms`: the FSM versions live nodes register (`gd_nodes.fsms`, `name@version`) next
//! to the versions present in rows, so an operator sees rows of a version no live node
//! runs, and versions nodes run that no row uses any more.
//!
//! No index has the FSM, so the rows are counted in a sample of about
//! `counts::SAMPLE_PAGES` pages: exact while the table is that small, estimates ("≈")
//! past it, and a version with few rows may be missing — the page says so, and points at
//! `gen_durable status`, which counts the live rows no live node runs exactly.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::Extension;
use maud::html;

use super::auth::{self, Csrf};
use super::error::DashboardError;
use super::layout::Page;
use super::live::Live;
use super::AppState;
use crate::store::{admin, dashboard};
use gen_durable::backend::counts;
use gen_durable::backend::counts::Figure;

/// One (FSM, version) line.
#[derive(Debug)]
struct VersionLine {
    /// Live nodes that register it.
    nodes: Vec<String>,
    live_rows: Figure,
    rows: Figure,
}

/// `name@version` → (name, version); the version is after the last `@` (a name may
/// contain `@`, see migration 0003).
pub(crate) fn split_tag(tag: &str) -> Option<(String, i32)> {
    let (name, version) = tag.rsplit_once('@')?;
    Some((name.to_string(), version.parse().ok()?))
}

pub(crate) async fn page(
    State(state): State<AppState>,
    Extension(csrf): Extension<Csrf>,
    headers: HeaderMap,
    live: Live,
) -> Result<Page, DashboardError> {
    let now = admin::db_now(&state.pool, None).await?;
    let nodes = admin::nodes(&state.pool, Some(now)).await?;
    let pages = counts::table_pages(&state.pool).await?;
    let percent = counts::sample_percent(pages);
    let exact = percent >= 100.0;
    let present = dashboard::fsm_versions_sampled(&state.pool, percent).await?;
    let figure = |n: i64| {
        if exact {
            Figure::Exact(n)
        } else {
            Figure::About((n as f64 * 100.0 / percent).round() as i64)
        }
    };
    let empty = || VersionLine {
        nodes: Vec::new(),
        live_rows: figure(0),
        rows: figure(0),
    };
    let mut lines: BTreeMap<(String, i32), VersionLine> = BTreeMap::new();
    for n in nodes.iter().filter(|n| n.live) {
        for tag in &n.fsms {
            if let Some(key) = split_tag(tag) {
                let line = lines.entry(key).or_insert_with(empty);
                line.nodes.push(n.node_id.clone());
            }
        }
    }
    for p in present {
        let line = lines.entry((p.fsm, p.fsm_version)).or_insert_with(empty);
        line.live_rows = figure(p.live);
        line.rows = figure(p.rows);
    }
    let live_nodes = nodes.iter().filter(|n| n.live).count();
    let operator = auth::is_operator(&state, &headers);
    let body = html! {
        h1 { "FSM versions" }
        p.note { (live_nodes) " live node(s). A row runs only on a live node that registers its exact version (or migrates it)." }
        @if lines.is_empty() {
            p id="fsms" { "No FSM registered by a live node, and no instance." }
        } @else {
            table id="fsms" {
                tr { th { "FSM" } th { "version" } th { "registered by live nodes" } th { "live rows" } th { "all rows" } th { "" } }
                @for ((fsm, version), l) in &lines {
                    tr data-fsm=(fsm) data-version=(version) {
                        td { a href=(format!("/instances?fsm={}", super::overview::urlencode(fsm))) { (fsm) } }
                        td.n { (version) }
                        td { @if l.nodes.is_empty() { "none" } @else { (l.nodes.join(", ")) } }
                        td.n { (l.live_rows) }
                        td.n { (l.rows) }
                        td {
                            @if l.nodes.is_empty() && l.live_rows.value() > 0 {
                                span.error.unrun { "no live node runs these live rows" }
                            } @else if !l.nodes.is_empty() && l.rows.value() == 0 {
                                span.note {
                                    @if exact { "no row of this version" } @else { "none in the sample" }
                                }
                            }
                        }
                    }
                }
            }
            p.note id="how-counted" {
                @if exact {
                    "Rows are exact counts (the whole table: " (Figure::Exact(pages)) " pages)."
                } @else {
                    "Rows are estimated (≈) from a sample of " (format!("{percent:.2}")) "% of the table's " (Figure::Exact(pages))
                    " pages (TABLESAMPLE SYSTEM): no index has the FSM, and counting every row would read the whole table. "
                    "A version with few rows may be missing; `gen_durable status` lists the live rows no live node runs, exactly (a full scan)."
                }
            }
        }
    };
    Ok(Page::new("FSMs", body)
        .live(live)
        .viewer(operator.then_some(csrf.0.as_str()), state.token.is_some()))
}

#[cfg(test)]
mod tests {
    use super::split_tag;

    #[test]
    fn tags_split_at_the_last_at() {
        assert_eq!(split_tag("Checkout@2"), Some(("Checkout".into(), 2)));
        assert_eq!(split_tag("a@b@3"), Some(("a@b".into(), 3)));
        assert_eq!(split_tag("nover"), None);
    }
}
