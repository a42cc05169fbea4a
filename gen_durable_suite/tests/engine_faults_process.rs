//! Reliability with real worker processes: SIGKILL mid-step, an ambiguous
//! commit, a worker paused past its lease, poison steps, and a SIGTERM drain.

mod common;
#[path = "common/process.rs"]
mod process;

use std::time::{Duration, Instant};

use common::{column, count, eventually, finished, status};
use gen_durable::Client;
use gen_durable_suite::fsms::{create_audit_table, Audited, Plan};
use gen_durable_testkit::TestDb;
use process::{url_of, Worker};

async fn setup() -> (TestDb, Client, String) {
    let db = TestDb::new().await;
    create_audit_table(db.pool()).await.unwrap();
    let gd = Client::new(db.pool().clone());
    let url = url_of(&db);
    (db, gd, url)
}

/// Each (instance, step) audited exactly once, and every instance done with the full trail.
async fn exactly_once(db: &TestDb, ids: &[i64]) {
    let wrong = count(
        db.pool(),
        "SELECT count(*) FROM (SELECT instance, step FROM gd_audit GROUP BY 1, 2 HAVING count(*) <> 1) x",
    )
    .await;
    assert_eq!(wrong, 0, "an (instance, step) audited other than once");
    let listed = ids
        .iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(",");
    assert_eq!(
        count(
            db.pool(),
            &format!("SELECT count(*) FROM gd_audit WHERE instance IN ({listed})")
        )
        .await,
        3 * ids.len() as i64
    );
    for &id in ids {
        assert_eq!(status(db.pool(), id).await, "done");
        assert_eq!(
            column(db.pool(), id, "result").await.as_deref(),
            Some(r#"{"trail": ["one", "two", "three"]}"#)
        );
    }
}

const FAST: &[&str] = &[
    "--lease-ttl-ms",
    "1000",
    "--reaper-ms",
    "100",
    "--poll-ms",
    "50",
];

#[tokio::test]
async fn sigkill_mid_step_recovers_within_ttl_plus_reaper_and_commits_once() {
    let (db, gd, url) = setup().await;
    let id = gd
        .insert::<Audited>(Plan {
            step_ms: 60_000,
            ..Default::default()
        })
        .await
        .unwrap();
    let a = Worker::start(&url, "kill-a", FAST, None).await;
    eventually(20, "step one running", || async {
        status(db.pool(), id).await == "executing"
    })
    .await;
    let b = Worker::start(&url, "kill-b", FAST, None).await;
    // Let the re-run be quick: the stored state is what the next attempt sees.
    sqlx::query(r#"UPDATE gd_instances SET state = '{"step_ms": 0}' WHERE id = $1"#)
        .bind(id)
        .execute(db.pool())
        .await
        .unwrap();
    let killed = Instant::now();
    a.kill().await;
    eventually(20, "recovered", || async {
        column(db.pool(), id, "gd_holder(gd_instances)")
            .await
            .as_deref()
            != Some("kill-a")
    })
    .await;
    let recovered = killed.elapsed();
    assert!(
        recovered <= Duration::from_millis(1000 + 100 + 1000),
        "recovered after {recovered:?}"
    );
    assert_eq!(finished(db.pool(), id, 20).await, "done");
    exactly_once(&db, &[id]).await;
    // Only step one repeated: one reap, and steps two and three ran on b.
    assert_eq!(
        count(
            db.pool(),
            "SELECT count(*) FROM gd_audit WHERE node = 'kill-b'"
        )
        .await,
        3
    );
    b.kill().await;
    db.close().await;
}

/// A worker killed in the middle of a batch of the ready log, some of its rows done and
/// others still running: the batch expires, the reaper gives back only the rows still at
/// their entry, and no step of any row runs twice.
#[tokio::test]
async fn sigkill_mid_batch_gives_back_only_the_rows_still_running() {
    let (db, gd, url) = setup().await;
    let plan = |step_ms| {
        gen_durable::Entry::<Audited>::new(Plan {
            step_ms,
            ..Default::default()
        })
    };
    // Inserted before the worker starts: its first claim takes all ten in one range.
    let ids = gd
        .insert_all::<Audited>((0..10).map(|k| plan(if k % 2 == 0 { 0 } else { 60_000 })))
        .await
        .unwrap();
    let fast: Vec<i64> = ids.iter().step_by(2).copied().collect();
    let slow: Vec<i64> = ids.iter().skip(1).step_by(2).copied().collect();
    // Room for all ten at once: its first claim asks for them all.
    let wide: Vec<&str> = FAST
        .iter()
        .copied()
        .chain(["--concurrency", "16"])
        .collect();
    let a = Worker::start(&url, "batch-a", &wide, None).await;
    let listed = |v: &[i64]| {
        v.iter()
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    let (fast_list, slow_list) = (listed(&fast), listed(&slow));
    eventually(20, "the fast rows done, the slow ones running on a", || async {
        count(
            db.pool(),
            &format!("SELECT count(*) FROM gd_instances WHERE id IN ({fast_list}) AND status = 'done'"),
        )
        .await
            == 5
            && count(
                db.pool(),
                &format!(
                    "SELECT count(*) FROM gd_instances i WHERE id IN ({slow_list})
                       AND gd_holder(i) = 'batch-a'"
                ),
            )
            .await
                == 5
    })
    .await;
    // The slow rows are held by one batch, the range of all ten rows' first entries.
    let spans = count(
        db.pool(),
        &format!(
            "SELECT count(*) FROM (SELECT DISTINCT b.lane, b.batch, b.hi - b.lo AS span
               FROM gd_instances i
               JOIN gd_lanes l ON l.queue = i.queue AND l.fsm = i.fsm AND l.priority = i.priority
               JOIN gd_batches b ON b.lane = l.lane AND b.lo <= i.ready_seq AND b.hi > i.ready_seq
              WHERE i.id IN ({slow_list})) x WHERE x.span >= 10"
        ),
    )
    .await;
    assert_eq!(
        spans, 1,
        "the slow rows are not all in one batch of the ten rows"
    );
    let b = Worker::start(&url, "batch-b", FAST, None).await;
    sqlx::query(r#"UPDATE gd_instances SET state = '{"step_ms": 0}' WHERE id = ANY ($1)"#)
        .bind(&slow)
        .execute(db.pool())
        .await
        .unwrap();
    a.kill().await;
    for &id in &ids {
        assert_eq!(finished(db.pool(), id, 20).await, "done");
    }
    exactly_once(&db, &ids).await;
    // The fast rows ran only on a; the slow rows' every step ran on b, once.
    assert_eq!(
        count(
            db.pool(),
            &format!("SELECT count(*) FROM gd_audit WHERE instance IN ({fast_list}) AND node = 'batch-a'")
        )
        .await,
        15
    );
    assert_eq!(
        count(
            db.pool(),
            &format!("SELECT count(*) FROM gd_audit WHERE instance IN ({slow_list}) AND node = 'batch-b'")
        )
        .await,
        15
    );
    b.kill().await;
    db.close().await;
}

#[tokio::test]
async fn an_ambiguous_commit_changes_nothing_twice() {
    let (db, gd, url) = setup().await;
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(gd.insert::<Audited>(Plan::default()).await.unwrap());
    }
    // A spawn of children and a signal consumption, among the first commits too.
    let parent = gd
        .insert::<gen_durable_suite::fsms::FanParent>(gen_durable_suite::fsms::Fan { n: 20 })
        .await
        .unwrap();
    let waiter = gd
        .insert::<gen_durable_suite::fsms::Waiter>(())
        .await
        .unwrap();
    gd.signal(waiter, "go", serde_json::json!({}))
        .await
        .unwrap();
    // The first six commits succeed in the database but the worker is told they failed.
    let w = Worker::start(&url, "ambiguous", FAST, Some("gd::after_commit=6*return")).await;
    for &id in &ids {
        assert_eq!(finished(db.pool(), id, 30).await, "done");
    }
    exactly_once(&db, &ids).await;
    assert_eq!(finished(db.pool(), parent, 30).await, "done");
    assert_eq!(
        count(
            db.pool(),
            &format!("SELECT count(*) FROM gd_instances WHERE parent_id = {parent}")
        )
        .await,
        20,
        "no duplicate child"
    );
    assert_eq!(
        column(db.pool(), parent, "result").await.as_deref(),
        Some(r#"{"done": 20, "children": 20}"#)
    );
    assert_eq!(finished(db.pool(), waiter, 30).await, "done");
    assert_eq!(
        column(db.pool(), waiter, "result").await.as_deref(),
        Some(r#"{"awaited": 1}"#)
    );
    assert_eq!(
        count(
            db.pool(),
            &format!("SELECT count(*) FROM gd_audit WHERE instance = {waiter}")
        )
        .await,
        1,
        "the signal was consumed by one committed step"
    );
    assert_eq!(count(db.pool(), "SELECT count(*) FROM gd_signals").await, 0);
    w.kill().await;
    db.close().await;
}

#[tokio::test]
async fn a_worker_paused_past_its_lease_commits_nothing_and_says_so() {
    let (db, gd, url) = setup().await;
    let id = gd
        .insert::<Audited>(Plan {
            step_ms: 1500,
            ..Default::default()
        })
        .await
        .unwrap();
    let mut a = Worker::start(
        &url,
        "paused",
        &[
            "--lease-ttl-ms",
            "600",
            "--reaper-ms",
            "100",
            "--poll-ms",
            "50",
        ],
        None,
    )
    .await;
    eventually(20, "step one running on a", || async {
        column(db.pool(), id, "gd_holder(gd_instances)")
            .await
            .as_deref()
            == Some("paused")
    })
    .await;
    a.signal("STOP");
    let b = Worker::start(
        &url,
        "taker",
        &[
            "--lease-ttl-ms",
            "5000",
            "--reaper-ms",
            "100",
            "--poll-ms",
            "50",
        ],
        None,
    )
    .await;
    // b reaps the lease, runs step one and commits it while a is frozen.
    eventually(20, "b committed step one", || async {
        count(
            db.pool(),
            "SELECT count(*) FROM gd_audit WHERE node = 'taker' AND step = 'one'",
        )
        .await
            == 1
    })
    .await;
    a.signal("CONT");
    let line = a.wait_line("lease.lost", 20).await;
    assert!(line.contains(&format!("id={id}")), "{line}");
    assert_eq!(finished(db.pool(), id, 30).await, "done");
    exactly_once(&db, &[id]).await;
    // The stale step-one commit left nothing (a may legitimately run later steps after CONT).
    assert_eq!(
        count(
            db.pool(),
            "SELECT count(*) FROM gd_audit WHERE node = 'paused' AND step = 'one'"
        )
        .await,
        0
    );
    a.kill().await;
    b.kill().await;
    db.close().await;
}

#[tokio::test]
async fn a_step_that_aborts_its_process_every_time_fails_after_max_reaps() {
    let (db, gd, url) = setup().await;
    // Run until `id` is `want`, restarting the worker whenever it dies, as a supervisor
    // would. One instance at a time: a crash takes every row of its worker down with it,
    // and a bystander reaped with three crashing workers would fail too (max_reaps = 3).
    let supervise = |id: i64, want: &'static str| {
        let (db, url) = (&db, url.clone());
        async move {
            let mut starts = 0;
            while status(db.pool(), id).await != want {
                assert!(
                    starts < 10,
                    "instance {id} not {want} after {starts} worker starts"
                );
                starts += 1;
                let mut w = Worker::start(&url, &format!("poison-{id}-{starts}"), FAST, None).await;
                tokio::select! {
                    _ = w.child.wait() => {}
                    _ = eventually(60, "the instance to end", || async { status(db.pool(), id).await == want }) => {
                        w.kill().await;
                    }
                }
            }
            starts
        }
    };
    // A step that crashes its worker once recovers and completes exactly once.
    let once = gd
        .insert::<Audited>(Plan {
            abort_in: Some("one".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let starts = supervise(once, "done").await;
    assert_eq!(starts, 2, "one crash, one clean run");
    assert_eq!(
        count(
            db.pool(),
            &format!("SELECT count(*) FROM gd_audit WHERE instance = {once}")
        )
        .await,
        3
    );
    // A step that crashes its worker every time (Audited has max_reaps = 3): three
    // crashes in step two, then the reaper fails it.
    let poison = gd
        .insert::<Audited>(Plan {
            always_abort_in: Some("two".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let starts = supervise(poison, "failed").await;
    let err = column(db.pool(), poison, "last_error").await.unwrap();
    assert!(err.contains("lease lost 3 times"), "{err}");
    assert_eq!(
        column(db.pool(), poison, "step").await.as_deref(),
        Some("two")
    );
    assert_eq!(
        starts, 4,
        "three crashes, then a worker whose reaper fails it"
    );
    db.close().await;
}

#[tokio::test]
async fn sigterm_drains_while_old_and_new_workers_overlap() {
    let (db, gd, url) = setup().await;
    let mut ids = Vec::new();
    for _ in 0..40 {
        ids.push(
            gd.insert::<Audited>(Plan {
                step_ms: 50,
                ..Default::default()
            })
            .await
            .unwrap(),
        );
    }
    let mut old = Worker::start(
        &url,
        "old",
        &["--prefetch", "8", "--concurrency", "2", "--poll-ms", "50"],
        None,
    )
    .await;
    eventually(20, "old is working", || async {
        count(
            db.pool(),
            "SELECT count(*) FROM gd_audit WHERE node = 'old'",
        )
        .await
            > 0
    })
    .await;
    let new = Worker::start(
        &url,
        "new",
        &["--concurrency", "4", "--poll-ms", "50"],
        None,
    )
    .await;
    old.signal("TERM");
    let drained = old.wait_line("drained", 20).await;
    // Buffered rows were released at once rather than held until the lease expired.
    let released: usize = drained
        .split("released=")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    old.child.wait().await.unwrap();
    assert_eq!(
        count(
            db.pool(),
            "SELECT count(*) FROM gd_instances i WHERE gd_holder(i) = 'old'"
        )
        .await,
        0
    );
    for &id in &ids {
        assert_eq!(finished(db.pool(), id, 60).await, "done");
    }
    exactly_once(&db, &ids).await;
    assert!(released <= 8);
    assert_eq!(
        count(
            db.pool(),
            "SELECT coalesce(max(attempt), 0)::int8 FROM gd_instances"
        )
        .await,
        0,
        "no attempt burned by the drain"
    );
    new.kill().await;
    db.close().await;
}

#[tokio::test]
async fn partition_exclusivity_across_two_processes_with_sixteen_workers() {
    use gen_durable_suite::fsms::{create_span_table, Keyed, KeyedWork};
    let (db, gd, url) = setup().await;
    create_span_table(db.pool()).await.unwrap();
    let entries = (0..1000).map(|i| {
        let key = format!("key-{}", i % 10);
        gen_durable::Entry::<Keyed>::new(KeyedWork {
            key: key.clone(),
            ms: 1,
        })
        .partition_key(key)
    });
    gd.insert_all::<Keyed>(entries).await.unwrap();
    let args = ["--concurrency", "8", "--prefetch", "4", "--poll-ms", "20"];
    let a = Worker::start(&url, "part-a", &args, None).await;
    let b = Worker::start(&url, "part-b", &args, None).await;
    eventually(120, "all 1,000 done", || async {
        count(
            db.pool(),
            "SELECT count(*) FROM gd_instances WHERE status = 'done'",
        )
        .await
            == 1000
    })
    .await;
    let overlaps = count(
        db.pool(),
        "SELECT count(*) FROM gd_spans x JOIN gd_spans y
           ON x.key = y.key AND x.instance < y.instance
          AND x.started < y.ended AND y.started < x.ended",
    )
    .await;
    assert_eq!(overlaps, 0, "two steps of one key overlapped");
    assert_eq!(
        count(db.pool(), "SELECT count(*) FROM gd_spans").await,
        1000
    );
    assert_eq!(
        count(
            db.pool(),
            "SELECT coalesce(max(attempt), 0)::int8 FROM gd_instances"
        )
        .await,
        0,
        "handed-back rows burn no attempt"
    );
    a.kill().await;
    b.kill().await;
    db.close().await;
}

/// The most steps of one key that ran at once, per key, from the database-clock spans:
/// at each span's start, the spans of its key covering that instant.
async fn max_overlap_per_key(db: &TestDb) -> Vec<(String, i64)> {
    sqlx::query_as(
        "SELECT x.key, max((SELECT count(*) FROM gd_spans y
                             WHERE y.key = x.key AND y.started <= x.started
                               AND y.ended > x.started))
           FROM gd_spans x GROUP BY x.key ORDER BY x.key",
    )
    .fetch_all(db.pool())
    .await
    .unwrap()
}

#[tokio::test]
async fn a_gate_of_three_is_never_exceeded_by_two_processes_of_thirty_two_workers() {
    use gen_durable_suite::fsms::{create_span_table, Keyed, KeyedWork};
    let (db, gd, url) = setup().await;
    create_span_table(db.pool()).await.unwrap();
    // Declared by the client: the workers read K from the database at each pick.
    gd.set_gate("api", gen_durable::Gate::new(3)).await.unwrap();
    let entries = (0..2000).map(|i| {
        let key = format!("tenant-{}", i % 5);
        gen_durable::Entry::<Keyed>::new(KeyedWork {
            key: key.clone(),
            ms: 15,
        })
        .gate(("api", key))
    });
    gd.insert_all::<Keyed>(entries).await.unwrap();
    let args = [
        "--concurrency",
        "32",
        "--prefetch",
        "8",
        "--pool",
        "40",
        "--poll-ms",
        "20",
    ];
    let a = Worker::start(&url, "gate-a", &args, None).await;
    let b = Worker::start(&url, "gate-b", &args, None).await;
    eventually(180, "all 2,000 done", || async {
        count(
            db.pool(),
            "SELECT count(*) FROM gd_instances WHERE status = 'done'",
        )
        .await
            == 2000
    })
    .await;
    let overlap = max_overlap_per_key(&db).await;
    assert_eq!(overlap.len(), 5, "{overlap:?}");
    for (key, most) in &overlap {
        assert_eq!(
            *most, 3,
            "key {key}: at most K = 3 at once, and 3 reached ({overlap:?})"
        );
    }
    assert_eq!(
        count(db.pool(), "SELECT count(*) FROM gd_spans").await,
        2000
    );
    assert_eq!(
        count(
            db.pool(),
            "SELECT coalesce(max(attempt), 0)::int8 FROM gd_instances"
        )
        .await,
        0,
        "rows a full gate turned back burn no attempt"
    );
    a.kill().await;
    b.kill().await;
    db.close().await;
}

#[tokio::test]
async fn slots_of_a_killed_worker_come_back_within_lease_plus_reaper() {
    use gen_durable_suite::fsms::{create_span_table, Keyed, KeyedWork};
    let (db, gd, url) = setup().await;
    create_span_table(db.pool()).await.unwrap();
    gd.set_gate("api", gen_durable::Gate::new(2)).await.unwrap();
    // Two long steps take both slots of the key; a third row waits for one.
    let long = |ms| {
        gen_durable::Entry::<Keyed>::new(KeyedWork {
            key: "k".into(),
            ms,
        })
        .gate(("api", "k"))
    };
    let held = gd
        .insert_all::<Keyed>([long(600_000), long(600_000)])
        .await
        .unwrap();
    let a = Worker::start(&url, "slots-a", FAST, None).await;
    eventually(20, "both slots held", || async {
        count(
            db.pool(),
            "SELECT count(*) FROM gd_instances WHERE status = 'executing' AND gate = 'api'",
        )
        .await
            == 2
    })
    .await;
    let waiting = gd.insert_all::<Keyed>([long(0)]).await.unwrap()[0];
    let b = Worker::start(&url, "slots-b", FAST, None).await;
    // Nothing frees a slot while the holder lives: the third row stays runnable.
    let explained = gd.explain(waiting).await.unwrap().to_string();
    assert_eq!(status(db.pool(), waiting).await, "runnable", "{explained}");
    // Speed the re-runs up: the stored state is what the next attempt sees.
    sqlx::query(r#"UPDATE gd_instances SET state = '{"key": "k", "ms": 0}' WHERE id = ANY($1)"#)
        .bind(&held)
        .execute(db.pool())
        .await
        .unwrap();
    let killed = Instant::now();
    a.kill().await;
    eventually(20, "the waiting row ran", || async {
        status(db.pool(), waiting).await == "done"
    })
    .await;
    let back = killed.elapsed();
    // Lease 1 s + reaper every 100 ms, plus a pick: well under 5 s.
    assert!(back < Duration::from_secs(5), "slots back after {back:?}");
    eventually(20, "the reaped rows ran again", || async {
        count(
            db.pool(),
            "SELECT count(*) FROM gd_instances WHERE status = 'done'",
        )
        .await
            == 3
    })
    .await;
    let overlap = max_overlap_per_key(&db).await;
    assert!(overlap.iter().all(|(_, n)| *n <= 2), "{overlap:?}");
    b.kill().await;
    db.close().await;
}

/// A worker killed inside a commit that hands a gate slot on (its step's write, its
/// outcome and the claim of the key's next row written, not committed) loses nothing and
/// commits nothing twice: all of it rolls back together, the reaper returns the slot, and
/// every row runs to its end with its write committed once.
#[tokio::test]
async fn a_worker_killed_inside_a_hand_off_of_gate_slots_commits_each_outcome_once() {
    use gen_durable_suite::fsms::{create_span_table, Keyed, KeyedWork};
    let (db, gd, url) = setup().await;
    create_span_table(db.pool()).await.unwrap();
    gd.set_gate("api", gen_durable::Gate::new(2)).await.unwrap();
    let rows = (0..6).map(|_| {
        gen_durable::Entry::<Keyed>::new(KeyedWork {
            key: "k".into(),
            ms: 0,
        })
        .gate(("api", "k"))
    });
    gd.insert_all::<Keyed>(rows).await.unwrap();
    let a = Worker::start(&url, "handoff-a", FAST, Some("gd::handoff=1*sleep(20000)")).await;
    // The sleeping commit: a transaction of this database that has written and stays
    // idle (its last statement is the hand-off's, or the savepoint's release after it in
    // a step's own transaction; other commits pass through that state in microseconds).
    // The failpoint's sleep blocks a thread of the worker's runtime, so another commit
    // may be held up with it, also inside its hand-off: one or more.
    eventually(20, "a commit asleep inside its hand-off", || async {
        count(
            db.pool(),
            "SELECT count(*) FROM pg_stat_activity
              WHERE datname = current_database() AND state = 'idle in transaction'
                AND backend_xid IS NOT NULL
                AND state_change < now() - interval '300 milliseconds'
                AND (query LIKE '/* gd:handoff */%' OR query LIKE 'RELEASE SAVEPOINT%')",
        )
        .await
            >= 1
    })
    .await;
    // The sleeping commit's transaction holds its step's span, its outcome and the row
    // it handed its slot to: none of it is visible.
    let spans_before = count(db.pool(), "SELECT count(*) FROM gd_spans").await;
    let done_before = count(
        db.pool(),
        "SELECT count(*) FROM gd_instances WHERE status = 'done'",
    )
    .await;
    assert_eq!(
        spans_before, done_before,
        "each committed outcome has its span"
    );
    a.kill().await;
    let b = Worker::start(&url, "handoff-b", FAST, None).await;
    eventually(30, "all six done", || async {
        count(
            db.pool(),
            "SELECT count(*) FROM gd_instances WHERE status = 'done'",
        )
        .await
            == 6
    })
    .await;
    assert_eq!(
        count(db.pool(), "SELECT count(*) FROM gd_spans").await,
        6,
        "each step's write committed once, with its outcome"
    );
    assert!(
        count(
            db.pool(),
            "SELECT count(*) FROM gd_instances WHERE reaps > 0"
        )
        .await
            >= 1,
        "the row of the killed commit came back through the reaper"
    );
    let overlap = max_overlap_per_key(&db).await;
    assert!(overlap.iter().all(|(_, n)| *n <= 2), "{overlap:?}");
    b.kill().await;
    db.close().await;
}

#[tokio::test]
async fn a_fan_out_of_a_thousand_survives_kills_during_the_spawn_commit_and_the_fan_in() {
    use gen_durable_suite::fsms::{Fan, FanParent};
    let (db, gd, url) = setup().await;
    let parent = gd.insert::<FanParent>(Fan { n: 1000 }).await.unwrap();
    // The first commit of this worker (the spawn) sleeps inside the failpoint: kill it there.
    let spawner = Worker::start(
        &url,
        "spawner",
        FAST,
        Some("gd::before_commit=1*sleep(20000)"),
    )
    .await;
    eventually(20, "spawn step ran", || async {
        status(db.pool(), parent).await == "executing"
    })
    .await;
    // Give the step time to reach its commit (it is a no-op step), then crash.
    eventually(20, "at the commit failpoint", || async {
        count(
            db.pool(),
            &format!("SELECT count(*) FROM gd_instances WHERE parent_id = {parent}"),
        )
        .await
            == 0
            && status(db.pool(), parent).await == "executing"
    })
    .await;
    spawner.kill().await;
    // Workers that crash now and then while children finish and the parent is woken.
    let mut round = 0;
    let deadline = Instant::now() + Duration::from_secs(120);
    while status(db.pool(), parent).await != "done" {
        assert!(Instant::now() < deadline, "fan-out did not finish");
        round += 1;
        let w = Worker::start(
            &url,
            &format!("fan-{round}"),
            &[
                "--lease-ttl-ms",
                "1000",
                "--reaper-ms",
                "100",
                "--poll-ms",
                "20",
                "--concurrency",
                "16",
            ],
            None,
        )
        .await;
        let until = Instant::now() + Duration::from_millis(700);
        // Each worker lives ~700 ms, then crashes, wherever it is.
        while Instant::now() < until && status(db.pool(), parent).await != "done" {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        w.kill().await;
    }
    assert_eq!(
        count(
            db.pool(),
            &format!("SELECT count(*) FROM gd_instances WHERE parent_id = {parent}")
        )
        .await,
        1000,
        "each child created once"
    );
    assert_eq!(count(db.pool(), "SELECT count(*) FROM (SELECT instance FROM gd_audit GROUP BY 1 HAVING count(*) <> 1) x").await, 0);
    assert_eq!(
        count(
            db.pool(),
            "SELECT count(*) FROM gd_audit WHERE step = 'child'"
        )
        .await,
        1000
    );
    assert_eq!(
        count(
            db.pool(),
            "SELECT count(*) FROM gd_audit WHERE step = 'sum'"
        )
        .await,
        1,
        "the parent was woken once"
    );
    assert_eq!(
        column(db.pool(), parent, "result").await.as_deref(),
        Some(r#"{"done": 1000, "children": 1000}"#)
    );
    db.close().await;
}

#[tokio::test]
async fn a_worker_clock_skewed_ten_minutes_either_way_changes_nothing() {
    // CI installs libfaketime (.ci/run), so there this test always runs; on a machine
    // without it, say so loudly rather than fail the whole suite.
    if std::env::var_os("CI").is_none() && !std::path::Path::new(process::LIBFAKETIME).exists() {
        eprintln!("SKIPPED: the clock-skew test needs libfaketime (apt-get install faketime)");
        return;
    }
    let (db, gd, url) = setup().await;
    for (i, skew) in ["+10m", "-10m"].into_iter().enumerate() {
        // The skewed worker's own clock says "now + 10 min" (or - 10 min).
        let mut w = Worker::start_skewed(
            skew,
            &url,
            &format!("skewed-{i}"),
            &[
                "--lease-ttl-ms",
                "3000",
                "--reaper-ms",
                "100",
                "--poll-ms",
                "20",
            ],
        )
        .await;
        // The worker's own clock really is skewed.
        let line = w.wait_line("clock", 10).await;
        let its_now =
            chrono::DateTime::parse_from_rfc3339(line.trim_start_matches("clock ")).unwrap();
        let db_now: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT now()")
            .fetch_one(db.pool())
            .await
            .unwrap();
        let skew_secs = (its_now.with_timezone(&chrono::Utc) - db_now).num_seconds();
        assert!(skew_secs.abs() >= 590, "worker clock off by {skew_secs}s");
        // Scheduling: not run before the database's eligible_at.
        let later = gd
            .insert::<Audited>(Plan::default())
            .schedule_in(Duration::from_millis(1500))
            .await
            .unwrap();
        // Leases: a long step keeps its lease by the database clock, so it is not reaped.
        let long = gd
            .insert::<Audited>(Plan {
                step_ms: 1000,
                ..Default::default()
            })
            .await
            .unwrap();
        eventually(20, "long step running", || async {
            status(db.pool(), long).await == "executing"
        })
        .await;
        // Its lease: its own, or its batch's in the ready log.
        let ttl_left: f64 = sqlx::query_scalar(
            "SELECT extract(epoch FROM coalesce(i.lease_expires_at, (
                        SELECT b.expires_at FROM gd_lanes l JOIN gd_batches b ON b.lane = l.lane
                         WHERE l.queue = i.queue AND l.fsm = i.fsm AND l.priority = i.priority
                           AND b.lo <= i.ready_seq AND b.hi > i.ready_seq)) - now())::float8
               FROM gd_instances i WHERE id = $1",
        )
        .bind(long)
        .fetch_one(db.pool())
        .await
        .unwrap();
        assert!(
            (0.0..=3.5).contains(&ttl_left),
            "lease expires in {ttl_left}s by the database clock"
        );
        assert_eq!(finished(db.pool(), long, 30).await, "done");
        assert_eq!(
            column(db.pool(), long, "attempt").await.as_deref(),
            Some("0"),
            "never reaped"
        );
        assert_eq!(finished(db.pool(), later, 30).await, "done");
        let early: bool = sqlx::query_scalar(
            "SELECT min(a.at) < i.inserted_at + interval '1500 ms'
               FROM gd_audit a JOIN gd_instances i ON i.id = a.instance WHERE a.instance = $1 GROUP BY i.inserted_at",
        )
        .bind(later)
        .fetch_one(db.pool())
        .await
        .unwrap();
        let detail: String = sqlx::query_scalar(
            "SELECT format('inserted %s eligible %s audit %s', i.inserted_at, i.eligible_at,
                           (SELECT string_agg(a.step || '@' || a.at::text, ', ') FROM gd_audit a WHERE a.instance = i.id))
               FROM gd_instances i WHERE i.id = $1",
        )
        .bind(later)
        .fetch_one(db.pool())
        .await
        .unwrap();
        assert!(
            !early,
            "a scheduled instance ran before its time ({skew}): {detail}"
        );
        w.kill().await;
    }
    db.close().await;
}

#[tokio::test]
async fn the_test_workers_failpoints_are_live() {
    // Proves the ambiguous-commit test injects something: with every commit refused
    // before it starts, nothing commits, and the reaper takes the row back each time.
    let (db, gd, url) = setup().await;
    let id = gd.insert::<Audited>(Plan::default()).await.unwrap();
    let w = Worker::start(&url, "refuses", FAST, Some("gd::before_commit=return")).await;
    eventually(30, "reaped twice", || async {
        column(db.pool(), id, "reaps").await.as_deref() >= Some("2")
    })
    .await;
    assert_eq!(column(db.pool(), id, "step").await.as_deref(), Some("one"));
    assert_eq!(count(db.pool(), "SELECT count(*) FROM gd_audit").await, 0);
    w.kill().await;
    db.close().await;
}
