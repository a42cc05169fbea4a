//! `Pooler::Transaction`: an engine and a client whose every statement can go through a
//! transaction-mode pooler. The server logs every statement of the test's database, and
//! the log shows what a pooler would break on: no named (prepared and cached) statement,
//! no session `SET`, no advisory lock, no temporary table, no LISTEN.
//!
//! With `DATABASE_URL` on a PgBouncer in transaction mode (`.ci/run` starts one with
//! `scripts/pgbouncer.sh`; `DATABASE_DIRECT_URL` on the server, `DATABASE_POOLER=
//! transaction`), the same workload runs through it.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::Count;
use gen_durable::{
    Child, Client, Engine, Key, Pooler, QueueConfig, Registry, Settled, Step, WakeListener,
};
use gen_durable_testkit::TestDb;
use serde_json::json;

test_fsm!(Parent, state = Count, queue = "p", version = 1, {
    Spawn => "spawn" |_ctx| {
        let kids = (0..3).map(|i| Child::new::<Leaf>(Count { n: i, ..Default::default() })).collect();
        Ok(Step::schedule_children(kids, Parent::Park))
    },
    Park => "park" |_ctx| { Ok(Step::await_signal(["go"], Parent::Finish)) },
    Finish => "finish" |ctx| { Ok(Step::done(json!({ "children": ctx.children().len() }))) },
});

test_fsm!(Leaf, state = Count, queue = "p", version = 1, {
    Run => "run" |ctx| {
        if ctx.state.n < 0 { return Err(gen_durable::StepError::new("negative")); }
        Ok(Step::done(json!(ctx.state.n)))
    },
});

fn registry() -> Registry {
    let mut r = Registry::new();
    r.register::<Parent>();
    r.register::<Leaf>();
    r
}

/// The server's log file as `pg_ctlcluster` writes it (Debian), for the running server.
async fn server_log(db: &TestDb) -> PathBuf {
    let version: String = sqlx::query_scalar("SELECT current_setting('server_version_num')")
        .fetch_one(db.direct())
        .await
        .unwrap();
    let major = version.parse::<u32>().unwrap() / 10_000;
    let path = PathBuf::from(format!("/var/log/postgresql/postgresql-{major}-main.log"));
    assert!(
        path.exists(),
        "this test reads the server's statement log at {} (a Debian cluster started by pg_ctlcluster)",
        path.display()
    );
    path
}

