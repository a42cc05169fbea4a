//! The dashboard's sign-in session over HTTP (round 4 of the audit): the cookie names a
//! random server-side session, never the operator token; it is `HttpOnly`,
//! `SameSite=Strict`, has a `Max-Age` equal to the session's lifetime and is `Secure` when
//! configured; an expired or signed-out session is refused; a short operator token is
//! refused when the dashboard is configured.

mod dashboard_support;

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use dashboard_support::http::{csrf_of, post, send};
use dashboard_support::{fingerprint, seed, status_of, TOKEN};
use gen_durable::Clock;
use gen_durable_ops::dashboard::{
    router_with, DashboardConfig, DashboardConfigError, MIN_OPERATOR_TOKEN_LEN,
};
use gen_durable_testkit::TestDb;

fn operator() -> DashboardConfig {
    DashboardConfig::new().with_operator_token(TOKEN).unwrap()
}

/// Signs in with the operator token from a browser holding CSRF cookie `csrf`: the
/// `Set-Cookie` line of the sign-in cookie.
async fn sign_in(app: &Router, csrf: &str) -> String {
    let a = send(
        app,
        post(
            "/login",
            Some(&format!("gd_csrf={csrf}")),
            &format!("csrf={csrf}&token={TOKEN}"),
        ),
    )
    .await;
    assert_eq!(a.status, StatusCode::SEE_OTHER, "{}", a.body);
    a.set_cookies
        .into_iter()
        .find(|c| !c.starts_with("gd_csrf="))
        .expect("a sign-in cookie")
}

/// `name=value` of a `Set-Cookie` line.
fn pair(set_cookie: &str) -> &str {
    set_cookie.split(';').next().unwrap().trim()
}

/// The attributes of a `Set-Cookie` line, lower-cased (`httponly`, `max-age=60`, …).
fn attributes(set_cookie: &str) -> Vec<String> {
    set_cookie
        .split(';')
        .skip(1)
        .map(|a| a.trim().to_ascii_lowercase())
        .collect()
}

/// A page with `cookies` (a `Cookie` header value): its body.
async fn page_as(app: &Router, path: &str, cookies: &str) -> String {
    let req = Request::get(path)
        .header(header::COOKIE, cookies)
        .body(Body::empty())
        .unwrap();
    send(app, req).await.body
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test]
async fn r4_session_cookie_holds_a_random_id_not_the_token() {
    let db = TestDb::new().await;
    let app = router_with(db.pool().clone(), operator());
    let csrf = csrf_of(&app).await;
    let first = sign_in(&app, &csrf).await;
    let second = sign_in(&app, &csrf).await;
    let value = |c: &str| pair(c).split_once('=').unwrap().1.to_ascii_lowercase();
    for v in [value(&first), value(&second)] {
        assert!(
            !v.contains(&TOKEN.to_ascii_lowercase()) && !v.contains(&hex(TOKEN.as_bytes())),
            "the sign-in cookie holds the operator token: {v}"
        );
        assert!(
            v.len() >= 32 && v.bytes().all(|b| b.is_ascii_hexdigit()),
            "not 128 random bits or more: {v}"
        );
    }
    assert_ne!(
        value(&first),
        value(&second),
        "each sign-in is a new session"
    );
    db.close().await;
}

#[tokio::test]
async fn r4_session_cookie_is_http_only_same_site_strict_with_max_age() {
    let db = TestDb::new().await;
    let app = router_with(db.pool().clone(), operator());
    let csrf = csrf_of(&app).await;
    let attrs = attributes(&sign_in(&app, &csrf).await);
    for want in ["httponly", "samesite=strict", "path=/", "max-age=43200"] {
        assert!(attrs.iter().any(|a| a == want), "no {want}: {attrs:?}");
    }
    assert!(
        !attrs.iter().any(|a| a == "secure"),
        "Secure only when configured: {attrs:?}"
    );

    // Max-Age follows the configured lifetime.
    let app = router_with(
        db.pool().clone(),
        operator().with_session_ttl(Duration::from_secs(90 * 60)),
    );
    let csrf = csrf_of(&app).await;
    let attrs = attributes(&sign_in(&app, &csrf).await);
    assert!(attrs.iter().any(|a| a == "max-age=5400"), "{attrs:?}");
    db.close().await;
}

