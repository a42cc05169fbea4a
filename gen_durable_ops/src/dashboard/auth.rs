//! Who may act: the operator token, the sign-in session, and the CSRF double submit.
//!
//! A read-only dashboard has no token, so [`authorize`] refuses everything before any
//! statement runs. With one, an action needs either the token itself in
//! `Authorization: Bearer TOKEN` (scripts; compared in constant time, [`subtle`]) or a
//! live sign-in session, named by the `gd_session` cookie that `/login` sets (browsers;
//! [`super::session`]: a random id, never the token). With the cookie, the form must also
//! carry the page's CSRF token: a browser sends the cookie along with a forged cross-site
//! POST, but the forger cannot read the `gd_csrf` cookie to copy its value into the form.
//! Both cookies are `HttpOnly` and `SameSite=Strict` (a cross-site POST carries neither
//! anyway), and `Secure` when the dashboard is configured so.
//!
//! Wrong tokens are rate-limited per client address ([`super::throttle`]). A cookie that
//! names no live session is refused but not counted: nobody guesses a 256-bit id, and an
//! operator whose session expired should not be locked out by clicking.

use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::header::{AUTHORIZATION, COOKIE, SET_COOKIE};
use axum::http::{HeaderMap, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use super::error::DashboardError;
use super::session::hex;
use super::AppState;

/// The cookie holding the CSRF token of a browser.
pub(crate) const CSRF_COOKIE: &str = "gd_csrf";
/// The cookie naming the sign-in session.
pub(crate) const SESSION_COOKIE: &str = "gd_session";
/// Random bytes in a CSRF token.
const CSRF_BYTES: usize = 32;

/// The CSRF token of this browser, for the hidden field of every form.
#[derive(Debug, Clone)]
pub(crate) struct Csrf(pub(crate) String);

/// Gives every browser a CSRF cookie: read from the request, or made and set now.
pub(crate) async fn csrf_cookie(
    State(state): State<AppState>,
    mut req: Request,
    next: Next,
) -> Response {
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
        let cookie = set_cookie(CSRF_COOKIE, &token, None, state.secure_cookies);
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

/// A `Set-Cookie` value: every cookie of the dashboard is `HttpOnly` and
/// `SameSite=Strict` on the whole site; `max_age` in whole seconds (`None`: until the
/// browser closes), `Secure` when `secure`.
pub(crate) fn set_cookie(
    name: &str,
    value: &str,
    max_age: Option<Duration>,
    secure: bool,
) -> String {
    let mut c = format!("{name}={value}; Path=/; HttpOnly; SameSite=Strict");
    if let Some(age) = max_age {
        c.push_str(&format!("; Max-Age={}", age.as_secs()));
    }
    if secure {
        c.push_str("; Secure");
    }
    c
}

/// The value of cookie `name`, if the request has it.
pub(crate) fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_string())
}

/// Whether `a` and `b` are equal, in a time that does not depend on where they differ.
pub(crate) fn same(a: &str, b: &str) -> bool {
    bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

/// How an operator proved who they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Proof {
    /// `Authorization: Bearer`: a browser never adds it on its own, so no CSRF check.
    Bearer,
    /// The sign-in cookie: a browser sends it with any request, so CSRF is checked.
    Session,
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
    let session = cookie(headers, SESSION_COOKIE)?;
    state
        .sessions
        .is_live(&session, state.now.now())
        .then_some(Proof::Session)
}

/// Whether this request comes from a signed-in operator (pages show the action forms).
pub(crate) fn is_operator(state: &AppState, headers: &HeaderMap) -> bool {
    proof(state, headers).is_some()
}

/// Lets an action through, or says why not. Called first by every action handler.
///
/// Returns the client the action runs with: the history records its actions as done by
/// `dashboard (token)` or `dashboard (signed in)`, as the operator proved it (the
/// dashboard has one operator token, not one per person).
pub(crate) fn authorize(
    state: &AppState,
    headers: &HeaderMap,
    form_csrf: &str,
) -> Result<gen_durable::Client, DashboardError> {
    if state.token.is_none() {
        return Err(DashboardError::ReadOnly);
    }
    let client = |actor: &str| gen_durable::Client::new(state.pool.clone()).with_actor(actor);
    match proof(state, headers) {
        Some(Proof::Bearer) => Ok(client("dashboard (token)")),
        Some(Proof::Session) => {
            check_csrf(headers, form_csrf).map(|()| client("dashboard (signed in)"))
        }
        // A token was presented and is wrong: it counts against the address.
        None if headers.contains_key(AUTHORIZATION) => Err(DashboardError::WrongToken),
        None if cookie(headers, SESSION_COOKIE).is_some() => Err(DashboardError::SessionEnded),
        None => Err(DashboardError::NotSignedIn),
    }
}

/// The double submit: the form's hidden field must equal the browser's CSRF cookie.
pub(crate) fn check_csrf(headers: &HeaderMap, form_csrf: &str) -> Result<(), DashboardError> {
    match cookie(headers, CSRF_COOKIE) {
        Some(c) if !form_csrf.is_empty() && same(&c, form_csrf) => Ok(()),
        _ => Err(DashboardError::Csrf),
    }
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
        assert_eq!(cookie(&h, SESSION_COOKIE), None);
    }

    #[test]
    fn cookies_are_strict_http_only_and_secure_when_asked() {
        let hour = Some(Duration::from_secs(3600));
        assert_eq!(
            set_cookie("a", "1", hour, false),
            "a=1; Path=/; HttpOnly; SameSite=Strict; Max-Age=3600"
        );
        assert_eq!(
            set_cookie("a", "", Some(Duration::ZERO), true),
            "a=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0; Secure"
        );
        assert_eq!(
            set_cookie("a", "1", None, false),
            "a=1; Path=/; HttpOnly; SameSite=Strict"
        );
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