#[tokio::test]
async fn a_pooled_engine_and_client_use_no_session_state() {
    let db = TestDb::new().await;
    let log = server_log(&db).await;
    let from = std::fs::metadata(&log).unwrap().len();
    // Every statement of this database from now on, from any session it opens.
    sqlx::query(&format!(
        "ALTER DATABASE {} SET log_statement = 'all'",
        db.name()
    ))
    .execute(db.direct())
    .await
    .unwrap();
    // A pool opened after the setting (a pooler's server connections are opened on use).
    let pool = db.new_pool(6).await;

    let gd = Client::new(pool.clone())
        .with_pooler(Pooler::Transaction)
        .with_registry(registry());
    let engine = Engine::builder(pool.clone())
        .with_pooler(Pooler::Transaction)
        .with_listener(WakeListener::Off)
        .with_registry(registry())
        .queue_with(
            "p",
            QueueConfig::new(4).with_poll_interval(Duration::from_millis(10)),
        )
        .start()
        .await
        .unwrap();

    // Inserts (grouped, keyed, batch), children, an await, a signal by key, a wait, a
    // failure, a retry and a cancel.
    let parent = gd
        .insert::<Parent>(Count::default())
        .correlation_key("order:1")
        .await
        .unwrap();
    let loose = gd.insert::<Leaf>(Count::default()).await.unwrap();
    let batch = gd
        .insert_all::<Leaf>(vec![
            gen_durable::Entry::new(Count::default()),
            gen_durable::Entry::new(Count::default()),
        ])
        .await
        .unwrap();
    let failing = gd
        .insert::<Leaf>(Count {
            n: -1,
            ..Default::default()
        })
        .await
        .unwrap();
    // Stored in the inbox whether the parent still awaits its children or already awaits it.
    gd.signal(Key("order:1"), "go", json!({})).await.unwrap();
    let done = gd
        .wait(Key("order:1"))
        .until_terminal()
        .timeout(Duration::from_secs(20))
        .await
        .unwrap();
    assert_eq!(done, Settled::Done(json!({ "children": 3 })));
    assert_eq!(gd.wait(parent).await.unwrap(), done);
    for id in [loose].into_iter().chain(batch) {
        let s = gd.wait(id).timeout(Duration::from_secs(20)).await.unwrap();
        assert!(matches!(s, Settled::Done(_)), "{id}: {s:?}");
    }
    let failed = gd
        .wait(failing)
        .timeout(Duration::from_secs(20))
        .await
        .unwrap();
    assert!(matches!(failed, Settled::Failed(_)), "{failed:?}");
    gd.retry(failing).await.unwrap();
    // The engine may run the retried step (it fails again) before the cancel comes: the
    // cancel's statement runs either way, and refuses a finished row.
    match gd.cancel(failing).await {
        Ok(_) | Err(gen_durable::Error::Finished { .. }) => {}
        Err(e) => panic!("cancel after retry: {e}"),
    }
    let later = gd
        .insert::<Leaf>(Count::default())
        .schedule_in(Duration::from_secs(3600))
        .await
        .unwrap();
    gd.cancel(later).await.unwrap();
    engine.shutdown(Duration::from_secs(10)).await;
    gd.flush().await;
    pool.close().await;

    let text = std::fs::read(&log).unwrap();
    let text = String::from_utf8_lossy(&text[from as usize..]);
    let ours: Vec<&str> = text
        .lines()
        .filter(|l| l.contains(&format!("@{} ", db.name())))
        .collect();
    let statements: Vec<&str> = ours
        .iter()
        .filter(|l| l.contains("LOG:  statement: ") || l.contains("LOG:  execute "))
        .copied()
        .collect();
    assert!(
        statements.iter().any(|l| l.contains("gd:claim")),
        "the log holds this database's statements (claims included): {} lines of it",
        ours.len()
    );
    let forbidden = [
        ("a named (cached) statement", "LOG:  execute sqlx_"),
        ("an advisory lock", "advisory"),
        ("a LISTEN", "LISTEN "),
        ("a temporary table", "TEMP"),
        ("a session setting", "statement: SET "),
        ("a prepared statement by SQL", "PREPARE "),
    ];
    // PgBouncer's own parameter tracking: it gives each server connection it lends the
    // client's startup parameters (sqlx sends TimeZone and the like).
    let tracked = [
        "TimeZone",
        "DateStyle",
        "client_encoding",
        "standard_conforming_strings",
        "application_name",
    ]
    .map(|p| format!("statement: SET {p}="));
    for (what, needle) in forbidden {
        let hits: Vec<&&str> = statements
            .iter()
            .filter(|l| l.contains(needle) && !tracked.iter().any(|t| l.contains(t.as_str())))
            .collect();
        assert!(hits.is_empty(), "{what} in the statement log: {hits:#?}");
    }
    // `set_config(…, true)` lasts until the end of its transaction (the claim turns
    // `synchronous_commit` off so): only one with `is_local` false outlives it.
    let session_set_config: Vec<&&str> = statements
        .iter()
        .filter(|l| {
            l.split("set_config(").skip(1).any(|call| {
                let args = call.split(')').next().unwrap_or_default();
                !args.trim_end().ends_with("true")
            })
        })
        .collect();
    assert!(
        session_set_config.is_empty(),
        "a session setting in the statement log: {session_set_config:#?}"
    );
    let bare = statements
        .iter()
        .filter(|l| l.contains("LOG:  execute <unnamed>") && l.contains("gd:"))
        .count();
    assert!(bare > 10, "gen_durable's statements run unnamed: {bare}");
    db.close().await;
}

/// A pooled engine that would LISTEN through the pooler is refused at start, by name.
#[tokio::test]
async fn a_pooled_engine_must_not_listen_through_the_pooler() {
    let db = TestDb::new().await;
    let e = Engine::builder(db.pool().clone())
        .with_pooler(Pooler::Transaction)
        .with_registry(registry())
        .queue("p", 1)
        .start()
        .await
        .expect_err("refused");
    assert!(
        matches!(&e, gen_durable::Error::InvalidConfig(m) if m.contains("WakeListener")),
        "{e}"
    );
    db.close().await;
}
