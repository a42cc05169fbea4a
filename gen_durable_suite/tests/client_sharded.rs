//! `ShardedClient` over two databases of one server, each with its own engine: every
//! instance on the shard its key hashes to and only there, signals and waits routed by
//! key, a child in its parent's database, ids named with their shard, a hash that never
//! changes.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::Count;
use gen_durable::{
    Child, Client, Engine, Error, Key, QueueConfig, Registry, Settled, ShardedClient, ShardedId,
    Step,
};
use gen_durable_testkit::TestDb;
use serde_json::json;
use sqlx::PgPool;

test_fsm!(Parked, state = Count, queue = "sh", version = 1, {
    Park => "park" |_ctx| { Ok(Step::await_signal(["go"], Parked::Use)) },
    // Without a signal (a retry after a cancel clears the await), `v` is null.
    Use => "use" |ctx| { Ok(Step::done(json!({ "v": ctx.awaited().first().map(|s| s.payload()["v"].clone()) }))) },
});

// Spawns one `Parked` child holding the key in `state.log[0]`, then reports its result.
test_fsm!(Root, state = Count, queue = "sh", version = 1, {
    Spawn => "spawn" |ctx| {
        let child = Child::new::<Parked>(Count::default()).correlation_key(ctx.state.log[0].clone());
        Ok(Step::schedule_children(vec![child], Root::Report))
    },
    Report => "report" |ctx| { Ok(Step::done(json!({ "child": ctx.children()[0].result.clone() }))) },
});

fn registry() -> Registry {
    let mut r = Registry::new();
    r.register::<Parked>();
    r.register::<Root>();
    r
}

const WAIT: Duration = Duration::from_secs(20);

/// Two databases, an engine on each, and a `ShardedClient` over their clients.
struct Shards {
    dbs: Vec<TestDb>,
    engines: Vec<Engine>,
    gd: ShardedClient,
}

impl Shards {
    async fn new() -> Shards {
        let dbs = vec![TestDb::new().await, TestDb::new().await];
        let mut engines = Vec::new();
        for db in &dbs {
            let engine = Engine::builder(db.pool().clone())
                .with_registry(registry())
                .queue_with(
                    "sh",
                    QueueConfig::new(8).with_poll_interval(Duration::from_millis(20)),
                )
                .start()
                .await
                .unwrap();
            engines.push(engine);
        }
        let clients = dbs
            .iter()
            .map(|db| Client::new(db.pool().clone()).with_registry(registry()))
            .collect();
        let gd = ShardedClient::new(clients).unwrap();
        Shards { dbs, engines, gd }
    }

    fn pool(&self, shard: usize) -> &PgPool {
        self.dbs[shard].pool()
    }

    async fn close(self) {
        for engine in self.engines {
            engine.shutdown(Duration::from_secs(5)).await;
        }
        for db in self.dbs {
            db.close().await;
        }
    }
}

/// The correlation keys stored in a database, with their rows' ids.
async fn keys_in(pool: &PgPool) -> BTreeMap<String, i64> {
    sqlx::query_as::<_, (String, i64)>(
        "SELECT unique_key, id FROM gd_instances WHERE unique_key IS NOT NULL",
    )
    .fetch_all(pool)
    .await
    .unwrap()
    .into_iter()
    .collect()
}

