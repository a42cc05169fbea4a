//! Shared test fixtures: hand-written FSMs (the engine's tests do not depend on the
//! macros) and small helpers.
#![allow(dead_code)]

pub mod scenario;

use gen_durable::{Ctx, DurableState, Fsm, Step, StepFuture};
use serde::{Deserialize, Serialize};

/// A state with one required and one optional field.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Order {
    pub order: u64,
    #[serde(default)]
    pub paid: Option<u64>,
}

impl DurableState for Order {
    const TYPE_NAME: &'static str = "Order";
}

/// A two-step FSM whose steps are never run by the client tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checkout {
    Reserve,
    Ship,
}

impl Fsm for Checkout {
    type State = Order;
    const NAME: &'static str = "Checkout";
    const VERSION: i32 = 2;
    const QUEUE: &'static str = "checkout";
    const STEPS: &'static [&'static str] = &["reserve", "ship"];

    fn initial() -> Self {
        Checkout::Reserve
    }
    fn step_name(self) -> &'static str {
        match self {
            Checkout::Reserve => "reserve",
            Checkout::Ship => "ship",
        }
    }
    fn from_step_name(name: &str) -> Option<Self> {
        match name {
            "reserve" => Some(Checkout::Reserve),
            "ship" => Some(Checkout::Ship),
            _ => None,
        }
    }
    fn run_step<'a>(self, _ctx: &'a mut Ctx<Self>) -> StepFuture<'a, Self> {
        Box::pin(async move { Ok(Step::done(serde_json::json!({"shipped": true}))) })
    }
}

/// A registry with the fixtures, for `Client::with_registry`.
pub fn registry() -> gen_durable::Registry {
    let mut r = gen_durable::Registry::new();
    r.register::<Checkout>();
    r
}

/// One column of one instance, as text, for assertions.
pub async fn column(pool: &sqlx::PgPool, id: i64, col: &str) -> Option<String> {
    sqlx::query_scalar(&format!(
        "SELECT ({col})::text FROM gd_instances WHERE id = $1"
    ))
    .bind(id)
    .fetch_one(pool)
    .await
    .expect("row exists")
}

/// The URL of `db`, for a binary of the CLI (`--database-url`).
pub fn database_url(db: &gen_durable_testkit::TestDb) -> String {
    let o = db.options();
    format!(
        "postgres://{}@{}:{}/{}",
        o.get_username(),
        o.get_host(),
        o.get_port(),
        db.name()
    )
}

pub async fn count(pool: &sqlx::PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql)
        .fetch_one(pool)
        .await
        .expect("count query")
}

/// Hand-rolls an `Fsm` impl for tests, so engine tests don't depend on the macros:
///
/// ```ignore
/// test_fsm!(Counter, state = Count, queue = "q", version = 1, {
///     A => "a" |ctx| { ctx.state.n += 1; Ok(Step::next(Counter::B)) },
///     B => "b" |ctx| { Ok(Step::done(json!(ctx.state.n))) },
/// });
/// ```
#[macro_export]
macro_rules! test_fsm {
    ($name:ident, state = $state:ty, queue = $queue:expr, version = $ver:expr,
     { $($variant:ident => $sname:literal |$ctx:ident| $body:block),+ $(,)? }
     $(, handle |$err:ident, $hctx:ident| $hbody:block)? $(, max_reaps = $mr:expr)?
     $(, rates |$rstep:ident, $rstate:ident| $rbody:block)? $(, history = $hist:expr)?) => {
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum $name { $($variant),+ }
        impl ::gen_durable::Fsm for $name {
            type State = $state;
            const NAME: &'static str = stringify!($name);
            const VERSION: i32 = $ver;
            const QUEUE: &'static str = $queue;
            $(const MAX_REAPS: i32 = $mr;)?
            $(const HISTORY: ::gen_durable::HistoryLevel = $hist;)?
            const STEPS: &'static [&'static str] = &[$($sname),+];
            fn initial() -> Self { [$($name::$variant),+][0] }
            fn step_name(self) -> &'static str { match self { $($name::$variant => $sname),+ } }
            fn from_step_name(name: &str) -> Option<Self> {
                match name { $($sname => Some($name::$variant),)+ _ => None }
            }
            #[allow(unused_mut)]
            fn run_step<'a>(self, ctx: &'a mut ::gen_durable::Ctx<Self>) -> ::gen_durable::StepFuture<'a, Self> {
                match self {
                    $($name::$variant => Box::pin(async move { let $ctx = ctx; $body }),)+
                }
            }
            $(fn handle<'a>($err: ::gen_durable::StepError, ctx: &'a mut ::gen_durable::Ctx<Self>) -> ::gen_durable::StepFuture<'a, Self> {
                Box::pin(async move { let $hctx = ctx; $hbody })
            })?
            // What `#[step(rate_limit = …)]` generates: the limit a step declares.
            $(fn step_rate_limit(self, $rstate: &Self::State) -> Option<::gen_durable::StepRate> {
                let $rstep = self;
                $rbody
            }
            fn rate_limited(self) -> bool { true })?
        }
    };
}

