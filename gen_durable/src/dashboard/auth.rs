//! Who may act: the operator token, its sign-in cookie, and the CSRF double submit.
//!
//! A read-only dashboard has no token, so [`authorize`] refuses everything before any
//! statement runs. With one, an action needs the token — `Authorization: Bearer TOKEN`
//! (scripts), or the `gd_token` cookie set by `/login` (browsers) — and, for the cookie,
//! the page's CSRF token in the form: a browser sends the cookie along with a forged
//! cross-site POST, but the forger cannot read the `gd_csrf` cookie to copy its value
//! into the form. Both cookies are `SameSite=Strict`, so a cross-site POST carries
//! neither anyway. Tokens are compared in constant time ([`subtle`]), and wrong ones are
//! rate-limited per client address ([`super::throttle`]).

use axum::extract::{Request, State};
use axum::http::header::{AUTHORIZATION, COOKIE, LOCATION, SET_COOKIE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Form};
use maud::html;
use serde::Deserialize;
use subtle::ConstantTimeEq;

use super::error::DashboardError;
use super::layout;
use super::throttle::TokenRejected;
use super::AppState;

/// The cookie holding the CSRF token of a browser.
const CSRF_COOKIE: &str = "gd_csrf";
/// The cookie holding the operator token (hex-encoded) once signed in.
const TOKEN_COOKIE: &str = "gd_token";
/// Random bytes in a CSRF token.
const CSRF_BYTES: usize = 32;

/// The CSRF token of this browser, for the hidden field of every form.
#[derive(Debug, Clone)]
pub(crate) struct Csrf(pub(crate) String);

/// Gives every browser a CSRF cookie: read from the request, or made and set now.
pub(crate) async fn csrf_cookie(mut req: Request, next: Next) -> Response {
    let existing = cookie(req.headers(), CSRF_COOKIE)
        .filter(|v| v.len() == CSRF_BYTES * 2 && v.bytes().all(|b| b.is_ascii_hexdigit()));
    let (token, fresh) = match existing {
        Some(t) => (t, false),
        None => match random_hex() {
            Some(t) => (t, true),
            None => return DashboardError::NoRandomness.into_response(),
        },
    };
    req.extensions_mut().insert(Csrf(token.clone()));
    let mut res = next.run(req).await;
    if fresh {
        let cookie = format!("{CSRF_COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict");
        if let Ok(v) = HeaderValue::from_str(&cookie) {
            res.headers_mut().append(SET_COOKIE, v);
        }
    }
    res
}

fn random_hex() -> Option<String> {
    let mut bytes = [0u8; CSRF_BYTES];
    getrandom::getrandom(&mut bytes).ok()?;
    Some(hex(&bytes))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The value of cookie `name`, if the request has it.
fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_string())
}

fn same(a: &str, b: &str) -> bool {
    bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

/// How an operator proved who they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Proof {
    /// `Authorization: Bearer`: a browser never adds it on its own, so no CSRF check.
    Bearer,
    /// The sign-in cookie: a browser sends it with any request, so CSRF is checked.
    Cookie,
}

fn proof(state: &AppState, headers: &HeaderMap) -> Option<Proof> {
    let token = state.token.as_deref()?;
    let bearer = headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if let Some(b) = bearer {
        return same(b.trim(), token).then_some(Proof::Bearer);
    }
    let signed_in = cookie(headers, TOKEN_COOKIE)?;
    same(&signed_in, &hex(token.as_bytes())).then_some(Proof::Cookie)
}

/// Whether the request carries a token at all (a bearer token or the sign-in cookie): a
/// wrong one counts against its address ([`super::throttle`]), a missing one does not.
fn presents_token(headers: &HeaderMap) -> bool {
    headers.contains_key(AUTHORIZATION) || cookie(headers, TOKEN_COOKIE).is_some()
}

/// Whether this request comes from a signed-in operator (pages show the action forms).
pub(crate) fn is_operator(state: &AppState, headers: &HeaderMap) -> bool {
    proof(state, headers).is_some()
}

/// Lets an action through, or says why not. Called first by every action handler.
pub(crate) fn authorize(
    state: &AppState,
    headers: &HeaderMap,
    form_csrf: &str,
) -> Result<(), DashboardError> {
    if state.token.is_none() {
        return Err(DashboardError::ReadOnly);
    }
    match proof(state, headers) {
        None if presents_token(headers) => Err(DashboardError::WrongToken),
        None => Err(DashboardError::NotSignedIn),
        Some(Proof::Bearer) => Ok(()),
        Some(Proof::Cookie) => check_csrf(headers, form_csrf),
    }
}

/// The double submit: the form's hidden field must equal the browser's CSRF cookie.
fn check_csrf(headers: &HeaderMap, form_csrf: &str) -> Result<(), DashboardError> {
    match cookie(headers, CSRF_COOKIE) {
        Some(c) if !form_csrf.is_empty() && same(&c, form_csrf) => Ok(()),
        _ => Err(DashboardError::Csrf),
    }
}

/// The sign-in form's fields.
#[derive(Debug, Deserialize)]
pub(crate) struct LoginForm {
    #[serde(default)]
    token: String,
    #[serde(default)]
    csrf: String,
}

pub(crate) async fn login_page(
    State(state): State<AppState>,
    Extension(csrf): Extension<Csrf>,
) -> Result<Response, DashboardError> {
    if state.token.is_none() {
        return Err(DashboardError::ReadOnly);
    }
    Ok(login_form(&csrf, None).into_response())
}

fn login_form(csrf: &Csrf, problem: Option<&str>) -> layout::Page {
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
    Form(form): Form<LoginForm>,
) -> Result<Response, DashboardError> {
    let Some(token) = state.token.as_deref() else {
        return Err(DashboardError::ReadOnly);
    };
    check_csrf(&headers, &form.csrf)?;
    if !same(&form.token, token) {
        let page = login_form(&csrf, Some("That is not the operator token."));
        let mut res = (StatusCode::FORBIDDEN, page).into_response();
        res.extensions_mut().insert(TokenRejected);
        return Ok(res);
    }
    let cookie = format!(
        "{TOKEN_COOKIE}={}; Path=/; HttpOnly; SameSite=Strict",
        hex(token.as_bytes())
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
    headers: HeaderMap,
    Form(form): Form<CsrfForm>,
) -> Result<Response, DashboardError> {
    check_csrf(&headers, &form.csrf)?;
    let cookie = format!("{TOKEN_COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0");
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookies_are_found_by_name() {
        let mut h = HeaderMap::new();
        h.insert(COOKIE, HeaderValue::from_static("a=1; gd_csrf=abc;b=2"));
        assert_eq!(cookie(&h, "gd_csrf").as_deref(), Some("abc"));
        assert_eq!(cookie(&h, "b").as_deref(), Some("2"));
        assert_eq!(cookie(&h, "gd_token"), None);
    }

    #[test]
    fn csrf_needs_the_cookie_and_the_same_field() {
        let mut h = HeaderMap::new();
        assert!(check_csrf(&h, "abc").is_err());
        h.insert(COOKIE, HeaderValue::from_static("gd_csrf=abc"));
        assert!(check_csrf(&h, "abc").is_ok());
        assert!(check_csrf(&h, "abd").is_err());
        assert!(check_csrf(&h, "").is_err());
    }
}
