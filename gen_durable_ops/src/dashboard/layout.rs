//! The page shell (navigation, style) and the small formatting helpers every page uses.

use axum::http::header::{CACHE_CONTROL, CONTENT_SECURITY_POLICY, X_FRAME_OPTIONS};
use axum::http::HeaderValue;
use axum::response::{Html, IntoResponse, Response};
use chrono::{DateTime, Utc};
use maud::{html, Markup, PreEscaped, DOCTYPE};

use super::live::Live;
use crate::cli::table;

/// The whole style sheet, inline: one request per page, nothing to serve apart.
const STYLE: &str = "\
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1d232a;background:#f6f7f9}\
header{background:#1d2a3a;color:#fff;padding:8px 16px;display:flex;gap:16px;align-items:center}\
header a{color:#cfe3ff;text-decoration:none;font-weight:600}header .who{margin-left:auto}\
header form{display:inline}main{padding:12px 16px}h1{font-size:20px}h2{font-size:16px;margin-top:24px}\
table{border-collapse:collapse;background:#fff}th,td{border:1px solid #d8dde3;padding:3px 8px;text-align:left;vertical-align:top}\
td.n{text-align:right;font-variant-numeric:tabular-nums}th{background:#eef1f4}\
.s{padding:1px 6px;border-radius:8px;font-size:12px;background:#e3e7ec}\
.s-runnable{background:#d8ecff}.s-executing{background:#fff1c2}.s-awaiting_signal,.s-awaiting_children{background:#eadcff}\
.s-done{background:#d5f5dd}.s-failed{background:#ffd9d6}\
.error{color:#a0150b;font-weight:600}.note{color:#5b6570}.notice{background:#e6f4ea;padding:6px 10px}\
pre{background:#fff;border:1px solid #d8dde3;padding:8px;max-width:1000px;overflow:auto}\
dl{display:grid;grid-template-columns:max-content auto;gap:2px 12px}dt{font-weight:600}dd{margin:0}\
ul.tree{list-style:none;padding-left:18px;border-left:1px dotted #9aa5b1}\
form.filters input,form.filters select{margin-right:8px}form.filters>span{margin-right:12px;white-space:nowrap}label.status-pick input{margin-right:2px}.actions form{display:inline-block;margin-right:12px}\
.tl{display:grid;grid-template-columns:minmax(220px,28%) 1fr;gap:0 8px;align-items:center;max-width:1100px}\
.tl-label{white-space:nowrap;overflow:hidden;text-overflow:ellipsis}.tl-step{font-weight:600}\
.tl-kind{font-size:12px;padding:0 5px;border-radius:6px;color:#fff}\
.tl-track{position:relative;height:14px;background:#fff;border:1px solid #e3e7ec}\
.tl-bar,.tl-wait{position:absolute;top:0;bottom:0}.tl-bar{min-width:2px}\
.tl-wait{border-top:2px dashed #7a5cc7;top:6px;bottom:auto}\
.k-ok{background:#3c9d5d}.k-bad{background:#d0453a}.k-await{background:#7a5cc7}.k-kids{background:#2f7fd0}.k-op{background:#5b6570}\
.tl-more{grid-column:1/3;margin:0 0 4px 0}.tl-more summary{font-size:12px;color:#5b6570;cursor:pointer}\
.tl-more dl{margin:4px 0}.tl-state{max-height:240px}\
@media (prefers-color-scheme:dark){body{color:#e3e7ec;background:#14181d}\
header{background:#0d1116}a{color:#8cc4ff}table,pre,.tl-track{background:#1c2229}\
th,td,pre,.tl-track{border-color:#333c46}th{background:#232b34}\
.s{background:#2e3740;color:#e3e7ec}.s-runnable{background:#163a5c}.s-executing{background:#5a4a10}\
.s-awaiting_signal,.s-awaiting_children{background:#3e2c66}.s-done{background:#1d4a2b}\
.s-failed{background:#6a1f19}.error{color:#ff8a80}.note,.tl-more summary{color:#9aa5b1}\
.notice{background:#1d3a27}input,select,button,textarea{background:#1c2229;color:#e3e7ec;border:1px solid #4a5561}}\
header .live{font-weight:400}";

/// One page: its title and body inside the shell.
#[derive(Debug)]
pub(crate) struct Page {
    title: String,
    body: Markup,
    /// The CSRF token, when the viewer is a signed-in operator (shows "sign out").
    operator: Option<String>,
    /// Whether the dashboard takes an operator token (shows "sign in").
    can_sign_in: bool,
    /// Whether the page reloads itself (`?live=N`), and its toggle; error pages have none.
    live: Option<Live>,
}

