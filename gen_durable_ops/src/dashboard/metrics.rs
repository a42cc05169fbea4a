//! `/metrics`: the Prometheus text exposition, when the dashboard was given a
//! [`gen_durable::metrics::PrometheusHandle`] ([`super::DashboardConfig::with_metrics`]; the
//! `gen_durable dashboard` command installs one). Each scrape first reads the queue
//! gauges from the database ([`gen_durable::metrics::observe_queues`]). Read-only: it needs no
//! token. Without a handle the route answers 404.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

use super::AppState;

pub(crate) async fn scrape(State(state): State<AppState>) -> Response {
    let Some(handle) = state.metrics.as_ref() else {
        return (
            StatusCode::NOT_FOUND,
            "no metrics recorder on this dashboard",
        )
            .into_response();
    };
    if let Err(e) = gen_durable::metrics::observe_queues(&state.pool).await {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("queue gauges: {e}"),
        )
            .into_response();
    }
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        handle.render(),
    )
        .into_response()
}
