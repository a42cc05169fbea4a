//! The action routes: POST only, each authorized first (`auth::authorize`: token, then
//! CSRF), then done through the library's own `Client` — the same code as the CLI's
//! `cancel`, `retry` and `signal`. On a read-only dashboard every route answers 403
//! before touching the database.
//!
//! Restart (from a step or a history entry), fork, pause/resume and the bulk actions are
//! in `operator`, the actions on rows selected on the list in `selected`; their routes are
//! here with the others, so a read-only dashboard refuses them alike.

use axum::extract::{Path, State};
use axum::http::header::LOCATION;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Extension, Form, Router};
use serde::Deserialize;
use serde_json::Value;

use super::auth::{authorize, Csrf};
use super::error::DashboardError;
use super::instance::{self, Notice};
use super::AppState;
use super::{operator, selected};

/// Every action route. On a read-only dashboard each one is [`refuse`], which reads
/// no body and runs nothing.
pub(crate) fn routes(read_only: bool) -> Router<AppState> {
    if read_only {
        return ACTION_PATHS
            .iter()
            .fold(Router::new(), |r, path| r.route(path, post(refuse)));
    }
    Router::new()
        .route(ACTION_PATHS[0], post(cancel))
        .route(ACTION_PATHS[1], post(retry))
        .route(ACTION_PATHS[2], post(signal))
        .route(ACTION_PATHS[3], post(operator::restart))
        .route(ACTION_PATHS[4], post(operator::pause))
        .route(ACTION_PATHS[5], post(operator::resume))
        .route(ACTION_PATHS[6], post(operator::bulk))
        .route(ACTION_PATHS[7], post(operator::fork))
        .route(ACTION_PATHS[8], post(selected::act))
}

/// The action routes, in `routes`' order.
pub(crate) const ACTION_PATHS: [&str; 9] = [
    "/instances/{id}/cancel",
    "/instances/{id}/retry",
    "/instances/{id}/signal",
    "/instances/{id}/restart",
    "/queues/{queue}/pause",
    "/queues/{queue}/resume",
    "/bulk",
    "/instances/{id}/fork",
    "/selected",
];

async fn refuse() -> DashboardError {
    DashboardError::ReadOnly
}

/// A form with only its CSRF token.
#[derive(Debug, Deserialize)]
pub(crate) struct CsrfOnly {
    #[serde(default)]
    csrf: String,
}

/// The signal form.
#[derive(Debug, Deserialize)]
pub(crate) struct SignalForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    payload: String,
    #[serde(default)]
    dedup_key: String,
}

pub(crate) fn back_to(id: i64, did: &str) -> Response {
    redirect(&format!("/instances/{id}?did={did}"))
}

/// A 303 to `to`.
pub(crate) fn redirect(to: &str) -> Response {
    let mut res = StatusCode::SEE_OTHER.into_response();
    if let Ok(v) = HeaderValue::from_str(to) {
        res.headers_mut().insert(LOCATION, v);
    }
    res
}

/// The answer to an action on instance `id`: where `done` leads, or — when the engine
/// refused it (a finished instance, a bad signal, an unknown step…) or its form did not
/// parse — the instance's own page saying why, with its actions to try again (409, 400).
pub(crate) async fn on_instance(
    state: &AppState,
    csrf: &Csrf,
    headers: &HeaderMap,
    id: i64,
    done: Result<Response, DashboardError>,
) -> Result<Response, DashboardError> {
    let (status, why) = match done {
        Err(DashboardError::Refused(e)) => (StatusCode::CONFLICT, e.to_string()),
        Err(DashboardError::BadRequest(why)) => (StatusCode::BAD_REQUEST, why),
        other => return other,
    };
    let page = instance::render(state, csrf, headers, id, Notice::Refused(why)).await?;
    Ok((status, page).into_response())
}

/// The engine's answer to an action: its refusals (unknown or finished instance, a bad
/// signal) are the operator's to read, not server failures.
pub(crate) fn refused(e: gen_durable::Error) -> DashboardError {
    match e {
        gen_durable::Error::NotFound { id } => DashboardError::NotFound(id),
        gen_durable::Error::Database(_) => DashboardError::Database(e),
        other => DashboardError::Refused(other),
    }
}

async fn cancel(
    State(state): State<AppState>,
    Extension(page_csrf): Extension<Csrf>,
    Path(id): Path<i64>,
    headers: HeaderMap,
    Form(form): Form<CsrfOnly>,
) -> Result<Response, DashboardError> {
    let gd = authorize(&state, &headers, &form.csrf)?;
    let done = gd
        .cancel(id)
        .await
        .map(|_| back_to(id, "cancelled"))
        .map_err(refused);
    on_instance(&state, &page_csrf, &headers, id, done).await
}

async fn retry(
    State(state): State<AppState>,
    Extension(page_csrf): Extension<Csrf>,
    Path(id): Path<i64>,
    headers: HeaderMap,
    Form(form): Form<CsrfOnly>,
) -> Result<Response, DashboardError> {
    let gd = authorize(&state, &headers, &form.csrf)?;
    let done = gd
        .retry(id)
        .await
        .map(|_| back_to(id, "retried"))
        .map_err(refused);
    on_instance(&state, &page_csrf, &headers, id, done).await
}

async fn signal(
    State(state): State<AppState>,
    Extension(page_csrf): Extension<Csrf>,
    Path(id): Path<i64>,
    headers: HeaderMap,
    Form(form): Form<SignalForm>,
) -> Result<Response, DashboardError> {
    let gd = authorize(&state, &headers, &form.csrf)?;
    let done = send_signal(&gd, id, &form).await;
    on_instance(&state, &page_csrf, &headers, id, done).await
}

async fn send_signal(
    gd: &gen_durable::Client,
    id: i64,
    form: &SignalForm,
) -> Result<Response, DashboardError> {
    let raw = if form.payload.trim().is_empty() {
        "null"
    } else {
        form.payload.as_str()
    };
    let payload: Value = serde_json::from_str(raw)
        .map_err(|e| DashboardError::BadRequest(format!("the payload is not JSON: {e}")))?;
    let mut send = gd.signal(id, form.name.as_str(), payload);
    if !form.dedup_key.trim().is_empty() {
        send = send.dedup_key(form.dedup_key.trim());
    }
    send.await.map_err(refused)?;
    Ok(back_to(id, "signalled"))
}
