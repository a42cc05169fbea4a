//! The dashboard over HTTP, without a browser: pages answer, a read-only dashboard
//! refuses every action and changes nothing, and an operator dashboard refuses an action
//! without its token or without the page's CSRF token.

mod dashboard_support;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use dashboard_support::http::{csrf_of, get, listed_ids, operator_get, post, send};
use dashboard_support::{fingerprint, seed, seed_flow_control, status_of, TOKEN};
use gen_durable_ops::dashboard::{router, router_with, DashboardConfig};
use gen_durable_testkit::TestDb;
use tower::ServiceExt;

#[tokio::test]
async fn pages_answer_with_their_content() {
    let db = TestDb::new().await;
    let s = seed(db.pool()).await;
    let app = router(db.pool().clone());

    let o = get(&app, "/").await;
    assert_eq!(o.status, StatusCode::OK);
    let headers = app
        .clone()
        .oneshot(Request::get("/").body(Body::empty()).unwrap())
        .await
        .unwrap()
        .headers()
        .clone();
    assert_eq!(headers[header::X_FRAME_OPTIONS], "DENY");
    assert!(headers[header::CONTENT_SECURITY_POLICY]
        .to_str()
        .unwrap()
        .contains("frame-ancestors 'none'"));
    for want in [
        "checkout",
        "fanout",
        "smtp maintenance",
        "node-a",
        "nightly-report",
        "0 2 * * *",
        "Europe/Paris",
        "id=\"throughput\"",
    ] {
        assert!(o.body.contains(want), "overview lacks {want:?}");
    }
    assert_eq!(o.body.matches("class=\"bar done\"").count(), 30);

    let l = get(&app, "/instances?status=failed&queue=checkout").await;
    assert_eq!(l.status, StatusCode::OK);
    assert!(l.body.contains(&format!("data-id=\"{}\"", s.failed)));
    assert!(!l.body.contains(&format!("data-id=\"{}\"", s.runnable)));
    let k = get(&app, "/instances?key=order%3A42").await;
    assert!(
        k.body.contains(&format!("data-id=\"{}\"", s.parked)),
        "{}",
        k.body
    );
    assert_eq!(k.body.matches("<tr data-id=").count(), 1);
    let bad = get(&app, "/instances?status=nope").await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    let t = get(
        &app,
        "/instances?since=2000-01-01T00:00&until=2000-01-02T00:00",
    )
    .await;
    assert!(t.body.contains("No instance matches"), "{}", t.body);

    let i = get(&app, &format!("/instances/{}", s.parked)).await;
    assert_eq!(i.status, StatusCode::OK);
    assert!(
        i.body
            .contains("awaiting signal &quot;payment_confirmed&quot;")
            || i.body.contains("awaiting signal \"payment_confirmed\""),
        "the explain line: {}",
        i.body
    );
    for want in [
        "payment_confirmed",
        "address_changed",
        "evt-1",
        "order:42",
        "Lyon",
    ] {
        assert!(i.body.contains(want), "instance page lacks {want:?}");
    }
    assert!(
        !i.body.contains("id=\"cancel\""),
        "no action form when read-only"
    );
    let p = get(&app, &format!("/instances/{}", s.parent)).await;
    for id in [s.child_done, s.child_mid, s.grandchild] {
        assert!(
            p.body.contains(&format!("href=\"/instances/{id}\"")),
            "tree lacks {id}"
        );
    }
    let g = get(&app, &format!("/instances/{}", s.grandchild)).await;
    assert!(g.body.contains(&format!(
        "id=\"parent\" href=\"/instances/{}\"",
        s.child_mid
    )));
    assert_eq!(
        get(&app, "/instances/999999999").await.status,
        StatusCode::NOT_FOUND
    );

    let f = get(&app, "/fsms").await;
    assert!(f.body.contains("data-fsm=\"Checkout\" data-version=\"1\""));
    assert!(f.body.contains("no live node runs these live rows"));
    assert!(f.body.contains("Rows are exact counts"), "{}", f.body);
    db.close().await;
}

/// The `<tr …>` of `/limits` whose attributes start with `attrs`, up to its `</tr>`.
fn table_row<'a>(body: &'a str, attrs: &str) -> &'a str {
    let at = body
        .find(&format!("<tr {attrs}"))
        .unwrap_or_else(|| panic!("no row {attrs}: {body}"));
    let row = &body[at..];
    &row[..row.find("</tr>").unwrap()]
}

/// A cell of `row` by its `data-field`: (`data-figure` if any, its text without tags).
fn field(row: &str, name: &str) -> (String, String) {
    let at = row
        .find(&format!("data-field=\"{name}\""))
        .unwrap_or_else(|| panic!("no {name} in {row}"));
    let td = &row[at..];
    let td = &td[..td.find("</td>").unwrap()];
    let kind = td
        .split("data-figure=\"")
        .nth(1)
        .map(|k| k[..k.find('"').unwrap()].to_string())
        .unwrap_or_default();
    (kind, td[td.find('>').unwrap() + 1..].to_string())
}

