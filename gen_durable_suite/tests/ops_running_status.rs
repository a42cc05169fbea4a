//! A plain instance whose step runs from the ready log keeps `runnable` in its row; every
//! reader shows it as `executing`, by the node that runs it: `inspect` (the CLI, and the
//! dashboard's instance page), its parent's children and tree, the dashboard's list and
//! its status filter, and `explain`'s children a parent waits on.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{count, eventually, Count};
use gen_durable::{Child, Client, Engine, Reason, Registry, Status, Step};
use gen_durable_testkit::TestDb;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Holds `Held`'s step until the test lets it end.
static GO: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(0);

test_fsm!(Held, state = Count, queue = "shown", version = 1, {
    Run => "run" |_ctx| { GO.acquire().await.unwrap().forget(); Ok(Step::done(json!(null))) },
});

test_fsm!(Spawner, state = Count, queue = "shown", version = 1, {
    Spawn => "spawn" |_ctx| { Ok(Step::schedule_children(vec![Child::new::<Held>(Count::default())], Spawner::End)) },
    End => "end" |_ctx| { Ok(Step::done(json!(null))) },
});

/// `inspect ID --json` through a user's binary of the CLI.
fn inspect(db: &TestDb, id: i64) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_gd_cli_upgrade"))
        .args([
            "--database-url",
            &common::database_url(db),
            "--json",
            "inspect",
            &id.to_string(),
        ])
        .output()
        .expect("run gd_cli_upgrade");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
        panic!(
            "not JSON: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// The body of `GET path` from a server on `addr`.
async fn get(addr: std::net::SocketAddr, path: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).await.unwrap();
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_plain_child_shows_as_executing_to_every_reader() {
    let db = TestDb::new().await;
    let mut registry = Registry::new();
    registry.register::<Held>();
    registry.register::<Spawner>();
    let engine = Engine::builder(db.pool().clone())
        .with_registry(registry)
        .queue("shown", 4)
        .with_node_id("shown-node")
        .start()
        .await
        .unwrap();
    let gd = Client::new(db.pool().clone());
    let parent = gd.insert::<Spawner>(Count::default()).await.unwrap();
    eventually(10, "the child runs", || async {
        count(
            db.pool(),
            "SELECT count(*) FROM gd_instances i WHERE i.fsm = 'Held' AND gd_status_of(i) = 'executing'",
        )
        .await
            == 1
    })
    .await;
    let child: i64 = sqlx::query_scalar("SELECT id FROM gd_instances WHERE fsm = 'Held'")
        .fetch_one(db.pool())
        .await
        .unwrap();
    let stored: String = sqlx::query_scalar("SELECT status::text FROM gd_instances WHERE id = $1")
        .bind(child)
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(
        stored, "runnable",
        "a plain row claimed from the log (the premise)"
    );

    // inspect: the row, and the parent's children.
    let row = &inspect(&db, child)["instance"];
    assert_eq!(row["status"], "executing", "{row}");
    assert_eq!(row["locked_by"], "shown-node", "{row}");
    let p = inspect(&db, parent);
    assert_eq!(p["children"][0]["status"], "executing", "{p}");
    assert_eq!(p["children_by_status"], json!({ "executing": 1 }), "{p}");

    // explain: the child the parent waits on.
    match gd.explain(parent).await.unwrap().reason {
        Reason::AwaitingChildren { waiting_on, .. } => {
            assert_eq!(waiting_on.len(), 1);
            assert_eq!(waiting_on[0].status, Status::Executing);
        }
        other => panic!("{other:?}"),
    }

    // The dashboard: the list and its filter, the instance page and the parent's tree.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = gen_durable_ops::dashboard::router(db.pool().clone());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let running = get(addr, "/instances?status=executing").await;
    assert!(
        running.contains(&format!("data-id=\"{child}\"")),
        "{running}"
    );
    let waiting = get(addr, "/instances?status=runnable").await;
    assert!(
        !waiting.contains(&format!("data-id=\"{child}\"")),
        "{waiting}"
    );
    let page = get(addr, &format!("/instances/{child}")).await;
    assert!(
        page.contains("data-field=\"status\">executing"),
        "the instance page's status: {page}"
    );
    let tree = get(addr, &format!("/instances/{parent}")).await;
    let children = &tree[tree.find("id=\"children\"").expect("the tree")..];
    assert!(children.contains("s-executing"), "{children}");

    GO.add_permits(1);
    assert_eq!(common::finished(db.pool(), parent, 10).await, "done");
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}
