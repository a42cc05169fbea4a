//! The dashboard in a real browser: headless Chromium driven through chromedriver
//! (WebDriver, `fantoccini`). Each page is loaded and checked, the children tree is
//! followed link by link, the chart's SVG is rendered, an action is refused without the
//! operator token (the row unchanged) and done with it (the row cancelled). Each page is
//! screenshot (a PNG must come back); with `GD_SCREENSHOTS=1` the PNGs are saved as
//! docs/dashboard/<page>.png, which the README shows: overview, instances, instance (a
//! parked one, as an operator sees it), instance-timeline (its history), instance-tree (a
//! parent), fsms, limits (gates and buckets).
//!
//! Needs `chromedriver` and `chromium` (Debian: `apt-get install chromium chromium-driver`;
//! `.ci/run` installs them and sets `GD_REQUIRE_BROWSER=1`). Without them the test says so
//! and passes, unless `GD_REQUIRE_BROWSER=1`.

mod dashboard_support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use dashboard_support::{fingerprint, seed, seed_flow_control, status_of, TOKEN};
use fantoccini::{Client, ClientBuilder, Locator};
use gen_durable_ops::dashboard::{router_with, DashboardConfig};
use gen_durable_testkit::TestDb;
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::json;

/// How long chromedriver and each page may take.
const DEADLINE: Duration = Duration::from_secs(30);