/// `/limits` shows every gate with K and its keys in use (running, waiting, full), and
/// every rate limit with its buckets (tokens now, reserved below zero); past the caps of
/// rows read, counts say "N+" and the page says where keys or buckets may be missing.
#[tokio::test]
async fn the_flow_control_page_shows_gates_and_buckets() {
    let db = TestDb::new().await;
    seed(db.pool()).await;
    seed_flow_control(db.pool()).await;
    let app = router(db.pool().clone());

    let home = get(&app, "/").await;
    assert!(home.body.contains("<a href=\"/limits\">Flow control</a>"));
    let p = get(&app, "/limits").await;
    assert_eq!(p.status, StatusCode::OK);
    assert!(p.body.contains("<title>Flow control"), "{}", p.body);
    assert!(p.body.contains("id=\"gates\"") && p.body.contains("id=\"rate-limits\""));

    // Key acme of gate stripe (K = 2): 2 running, full, 1 waiting.
    let acme = table_row(&p.body, "data-gate=\"stripe\" data-key=\"acme\"");
    assert!(acme.contains("data-full=\"true\""), "{acme}");
    assert_eq!(field(acme, "limit").1, "2");
    assert_eq!(field(acme, "running"), ("exact".into(), "2".into()));
    assert_eq!(field(acme, "waiting"), ("exact".into(), "1".into()));
    assert!(acme.contains(">full</span> (2/2 running"), "{acme}");
    // Key beta: 1 of 2, not full, nothing waiting.
    let beta = table_row(&p.body, "data-gate=\"stripe\" data-key=\"beta\"");
    assert!(beta.contains("data-full=\"false\""), "{beta}");
    assert_eq!(field(beta, "running").1, "1");
    assert_eq!(field(beta, "waiting").1, "0");
    assert!(beta.contains("1 free slot(s)"), "{beta}");
    // The busiest key first; a declared gate with no key in use is listed.
    assert!(p.body.find("data-key=\"acme\"") < p.body.find("data-key=\"beta\""));
    let smtp = table_row(&p.body, "data-gate=\"smtp\"");
    assert_eq!(field(smtp, "limit").1, "5");
    assert!(smtp.contains("no key in use"), "{smtp}");
    assert!(
        p.body.contains("Every figure is an exact count"),
        "{}",
        p.body
    );

    // Bucket eu of carrier: 3 tokens below zero, reserved by waiting rows.
    let eu = table_row(&p.body, "data-limit=\"carrier\" data-key=\"eu\"");
    assert!(eu.contains("data-reserved=\"true\""), "{eu}");
    assert_eq!(field(eu, "tokens").1, "-3");
    assert_eq!(field(eu, "burst").1, "5");
    assert!(eu.contains("3 token(s) reserved by waiting rows"), "{eu}");
    let us = table_row(&p.body, "data-limit=\"carrier\" data-key=\"us\"");
    assert!(us.contains("data-reserved=\"false\""), "{us}");
    assert_eq!(field(us, "tokens").1, "2");
    assert!(us.contains("2 of 5 free"), "{us}");
    let sms = table_row(&p.body, "data-limit=\"sms\"");
    assert!(sms.contains("no bucket"), "{sms}");
    // Read-only: no form, whoever looks.
    assert!(
        !p.body.contains("<form method=\"post\" action=\"/"),
        "{}",
        p.body
    );

    // More runnable rows than the page reads, all before the gated one in the pick
    // index's order (rows with a key: plain rows wait on the log, never gated): the
    // waiting counts become lower bounds, and say so.
    sqlx::query(
        "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, partition_key)
         SELECT 'Mail', 1, 'send', '{}', 'aaa', 'k' || g FROM generate_series(1, 1000) g",
    )
    .execute(db.pool())
    .await
    .unwrap();
    let p = get(&app, "/limits").await;
    let acme = table_row(&p.body, "data-gate=\"stripe\" data-key=\"acme\"");
    assert_eq!(field(acme, "running"), ("exact".into(), "2".into()));
    assert_eq!(field(acme, "waiting"), ("at-least".into(), "0+".into()));
    assert!(
        p.body.contains("waiting figures are lower bounds"),
        "{}",
        p.body
    );

    // More executing gated rows and more buckets than the page reads (1,000 of each, in
    // key order): the key where reading stopped is a lower bound, the keys after it are
    // not listed and a row says so; the limit after the last bucket read is "not read".
    sqlx::query(
        "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, status, locked_by,
                                   lease_epoch, lease_expires_at, gate, partition_key, gate_slot)
         SELECT 'Charge', 1, 'charge', '{}', 'payments', 'executing', 'node-a', 1,
                now() + interval '30 seconds', 'stripe', 'k' || lpad(g::text, 4, '0'), 0
           FROM generate_series(0, 999) g",
    )
    .execute(db.pool())
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO gd_buckets (name, key, tokens, at)
         SELECT 'carrier', 'k' || lpad(g::text, 4, '0'), 1, now() FROM generate_series(0, 999) g",
    )
    .execute(db.pool())
    .await
    .unwrap();
    let p = get(&app, "/limits").await;
    let acme = table_row(&p.body, "data-gate=\"stripe\" data-key=\"acme\"");
    assert_eq!(field(acme, "running"), ("exact".into(), "2".into()));
    // acme (2), beta (1), k0000 … k0996: 1,000 rows read.
    let last = table_row(&p.body, "data-gate=\"stripe\" data-key=\"k0996\"");
    assert_eq!(field(last, "running"), ("at-least".into(), "1+".into()));
    assert!(
        !p.body.contains("data-gate=\"stripe\" data-key=\"k0997\""),
        "{}",
        p.body
    );
    assert!(
        table_row(&p.body, "data-gate=\"stripe\" data-more=\"true\"")
            .contains("more keys may be running")
    );
    assert!(table_row(&p.body, "data-gate=\"smtp\"").contains("no key in use"));
    // eu, k0000 … k0998: 1,000 buckets read; us and the limit sms are past them.
    assert!(p.body.contains("data-limit=\"carrier\" data-key=\"k0998\""));
    assert!(!p.body.contains("data-limit=\"carrier\" data-key=\"us\""));
    assert!(
        table_row(&p.body, "data-limit=\"carrier\" data-more=\"true\"")
            .contains("more buckets may follow")
    );
    assert!(table_row(&p.body, "data-limit=\"sms\"").contains("buckets not read"));
    db.close().await;
}

/// The overview's and the FSMs page's counts on a table too large to read whole: cheap
/// index counts stay exact below the cap and say "1,000+" or "≈" past it; the statuses no
/// index gives by queue are estimated from a sample and marked so; a small table's are
/// all exact (the sample is the whole table).
#[tokio::test]
async fn counts_are_exact_where_cheap_and_marked_as_estimates_past_the_sample() {
    let db = TestDb::new().await;
    let app = router(db.pool().clone());
    // A small table: exact everywhere.
    sqlx::query(
        "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, status)
         SELECT 'Mail', 1, 'send', '{}', 'small',
                (ARRAY['runnable', 'done', 'awaiting_signal'])[1 + g % 3]::gd_status
           FROM generate_series(1, 30) g",
    )
    .execute(db.pool())
    .await
    .unwrap();
    let o = get(&app, "/").await;
    assert!(
        o.body.contains("Every figure is an exact count"),
        "{}",
        o.body
    );
    let cell = |body: &str, queue: &str, status: &str| -> String {
        let row = &body[body.find(&format!("data-queue=\"{queue}\"")).unwrap()..];
        let at = row.find(&format!("data-status=\"{status}\"")).unwrap();
        let td = &row[at..row[at..].find("</td>").unwrap() + at];
        let kind = td.split("data-figure=\"").nth(1).unwrap();
        let kind = &kind[..kind.find('"').unwrap()];
        // The cell's text, without its tags (a non-zero count is a link).
        let mut text = String::new();
        let mut in_tag = false;
        for c in td[td.find('>').unwrap() + 1..].chars() {
            match c {
                '<' => in_tag = true,
                '>' => in_tag = false,
                c if !in_tag => text.push(c),
                _ => {}
            }
        }
        format!("{kind} {text}")
    };
    assert_eq!(cell(&o.body, "small", "runnable"), "exact 10");
    assert_eq!(cell(&o.body, "small", "done"), "exact 10");
    assert_eq!(cell(&o.body, "small", "awaiting_signal"), "exact 10");
    assert_eq!(cell(&o.body, "small", "failed"), "exact 0");

    // 60,000 rows, with a fat state so that they span far more pages than the sample
    // reads: "big" has 20,000 runnable rows (past the cap), "tiny" 5.
    sqlx::query(
        "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, status)
         SELECT 'Report', 1 + g % 2, 'run', jsonb_build_object('pad', repeat('x', 400)), 'big',
                CASE WHEN g % 3 = 0 THEN 'runnable' ELSE 'done' END::gd_status
           FROM generate_series(1, 60000) g",
    )
    .execute(db.pool())
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue)
         SELECT 'Mail', 1, 'send', '{}', 'tiny' FROM generate_series(1, 5)",
    )
    .execute(db.pool())
    .await
    .unwrap();
    let o = get(&app, "/").await;
    assert!(o.body.contains("estimated from a sample of"), "{}", o.body);
    let big_runnable = cell(&o.body, "big", "runnable");
    assert!(
        big_runnable.starts_with("estimate ≈") || big_runnable == "at-least 1,000+",
        "{big_runnable}"
    );
    assert!(
        cell(&o.body, "big", "done").starts_with("estimate ≈"),
        "{}",
        cell(&o.body, "big", "done")
    );
    assert_eq!(cell(&o.body, "tiny", "runnable"), "exact 5");
    assert_eq!(cell(&o.body, "tiny", "executing"), "exact 0");
    let f = get(&app, "/fsms").await;
    assert!(f.body.contains("Rows are estimated"), "{}", f.body);
    assert!(f.body.contains("data-fsm=\"Report\" data-version=\"2\""));
    assert!(f.body.contains('≈'));
    db.close().await;
}