/// A JSON state for tests.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Count {
    #[serde(default)]
    pub n: i64,
    #[serde(default)]
    pub log: Vec<String>,
}

impl DurableState for Count {
    const TYPE_NAME: &'static str = "Count";
}

/// Polls `cond` every 10 ms until it holds or `secs` pass; panics with `what` otherwise.
pub async fn eventually<F, Fut>(secs: u64, what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(secs);
    while !cond().await {
        if tokio::time::Instant::now() > deadline {
            panic!("timed out after {secs}s waiting for: {what}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// Like [`eventually`], but a timeout also prints what `describe` says of the world then
/// (a row's columns, its history), so that a rare failure can be read from its log.
pub async fn eventually_or_show<F, Fut, D, DFut>(secs: u64, what: &str, mut cond: F, describe: D)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
    D: FnOnce() -> DFut,
    DFut: std::future::Future<Output = String>,
{
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(secs);
    while !cond().await {
        if tokio::time::Instant::now() > deadline {
            panic!(
                "timed out after {secs}s waiting for: {what}\nthen: {}",
                describe().await
            );
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// An instance's row and history as text, for a timeout's message.
pub async fn show_instance(pool: &sqlx::PgPool, id: i64) -> String {
    let row: Option<String> = sqlx::query_scalar(
        "SELECT row_to_json(x)::text FROM (SELECT i.step, i.status, gd_status_of(i) AS seen,
                i.locked_by, i.lease_epoch, i.ready_seq, i.attempt, i.last_error,
                gd_holder(i) AS holder FROM gd_instances i WHERE id = $1) x",
    )
    .bind(id)
    .fetch_optional(pool)
    .await
    .ok()
    .flatten();
    let history: Vec<String> = sqlx::query_scalar(
        "SELECT row_to_json(h)::text FROM gd_history h WHERE instance_id = $1 ORDER BY entry",
    )
    .bind(id)
    .fetch_all(pool)
    .await
    .unwrap_or_default();
    let batches: Vec<String> =
        sqlx::query_scalar("SELECT row_to_json(b)::text FROM gd_batches b ORDER BY lane, batch")
            .fetch_all(pool)
            .await
            .unwrap_or_default();
    format!("row {row:?}; history {history:?}; batches {batches:?}")
}

/// The status of an instance.
pub async fn status(pool: &sqlx::PgPool, id: i64) -> String {
    // As readers see it: a plain row whose step runs from the log is `executing`.
    sqlx::query_scalar("SELECT gd_status_of(i)::text FROM gd_instances i WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .expect("status is never null")
}

/// Waits until the instance is terminal; returns its status.
pub async fn finished(pool: &sqlx::PgPool, id: i64, secs: u64) -> String {
    eventually(secs, &format!("instance {id} to finish"), || async move {
        matches!(status(pool, id).await.as_str(), "done" | "failed")
    })
    .await;
    status(pool, id).await
}

/// Collects telemetry events for assertions.
#[derive(Clone, Default)]
pub struct Events(pub std::sync::Arc<std::sync::Mutex<Vec<gen_durable::Event>>>);

impl Events {
    pub fn handler(&self) -> impl Fn(&gen_durable::Event) + Send + Sync + 'static {
        let v = self.0.clone();
        move |e| v.lock().unwrap().push(e.clone())
    }
    pub fn all(&self) -> Vec<gen_durable::Event> {
        self.0.lock().unwrap().clone()
    }
}
