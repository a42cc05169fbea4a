//! Requests to a dashboard router without a server or a browser (`tower::ServiceExt`), and
//! what the tests read from the answers.

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use tower::ServiceExt;

/// What a request got back.
pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) body: String,
    pub(crate) set_cookies: Vec<String>,
    pub(crate) location: Option<String>,
}

/// Sends `req` to `app` and reads the whole answer.
pub(crate) async fn send(app: &Router, req: Request<Body>) -> Answer {
    let res = app.clone().oneshot(req).await.unwrap();
    let status = res.status();
    let set_cookies = res
        .headers()
        .get_all(header::SET_COOKIE)
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .collect();
    let location = res
        .headers()
        .get(header::LOCATION)
        .map(|v| v.to_str().unwrap().to_string());
    let bytes = axum::body::to_bytes(res.into_body(), usize::MAX)
        .await
        .unwrap();
    Answer {
        status,
        body: String::from_utf8_lossy(&bytes).into_owned(),
        set_cookies,
        location,
    }
}

/// A GET of `path`, with no cookie.
pub(crate) async fn get(app: &Router, path: &str) -> Answer {
    send(app, Request::get(path).body(Body::empty()).unwrap()).await
}

/// The ids of the instance list's rows in `body`, in the page's order.
pub(crate) fn listed_ids(body: &str) -> Vec<i64> {
    body.split("<tr data-id=\"")
        .skip(1)
        .map(|r| r[..r.find('"').unwrap()].parse().unwrap())
        .collect()
}

/// A GET of `path` as an operator's script sends it (the token as a bearer), with
/// `cookie` (a `Cookie` header value) if any.
pub(crate) fn operator_get(path: &str, token: &str, cookie: Option<&str>) -> Request<Body> {
    let mut b = Request::get(path).header(header::AUTHORIZATION, format!("Bearer {token}"));
    if let Some(c) = cookie {
        b = b.header(header::COOKIE, c);
    }
    b.body(Body::empty()).unwrap()
}

/// A form POST to `path` with `cookie` (a `Cookie` header value) if any.
pub(crate) fn post(path: &str, cookie: Option<&str>, form: &str) -> Request<Body> {
    let mut b =
        Request::post(path).header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
    if let Some(c) = cookie {
        b = b.header(header::COOKIE, c);
    }
    b.body(Body::from(form.to_string())).unwrap()
}

/// The CSRF cookie a first page load hands out: its value.
pub(crate) async fn csrf_of(app: &Router) -> String {
    let a = get(app, "/").await;
    let c = a
        .set_cookies
        .iter()
        .find(|c| c.starts_with("gd_csrf="))
        .expect("a CSRF cookie on the first page");
    assert!(
        c.contains("SameSite=Strict") && c.contains("HttpOnly"),
        "{c}"
    );
    c["gd_csrf=".len()..c.find(';').unwrap()].to_string()
}