#[tokio::test]
async fn the_instance_list_pages_by_keyset() {
    let db = TestDb::new().await;
    sqlx::query(
        "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue)
         SELECT 'Job', 1, 'run', '{}', CASE WHEN g % 2 = 0 THEN 'even' ELSE 'odd' END
           FROM generate_series(1, 120) g",
    )
    .execute(db.pool())
    .await
    .unwrap();
    let app = router(db.pool().clone());
    let first = get(&app, "/instances").await;
    assert_eq!(first.body.matches("<tr data-id=").count(), 50);
    assert!(first.body.contains("data-id=\"120\"") && first.body.contains("data-id=\"71\""));
    assert!(
        first.body.contains("href=\"/instances?after=71\""),
        "{}",
        first.body
    );
    let third = get(&app, "/instances?after=21").await;
    assert_eq!(third.body.matches("<tr data-id=").count(), 20);
    assert!(!third.body.contains("id=\"older\""), "nothing below id 1");
    // A filter keeps its value in the next page's link.
    let odd = get(&app, "/instances?queue=odd").await;
    assert!(odd.body.contains("data-id=\"119\"") && !odd.body.contains("data-id=\"120\""));
    assert!(
        odd.body
            .contains("href=\"/instances?after=21&amp;queue=odd\""),
        "{}",
        odd.body
    );
    db.close().await;
}

#[tokio::test]
async fn a_read_only_dashboard_refuses_every_action_and_changes_nothing() {
    let db = TestDb::new().await;
    let s = seed(db.pool()).await;
    let app = router(db.pool().clone());
    let before = fingerprint(db.pool()).await;
    let csrf = csrf_of(&app).await;
    let cookie = format!("gd_csrf={csrf}; gd_session=00");
    let mut paths = Vec::new();
    for id in [s.runnable, s.parked, s.failed, s.parent, 999_999_999] {
        for action in ["cancel", "retry", "signal", "restart", "fork"] {
            paths.push(format!("/instances/{id}/{action}"));
        }
    }
    paths.extend([
        "/queues/checkout/pause".to_string(),
        "/queues/mail/resume".to_string(),
        "/bulk".to_string(),
    ]);
    let form = format!(
        "csrf={csrf}&name=payment_confirmed&payload=%7B%7D&step=ship&queue=checkout&action=cancel"
    );
    for path in &paths {
        let tries = [
            post(path, None, ""),
            post(path, Some(&cookie), &form),
            Request::post(path.as_str())
                .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
                .body(Body::empty())
                .unwrap(),
        ];
        for req in tries {
            let a = send(&app, req).await;
            assert_eq!(a.status, StatusCode::FORBIDDEN, "{path}: {}", a.body);
            assert!(a.body.contains("read-only"), "{}", a.body);
        }
    }
    assert_eq!(get(&app, "/login").await.status, StatusCode::FORBIDDEN);
    let login = send(
        &app,
        post(
            "/login",
            Some(&cookie),
            &format!("csrf={csrf}&token={TOKEN}"),
        ),
    )
    .await;
    assert_eq!(login.status, StatusCode::FORBIDDEN);
    assert_eq!(
        fingerprint(db.pool()).await,
        before,
        "a read-only dashboard changed a row"
    );
    db.close().await;
}