impl Page {
    pub(crate) fn new(title: &str, body: Markup) -> Self {
        Page {
            title: title.to_string(),
            body,
            operator: None,
            can_sign_in: false,
            live: None,
        }
    }

    /// Reloads the page every `live.every` seconds, and shows the header's toggle.
    pub(crate) fn live(mut self, live: Live) -> Self {
        self.live = Some(live);
        self
    }

    /// Shows who is looking: a signed-in operator (with the CSRF token of the sign-out
    /// form), or a viewer who could sign in.
    pub(crate) fn viewer(mut self, operator: Option<&str>, can_sign_in: bool) -> Self {
        self.operator = operator.map(str::to_string);
        self.can_sign_in = can_sign_in;
        self
    }

    fn render(&self) -> Markup {
        html! {
            (DOCTYPE)
            html lang="en" {
                head {
                    meta charset="utf-8";
                    title { (self.title) " · gen_durable" }
                    meta name="color-scheme" content="light dark";
                    @if let Some(every) = self.live.as_ref().and_then(|l| l.every) {
                        meta http-equiv="refresh" content=(every);
                    }
                    style { (PreEscaped(STYLE)) }
                }
                body {
                    header {
                        span { "gen_durable" }
                        a href="/" { "Overview" }
                        a href="/instances" { "Instances" }
                        a href="/fsms" { "FSMs" }
                        a href="/limits" { "Flow control" }
                        @if let Some(live) = &self.live {
                            a.live id="live" href=(live.toggle) {
                                @match live.every {
                                    Some(n) => { "Live: every " (n) " s · stop" }
                                    None => { "Live: off · start" }
                                }
                            }
                        }
                        span.who {
                            @if let Some(csrf) = &self.operator {
                                "operator · "
                                form method="post" action="/logout" {
                                    input type="hidden" name="csrf" value=(csrf);
                                    button type="submit" { "Sign out" }
                                }
                            } @else if self.can_sign_in {
                                a href="/login" { "Sign in" }
                            } @else {
                                "read-only"
                            }
                        }
                    }
                    main { (self.body) }
                }
            }
        }
    }
}

impl IntoResponse for Page {
    fn into_response(self) -> Response {
        Html(self.render().into_string()).into_response()
    }
}

/// A status as a colored badge.
pub(crate) fn status(s: &str) -> Markup {
    html! { span class=(format!("s s-{s}")) { (s) } }
}

/// A link to an instance's page.
pub(crate) fn instance_link(id: i64) -> Markup {
    html! { a href=(format!("/instances/{id}")) { "#" (id) } }
}

/// A time as the CLI prints it.
pub(crate) fn time(t: &DateTime<Utc>) -> String {
    table::time(t)
}

/// A time as how long ago (or in how long) it is from `now`, the time itself on hover.
pub(crate) fn when(now: DateTime<Utc>, t: DateTime<Utc>) -> Markup {
    let secs = (now - t).num_milliseconds() as f64 / 1000.0;
    let relative = if secs >= 0.0 {
        format!("{} ago", table::span(secs))
    } else {
        format!("in {}", table::span(-secs))
    };
    html! { time datetime=(t.to_rfc3339()) title=(table::time(&t)) { (relative) } }
}

/// A time of a JSON row as the CLI prints it, then how long ago (or in how long) it is.
pub(crate) fn json_when(now: DateTime<Utc>, v: &serde_json::Value) -> Markup {
    let at = v
        .as_str()
        .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
        .map(|t| t.with_timezone(&Utc));
    html! {
        (table::json_time(v).unwrap_or_default())
        @if let Some(t) = at { " (" (when(now, t)) ")" }
    }
}

/// How long ago `t` was, seen from `now`.
pub(crate) fn ago(now: DateTime<Utc>, t: DateTime<Utc>) -> String {
    format!(
        "{} ago",
        table::span((now - t).num_milliseconds() as f64 / 1000.0)
    )
}

/// A span of seconds as the CLI prints it.
pub(crate) fn span(secs: f64) -> String {
    table::span(secs)
}

/// The first `n` characters of `s`, with an ellipsis when cut.
pub(crate) fn clip(s: &str, n: usize) -> String {
    match s.char_indices().nth(n) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_string(),
    }
}

/// What every answer carries: no caching (pages show live rows and CSRF tokens), no
/// framing (an operator's buttons cannot be clickjacked), and a policy that allows the
/// inline style sheet and forms to this origin, and nothing else: no script runs.
pub(crate) async fn security_headers(mut res: Response) -> Response {
    let h = res.headers_mut();
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; \
             connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    res
}

/// The most characters of a state or result the instance page prints.
pub(crate) const MAX_JSON_SHOWN: usize = 100_000;
