//! What can go wrong while serving a page or an action, and the page each answers with.

use axum::extract::Request;
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use maud::html;

use super::layout::Page;

/// Why the dashboard refused or failed a request.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DashboardError {
    /// The dashboard has no operator token: it only shows (403).
    #[error(
        "this dashboard is read-only: start it with an operator token (--auth-token-env) to act"
    )]
    ReadOnly,
    /// The request carries no operator token (403).
    #[error("sign in with the operator token first")]
    NotSignedIn,
    /// The request carries an operator token (a bearer header, or the sign-in form's) that
    /// is not the dashboard's (403); it counts towards the address's limit of wrong tokens.
    #[error("that is not the operator token")]
    WrongToken,
    /// The sign-in cookie names no live session: it expired, or its operator signed out
    /// (403). Not counted as a wrong token.
    #[error("your sign-in has expired or was signed out: sign in again")]
    SessionEnded,
    /// The form's CSRF token is missing or is not this browser's (403).
    #[error("the form's CSRF token does not match this browser's: reload the page and try again")]
    Csrf,
    /// No such instance (404).
    #[error("no instance with id {0}")]
    NotFound(i64),
    /// A query parameter or form field that does not parse (400).
    #[error("bad request: {0}")]
    BadRequest(String),
    /// The engine refused the action (a finished instance, a bad signal…) (409).
    #[error("{0}")]
    Refused(gen_durable::Error),
    /// The database failed (500).
    #[error("database error: {0}")]
    Database(gen_durable::Error),
    /// The operating system gave no random bytes for a CSRF token or a session id (500).
    #[error("no randomness available for a CSRF token or a session id")]
    NoRandomness,
}

impl From<gen_durable::Error> for DashboardError {
    fn from(e: gen_durable::Error) -> Self {
        DashboardError::Database(e)
    }
}

impl DashboardError {
    fn status(&self) -> StatusCode {
        match self {
            DashboardError::ReadOnly
            | DashboardError::NotSignedIn
            | DashboardError::WrongToken
            | DashboardError::SessionEnded
            | DashboardError::Csrf => StatusCode::FORBIDDEN,
            DashboardError::NotFound(_) => StatusCode::NOT_FOUND,
            DashboardError::BadRequest(_) => StatusCode::BAD_REQUEST,
            DashboardError::Refused(_) => StatusCode::CONFLICT,
            DashboardError::Database(_) | DashboardError::NoRandomness => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        }
    }
}

impl IntoResponse for DashboardError {
    fn into_response(self) -> Response {
        let rejected = matches!(self, DashboardError::WrongToken);
        let mut res = page(self.status(), &self.to_string());
        if rejected {
            res.extensions_mut().insert(super::throttle::TokenRejected);
        }
        res
    }
}

/// The dashboard's error page: the status, what was wrong, and the way back.
fn page(status: StatusCode, message: &str) -> Response {
    let reason = status.canonical_reason().unwrap_or("error");
    let page = Page::new(
        reason,
        html! {
            h1 { (status.as_u16()) " " (reason) }
            p.error id="error" { (message) }
            p { a href="/" { "Back to the overview" } }
        },
    );
    (status, page).into_response()
}

/// The answers axum gives by itself — a path, query or form that does not parse, an
/// unknown route, a method a route does not take — are plain text or empty; each becomes
/// the dashboard's error page, saying the same (its other headers, `Allow` say, kept).
pub(crate) async fn styled(request: Request, next: Next) -> Response {
    let path = request.uri().path().to_string();
    let res = next.run(request).await;
    let status = res.status();
    let is_html = res
        .headers()
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/html"));
    if is_html || !(status.is_client_error() || status.is_server_error()) {
        return res;
    }
    let (mut parts, body) = res.into_parts();
    let text = axum::body::to_bytes(body, MAX_PLAIN_ERROR)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_default();
    let message = match status {
        _ if !text.is_empty() => text,
        StatusCode::NOT_FOUND => format!("no page at {path}"),
        StatusCode::METHOD_NOT_ALLOWED => format!("{path} does not take this method"),
        _ => status.canonical_reason().unwrap_or("error").to_string(),
    };
    let styled = page(status, &message);
    parts.headers.remove(CONTENT_TYPE);
    parts.headers.remove(CONTENT_LENGTH);
    let (styled_parts, body) = styled.into_parts();
    parts.headers.extend(styled_parts.headers);
    Response::from_parts(parts, body)
}

/// The most of a plain error body read to show it (axum's are one line).
const MAX_PLAIN_ERROR: usize = 64 * 1024;