#[tokio::test]
async fn an_operator_dashboard_needs_the_token_and_the_csrf_token() {
    let db = TestDb::new().await;
    let s = seed(db.pool()).await;
    let app = router_with(
        db.pool().clone(),
        DashboardConfig::new().with_operator_token(TOKEN).unwrap(),
    );
    let before = fingerprint(db.pool()).await;
    let csrf = csrf_of(&app).await;
    let path = format!("/instances/{}/cancel", s.parked);

    // Sign in: a wrong token is refused, the right one sets the cookie.
    let wrong = send(
        &app,
        post(
            "/login",
            Some(&format!("gd_csrf={csrf}")),
            &format!("csrf={csrf}&token=nope"),
        ),
    )
    .await;
    assert_eq!(wrong.status, StatusCode::FORBIDDEN);
    let no_csrf = send(
        &app,
        post(
            "/login",
            Some(&format!("gd_csrf={csrf}")),
            &format!("token={TOKEN}"),
        ),
    )
    .await;
    assert_eq!(
        no_csrf.status,
        StatusCode::FORBIDDEN,
        "sign-in needs the CSRF token too"
    );
    let ok = send(
        &app,
        post(
            "/login",
            Some(&format!("gd_csrf={csrf}")),
            &format!("csrf={csrf}&token={TOKEN}"),
        ),
    )
    .await;
    assert_eq!(ok.status, StatusCode::SEE_OTHER);
    let token_cookie = ok
        .set_cookies
        .iter()
        .find(|c| c.starts_with("gd_session="))
        .expect("the sign-in cookie");
    assert!(token_cookie.contains("SameSite=Strict") && token_cookie.contains("HttpOnly"));
    let signed_in = token_cookie[..token_cookie.find(';').unwrap()].to_string();

    let refused = [
        // No token at all.
        post(
            &path,
            Some(&format!("gd_csrf={csrf}")),
            &format!("csrf={csrf}"),
        ),
        // Signed in, but the form has no CSRF token (a forged cross-site form).
        post(&path, Some(&format!("gd_csrf={csrf}; {signed_in}")), ""),
        // Signed in, a CSRF token that is not this browser's.
        post(
            &path,
            Some(&format!("gd_csrf={csrf}; {signed_in}")),
            &format!("csrf={}", "0".repeat(64)),
        ),
        // Signed in, a CSRF field but no CSRF cookie.
        post(&path, Some(&signed_in), &format!("csrf={csrf}")),
        // A wrong bearer token.
        Request::post(&path)
            .header(header::AUTHORIZATION, "Bearer not-the-token")
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(Body::empty())
            .unwrap(),
    ];
    for req in refused {
        let a = send(&app, req).await;
        assert_eq!(a.status, StatusCode::FORBIDDEN, "{}", a.body);
    }
    assert_eq!(
        fingerprint(db.pool()).await,
        before,
        "a refused action changed a row"
    );

    // The signed-in form with its CSRF token acts.
    let done = send(
        &app,
        post(
            &path,
            Some(&format!("gd_csrf={csrf}; {signed_in}")),
            &format!("csrf={csrf}"),
        ),
    )
    .await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
    assert_eq!(
        done.location.as_deref(),
        Some(&*format!("/instances/{}?did=cancelled", s.parked))
    );
    assert_eq!(
        status_of(db.pool(), s.parked).await,
        ("failed".into(), Some("cancelled".into()))
    );
    // A script with the bearer token needs no CSRF token: a browser never sends that header.
    let retry = send(
        &app,
        Request::post(format!("/instances/{}/retry", s.failed))
            .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(retry.status, StatusCode::SEE_OTHER, "{}", retry.body);
    assert_eq!(status_of(db.pool(), s.failed).await.0, "runnable");
    // The history says who acted, as the dashboard knows them: by how they proved it.
    let actor = |id: i64| {
        sqlx::query_scalar::<_, Option<String>>(
            "SELECT actor FROM gd_history WHERE instance_id = $1 ORDER BY entry DESC LIMIT 1",
        )
        .bind(id)
        .fetch_one(db.pool())
    };
    assert_eq!(
        actor(s.parked).await.unwrap().as_deref(),
        Some("dashboard (signed in)")
    );
    assert_eq!(
        actor(s.failed).await.unwrap().as_deref(),
        Some("dashboard (token)")
    );
    // The engine's refusals are shown, not hidden: a done row cannot be cancelled.
    let late = send(
        &app,
        post(
            &format!("/instances/{}/cancel", s.child_done),
            Some(&format!("gd_csrf={csrf}; {signed_in}")),
            &format!("csrf={csrf}"),
        ),
    )
    .await;
    assert_eq!(late.status, StatusCode::CONFLICT, "{}", late.body);
    db.close().await;
}

/// `/metrics` serves the Prometheus exposition with the queue gauges read at the scrape,
/// when the dashboard has a recorder; without one the route is not there.
#[tokio::test]
async fn metrics_are_served_when_the_dashboard_has_a_recorder() {
    let db = TestDb::new().await;
    seed(db.pool()).await;
    let without = get(&router(db.pool().clone()), "/metrics").await;
    assert_eq!(without.status, StatusCode::NOT_FOUND);

    let handle = gen_durable::metrics::install_prometheus().unwrap();
    let app = router_with(
        db.pool().clone(),
        DashboardConfig::new().with_metrics(handle),
    );
    let m = get(&app, "/metrics").await;
    assert_eq!(m.status, StatusCode::OK);
    // Every queue has a line per status; the seeded runnable row is in one of them.
    let runnable: f64 = m
        .body
        .lines()
        .filter(|l| l.starts_with("gen_durable_queue_depth{") && l.contains("status=\"runnable\""))
        .map(|l| l.rsplit_once(' ').unwrap().1.parse::<f64>().unwrap())
        .sum();
    assert!(runnable >= 1.0, "no runnable depth in:\n{}", m.body);
    assert!(
        m.body.contains("status=\"done\"") && m.body.contains("status=\"awaiting_signal\""),
        "{}",
        m.body
    );
    assert!(
        m.body.contains("gen_durable_queue_lag_seconds{"),
        "{}",
        m.body
    );
    db.close().await;
}

/// An operator restarts an instance from a named step, pauses and resumes a queue, and
/// cancels every instance a filter matches after a preview that writes nothing.
#[tokio::test]
async fn an_operator_restarts_pauses_resumes_and_acts_in_bulk_after_a_preview() {
    let db = TestDb::new().await;
    let s = seed(db.pool()).await;
    // The step names a live node announces (the suite links no Checkout v2).
    sqlx::query(r#"UPDATE gd_nodes SET steps = '{"Checkout@2": ["reserve", "ship"]}'"#)
        .execute(db.pool())
        .await
        .unwrap();
    let app = router_with(
        db.pool().clone(),
        DashboardConfig::new().with_operator_token(TOKEN).unwrap(),
    );
    let csrf = csrf_of(&app).await;
    let jar = format!("gd_csrf={csrf}");
    // As an operator's script would: the token as a bearer, with the page's CSRF token.
    let act = |path: String, form: String| {
        let (app, jar) = (app.clone(), jar.clone());
        async move {
            let mut req = post(&path, Some(&jar), &form);
            req.headers_mut().insert(
                header::AUTHORIZATION,
                format!("Bearer {TOKEN}").parse().unwrap(),
            );
            send(&app, req).await
        }
    };

    // Restart: an unknown step is refused, a known one makes the failed row runnable there.
    let bad = act(
        format!("/instances/{}/restart", s.failed),
        format!("csrf={csrf}&step=nope"),
    )
    .await;
    assert_eq!(bad.status, StatusCode::CONFLICT, "{}", bad.body);
    // Refused on the instance's own page, saying why, with its actions to try again.
    for want in [
        format!("Instance #{}", s.failed),
        "id=\"refused\"".to_string(),
        "nope".to_string(),
        "id=\"restart\"".to_string(),
    ] {
        assert!(bad.body.contains(&want), "no {want:?} in {}", bad.body);
    }
    let ok = act(
        format!("/instances/{}/restart", s.failed),
        format!("csrf={csrf}&step=ship"),
    )
    .await;
    assert_eq!(ok.status, StatusCode::SEE_OTHER, "{}", ok.body);
    let (status, step): (String, String) =
        sqlx::query_as("SELECT status::text, step FROM gd_instances WHERE id = $1")
            .bind(s.failed)
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!((status.as_str(), step.as_str()), ("runnable", "ship"));
    let page = get_as(&app, &format!("/instances/{}", s.runnable), &jar).await;
    assert!(
        page.contains("id=\"restart\""),
        "the restart form for an operator"
    );
    // The step is chosen from the version's steps, its current one first selected.
    assert!(
        page.contains(
            "<select name=\"step\" id=\"restart-step\"><option value=\"reserve\" selected>reserve</option><option value=\"ship\">ship</option></select>"
        ),
        "{page}"
    );

    // From the timeline: restart from an entry takes its step and state; a fork needs the
    // FSM's code, which this binary does not link, and is refused with nothing written.
    let first: i64 = sqlx::query_scalar("SELECT min(entry) FROM gd_history WHERE instance_id = $1")
        .bind(s.parked)
        .fetch_one(db.pool())
        .await
        .unwrap();
    let page = get_as(&app, &format!("/instances/{}", s.parked), &jar).await;
    assert!(
        page.contains("class=\"fork\""),
        "the fork form on the timeline"
    );
    let bad = act(
        format!("/instances/{}/fork", s.parked),
        format!("csrf={csrf}&entry=abc"),
    )
    .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{}", bad.body);
    let before = fingerprint(db.pool()).await;
    let fork = act(
        format!("/instances/{}/fork", s.parked),
        format!("csrf={csrf}&entry={first}"),
    )
    .await;
    assert_eq!(fork.status, StatusCode::CONFLICT, "{}", fork.body);
    assert!(fork.body.contains("Checkout"), "{}", fork.body);
    assert_eq!(fingerprint(db.pool()).await, before, "a refused fork wrote");
    let back = act(
        format!("/instances/{}/restart", s.parked),
        format!("csrf={csrf}&entry={first}"),
    )
    .await;
    assert_eq!(back.status, StatusCode::SEE_OTHER, "{}", back.body);
    let (status, step, state): (String, String, serde_json::Value) =
        sqlx::query_as("SELECT status::text, step, state FROM gd_instances WHERE id = $1")
            .bind(s.parked)
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(
        (status.as_str(), step.as_str(), state),
        ("runnable", "reserve", serde_json::json!({"order": 42}))
    );

    // Pause and resume.
    let paused = act(
        "/queues/checkout/pause".into(),
        format!("csrf={csrf}&reason=deploy"),
    )
    .await;
    assert_eq!(paused.status, StatusCode::SEE_OTHER, "{}", paused.body);
    // The overview it leads to says what was done.
    assert_eq!(
        paused.location.as_deref(),
        Some("/?did=paused&queue=checkout")
    );
    let told = get_as(&app, "/?did=paused&queue=checkout", &jar).await;
    assert!(
        told.contains("Paused queue <code>checkout</code>: no node claims its rows"),
        "{told}"
    );
    let pauses: Vec<(String, Option<String>)> =
        sqlx::query_as("SELECT queue, reason FROM gd_queue_pauses ORDER BY queue")
            .fetch_all(db.pool())
            .await
            .unwrap();
    assert!(
        pauses.contains(&("checkout".into(), Some("deploy".into()))),
        "{pauses:?}"
    );
    let overview = get_as(&app, "/", &jar).await;
    assert!(
        overview.contains("/queues/mail/resume"),
        "a resume button for a paused queue"
    );
    let resumed = act("/queues/checkout/resume".into(), format!("csrf={csrf}")).await;
    assert_eq!(resumed.status, StatusCode::SEE_OTHER);
    assert_eq!(
        resumed.location.as_deref(),
        Some("/?did=resumed&queue=checkout")
    );
    let left: i64 =
        sqlx::query_scalar("SELECT count(*) FROM gd_queue_pauses WHERE queue = 'checkout'")
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(left, 0);

    // Bulk: the preview counts and writes nothing; the confirmation cancels.
    // Live rows of the queue: an executing one is cancelled after its step.
    let live = |statuses: &'static str| {
        let pool = db.pool().clone();
        async move {
            sqlx::query_scalar::<_, i64>(&format!(
                "SELECT count(*) FROM gd_instances WHERE queue = 'checkout' AND status::text IN ({statuses})"
            ))
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    const WAITING: &str = "'runnable', 'awaiting_signal', 'awaiting_children'";
    let before = fingerprint(db.pool()).await;
    let n = live("'executing', 'runnable', 'awaiting_signal', 'awaiting_children'").await;
    assert!(
        live(WAITING).await >= 2,
        "the seed has waiting checkout rows"
    );
    let preview = act(
        "/bulk".into(),
        format!("csrf={csrf}&queue=checkout&fsm=&status=&action=cancel&preview=1"),
    )
    .await;
    assert_eq!(preview.status, StatusCode::OK, "{}", preview.body);
    assert!(
        preview.body.contains(&format!("{n} instance(s) match")),
        "{}",
        preview.body
    );
    assert_eq!(
        fingerprint(db.pool()).await,
        before,
        "a preview writes nothing"
    );
    let done = act(
        "/bulk".into(),
        format!("csrf={csrf}&queue=checkout&fsm=&status=&action=cancel"),
    )
    .await;
    assert_eq!(done.status, StatusCode::OK, "{}", done.body);
    assert!(done.body.contains(&format!("{n} matched")), "{}", done.body);
    assert_eq!(live(WAITING).await, 0);
    db.close().await;
}

/// A page as a signed-in operator: its body.
async fn get_as(app: &Router, path: &str, jar: &str) -> String {
    let req = Request::get(path)
        .header(header::COOKIE, jar)
        .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
        .body(Body::empty())
        .unwrap();
    send(app, req).await.body
}

/// Wrong operator tokens are limited per client address: after five within a minute, the
/// address's POSTs — even with the right token — are answered 429 with `Retry-After`,
/// while another address signs in as usual. Without the limit, guessing is unbounded.
#[tokio::test]
async fn wrong_tokens_are_rate_limited_per_client_address() {
    use axum::extract::ConnectInfo;
    use std::net::SocketAddr;

    let db = TestDb::new().await;
    let s = seed(db.pool()).await;
    let app = router_with(
        db.pool().clone(),
        DashboardConfig::new().with_operator_token(TOKEN).unwrap(),
    );
    let csrf = csrf_of(&app).await;
    let from = |addr: &str, mut req: Request<Body>| {
        let peer: SocketAddr = addr.parse().unwrap();
        req.extensions_mut().insert(ConnectInfo(peer));
        req
    };
    let login = |token: &str| {
        post(
            "/login",
            Some(&format!("gd_csrf={csrf}")),
            &format!("csrf={csrf}&token={token}"),
        )
    };
    let guesser = "203.0.113.7:40000";
    for n in 0..5 {
        let a = send(&app, from(guesser, login(&format!("guess-{n}")))).await;
        assert_eq!(a.status, StatusCode::FORBIDDEN, "guess {n}: {}", a.body);
    }
    // Locked out: the right token is refused too, and so is a bearer action, from any
    // port of that address; nothing runs.
    let before = fingerprint(db.pool()).await;
    let locked = app
        .clone()
        .oneshot(from("203.0.113.7:40001", login(TOKEN)))
        .await
        .unwrap();
    assert_eq!(locked.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry_after: u64 = locked.headers()[header::RETRY_AFTER]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry_after), "Retry-After {retry_after}");
    let bearer = Request::post(format!("/instances/{}/cancel", s.parked))
        .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::empty())
        .unwrap();
    let a = send(&app, from(guesser, bearer)).await;
    assert_eq!(a.status, StatusCode::TOO_MANY_REQUESTS, "{}", a.body);
    assert_eq!(
        fingerprint(db.pool()).await,
        before,
        "a locked-out POST acted"
    );
    // Pages are still served to it.
    let page = send(
        &app,
        from(guesser, Request::get("/").body(Body::empty()).unwrap()),
    )
    .await;
    assert_eq!(page.status, StatusCode::OK);

    // Another address is not affected.
    let ok = send(&app, from("198.51.100.2:50000", login(TOKEN))).await;
    assert_eq!(ok.status, StatusCode::SEE_OTHER, "{}", ok.body);

    // Wrong bearer tokens count as well; a request with no token at all does not.
    let scripted = "198.51.100.9:1";
    let no_token = || {
        from(
            scripted,
            post(&format!("/instances/{}/cancel", s.parked), None, ""),
        )
    };
    for _ in 0..10 {
        assert_eq!(send(&app, no_token()).await.status, StatusCode::FORBIDDEN);
    }
    for _ in 0..5 {
        let wrong = Request::post(format!("/instances/{}/cancel", s.parked))
            .header(header::AUTHORIZATION, "Bearer nope")
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(Body::empty())
            .unwrap();
        let a = send(&app, from(scripted, wrong)).await;
        assert_eq!(a.status, StatusCode::FORBIDDEN, "{}", a.body);
    }
    assert_eq!(
        send(&app, no_token()).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    db.close().await;
}

/// A request the dashboard cannot serve gets the dashboard's own page, styled and saying
/// what was wrong, with a way back: a malformed id or query (400), an unknown route (404),
/// a wrong method (405). Axum's plain-text rejections and empty 404 never reach a person.
#[tokio::test]
async fn bad_requests_and_unknown_routes_get_the_dashboards_error_page() {
    let db = TestDb::new().await;
    let app = router(db.pool().clone());
    for (path, status, says) in [
        (
            "/instances/abc",
            StatusCode::BAD_REQUEST,
            "&quot;abc&quot; is not an instance id",
        ),
        (
            "/instances?after=yesterday",
            StatusCode::BAD_REQUEST,
            "after",
        ),
        (
            "/instances/99999999",
            StatusCode::NOT_FOUND,
            "no instance with id 99999999",
        ),
        (
            "/no/such/page",
            StatusCode::NOT_FOUND,
            "no page at /no/such/page",
        ),
        (
            "/instances?live=1",
            StatusCode::BAD_REQUEST,
            "live=1: give the seconds between reloads",
        ),
    ] {
        let r = get(&app, path).await;
        assert_eq!(r.status, status, "{path}: {}", r.body);
        assert!(
            r.body.contains("<!DOCTYPE html>"),
            "{path} is not a page: {}",
            r.body
        );
        assert!(r.body.contains("id=\"error\""), "{path}: {}", r.body);
        assert!(
            r.body.contains(says),
            "{path} does not say {says:?}: {}",
            r.body
        );
        assert!(
            r.body.contains("href=\"/\""),
            "{path} has no way back: {}",
            r.body
        );
    }
    let r = send(
        &app,
        Request::delete("/instances").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED, "{}", r.body);
    assert!(r.body.contains("id=\"error\""), "{}", r.body);
    db.close().await;
}

/// Finding: a queue or FSM in another case is the one in use (offered in pick lists), an
/// error's text in any case, a parent's children, an id straight to its page; the bulk
/// form acts on the same filter (a JSON path aside: then it says so instead of acting on
/// more).
#[tokio::test]
async fn the_list_finds_by_any_case_error_text_parent_and_id() {
    let db = TestDb::new().await;
    let s = seed(db.pool()).await;
    let app = router_with(
        db.pool().clone(),
        DashboardConfig::new().with_operator_token(TOKEN).unwrap(),
    );

    let l = get(&app, "/instances?fsm=checkout&queue=CHECKOUT&status=failed").await;
    assert_eq!(l.status, StatusCode::OK, "{}", l.body);
    assert_eq!(listed_ids(&l.body), vec![s.failed], "{}", l.body);
    assert!(
        l.body.contains("value=\"Checkout\""),
        "the name in use shown"
    );
    for pick in [
        "<datalist id=\"queues\">",
        "<option value=\"fanout\">",
        "<datalist id=\"fsms\">",
        "<option value=\"Fanout\">",
    ] {
        assert!(l.body.contains(pick), "no {pick} in {}", l.body);
    }

    let e = get(&app, "/instances?error=PROVIDER%20said").await;
    assert_eq!(listed_ids(&e.body), vec![s.failed], "{}", e.body);
    let pct = get(&app, "/instances?error=100%25").await;
    assert!(
        listed_ids(&pct.body).is_empty(),
        "a % is a character, not a wildcard"
    );

    let c = get(&app, &format!("/instances?parent={}", s.parent)).await;
    assert_eq!(
        listed_ids(&c.body),
        vec![s.child_mid, s.child_done],
        "{}",
        c.body
    );
    assert!(c.body.contains("id=\"parent-of\""), "{}", c.body);
    let g = get(
        &app,
        &format!("/instances?parent={}&status=runnable", s.child_mid),
    )
    .await;
    assert_eq!(listed_ids(&g.body), vec![s.grandchild], "{}", g.body);

    let go = get(&app, &format!("/instances?id={}", s.parked)).await;
    assert_eq!(go.status, StatusCode::SEE_OTHER);
    assert_eq!(go.location, Some(format!("/instances/{}", s.parked)));
    let bad = get(&app, "/instances?id=x").await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);

    // The bulk form takes the list's filters: with an error text on, it acts on the rows
    // whose error holds it, in any case, and on no other.
    let csrf = csrf_of(&app).await;
    let jar = format!("gd_csrf={csrf}");
    let list = send(
        &app,
        operator_get("/instances?fsm=Checkout&error=said", TOKEN, Some(&jar)),
    )
    .await;
    assert!(list.body.contains("id=\"bulk\""), "{}", list.body);
    assert!(
        list.body.contains("name=\"error\" value=\"said\""),
        "{}",
        list.body
    );
    let act = |form: String| {
        let (app, jar) = (app.clone(), jar.clone());
        async move {
            let mut req = post("/bulk", Some(&jar), &form);
            req.headers_mut().insert(
                header::AUTHORIZATION,
                format!("Bearer {TOKEN}").parse().unwrap(),
            );
            send(&app, req).await
        }
    };
    let form = format!("csrf={csrf}&fsm=Checkout&status=failed&error=SAID&action=retry");
    let preview = act(format!("{form}&preview=1")).await;
    assert!(
        preview.body.contains("1 instance(s) match"),
        "{}",
        preview.body
    );
    // The confirmation carries the filter previewed, and the way back keeps it.
    assert!(
        preview.body.contains("name=\"error\" value=\"SAID\""),
        "{}",
        preview.body
    );
    assert!(
        preview
            .body
            .contains("/instances?fsm=Checkout&amp;status=failed&amp;error=SAID"),
        "{}",
        preview.body
    );
    let none = act(format!(
        "csrf={csrf}&fsm=Checkout&status=failed&error=nowhere&action=retry&preview=1"
    ))
    .await;
    assert!(none.body.contains("0 instance(s) match"), "{}", none.body);
    let done = act(form).await;
    assert!(done.body.contains("1 matched, 1 changed"), "{}", done.body);
    assert_eq!(status_of(db.pool(), s.failed).await.0, "runnable");

    // A JSON path it cannot take: it says so instead of acting on more.
    let narrowed = send(
        &app,
        operator_get(
            "/instances?fsm=Checkout&path=%24.state.order%20%3D%3D%2042",
            TOKEN,
            Some(&jar),
        ),
    )
    .await;
    assert!(
        narrowed.body.contains("id=\"bulk-narrower\""),
        "{}",
        narrowed.body
    );
    assert!(!narrowed.body.contains("id=\"bulk\""), "{}", narrowed.body);
    db.close().await;
}

/// The overview's "What waits, and why": per queue, the rows that are not running by the
/// reason `explain` gives each (in its order), with how many and the first of each.
#[tokio::test]
async fn the_overview_says_what_waits_and_why_by_reason() {
    let db = TestDb::new().await;
    seed(db.pool()).await;
    // payments: gate `stripe` of K = 2, key `acme` runs 2 and has 1 due row waiting.
    seed_flow_control(db.pool()).await;
    let app = router(db.pool().clone());
    // (rows, first) of one line, or None when the table has no such line.
    let line = |body: &str, queue: &str, reason: &str| -> Option<(String, String)> {
        let at = body.find(&format!("data-queue=\"{queue}\" data-reason=\"{reason}\""))?;
        let row = &body[at..body[at..].find("</tr>").map(|e| at + e).unwrap()];
        let cells: Vec<&str> = row.split("<td").skip(1).collect();
        let text = |cell: &str| -> String {
            let mut out = String::new();
            let mut tag = false;
            for c in cell[cell.find('>').unwrap() + 1..].chars() {
                match c {
                    '<' => tag = true,
                    '>' => tag = false,
                    c if !tag => out.push(c),
                    _ => {}
                }
            }
            out
        };
        Some((text(cells[2]), text(cells[3])))
    };
    let o = get(&app, "/").await.body;
    // The seed's runnable row, due 90 s ago, waits for a worker; its row of Checkout v1,
    // which no live node runs, for a node.
    let (rows, first) = line(&o, "checkout", "runnable").expect(&o);
    assert_eq!(rows, "1", "{o}");
    assert!(first.starts_with("waiting since 1m 3"), "{first}");
    let (rows, _) = line(&o, "checkout", "no_node_for_version").expect(&o);
    assert_eq!(rows, "1", "{o}");
    assert_eq!(line(&o, "payments", "gate_full").expect(&o).0, "1", "{o}");
    let (rows, first) = line(&o, "checkout", "awaiting_signals").expect(&o);
    assert_eq!(rows, "1", "{o}");
    assert!(first.starts_with("waiting since"), "{first}");
    assert!(line(&o, "checkout", "scheduled").is_none(), "{o}");

    // Rows not due yet, each of its kind; a partition key held by a running row; a queue
    // no live node picks.
    sqlx::raw_sql(
        "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, eligible_at)
         VALUES ('Checkout', 2, 'reserve', '{}', 'checkout', now() + interval '1 hour'),
                ('Checkout', 2, 'reserve', '{}', 'checkout', now() + interval '2 hours');
         INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, eligible_at, attempt,
                                   last_error)
         VALUES ('Checkout', 2, 'ship', '{}', 'checkout', now() + interval '30 seconds', 2,
                 'card declined');
         INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, eligible_at,
                                   rate_limit, rate_key, rate_step, rate_weight, rate_paid)
         VALUES ('Checkout', 2, 'ship', '{}', 'checkout', now() + interval '10 minutes',
                 'carrier', 'eu', 'ship', 1, true);
         INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, status, locked_by,
                                   lease_epoch, lease_expires_at, partition_key)
         VALUES ('Checkout', 2, 'ship', '{}', 'checkout', 'executing', 'node-a', 1,
                 now() + interval '30 seconds', 'order:7');
         INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, partition_key)
         VALUES ('Checkout', 2, 'ship', '{}', 'checkout', 'order:7');
         INSERT INTO gd_instances (fsm, fsm_version, step, state, queue)
         VALUES ('Report', 1, 'build', '{}', 'reports');",
    )
    .execute(db.pool())
    .await
    .unwrap();
    let o = get(&app, "/").await.body;
    let (rows, first) = line(&o, "checkout", "scheduled").expect(&o);
    assert_eq!(rows, "2", "{o}");
    assert!(
        first.starts_with("due in 59m") || first.starts_with("due in 1h"),
        "{first}"
    );
    let (rows, first) = line(&o, "checkout", "backoff").expect(&o);
    assert_eq!(rows, "1", "{o}");
    assert!(
        first.starts_with("due in 29") || first.starts_with("due in 30"),
        "{first}"
    );
    assert_eq!(
        line(&o, "checkout", "rate_limited").expect(&o).0,
        "1",
        "{o}"
    );
    assert_eq!(
        line(&o, "checkout", "partition_blocked").expect(&o).0,
        "1",
        "{o}"
    );
    // The held-back rows are not counted as waiting for a worker.
    assert_eq!(line(&o, "checkout", "runnable").expect(&o).0, "1", "{o}");
    // A delayed row of Checkout v1 that has come due: no claim promotes it (none runs
    // v1), so it stays in gd_due; it waits for a node all the same.
    let late: i64 = sqlx::query_scalar(
        "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, eligible_at)
         VALUES ('Checkout', 1, 'reserve', '{}', 'checkout', now() + interval '1 hour')
         RETURNING id",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    sqlx::query("UPDATE gd_instances SET eligible_at = now() - interval '1 minute' WHERE id = $1;")
        .bind(late)
        .execute(db.pool())
        .await
        .unwrap();
    let moved = sqlx::query("UPDATE gd_due SET at = now() - interval '1 minute' WHERE id = $1")
        .bind(late)
        .execute(db.pool())
        .await
        .unwrap()
        .rows_affected();
    assert_eq!(moved, 1, "a delayed plain row waits in gd_due");
    let o = get(&app, "/").await.body;
    assert_eq!(
        line(&o, "checkout", "no_node_for_version").expect(&o).0,
        "2",
        "{o}"
    );
    assert_eq!(line(&o, "checkout", "runnable").expect(&o).0, "1", "{o}");
    assert_eq!(
        line(&o, "reports", "no_node_for_queue").expect(&o).0,
        "1",
        "{o}"
    );
    assert!(line(&o, "reports", "runnable").is_none(), "{o}");

    // A paused queue: every runnable row of it waits for the resume, whatever else holds.
    sqlx::query("INSERT INTO gd_queue_pauses (queue) VALUES ('checkout')")
        .execute(db.pool())
        .await
        .unwrap();
    let o = get(&app, "/").await.body;
    assert_eq!(
        line(&o, "checkout", "queue_paused").expect(&o).0,
        "8",
        "{o}"
    );
    for reason in [
        "scheduled",
        "backoff",
        "rate_limited",
        "partition_blocked",
        "runnable",
    ] {
        assert!(line(&o, "checkout", reason).is_none(), "{reason}: {o}");
    }
    assert!(line(&o, "checkout", "awaiting_signals").is_some(), "{o}");
    db.close().await;
}

