//! `/login` and `/logout`: signing in with the operator token opens a session
//! ([`super::session`]) that the `gd_session` cookie names; signing out closes it on the
//! server, so the cookie, wherever it was copied, stops working. Both check the CSRF
//! double submit ([`super::auth`]).

use axum::extract::State;
use axum::http::header::{LOCATION, SET_COOKIE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Form};
use maud::html;
use serde::Deserialize;
use std::time::Duration;

use super::auth::{check_csrf, cookie, same, set_cookie, Csrf, SESSION_COOKIE};
use super::error::DashboardError;
use super::layout;
use super::throttle::TokenRejected;
use super::AppState;

/// The sign-in form's fields.
#[derive(Debug, Deserialize)]
pub(crate) struct LoginForm {
    #[serde(default)]
    token: String,
    #[serde(default)]
    csrf: String,
}

pub(crate) async fn page(
    State(state): State<AppState>,
    Extension(csrf): Extension<Csrf>,
) -> Result<Response, DashboardError> {
    if state.token.is_none() {
        return Err(DashboardError::ReadOnly);
    }
    Ok(form(&csrf, None).into_response())
}

fn form(csrf: &Csrf, problem: Option<&str>) -> layout::Page {
    layout::Page::new(
        "Sign in",
        html! {
            h1 { "Sign in as operator" }
            @if let Some(p) = problem { p.error { (p) } }
            form method="post" action="/login" {
                input type="hidden" name="csrf" value=(csrf.0);
                label { "Operator token " input type="password" name="token" id="token" autofocus; }
                " "
                button type="submit" id="sign-in" { "Sign in" }
            }
        },
    )
}

pub(crate) async fn login(
    State(state): State<AppState>,
    Extension(csrf): Extension<Csrf>,
    headers: HeaderMap,
    Form(login): Form<LoginForm>,
) -> Result<Response, DashboardError> {
    let Some(token) = state.token.as_deref() else {
        return Err(DashboardError::ReadOnly);
    };
    check_csrf(&headers, &login.csrf)?;
    if !same(&login.token, token) {
        let page = form(&csrf, Some("That is not the operator token."));
        let mut res = (StatusCode::FORBIDDEN, page).into_response();
        res.extensions_mut().insert(TokenRejected);
        return Ok(res);
    }
    // A new session at every sign-in; the one this browser held, if any, ends.
    if let Some(old) = cookie(&headers, SESSION_COOKIE) {
        state.sessions.close(&old);
    }
    let id = state
        .sessions
        .open(state.now.now(), state.session_ttl)
        .ok_or(DashboardError::NoRandomness)?;
    let cookie = set_cookie(
        SESSION_COOKIE,
        &id,
        Some(state.session_ttl),
        state.secure_cookies,
    );
    Ok(redirect_with_cookie("/", &cookie))
}

/// Sign-out's form: only the CSRF token.
#[derive(Debug, Deserialize)]
pub(crate) struct CsrfForm {
    #[serde(default)]
    csrf: String,
}

pub(crate) async fn logout(
    State(state): State<AppState>,
    headers: HeaderMap,
    Form(form): Form<CsrfForm>,
) -> Result<Response, DashboardError> {
    check_csrf(&headers, &form.csrf)?;
    if let Some(id) = cookie(&headers, SESSION_COOKIE) {
        state.sessions.close(&id);
    }
    let cookie = set_cookie(
        SESSION_COOKIE,
        "",
        Some(Duration::ZERO),
        state.secure_cookies,
    );
    Ok(redirect_with_cookie("/", &cookie))
}

fn redirect_with_cookie(to: &str, cookie: &str) -> Response {
    let mut res = StatusCode::SEE_OTHER.into_response();
    res.headers_mut()
        .insert(LOCATION, HeaderValue::from_str(to).expect("a path"));
    if let Ok(v) = HeaderValue::from_str(cookie) {
        res.headers_mut().append(SET_COOKIE, v);
    }
    res
}
