//! A web dashboard over a gen_durable database: the overview of every queue, the
//! instance list and pages, the FSM versions nodes run, and the flow control
//! (concurrency gates and rate limits).
//!
//! Server-rendered HTML (no script to build; the throughput chart is inline SVG), every
//! page a handful of indexed statements (docs/design/dashboard.md has their plans at 1M rows).
//! Serve [`router`] for a read-only dashboard, or [`router_with`] and an operator token
//! for one that can also cancel, retry and signal:
//!
//! ```no_run
//! # async fn run(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! use gen_durable_ops::dashboard::{router_with, DashboardConfig};
//! // At least 32 bytes (`openssl rand -hex 32`): a shorter token is refused here.
//! let token = std::env::var("GD_TOKEN")?;
//! let app = router_with(pool, DashboardConfig::new().with_operator_token(token)?);
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:4000").await?;
//! axum::serve(listener, app).await?;
//! # Ok(()) }
//! ```
//!
//! Or run `gen_durable dashboard --listen 127.0.0.1:4000 [--auth-token-env VAR]
//! [--secure-cookies]`.
//!
//! **Read-only** (no token): every action route answers 403 and runs no statement; the
//! pages only read. **With a token** (at least [`MIN_OPERATOR_TOKEN_LEN`] bytes, else
//! [`DashboardConfig::with_operator_token`] refuses it): an operator signs in with it on
//! `/login`, which opens a server-side session that an `HttpOnly`, `SameSite=Strict`
//! cookie names (a random id, not the token; it lasts [`DEFAULT_SESSION_TTL`] unless
//! [`DashboardConfig::with_session_ttl`] says otherwise, and `/logout` ends it on the
//! server), or a script sends `Authorization: Bearer TOKEN`, compared in constant time.
//! Every action is a POST, and a form must also carry the CSRF token of its page (double
//! submit: a random value in a `SameSite=Strict` cookie and in the form's hidden field,
//! compared in constant time). After 5 wrong tokens from one client address within a
//! minute, its POSTs are answered 429 with `Retry-After` (the address is the TCP peer:
//! serve the router with `into_make_service_with_connect_info::<SocketAddr>()`, as
//! `gen_durable dashboard` does, or every client shares one limit).
//! Put the dashboard behind TLS when it leaves localhost (the token and the session
//! cookie travel in clear otherwise), and then mark its cookies `Secure`
//! ([`DashboardConfig::secure_cookies`]).

mod actions;
mod auth;
mod chart;
mod clock;
mod config;
mod confirm;
mod error;
mod explain;
mod fsms;
mod instance;
mod instances;
mod layout;
mod limits;
mod live;
mod metrics;
mod operator;
mod overview;
mod selected;
mod session;
mod signin;
mod throttle;
mod timeline;
mod waiting;

use std::sync::Arc;
use std::time::Duration;

use axum::routing::{get, post};
use axum::Router;
use sqlx::PgPool;

pub use config::{
    DashboardConfig, DashboardConfigError, DEFAULT_SESSION_TTL, MIN_OPERATOR_TOKEN_LEN,
};
pub use error::DashboardError;

/// What every handler gets.
#[derive(Clone)]
pub(crate) struct AppState {
    pub(crate) pool: PgPool,
    /// `None`: read-only.
    pub(crate) token: Option<Arc<str>>,
    /// `None`: no `/metrics`.
    pub(crate) metrics: Option<gen_durable::metrics::PrometheusHandle>,
    /// Wrong operator tokens by client address.
    pub(crate) throttle: Arc<throttle::Throttle>,
    /// Who is signed in, until when.
    pub(crate) sessions: Arc<session::Sessions>,
    /// How long a sign-in lasts (whole seconds).
    pub(crate) session_ttl: Duration,
    /// Whether cookies are `Secure`.
    pub(crate) secure_cookies: bool,
    /// The time sessions and the throttle count in.
    pub(crate) now: clock::Now,
}

/// A read-only dashboard over `pool`: pages only, every action refused.
pub fn router(pool: PgPool) -> Router {
    router_with(pool, DashboardConfig::new())
}

/// A dashboard over `pool` as `config` says.
pub fn router_with(pool: PgPool, config: DashboardConfig) -> Router {
    let read_only = config.is_read_only();
    let state = AppState {
        pool,
        token: config.operator_token.map(Arc::from),
        metrics: config.metrics,
        throttle: Arc::default(),
        sessions: Arc::default(),
        session_ttl: config.session_ttl,
        secure_cookies: config.secure_cookies,
        now: clock::Now::new(&config.clock),
    };
    Router::new()
        .route("/", get(overview::page))
        .route("/instances", get(instances::page))
        .route("/instances/{id}", get(instance::page))
        .route("/instances/{id}/confirm", get(confirm::page))
        .route("/fsms", get(fsms::page))
        .route("/limits", get(limits::page))
        .route("/metrics", get(metrics::scrape))
        .route("/login", get(signin::page).post(signin::login))
        .route("/logout", post(signin::logout))
        .merge(actions::routes(read_only))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            throttle::limit,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::csrf_cookie,
        ))
        .layer(axum::middleware::from_fn(error::styled))
        .layer(axum::middleware::map_response(layout::security_headers))
        .with_state(state)
}

/// `EXPLAIN (ANALYZE, BUFFERS)` of every statement the pages run, `id` standing for the
/// instance page's instance: (what, plan). For docs/design/dashboard.md (see the ignored test
/// `dashboard_load`); runs each statement once.
#[doc(hidden)]
pub async fn plans(pool: &PgPool, id: i64) -> Result<Vec<(String, String)>, DashboardError> {
    Ok(crate::store::dashboard::plans(pool, id).await?)
}