/// A JSON path predicate over an instance's state and result finds the rows it holds
/// for; one PostgreSQL cannot read is a 400 that says why.
#[tokio::test]
async fn the_list_filters_by_a_json_path_over_state_and_result() {
    let db = TestDb::new().await;
    let s = seed(db.pool()).await;
    let app = router(db.pool().clone());
    let l = get(&app, "/instances?path=%24.state.order%20%3D%3D%2042").await;
    assert_eq!(l.status, StatusCode::OK, "{}", l.body);
    assert!(
        l.body.contains(&format!("data-id=\"{}\"", s.parked)),
        "{}",
        l.body
    );
    assert_eq!(l.body.matches("<tr data-id=").count(), 1, "{}", l.body);
    let r = get(&app, "/instances?path=%24.result.part%20%3D%3D%201").await;
    assert!(
        r.body.contains(&format!("data-id=\"{}\"", s.child_done)),
        "{}",
        r.body
    );
    let bad = get(&app, "/instances?path=order%20%3D%3D").await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{}", bad.body);
    assert!(bad.body.contains("is not a JSON path"), "{}", bad.body);
    db.close().await;
}

/// Several statuses at once, as the form's checkboxes send them or as a link writes
/// them; the bulk form acts on the same statuses, and on a failed-only list it offers
/// retry first.
#[tokio::test]
async fn the_list_takes_several_statuses_and_the_bulk_form_follows() {
    let db = TestDb::new().await;
    let s = seed(db.pool()).await;
    let app = router_with(
        db.pool().clone(),
        DashboardConfig::new().with_operator_token(TOKEN).unwrap(),
    );
    let want = {
        let mut v = vec![s.failed, s.parked];
        v.sort_unstable_by(|a, b| b.cmp(a));
        v
    };
    for q in [
        "queue=checkout&status=failed&status=awaiting_signal",
        "queue=checkout&status=failed,awaiting_signal",
        "queue=checkout&status=failed%2Cawaiting_signal",
    ] {
        let l = get(&app, &format!("/instances?{q}")).await;
        assert_eq!(l.status, StatusCode::OK, "{q}: {}", l.body);
        assert_eq!(listed_ids(&l.body), want, "{q}");
        assert!(l.body.contains("value=\"failed\" checked"), "{q}");
    }
    let bad = get(&app, "/instances?status=failed,lost").await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);

    let as_operator = |path: &str| operator_get(path, TOKEN, None);
    let both = send(
        &app,
        as_operator("/instances?queue=checkout&status=failed,awaiting_signal"),
    )
    .await;
    assert!(
        both.body
            .contains("name=\"status\" value=\"failed,awaiting_signal\""),
        "{}",
        both.body
    );
    assert!(
        both.body.contains("<option value=\"cancel\" selected>"),
        "{}",
        both.body
    );
    let failed = send(&app, as_operator("/instances?queue=checkout&status=failed")).await;
    assert!(
        failed.body.contains("<option value=\"retry\" selected>"),
        "{}",
        failed.body
    );
    db.close().await;
}

