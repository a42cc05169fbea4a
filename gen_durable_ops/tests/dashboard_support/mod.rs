//! What the dashboard tests share: a database seeded with an instance in every status, a
//! parent with a tree of children, a parked instance with an inbox and a history, a node, a paused
//! queue and a finished history for the chart; and a fingerprint of every row, to prove
//! a refused action changed nothing.
#![allow(dead_code)]

pub(crate) mod http;

use sqlx::PgPool;

/// The ids of the seeded instances.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Seeded {
    pub(crate) runnable: i64,
    pub(crate) executing: i64,
    /// Awaiting `payment_confirmed` (deadline in an hour), an unrelated signal in its inbox,
    /// correlation key `order:42`; five history entries (the first holds a state).
    pub(crate) parked: i64,
    pub(crate) failed: i64,
    /// Awaiting its children: `child_done` (done) and `child_mid` (itself awaiting its
    /// child `grandchild`, runnable).
    pub(crate) parent: i64,
    pub(crate) child_done: i64,
    pub(crate) child_mid: i64,
    pub(crate) grandchild: i64,
    /// A runnable row of `Checkout@1`, which no live node registers.
    pub(crate) old_version: i64,
}

/// The operator token the tests start an operator dashboard with.
/// At least 32 bytes, as the dashboard requires.
pub(crate) const TOKEN: &str = "test-operator-token-0123456789abcdef0123456789";

async fn insert(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

/// Seeds `pool` (a fresh `TestDb`).
pub(crate) async fn seed(pool: &PgPool) -> Seeded {
    sqlx::query(
        "INSERT INTO gd_nodes (node_id, queues, fsms)
         VALUES ('node-a', '{checkout,fanout,mail}', '{Checkout@2,Fanout@1,Mail@1}')",
    )
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO gd_schedules (name, pattern, timezone, catch_up, next_fire, skipped)
         VALUES ('nightly-report', '0 2 * * *', 'Europe/Paris', 'run_once', now() + interval '1 day', 3)",
    )
    .execute(pool)
    .await
    .unwrap();
    sqlx::query("INSERT INTO gd_queue_pauses (queue, reason) VALUES ('mail', 'smtp maintenance')")
        .execute(pool)
        .await
        .unwrap();
    // A finished history: done and failed rows over the last half hour, for the chart.
    sqlx::query(
        "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, status, result,
                                   last_error, inserted_at, updated_at)
         SELECT 'Mail', 1, 'send', '{}', 'mail',
                CASE WHEN g % 7 = 0 THEN 'failed' ELSE 'done' END::gd_status,
                CASE WHEN g % 7 = 0 THEN NULL ELSE '{\"sent\": true}' END::jsonb,
                CASE WHEN g % 7 = 0 THEN 'smtp refused' END,
                now() - (g * 25 + 5) * interval '1 second',
                now() - (g * 25) * interval '1 second'
           FROM generate_series(1, 60) g",
    )
    .execute(pool)
    .await
    .unwrap();
    let runnable = insert(
        pool,
        "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, eligible_at)
         VALUES ('Checkout', 2, 'reserve', '{\"order\": 41}', 'checkout', now() - interval '90 seconds')
         RETURNING id",
    )
    .await;
    let executing = insert(
        pool,
        "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, status, locked_by,
                                   lease_epoch, lease_expires_at)
         VALUES ('Checkout', 2, 'ship', '{\"order\": 40}', 'checkout', 'executing', 'node-a', 1,
                 now() + interval '30 seconds')
         RETURNING id",
    )
    .await;
    let parked = insert(
        pool,
        "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, status, awaits,
                                   await_deadline, unique_key, unique_scope)
         VALUES ('Checkout', 2, 'ship', '{\"order\": 42}', 'checkout', 'awaiting_signal',
                 '{payment_confirmed}', now() + interval '1 hour', 'order:42',
                 '{runnable,executing,awaiting_signal,awaiting_children}')
         RETURNING id",
    )
    .await;
    sqlx::query(
        "INSERT INTO gd_signals (target_id, name, payload, dedup_key)
         VALUES ($1, 'address_changed', '{\"city\": \"Lyon\"}', 'evt-1')",
    )
    .bind(parked)
    .execute(pool)
    .await
    .unwrap();
    // Its history: a step, a retry, a lost lease, the step again, the await it parks in.
    sqlx::query(
        "INSERT INTO gd_history (instance_id, at, kind, step, attempt, started_at, next_step,
                                 node, error, state)
         VALUES
           ($1, now() - interval '61.9 s', 'next', 'reserve', 1, now() - interval '62 s',
            'charge', 'node-a', NULL, '{\"order\": 42}'),
           ($1, now() - interval '59 s', 'retry', 'charge', 1, now() - interval '61.5 s',
            NULL, 'node-a', 'card declined', '{\"order\": 42, \"reserved\": true}'),
           ($1, now() - interval '45 s', 'lease_lost', 'charge', 2, NULL, NULL, 'node-b',
            'lease lost on node-b (batch 17); retrying', NULL),
           ($1, now() - interval '39 s', 'next', 'charge', 3, now() - interval '41 s',
            'request_payment', 'node-a', NULL, '{\"order\": 42, \"reserved\": true}'),
           ($1, now() - interval '30 s', 'await', 'request_payment', 1, now() - interval '31 s',
            'ship', 'node-a', NULL, '{\"order\": 42, \"charged\": 1200}')",
    )
    .bind(parked)
    .execute(pool)
    .await
    .unwrap();
    let failed = insert(
        pool,
        "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, status, last_error, attempt)
         VALUES ('Checkout', 2, 'reserve', '{\"order\": 43}', 'checkout', 'failed',
                 'payment provider said no', 3)
         RETURNING id",
    )
    .await;
    let parent = insert(
        pool,
        "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, status, children_pending)
         VALUES ('Fanout', 1, 'gather', '{}', 'fanout', 'awaiting_children', 1)
         RETURNING id",
    )
    .await;
    let child =
        |status: &'static str, parent: i64| {
            let sql =
                format!(
            "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, status, parent_id,
                                       children_pending, result)
             VALUES ('Fanout', 1, 'part', '{{}}', 'fanout', '{status}', {parent},
                     {pending}, {result})
             RETURNING id",
            pending = i32::from(status == "awaiting_children"),
            result = if status == "done" { "'{\"part\": 1}'" } else { "NULL" },
        );
            async move { insert(pool, &sql).await }
        };
    let child_done = child("done", parent).await;
    let child_mid = child("awaiting_children", parent).await;
    let grandchild = child("runnable", child_mid).await;
    let old_version = insert(
        pool,
        "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue)
         VALUES ('Checkout', 1, 'reserve', '{}', 'checkout') RETURNING id",
    )
    .await;
    sqlx::query("ANALYZE gd_instances")
        .execute(pool)
        .await
        .unwrap();
    Seeded {
        runnable,
        executing,
        parked,
        failed,
        parent,
        child_done,
        child_mid,
        grandchild,
        old_version,
    }
}