#[tokio::test]
async fn each_instance_lives_on_its_keys_shard_and_signals_by_key_reach_it() {
    let s = Shards::new().await;
    let gd = &s.gd;
    let keys: Vec<String> = (0..40).map(|i| format!("order:{i}")).collect();

    let mut placed = BTreeMap::new();
    for key in &keys {
        let at = gd
            .insert::<Parked>(key.clone(), Count::default())
            .await
            .unwrap();
        assert_eq!(at.shard, gd.shard_of(key), "{key} went to its key's shard");
        placed.insert(key.clone(), at);
    }
    let on = |shard: usize| placed.values().filter(|at| at.shard == shard).count();
    assert!(
        on(0) > 0 && on(1) > 0,
        "both shards got keys: {} and {}",
        on(0),
        on(1)
    );

    // Each database holds exactly the keys routed to it, each under the id the insert
    // returned: no instance is on both, none is missing.
    for shard in 0..2 {
        let expected: BTreeMap<String, i64> = placed
            .iter()
            .filter(|(_, at)| at.shard == shard)
            .map(|(k, at)| (k.clone(), at.id))
            .collect();
        assert_eq!(keys_in(s.pool(shard)).await, expected, "shard {shard}");
    }
    // Ids are per database: the same number names an instance on each shard.
    let ids = |shard: usize| -> Vec<i64> {
        placed
            .values()
            .filter(|at| at.shard == shard)
            .map(|at| at.id)
            .collect()
    };
    assert!(
        ids(0).iter().any(|id| ids(1).contains(id)),
        "ids repeat across shards"
    );

    // A signal by key reaches the holder on its shard, whose engine runs it to the end.
    for (i, key) in keys.iter().enumerate() {
        let delivery = gd
            .signal(Key(key.as_str()), "go", json!({ "v": i }))
            .await
            .unwrap();
        assert_eq!(delivery.id, placed[key].id, "{key}");
    }
    for (i, key) in keys.iter().enumerate() {
        let by_key = gd
            .wait(Key(key.as_str()))
            .until_terminal()
            .timeout(WAIT)
            .await
            .unwrap();
        assert_eq!(by_key, Settled::Done(json!({ "v": i })), "{key}");
        let by_id = gd.wait_id(placed[key]).unwrap().await.unwrap();
        assert_eq!(by_id, by_key, "{key}");
    }
    // And in the databases themselves: every row is done with its own key's payload.
    for shard in 0..2 {
        let rows: Vec<(String, String, serde_json::Value)> =
            sqlx::query_as("SELECT unique_key, status::text, result FROM gd_instances ORDER BY id")
                .fetch_all(s.pool(shard))
                .await
                .unwrap();
        assert_eq!(rows.len(), on(shard));
        for (key, status, result) in rows {
            let i = keys.iter().position(|k| *k == key).unwrap();
            assert_eq!(
                (status.as_str(), result),
                ("done", json!({ "v": i })),
                "{key}"
            );
        }
    }
    s.close().await;
}

#[tokio::test]
async fn a_child_lives_in_its_parents_database_whatever_its_key() {
    let s = Shards::new().await;
    let gd = &s.gd;
    let root = "tree:1";
    // A child key that hashes to the other shard than its root's.
    let child = (0..)
        .map(|i| format!("tree:1/child:{i}"))
        .find(|k| gd.shard_of(k) != gd.shard_of(root))
        .unwrap();
    let state = Count {
        log: vec![child.clone()],
        ..Default::default()
    };
    let at = gd.insert::<Root>(root, state).await.unwrap();

    // Parked on its child: the child was inserted in the same commit.
    let parked = gd.wait_id(at).unwrap().timeout(WAIT).await.unwrap();
    assert!(matches!(parked, Settled::Parked { .. }), "{parked:?}");
    let other = 1 - at.shard;
    let in_parent_db: Vec<(i64, String)> = sqlx::query_as(
        "SELECT parent_id, unique_key FROM gd_instances WHERE parent_id IS NOT NULL",
    )
    .fetch_all(s.pool(at.shard))
    .await
    .unwrap();
    assert_eq!(in_parent_db, [(at.id, child.clone())]);
    assert!(
        keys_in(s.pool(other)).await.is_empty(),
        "nothing on the shard the child's key hashes to"
    );

    // Routed by its own key, a signal to the child goes to the wrong shard and stores
    // nothing; routed by its root's key, it reaches it.
    let wrong = gd
        .signal(Key(child.as_str()), "go", json!({ "v": 7 }))
        .await;
    assert!(matches!(wrong, Err(Error::KeyNotFound { .. })), "{wrong:?}");
    gd.client(root)
        .signal(Key(child.as_str()), "go", json!({ "v": 7 }))
        .await
        .unwrap();
    let done = gd
        .wait_id(at)
        .unwrap()
        .until_terminal()
        .timeout(WAIT)
        .await
        .unwrap();
    assert_eq!(done, Settled::Done(json!({ "child": { "v": 7 } })));
    let signals: i64 = sqlx::query_scalar("SELECT count(*) FROM gd_signals")
        .fetch_one(s.pool(other))
        .await
        .unwrap();
    assert_eq!(signals, 0, "the misrouted signal stored nothing");
    s.close().await;
}