/// Each action on an instance says what it will do before it is done: the confirmation
/// page writes nothing, and its button posts to the action with the page's CSRF token. A
/// read-only dashboard, or a viewer who is not signed in, gets no such page.
#[tokio::test]
async fn actions_are_confirmed_before_they_are_done() {
    let db = TestDb::new().await;
    let s = seed(db.pool()).await;
    let app = router_with(
        db.pool().clone(),
        DashboardConfig::new().with_operator_token(TOKEN).unwrap(),
    );
    let csrf = csrf_of(&app).await;
    let jar = format!("gd_csrf={csrf}");
    let as_operator = |path: String| operator_get(&path, TOKEN, Some(&jar));
    let before = fingerprint(db.pool()).await;
    let c = send(
        &app,
        as_operator(format!("/instances/{}/confirm?action=cancel", s.parent)),
    )
    .await;
    assert_eq!(c.status, StatusCode::OK, "{}", c.body);
    for want in [
        format!("action=\"/instances/{}/cancel\"", s.parent),
        format!("name=\"csrf\" value=\"{csrf}\""),
        "its live children (1)".to_string(),
        "id=\"confirm\"".to_string(),
        format!("href=\"/instances/{}\"", s.parent),
    ] {
        assert!(c.body.contains(&want), "no {want:?} in {}", c.body);
    }
    let r = send(
        &app,
        as_operator(format!(
            "/instances/{}/confirm?action=restart&step=ship",
            s.failed
        )),
    )
    .await;
    assert!(
        r.body.contains("runnable now at step <code>ship</code>"),
        "{}",
        r.body
    );
    assert!(
        r.body.contains("name=\"step\" value=\"ship\""),
        "{}",
        r.body
    );
    let sig = send(
        &app,
        as_operator(format!(
            "/instances/{}/confirm?action=signal&name=paid&payload=%7B%7D",
            s.parked
        )),
    )
    .await;
    assert!(
        sig.body.contains("signal <code>paid</code>"),
        "{}",
        sig.body
    );
    let bad = send(
        &app,
        as_operator(format!("/instances/{}/confirm?action=drop", s.parked)),
    )
    .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        fingerprint(db.pool()).await,
        before,
        "a confirmation page wrote"
    );

    let anonymous = get(
        &app,
        &format!("/instances/{}/confirm?action=cancel", s.parent),
    )
    .await;
    assert_eq!(anonymous.status, StatusCode::FORBIDDEN);
    let read_only = router(db.pool().clone());
    let ro = get(
        &read_only,
        &format!("/instances/{}/confirm?action=cancel", s.parent),
    )
    .await;
    assert_eq!(ro.status, StatusCode::FORBIDDEN);
    db.close().await;
}

