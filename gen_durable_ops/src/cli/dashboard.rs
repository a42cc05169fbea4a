//! `gen_durable dashboard`: serves `crate::dashboard` until Ctrl-C.

use std::net::SocketAddr;

use serde_json::json;
use sqlx::PgPool;

use super::error::{CliError, Kind};
use super::Output;
use crate::dashboard::{router_with, DashboardConfig};

/// Connections the dashboard's pool keeps: a few pages load side by side.
pub(crate) const POOL_SIZE: u32 = 8;

/// The dashboard's configuration: read-only, or with the token of environment variable
/// `var` (read now, before connecting, so that a missing or short one is a usage error);
/// `secure_cookies` when it is served over TLS.
pub(crate) fn config(var: Option<&str>, secure_cookies: bool) -> Result<DashboardConfig, CliError> {
    let base = DashboardConfig::new().secure_cookies(secure_cookies);
    let Some(var) = var else {
        return Ok(base);
    };
    match std::env::var(var) {
        Ok(token) if !token.trim().is_empty() => {
            base.with_operator_token(token.trim()).map_err(|e| {
                CliError::new(Kind::Usage, format!("--auth-token-env {var}: {e}"))
                    .hint(format!("export {var}=$(openssl rand -hex 32)"))
            })
        }
        _ => Err(CliError::new(
            Kind::Usage,
            format!("--auth-token-env {var}: the environment variable {var} is unset or empty"),
        )
        .hint(format!(
            "export {var}=$(openssl rand -hex 32), or drop --auth-token-env for a read-only dashboard"
        ))),
    }
}

pub(crate) async fn run(
    pool: &PgPool,
    listen: SocketAddr,
    config: DashboardConfig,
) -> Result<Output, CliError> {
    let listener = tokio::net::TcpListener::bind(listen).await.map_err(|e| {
        CliError::new(Kind::Usage, format!("cannot listen on {listen}: {e}"))
            .hint("pick a free address with --listen HOST:PORT")
    })?;
    let addr = listener.local_addr().unwrap_or(listen);
    let mode = if config.is_read_only() {
        "read-only"
    } else {
        "operator actions enabled"
    };
    eprintln!("gen_durable dashboard on http://{addr}/ ({mode}); Ctrl-C stops it");
    // `/metrics` here has the queue gauges (no engine runs in this process: its step
    // metrics are the engine process's to serve).
    let config = match gen_durable::metrics::install_prometheus() {
        Ok(handle) => config.with_metrics(handle),
        Err(_) => config,
    };
    // With the peer's address, so that wrong operator tokens are limited per client.
    let app = router_with(pool.clone(), config)
        .into_make_service_with_connect_info::<std::net::SocketAddr>();
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .map_err(|e| CliError::new(Kind::Failed, format!("the dashboard stopped: {e}")))?;
    Ok(Output {
        json: json!({ "listen": addr.to_string(), "stopped": true }),
        text: "dashboard stopped\n".into(),
    })
}