/// A chromedriver this test started, stopped (by its handle) when dropped.
struct Driver {
    child: Child,
    url: String,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn chromedriver_path() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("chromedriver"))
            .find(|p| p.is_file())
    });
    on_path.or_else(|| {
        let p = PathBuf::from("/usr/bin/chromedriver");
        p.is_file().then_some(p)
    })
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts chromedriver on a free port and waits (polling, within [`DEADLINE`]) until it
/// accepts connections.
async fn start_driver(path: &Path) -> Driver {
    let port = free_port();
    let child = Command::new(path)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromedriver starts");
    let driver = Driver {
        child,
        url: format!("http://127.0.0.1:{port}"),
    };
    let until = Instant::now() + DEADLINE;
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(
            Instant::now() < until,
            "chromedriver did not listen on {port}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    driver
}

async fn browser(driver: &Driver) -> Client {
    browser_with(driver, &[]).await
}

/// A Chromium session with `extra` command-line switches.
async fn browser_with(driver: &Driver, extra: &[&str]) -> Client {
    let mut caps = serde_json::Map::new();
    let mut args = vec![
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
        "--hide-scrollbars",
    ];
    args.extend_from_slice(extra);
    let mut chrome = json!({ "args": args });
    if Path::new("/usr/bin/chromium").is_file() {
        chrome["binary"] = json!("/usr/bin/chromium");
    }
    caps.insert("goog:chromeOptions".into(), chrome);
    ClientBuilder::new(HttpConnector::new())
        .capabilities(caps)
        .connect(&driver.url)
        .await
        .expect("a Chromium session")
}

/// chromedriver's path; `None` (the test skips) when there is none, unless
/// `GD_REQUIRE_BROWSER=1` (as in CI), which makes that a failure.
fn chromedriver_or_skip() -> Option<PathBuf> {
    let path = chromedriver_path();
    if path.is_none() {
        assert!(
            std::env::var("GD_REQUIRE_BROWSER").as_deref() != Ok("1"),
            "GD_REQUIRE_BROWSER=1 but no chromedriver on PATH or in /usr/bin"
        );
        eprintln!("skipped: no chromedriver (apt-get install chromium chromium-driver)");
    }
    path
}

/// Serves an operator dashboard on a free port; returns its base URL.
async fn serve(pool: sqlx::PgPool) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = router_with(
        pool,
        DashboardConfig::new().with_operator_token(TOKEN).unwrap(),
    );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

async fn screenshot(c: &Client, page: &str) {
    let png = c.screenshot().await.unwrap();
    assert!(png.starts_with(b"\x89PNG"), "{page}: not a PNG");
    save(page, png);
}

/// With `GD_SCREENSHOTS=1`, saves `png` as docs/dashboard/<page>.png.
fn save(page: &str, png: Vec<u8>) {
    if std::env::var_os("GD_SCREENSHOTS").is_none() {
        return;
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/dashboard");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(format!("{page}.png")), png).unwrap();
}

async fn text(c: &Client, css: &str) -> String {
    c.wait()
        .at_most(DEADLINE)
        .for_element(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("no {css}: {e}"))
        .text()
        .await
        .unwrap()
}

/// Clicks `css` and waits until the browser is on a page whose path is `path`.
async fn click_to(c: &Client, css: &str, path: &str) {
    c.find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("no {css}: {e}"))
        .click()
        .await
        .unwrap();
    let want = path.to_string();
    wait_for_url(c, move |u| {
        u.split_once("://")
            .and_then(|(_, rest)| rest.find('/').map(|i| &rest[i..]))
            .is_some_and(|p| p.split('?').next() == Some(want.as_str()))
    })
    .await;
}

/// Waits (polling, within [`DEADLINE`]) until the browser is on a URL `ok` accepts: a
/// click that navigates may return before the new page is there.
async fn wait_for_url(c: &Client, ok: impl Fn(&str) -> bool) {
    let until = Instant::now() + DEADLINE;
    loop {
        let url = c.current_url().await.unwrap();
        let ready = c
            .execute("return document.readyState", vec![])
            .await
            .unwrap();
        if ok(url.as_str()) && ready == json!("complete") {
            return;
        }
        assert!(Instant::now() < until, "still on {url}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_in_a_real_browser() {
    let Some(path) = chromedriver_or_skip() else {
        return;
    };
    let db = TestDb::new().await;
    let s = seed(db.pool()).await;
    let base = serve(db.pool().clone()).await;
    let driver = start_driver(&path).await;
    let c = browser(&driver).await;

    // Overview: counts per queue, the paused queue, the node, the chart.
    c.goto(&base).await.unwrap();
    let queues = text(&c, "#queues").await;
    assert!(
        queues.contains("checkout") && queues.contains("fanout"),
        "{queues}"
    );
    assert!(text(&c, "#pauses").await.contains("smtp maintenance"));
    assert!(text(&c, "#nodes").await.contains("node-a"));
    let bars = c
        .find_all(Locator::Css("svg#throughput rect.bar.done"))
        .await
        .unwrap();
    assert_eq!(bars.len(), 30, "a bar per minute");
    let failed_bars = c
        .find_all(Locator::Css("svg#throughput rect.bar.failed"))
        .await
        .unwrap();
    assert!(!failed_bars.is_empty(), "the failed rows show");
    // Rendered, not only present: the browser laid the chart out at its size.
    let width = c
        .execute(
            "return document.querySelector('svg#throughput').getBoundingClientRect().width",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(width.as_f64(), Some(600.0));
    // What waits, and why: the ready checkout rows wait for a worker, the parked ones
    // for their signals.
    assert!(
        text(&c, "#waiting tr[data-queue=checkout][data-reason=runnable]")
            .await
            .contains("ready: waiting for a worker")
    );
    assert!(text(
        &c,
        "#waiting tr[data-queue=checkout][data-reason=awaiting_signals]"
    )
    .await
    .contains("awaiting signals"));
    screenshot(&c, "overview").await;
    let charts = c.find(Locator::Id("charts")).await.unwrap();
    c.execute(
        "arguments[0].scrollIntoView()",
        vec![serde_json::to_value(&charts).unwrap()],
    )
    .await
    .unwrap();
    let png = charts.screenshot().await.unwrap();
    assert!(png.starts_with(b"\x89PNG"), "charts: not a PNG");
    save("overview-charts", png);
    // The charts' window, picked by its link: a day in half hours.
    c.find(Locator::Css("#window a[data-window='24h']"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_for_url(&c, |u| u.ends_with("/?window=24h")).await;
    let bars = c
        .find_all(Locator::Css(
            "svg#throughput[data-window='24h'] rect.bar.done",
        ))
        .await
        .unwrap();
    assert_eq!(bars.len(), 48, "a bar per half hour");
    assert!(c.find(Locator::Css("svg#latency")).await.is_ok());

    // Instances: the list, then the filter form.
    c.goto(&format!("{base}/instances")).await.unwrap();
    let list = text(&c, "#instances").await;
    for id in [s.runnable, s.parked, s.failed, s.grandchild] {
        assert!(
            c.find(Locator::Css(&format!("#instances tr[data-id='{id}']")))
                .await
                .is_ok(),
            "{id} not listed: {list}"
        );
    }
    screenshot(&c, "instances").await;
    c.find(Locator::Css("input[name=status][value=failed]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    c.find(Locator::Css("input[name=queue]"))
        .await
        .unwrap()
        .send_keys("checkout")
        .await
        .unwrap();
    c.find(Locator::Css("form.filters button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_for_url(&c, |u| u.contains("status=failed")).await;
    let rows = c
        .find_all(Locator::Css("#instances tr[data-id]"))
        .await
        .unwrap();
    assert_eq!(rows.len(), 1, "only the failed checkout row");
    assert_eq!(
        rows[0].attr("data-id").await.unwrap(),
        Some(s.failed.to_string())
    );

    // A parked instance with its inbox.
    c.goto(&format!("{base}/instances/{}", s.parked))
        .await
        .unwrap();
    assert!(text(&c, "[data-field=awaits]")
        .await
        .contains("payment_confirmed"));
    assert!(!text(&c, "[data-field=await_deadline]").await.is_empty());
    assert!(text(&c, "#inbox").await.contains("address_changed"));

    // The parent's tree, followed link by link, and back up by the parent link.
    c.goto(&format!("{base}/instances/{}", s.parent))
        .await
        .unwrap();
    let tree = text(&c, "#children").await;
    assert!(
        tree.contains("done") && tree.contains("awaiting_children"),
        "{tree}"
    );
    screenshot(&c, "instance-tree").await;
    let child_link = |id: i64| format!("li[data-id='{id}'] > a.child");
    click_to(
        &c,
        &child_link(s.child_mid),
        &format!("/instances/{}", s.child_mid),
    )
    .await;
    click_to(
        &c,
        &child_link(s.grandchild),
        &format!("/instances/{}", s.grandchild),
    )
    .await;
    assert!(text(&c, "#children").await.contains("None"));
    click_to(&c, "#parent", &format!("/instances/{}", s.child_mid)).await;
    click_to(&c, "#parent", &format!("/instances/{}", s.parent)).await;

    // FSMs: versions nodes run against versions in rows.
    c.goto(&format!("{base}/fsms")).await.unwrap();
    let fsms = text(&c, "#fsms").await;
    assert!(
        fsms.contains("Checkout") && fsms.contains("node-a"),
        "{fsms}"
    );
    assert!(
        text(&c, "tr[data-fsm=Checkout][data-version='1']")
            .await
            .contains("no live node runs"),
        "{fsms}"
    );
    screenshot(&c, "fsms").await;

    // Flow control, reached by its link: the gates and the buckets (seeded only now, so
    // the pages above show the shared seed).
    seed_flow_control(db.pool()).await;
    click_to(&c, "header a[href='/limits']", "/limits").await;
    let gates = text(&c, "#gates").await;
    assert!(
        gates.contains("stripe") && gates.contains("smtp"),
        "{gates}"
    );
    let acme = "#gates tr[data-gate=stripe][data-key=acme][data-full=true]";
    assert_eq!(text(&c, &format!("{acme} [data-field=running]")).await, "2");
    assert_eq!(text(&c, &format!("{acme} [data-field=waiting]")).await, "1");
    assert!(text(&c, acme).await.contains("full"));
    let eu = "#rate-limits tr[data-limit=carrier][data-key=eu][data-reserved=true]";
    assert_eq!(text(&c, &format!("{eu} [data-field=tokens]")).await, "-3");
    assert!(text(&c, eu).await.contains("reserved by waiting rows"));
    // Rendered, not only present: both tables laid out with rows.
    for table in ["#gates", "#rate-limits"] {
        let height = c
            .execute(
                "return document.querySelector(arguments[0]).getBoundingClientRect().height",
                vec![json!(table)],
            )
            .await
            .unwrap();
        assert!(height.as_f64().unwrap_or(0.0) > 40.0, "{table}: {height}");
    }
    screenshot(&c, "limits").await;

    // Not signed in: no action form, and a POST from the page is refused.
    let before = fingerprint(db.pool()).await;
    c.goto(&format!("{base}/instances/{}", s.runnable))
        .await
        .unwrap();
    assert!(
        c.find(Locator::Id("cancel")).await.is_err(),
        "a cancel button before signing in"
    );
    let refused = c
        .execute_async(
            "const done = arguments[arguments.length - 1];
             fetch(arguments[0], { method: 'POST', body: new URLSearchParams({ csrf: 'x' }) })
               .then(r => done(r.status), e => done(String(e)));",
            vec![json!(format!("/instances/{}/cancel", s.runnable))],
        )
        .await
        .unwrap();
    assert_eq!(refused, json!(403));
    assert_eq!(
        fingerprint(db.pool()).await,
        before,
        "a refused cancel changed a row"
    );

    // Signed in with the token: cancel from the instance page.
    c.goto(&format!("{base}/login")).await.unwrap();
    c.find(Locator::Id("token"))
        .await
        .unwrap()
        .send_keys(TOKEN)
        .await
        .unwrap();
    click_to(&c, "#sign-in", "/").await;
    // The parked instance as an operator sees it: its inbox and the action forms.
    c.goto(&format!("{base}/instances/{}", s.parked))
        .await
        .unwrap();
    assert!(c.find(Locator::Id("signal")).await.is_ok());
    screenshot(&c, "instance").await;
    // Its timeline: a bar per entry, laid out on one axis (a later entry further right),
    // the await's wait running on to now; an entry opens to its state and, for an
    // operator, the forms that start again from it.
    let bars = c.find_all(Locator::Css("#timeline .tl")).await.unwrap();
    assert_eq!(bars.len(), 5);
    let left = |css: &'static str| {
        let c = c.clone();
        async move {
            c.execute(
                "return document.querySelector(arguments[0]).getBoundingClientRect().left",
                vec![json!(css)],
            )
            .await
            .unwrap()
            .as_f64()
            .unwrap()
        }
    };
    let (first, last) = (
        left("#timeline .tl:first-of-type .tl-bar").await,
        left("#timeline .tl:last-of-type .tl-bar").await,
    );
    assert!(first < last, "bars on a time axis: {first} then {last}");
    assert!(c.find(Locator::Css("#timeline .tl-wait")).await.is_ok());
    let timeline = c.find(Locator::Id("timeline")).await.unwrap();
    c.execute(
        "arguments[0].scrollIntoView()",
        vec![serde_json::to_value(&timeline).unwrap()],
    )
    .await
    .unwrap();
    let png = timeline.screenshot().await.unwrap();
    assert!(png.starts_with(b"\x89PNG"), "timeline: not a PNG");
    save("instance-timeline", png);
    c.find(Locator::Css("#timeline .tl:first-of-type summary"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    assert!(text(&c, "#timeline .tl:first-of-type .tl-state")
        .await
        .contains("\"order\": 42"));
    assert!(c
        .find(Locator::Css("#timeline .tl:first-of-type button.fork"))
        .await
        .is_ok());
    c.goto(&format!("{base}/instances/{}", s.runnable))
        .await
        .unwrap();
    // An action says what it will do first; nothing changes until it is confirmed.
    click_to(&c, "#cancel", &format!("/instances/{}/confirm", s.runnable)).await;
    assert!(text(&c, "#confirm-what")
        .await
        .contains("fails with \"cancelled\""));
    assert_eq!(status_of(db.pool(), s.runnable).await.0, "runnable");
    click_to(&c, "#confirm", &format!("/instances/{}", s.runnable)).await;
    assert!(text(&c, "#notice").await.starts_with("Cancelled"));
    assert_eq!(
        status_of(db.pool(), s.runnable).await,
        ("failed".into(), Some("cancelled".into()))
    );
    assert!(text(&c, "[data-field=last_error]")
        .await
        .contains("cancelled"));

    // Rows ticked on the list: previewed (nothing written), then cancelled, each said so.
    c.goto(&format!("{base}/instances?queue=checkout"))
        .await
        .unwrap();
    for id in [s.parked, s.old_version] {
        c.find(Locator::Css(&format!(
            "#instances tr[data-id='{id}'] input[name=id]"
        )))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    }
    screenshot(&c, "instances-selected").await;
    click_to(&c, "#selected-preview", "/selected").await;
    assert!(text(&c, "#selected-report")
        .await
        .contains("2 instance(s) selected"));
    assert_eq!(status_of(db.pool(), s.parked).await.0, "awaiting_signal");
    click_to(&c, "#selected-confirm", "/selected").await;
    for id in [s.parked, s.old_version] {
        assert!(text(&c, &format!("#selected tr[data-id='{id}']"))
            .await
            .contains("cancelled"));
        assert_eq!(status_of(db.pool(), id).await.0, "failed");
    }

    c.close().await.unwrap();
    drop(driver);
    db.close().await;
}

/// The page's own background, as the browser computed it.
async fn background(c: &Client) -> String {
    c.execute(
        "return getComputedStyle(document.body).backgroundColor",
        vec![],
    )
    .await
    .unwrap()
    .as_str()
    .unwrap()
    .to_string()
}

/// Live and legible: a page reloads itself while "Live" is on, and stops when it is
/// turned off; the colors follow the system's dark mode; an unknown page is the
/// dashboard's own error page, with the way back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_reload_dark_mode_and_error_pages_in_a_real_browser() {
    let Some(path) = chromedriver_or_skip() else {
        return;
    };
    let db = TestDb::new().await;
    let s = seed(db.pool()).await;
    let base = serve(db.pool().clone()).await;
    let driver = start_driver(&path).await;
    let c = browser(&driver).await;

    // Live: the header's toggle turns reloading on (the filters kept); the page then
    // reloads by itself, which a new document's time origin shows.
    c.goto(&format!("{base}/instances?status=failed"))
        .await
        .unwrap();
    assert!(text(&c, "#live").await.contains("off"));
    click_to(&c, "#live", "/instances").await;
    let url = c.current_url().await.unwrap();
    assert_eq!(url.query(), Some("status=failed&live=10"));
    c.goto(&format!("{base}/instances?status=failed&live=2"))
        .await
        .unwrap();
    let origin = |c: &Client| {
        let c = c.clone();
        async move {
            c.execute("return performance.timeOrigin", vec![])
                .await
                .unwrap()
                .as_f64()
                .unwrap()
        }
    };
    let first = origin(&c).await;
    let until = Instant::now() + Duration::from_secs(15);
    loop {
        if origin(&c).await != first {
            break;
        }
        assert!(Instant::now() < until, "the live page never reloaded");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(text(&c, "#live").await.contains("every 2 s"));
    click_to(&c, "#live", "/instances").await;
    assert_eq!(
        c.current_url().await.unwrap().query(),
        Some("status=failed")
    );
    assert!(
        c.find(Locator::Css("meta[http-equiv='refresh']"))
            .await
            .is_err(),
        "still reloading after the toggle"
    );
    // The list's times read relative, the time itself on hover.
    let when = c
        .find(Locator::Css("#instances time"))
        .await
        .expect("a relative time");
    assert!(when.text().await.unwrap().ends_with(" ago"));
    assert!(when.attr("title").await.unwrap().unwrap().ends_with("UTC"));

    // Finding an instance by its id, from the list's form; its children from its page's
    // filter, the FSM typed in another case.
    c.goto(&format!("{base}/instances")).await.unwrap();
    c.find(Locator::Css("input[name='id']"))
        .await
        .unwrap()
        .send_keys(&s.parent.to_string())
        .await
        .unwrap();
    click_to(&c, "#go", &format!("/instances/{}", s.parent)).await;
    c.goto(&format!("{base}/instances?parent={}&fsm=fanout", s.parent))
        .await
        .unwrap();
    let rows = c
        .find_all(Locator::Css("#instances tr[data-id]"))
        .await
        .unwrap();
    assert_eq!(rows.len(), 2, "the parent's two children");

    // An unknown page: the dashboard's page, saying so, with the way back.
    c.goto(&format!("{base}/no/such/page")).await.unwrap();
    assert!(text(&c, "#error")
        .await
        .contains("no page at /no/such/page"));
    click_to(&c, "main a[href='/']", "/").await;
    assert_eq!(
        background(&c).await,
        "rgb(246, 247, 249)",
        "light by default"
    );
    c.close().await.unwrap();

    // Dark mode, as the system asks for it.
    let dark = browser_with(
        &driver,
        &[
            "--force-dark-mode",
            "--blink-settings=preferredColorScheme=0",
        ],
    )
    .await;
    dark.goto(&base).await.unwrap();
    let prefers = dark
        .execute(
            "return matchMedia('(prefers-color-scheme: dark)').matches",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(prefers, json!(true), "the session does not ask for dark");
    assert_eq!(background(&dark).await, "rgb(20, 24, 29)");
    screenshot(&dark, "overview-dark").await;
    dark.close().await.unwrap();
    db.close().await;
}