/// Per-row selection: an operator ticks rows on the list, previews (nothing written), then
/// acts; each row's answer is its own (a refusal included). A read-only list has no boxes,
/// and bad selections are refused whole.
#[tokio::test]
async fn an_operator_acts_on_the_rows_selected_on_the_list() {
    let db = TestDb::new().await;
    let s = seed(db.pool()).await;
    let app = router_with(
        db.pool().clone(),
        DashboardConfig::new().with_operator_token(TOKEN).unwrap(),
    );
    let csrf = csrf_of(&app).await;
    let jar = format!("gd_csrf={csrf}");
    let act = |form: String| {
        let (app, jar) = (app.clone(), jar.clone());
        async move {
            let mut req = post("/selected", Some(&jar), &form);
            req.headers_mut().insert(
                header::AUTHORIZATION,
                format!("Bearer {TOKEN}").parse().unwrap(),
            );
            send(&app, req).await
        }
    };

    // The list has a box per row, tied to the selection's form, which comes back here.
    let list = send(
        &app,
        operator_get("/instances?queue=checkout", TOKEN, Some(&jar)),
    )
    .await;
    assert!(list.body.contains("id=\"selected\""), "{}", list.body);
    let boxed = format!("name=\"id\" value=\"{}\" form=\"selected\"", s.runnable);
    assert!(list.body.contains(&boxed), "{}", list.body);
    assert!(
        list.body
            .contains("name=\"back\" value=\"/instances?queue=checkout\""),
        "{}",
        list.body
    );
    let read_only = get(&router(db.pool().clone()), "/instances").await.body;
    assert!(!read_only.contains("form=\"selected\""), "{read_only}");

    // Refused whole, nothing written: no row, an id that is not one, an unknown action.
    let before = fingerprint(db.pool()).await;
    for (form, says) in [
        (
            format!("csrf={csrf}&action=cancel"),
            "no instance is selected",
        ),
        (
            format!("csrf={csrf}&action=cancel&id=abc"),
            "is not an instance id",
        ),
        (
            format!("csrf={csrf}&action=delete&id={}", s.runnable),
            "cancel or retry",
        ),
    ] {
        let a = act(form).await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{}", a.body);
        assert!(a.body.contains(says), "{says}: {}", a.body);
    }
    // The preview names them and writes nothing.
    let ids = format!("id={}&id={}", s.runnable, s.parked);
    let preview = act(format!("csrf={csrf}&action=cancel&preview=1&{ids}")).await;
    assert_eq!(preview.status, StatusCode::OK, "{}", preview.body);
    assert!(
        preview.body.contains("2 instance(s) selected"),
        "{}",
        preview.body
    );
    assert!(
        preview.body.contains("id=\"selected-confirm\""),
        "{}",
        preview.body
    );
    assert_eq!(fingerprint(db.pool()).await, before);

    // Confirmed: both cancelled, each said so.
    let done = act(format!("csrf={csrf}&action=cancel&{ids}")).await;
    assert_eq!(done.status, StatusCode::OK, "{}", done.body);
    assert_eq!(
        listed_ids(&done.body),
        [s.runnable, s.parked],
        "{}",
        done.body
    );
    assert_eq!(
        done.body.matches("cancelled (1 failed at once)").count(),
        2,
        "{}",
        done.body
    );
    for id in [s.runnable, s.parked] {
        assert_eq!(status_of(db.pool(), id).await.0, "failed");
    }
    // Retry of a failed row and of a finished one: the first is retried, the second
    // refused on its own line.
    let done = act(format!(
        "csrf={csrf}&action=retry&id={}&id={}",
        s.runnable, s.child_done
    ))
    .await;
    assert_eq!(done.status, StatusCode::OK, "{}", done.body);
    assert!(done.body.contains("retried"), "{}", done.body);
    assert!(done.body.contains("refused:"), "{}", done.body);
    assert_eq!(status_of(db.pool(), s.runnable).await.0, "runnable");
    assert_eq!(status_of(db.pool(), s.child_done).await.0, "done");

    // A read-only dashboard refuses it and changes nothing.
    let before = fingerprint(db.pool()).await;
    let ro = send(
        &router(db.pool().clone()),
        post(
            "/selected",
            None,
            &format!("action=cancel&id={}", s.executing),
        ),
    )
    .await;
    assert_eq!(ro.status, StatusCode::FORBIDDEN, "{}", ro.body);
    assert_eq!(fingerprint(db.pool()).await, before);
    db.close().await;
}