#[tokio::test]
async fn r4_session_cookie_is_secure_when_configured() {
    let db = TestDb::new().await;
    let app = router_with(db.pool().clone(), operator().secure_cookies(true));
    let first = send(&app, Request::get("/").body(Body::empty()).unwrap()).await;
    let csrf_cookie = first
        .set_cookies
        .iter()
        .find(|c| c.starts_with("gd_csrf="))
        .expect("a CSRF cookie");
    assert!(
        attributes(csrf_cookie).iter().any(|a| a == "secure"),
        "{csrf_cookie}"
    );
    let csrf = pair(csrf_cookie)["gd_csrf=".len()..].to_string();
    let signed_in = sign_in(&app, &csrf).await;
    assert!(
        attributes(&signed_in).iter().any(|a| a == "secure"),
        "{signed_in}"
    );
    let out = send(
        &app,
        post(
            "/logout",
            Some(&format!("gd_csrf={csrf}; {}", pair(&signed_in))),
            &format!("csrf={csrf}"),
        ),
    )
    .await;
    let cleared = out
        .set_cookies
        .iter()
        .find(|c| !c.starts_with("gd_csrf="))
        .expect("sign-out clears the cookie");
    assert!(
        attributes(cleared).iter().any(|a| a == "secure"),
        "{cleared}"
    );
    db.close().await;
}

/// On a manual clock: signed in until the session's lifetime has passed, then the same
/// cookie shows no action form and its action is refused, changing nothing.
#[tokio::test]
async fn r4_session_expired_session_is_refused() {
    let db = TestDb::new().await;
    let s = seed(db.pool()).await;
    let clock = Clock::manual(chrono::Utc::now());
    let app = router_with(
        db.pool().clone(),
        operator()
            .with_session_ttl(Duration::from_secs(60 * 60))
            .with_clock(clock.clone()),
    );
    let csrf = csrf_of(&app).await;
    let jar = format!("gd_csrf={csrf}; {}", pair(&sign_in(&app, &csrf).await));
    let page = format!("/instances/{}", s.parked);
    assert!(page_as(&app, &page, &jar).await.contains("id=\"cancel\""));
    clock.advance(Duration::from_secs(60 * 60 - 1));
    assert!(
        page_as(&app, &page, &jar).await.contains("id=\"cancel\""),
        "signed in until the hour is over"
    );

    clock.advance(Duration::from_secs(1));
    assert!(
        !page_as(&app, &page, &jar).await.contains("id=\"cancel\""),
        "an expired session still shows the action forms"
    );
    let before = fingerprint(db.pool()).await;
    let a = send(
        &app,
        post(
            &format!("/instances/{}/cancel", s.parked),
            Some(&jar),
            &format!("csrf={csrf}"),
        ),
    )
    .await;
    assert_eq!(
        a.status,
        StatusCode::FORBIDDEN,
        "an expired session acted: {}",
        a.body
    );
    assert!(a.body.contains("sign in again"), "{}", a.body);
    assert_eq!(fingerprint(db.pool()).await, before);
    db.close().await;
}

/// Sign-out forgets the session on the server: the cookie, copied before, no longer
/// acts. The bearer header still does.
#[tokio::test]
async fn r4_session_sign_out_ends_the_session_server_side() {
    let db = TestDb::new().await;
    let s = seed(db.pool()).await;
    let app = router_with(db.pool().clone(), operator());
    let csrf = csrf_of(&app).await;
    let jar = format!("gd_csrf={csrf}; {}", pair(&sign_in(&app, &csrf).await));
    let out = send(&app, post("/logout", Some(&jar), &format!("csrf={csrf}"))).await;
    assert_eq!(out.status, StatusCode::SEE_OTHER, "{}", out.body);

    let before = fingerprint(db.pool()).await;
    let cancel = format!("/instances/{}/cancel", s.parked);
    let again = send(&app, post(&cancel, Some(&jar), &format!("csrf={csrf}"))).await;
    assert_eq!(
        again.status,
        StatusCode::FORBIDDEN,
        "the copied cookie acted after sign-out: {}",
        again.body
    );
    assert_eq!(fingerprint(db.pool()).await, before);
    assert!(!page_as(&app, &format!("/instances/{}", s.parked), &jar)
        .await
        .contains("id=\"cancel\""));

    let bearer = Request::post(&cancel)
        .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&app, bearer).await.status, StatusCode::SEE_OTHER);
    assert_eq!(status_of(db.pool(), s.parked).await.0, "failed");
    db.close().await;
}

#[test]
fn r4_session_short_operator_token_is_refused() {
    let short = "s3cret-but-only-31-bytes-long!!";
    assert_eq!(short.len(), MIN_OPERATOR_TOKEN_LEN - 1);
    let e = DashboardConfig::new()
        .with_operator_token(short)
        .expect_err("a 31-byte token was accepted");
    assert_eq!(e, DashboardConfigError::TokenTooShort { len: 31 });
    let said = e.to_string();
    for want in ["31 bytes", "at least 32", "openssl rand -hex 32"] {
        assert!(said.contains(want), "{said:?} lacks {want:?}");
    }
    assert_eq!(
        DashboardConfig::new().with_operator_token("").unwrap_err(),
        DashboardConfigError::TokenTooShort { len: 0 }
    );
    let ok = DashboardConfig::new().with_operator_token("x".repeat(MIN_OPERATOR_TOKEN_LEN));
    assert!(ok.is_ok_and(|c| !c.is_read_only()));
}