#[tokio::test]
async fn operations_by_id_name_their_shard() {
    let s = Shards::new().await;
    let gd = &s.gd;
    // The first instance of each fresh database has the same id.
    let mut first = [None, None];
    for i in 0.. {
        let key = format!("cancel:{i}");
        let shard = gd.shard_of(&key);
        if first[shard].is_none() {
            first[shard] = Some(gd.insert::<Parked>(key, Count::default()).await.unwrap());
        }
        if first.iter().all(Option::is_some) {
            break;
        }
    }
    let [a, b] = first.map(Option::unwrap);
    assert_eq!(a.id, b.id, "one id on both shards");

    // Both parked on their signal (so a cancel fails `a` at once, at the step after the
    // await).
    for at in [a, b] {
        let parked = gd.wait_id(at).unwrap().timeout(WAIT).await.unwrap();
        assert!(matches!(parked, Settled::Parked { .. }), "{at}: {parked:?}");
    }
    let cancelled = gd.cancel(a).await.unwrap();
    assert_eq!((cancelled.failed, cancelled.after_current_step), (1, 0));
    // Explained on its own shard: `a` failed, `b` of the same id still parked.
    let why_a = gd.explain_id(a).await.unwrap();
    assert_eq!(
        (why_a.id, why_a.status),
        (a.id, gen_durable::Status::Failed)
    );
    let why_b = gd.explain_id(b).await.unwrap();
    assert_eq!(why_b.status, gen_durable::Status::AwaitingSignal);
    let a_now = gd.wait_id(a).unwrap().timeout(WAIT).await.unwrap();
    assert_eq!(a_now, Settled::Failed("cancelled".into()));
    let b_now = gd.wait_id(b).unwrap().timeout(WAIT).await.unwrap();
    assert!(
        matches!(b_now, Settled::Parked { .. }),
        "the other shard's instance of the same id is untouched: {b_now:?}"
    );
    // A retry reaches the cancelled instance (it awaits its signal again), and a signal by
    // id each instance on its own shard.
    gd.retry(a).await.unwrap();
    let a_parked = gd.wait_id(a).unwrap().timeout(WAIT).await.unwrap();
    assert!(matches!(a_parked, Settled::Parked { .. }), "{a_parked:?}");
    gd.signal_id(a, "go", json!({ "v": "a" }))
        .unwrap()
        .await
        .unwrap();
    let a_done = gd
        .wait_id(a)
        .unwrap()
        .until_terminal()
        .timeout(WAIT)
        .await
        .unwrap();
    assert_eq!(a_done, Settled::Done(json!({ "v": "a" })));
    gd.signal_id(b, "go", json!({ "v": "b" }))
        .unwrap()
        .await
        .unwrap();
    let b_done = gd
        .wait_id(b)
        .unwrap()
        .until_terminal()
        .timeout(WAIT)
        .await
        .unwrap();
    assert_eq!(b_done, Settled::Done(json!({ "v": "b" })));

    // A shard this client does not have, and a correlation key other than the routing key.
    let nowhere = ShardedId { shard: 2, id: a.id };
    assert!(matches!(
        gd.wait_id(nowhere),
        Err(Error::InvalidInput { what: "shard", .. })
    ));
    assert!(matches!(
        gd.cancel(nowhere).await,
        Err(Error::InvalidInput { what: "shard", .. })
    ));
    assert!(matches!(
        gd.explain_id(nowhere).await,
        Err(Error::InvalidInput { what: "shard", .. })
    ));
    let other_key = gd
        .insert::<Parked>("order:1", Count::default())
        .correlation_key("order:2")
        .await;
    assert!(
        matches!(
            other_key,
            Err(Error::InvalidInput {
                what: "correlation_key",
                ..
            })
        ),
        "{other_key:?}"
    );
    s.close().await;
}