/// The charts over a window: the last 30 minutes from the finished rows (every one took
/// 5 s), longer windows from the collector's rollup (`gd_minutes`, written here as the
/// collector would), bucketed; an unknown window is a 400 that says which exist.
#[tokio::test]
async fn the_charts_show_throughput_and_latency_over_the_window_picked() {
    let db = TestDb::new().await;
    seed(db.pool()).await;
    let app = router(db.pool().clone());
    let o = get(&app, "/").await.body;
    assert!(o.contains("id=\"window\""), "{o}");
    assert!(o.contains("<svg id=\"latency\" data-window=\"30m\""), "{o}");
    assert!(o.contains("median 5.0s, 95% within 5.0s"), "{o}");

    // A week of rollup: 100 done an hour, taking 40–60 ms (slot 7: [32, 64) ms), and 10
    // failed an hour, taking 3–4 s (slot 13: [2048, 4096) ms); one minute an hour.
    sqlx::raw_sql(
        "INSERT INTO gd_minutes (minute, queue, done, failed, took_ms)
         SELECT date_trunc('hour', now()) - h * interval '1 hour', '*', 100, 10,
                array_fill(0::int8, ARRAY[6]) || ARRAY[100::int8] || array_fill(0::int8, ARRAY[5])
                || ARRAY[10::int8] || array_fill(0::int8, ARRAY[19])
           FROM generate_series(1, 7 * 24) h",
    )
    .execute(db.pool())
    .await
    .unwrap();
    let week = get(&app, "/?window=7d").await;
    assert_eq!(week.status, StatusCode::OK, "{}", week.body);
    let w = &week.body;
    assert!(
        w.contains("<svg id=\"throughput\" data-window=\"7d\""),
        "{w}"
    );
    assert_eq!(
        w.matches("class=\"bar done\"").count(),
        42,
        "a bar per 4 hours"
    );
    // A whole 4-hour bucket in the middle of the week: four rolled minutes.
    assert!(w.contains(": 400 done, 40 failed"), "{w}");
    // Its median is under 64 ms; its 95th percentile in the failures' slot.
    assert!(w.contains("median 64ms, 95% within 4.1s"), "{w}");
    assert!(w.contains("per-minute rollup"), "{w}");
    let day = get(&app, "/?window=24h").await.body;
    assert_eq!(
        day.matches("class=\"bar done\"").count(),
        48,
        "a bar per 30 minutes"
    );
    assert!(day.contains(": 100 done, 10 failed"), "{day}");

    // A live page's window links keep it live.
    let live = get(&app, "/?live=30").await.body;
    assert!(live.contains("href=\"/?window=7d&amp;live=30\""), "{live}");

    let bad = get(&app, "/?window=1y").await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{}", bad.body);
    assert!(bad.body.contains("30m, 6h, 24h or 7d"), "{}", bad.body);
    db.close().await;
}

/// No page statement reads `gd_instances` whole: with sequential scans turned off, each
/// still finds an index (or samples pages). A statement whose condition no longer implies
/// a partial index's predicate has nothing but the table to scan, whatever the planner is
/// told, so it shows here on a small table as it would on a million rows.
#[tokio::test]
async fn every_page_statement_reads_the_instances_through_an_index() {
    let db = TestDb::new().await;
    let s = seed(db.pool()).await;
    seed_flow_control(db.pool()).await;
    let no_seqscan = (*db.pool().connect_options())
        .clone()
        .options([("enable_seqscan", "off")]);
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_with(no_seqscan)
        .await
        .unwrap();
    for (name, plan) in gen_durable_ops::dashboard::plans(&pool, s.parent)
        .await
        .unwrap()
    {
        assert!(
            !plan.contains("Seq Scan on gd_instances"),
            "{name} scans the table:\n{plan}"
        );
    }
    pool.close().await;
    db.close().await;
}