/// Seeds flow control (after [`seed`] or alone), in queue `payments`: gate `stripe` of
/// K = 2 whose key `acme` is full (2 executing rows, slots 0 and 1) with one row waiting,
/// and whose key `beta` runs 1 of 2; gate `smtp` (K = 5) with no key in use; rate limit
/// `carrier` (one token an hour, burst 5) whose bucket `eu` is 3 tokens below zero
/// (reserved by waiting rows) and whose bucket `us` has 2; rate limit `sms` with no
/// bucket.
pub(crate) async fn seed_flow_control(pool: &PgPool) {
    let gd = gen_durable::Client::new(pool.clone());
    gd.set_gate("stripe", gen_durable::Gate::new(2))
        .await
        .unwrap();
    gd.set_gate("smtp", gen_durable::Gate::new(5))
        .await
        .unwrap();
    let hourly = gen_durable::RateLimit::per(1, std::time::Duration::from_secs(3600)).burst(5);
    gd.set_rate_limit("carrier", hourly).await.unwrap();
    gd.set_rate_limit("sms", hourly).await.unwrap();
    sqlx::query(
        "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, status, locked_by,
                                   lease_epoch, lease_expires_at, gate, partition_key, gate_slot)
         SELECT 'Charge', 1, 'charge', '{}', 'payments', 'executing', 'node-a', 1,
                now() + interval '30 seconds', 'stripe', k, slot
           FROM (VALUES ('acme', 0::int2), ('acme', 1::int2), ('beta', 0::int2)) v(k, slot)",
    )
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO gd_instances (fsm, fsm_version, step, state, queue, gate, partition_key)
         VALUES ('Charge', 1, 'charge', '{}', 'payments', 'stripe', 'acme')",
    )
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO gd_buckets (name, key, tokens, at)
         VALUES ('carrier', 'eu', -3, now()), ('carrier', 'us', 2, now())",
    )
    .execute(pool)
    .await
    .unwrap();
}

/// Every instance and signal as text, in id order: equal fingerprints, nothing changed.
pub(crate) async fn fingerprint(pool: &PgPool) -> String {
    sqlx::query_scalar(
        "SELECT (SELECT string_agg(i::text, E'\\n' ORDER BY id) FROM gd_instances i)
                || E'\\n--\\n' ||
                coalesce((SELECT string_agg(s::text, E'\\n' ORDER BY id) FROM gd_signals s), '')",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// (status, last_error) of one instance.
pub(crate) async fn status_of(pool: &PgPool, id: i64) -> (String, Option<String>) {
    sqlx::query_as("SELECT status::text, last_error FROM gd_instances WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}