/// The shard of a key is part of the stored data: these answers must never change (a
/// change of the hash, of the bytes hashed, or of the shard arithmetic fails here).
#[tokio::test]
async fn the_shard_of_a_key_never_changes() {
    let pool = PgPool::connect_lazy("postgres://postgres@127.0.0.1:5432/postgres").unwrap();
    let client = Client::new(pool);
    let over = |n: usize| ShardedClient::new(vec![client.clone(); n]).unwrap();
    let counts = [1, 2, 3, 4, 5, 8, 16, 100];
    let golden: [(&str, [usize; 8]); 8] = [
        ("order:42", [0, 1, 1, 3, 3, 3, 3, 55]),
        ("order:43", [0, 0, 2, 2, 2, 6, 6, 63]),
        ("user:alice", [0, 1, 2, 2, 2, 2, 15, 64]),
        ("report:2026-11-30", [0, 0, 0, 0, 0, 0, 13, 13]),
        ("", [0, 1, 1, 1, 1, 1, 13, 90]),
        ("tenant/7/invoice/2026-001", [0, 1, 1, 1, 4, 4, 4, 54]),
        ("été", [0, 0, 0, 3, 4, 7, 15, 94]),
        ("🦀", [0, 0, 0, 3, 3, 3, 3, 92]),
    ];
    for (n, column) in counts.iter().zip(0..) {
        let gd = over(*n);
        for (key, expected) in &golden {
            assert_eq!(
                gd.shard_of(key),
                expected[column],
                "{key:?} over {n} shards"
            );
        }
    }
    // The first 40 keys of the first test, over two shards.
    let two = over(2);
    let shards: Vec<usize> = (0..40)
        .map(|i| two.shard_of(&format!("order:{i}")))
        .collect();
    assert_eq!(
        shards,
        [
            1, 1, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 0, 1, 1, 1, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 0, 0, 1,
            1, 1, 0, 0, 1, 0, 0, 1, 1, 0, 1
        ]
    );
}

#[tokio::test]
async fn an_empty_list_of_shards_is_a_typed_error() {
    let err = ShardedClient::new(Vec::new()).unwrap_err();
    assert!(matches!(err, Error::InvalidConfig(_)), "{err:?}");
}

/// R4B-6: a down shard's calls fail fast and name the shard. Shard 1 is a pool of
/// `connect_lazy` to a port where no server listens: an insert routed to it fails within
/// a few seconds (`SHARD_ACQUIRE_TIMEOUT`, not sqlx's 30 s) with `Error::Shard` naming
/// shard 1, and shard 0 goes on.
#[tokio::test]
async fn r4b_6_a_down_shard_fails_fast_and_names_itself() {
    let db = TestDb::new().await;
    let o = db.options();
    let up = format!(
        "postgres://{}@{}:{}/{}",
        o.get_username(),
        o.get_host(),
        o.get_port(),
        db.name()
    );
    // A port nothing listens on: bound, then released.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let down = format!("postgres://postgres@127.0.0.1:{port}/postgres");
    let gd = ShardedClient::connect_lazy([up.as_str(), down.as_str()]).unwrap();
    let key = |shard: usize| {
        (0..)
            .map(|n| format!("order:{n}"))
            .find(|k| gd.shard_of(k) == shard)
            .unwrap()
    };
    let started = std::time::Instant::now();
    let e = gd
        .insert::<Parked>(key(1), Count::default())
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert!(
        matches!(&e, Error::Shard { shard: 1, .. }),
        "{e:?} ({e}) names shard 1"
    );
    assert!(e.to_string().starts_with("shard 1: "), "{e}");
    assert!(took < Duration::from_secs(10), "failed after {took:?}");
    let e = gd
        .wait(Key(key(1)))
        .timeout(Duration::from_secs(60))
        .await
        .unwrap_err();
    assert!(matches!(&e, Error::Shard { shard: 1, .. }), "{e:?}");
    let up_id = gd.insert::<Parked>(key(0), Count::default()).await.unwrap();
    assert_eq!(up_id.shard, 0);
    db.close().await;
}
