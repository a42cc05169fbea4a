//! `gen_durable dashboard`: it serves the pages read-only, refuses actions, reads its
//! operator token from the variable `--auth-token-env` names (refusing a short one), and
//! marks its cookies `Secure` with `--secure-cookies`.

mod cli_support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};

use cli_support::{gd, gd_with_env, url_of};
use gen_durable_testkit::TestDb;

/// An operator token long enough (32 bytes or more).
const TOKEN: &str = "cli-test-operator-token-0123456789abcdef";

/// A dashboard process this test started, killed (by its handle) when dropped.
struct Served {
    child: Child,
    addr: String,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `gen_durable dashboard --listen 127.0.0.1:0 EXTRA` on `db` and reads the
/// address it prints once it listens.
fn serve(db: &TestDb, extra: &[&str], env: &[(&str, &str)]) -> Served {
    let mut child = Command::new(env!("CARGO_BIN_EXE_gen_durable"))
        .args([
            "--database-url",
            &url_of(db.name()),
            "dashboard",
            "--listen",
            "127.0.0.1:0",
        ])
        .args(extra)
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the gen_durable binary");
    let mut line = String::new();
    BufReader::new(child.stderr.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();
    Served { child, addr }
}

/// One HTTP/1.0 request; the whole answer.
fn http(addr: &str, request: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[tokio::test]
async fn it_serves_the_pages_and_refuses_actions_when_read_only() {
    let db = TestDb::new().await;
    let d = serve(&db, &[], &[]);
    let page = http(&d.addr, "GET / HTTP/1.0\r\n\r\n");
    assert!(page.starts_with("HTTP/1.0 200"), "{page}");
    assert!(
        page.contains("Overview") && page.contains("read-only"),
        "{page}"
    );
    let refused = http(
        &d.addr,
        "POST /instances/1/cancel HTTP/1.0\r\nContent-Length: 0\r\n\r\n",
    );
    assert!(refused.starts_with("HTTP/1.0 403"), "{refused}");
    drop(d);
    db.close().await;
}

#[tokio::test]
async fn the_token_comes_from_the_named_variable() {
    let db = TestDb::new().await;
    let d = serve(
        &db,
        &["--auth-token-env", "GD_TEST_TOKEN"],
        &[("GD_TEST_TOKEN", TOKEN)],
    );
    let page = http(&d.addr, "GET / HTTP/1.0\r\n\r\n");
    assert!(page.contains("Sign in"), "{page}");
    // The bearer token acts (here: on an instance that does not exist).
    let missing = http(
        &d.addr,
        &format!(
            "POST /instances/1/cancel HTTP/1.0\r\nAuthorization: Bearer {TOKEN}\r\n\
             Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 0\r\n\r\n"
        ),
    );
    assert!(missing.starts_with("HTTP/1.0 404"), "{missing}");
    drop(d);
    // An unset variable is a usage error, before connecting.
    let r = gd(&["dashboard", "--auth-token-env", "GD_TEST_UNSET_TOKEN"]).expect(2);
    assert!(r.stderr.contains("GD_TEST_UNSET_TOKEN"), "{}", r.stderr);
    db.close().await;
}

/// A token shorter than 32 bytes is a usage error at start-up, before connecting, that
/// says the minimum and how to make a good one.
#[test]
fn r4_session_cli_refuses_a_short_token() {
    let stderr = gd_with_env(
        &["dashboard", "--auth-token-env", "GD_TEST_SHORT_TOKEN"],
        &[("GD_TEST_SHORT_TOKEN", "s3cret-but-only-31-bytes-long!!")],
    )
    .expect(2)
    .stderr;
    assert!(
        stderr.contains("GD_TEST_SHORT_TOKEN")
            && stderr.contains("31 bytes")
            && stderr.contains("at least 32")
            && stderr.contains("openssl rand -hex 32"),
        "{stderr}"
    );
}

/// `--secure-cookies` (a dashboard served over TLS, or behind a TLS proxy) marks the
/// cookies `Secure`, so a browser never sends them over plain HTTP.
#[tokio::test]
async fn r4_session_cli_secure_cookies_flag_marks_the_cookies_secure() {
    let db = TestDb::new().await;
    let d = serve(
        &db,
        &["--auth-token-env", "GD_TEST_TOKEN", "--secure-cookies"],
        &[("GD_TEST_TOKEN", TOKEN)],
    );
    let page = http(&d.addr, "GET / HTTP/1.0\r\n\r\n");
    let csrf = page
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("set-cookie: gd_csrf="))
        .unwrap_or_else(|| panic!("no CSRF cookie in {page}"));
    assert!(csrf.contains("; Secure"), "{csrf}");
    drop(d);
    db.close().await;
}
