//! # gen_durable
//!
//! Durable finite-state machines for Rust on PostgreSQL. Declare an FSM, insert
//! instances, deliver signals; workers run one step at a time outside any transaction
//! and commit each step's outcome, fenced by a lease, before the instance goes on. A
//! process may die at any instruction: the instance resumes from its last committed step.
//!
//! ```no_run
//! use gen_durable::prelude::*;
//!
//! #[derive(DurableState, Serialize, Deserialize, Default, Debug, Clone)]
//! pub struct CheckoutState {
//!     pub order: u64,
//!     #[durable(default)]
//!     pub paid: Option<u64>,
//! }
//!
//! // The variants are the steps; transitions name variants, so a wrong target is a
//! // compile error.
//! #[durable_fsm(state = CheckoutState, queue = "checkout", version = 2)]
//! pub enum Checkout {
//!     #[initial]
//!     Reserve,
//!     Ship,
//! }
//!
//! #[durable_steps]
//! impl Checkout {
//!     async fn reserve(ctx: &mut Ctx<Self>) -> StepResult<Self> {
//!         Ok(Step::await_signal(["payment_confirmed"], Checkout::Ship)
//!             .timeout(Duration::from_secs(3600)))
//!     }
//!
//!     async fn ship(ctx: &mut Ctx<Self>) -> StepResult<Self> {
//!         let paid = ctx.awaited().first().map(|s| s.payload()["amount"].clone());
//!         Ok(Step::done(json!({ "shipped": true, "paid": paid })))
//!     }
//!
//!     /// Optional: what a failed step (an `Err` or a panic) turns into.
//!     async fn handle(err: StepError, ctx: &mut Ctx<Self>) -> StepResult<Self> {
//!         if ctx.attempt() < 5 { Ok(Step::replay(backoff(ctx.attempt()))) } else { Ok(Step::stop(err)) }
//!     }
//! }
//!
//! /// The job form: a one-step FSM with retries (`SendWelcome` is generated).
//! #[durable_job(queue = "mail", max_attempts = 20)]
//! async fn send_welcome(args: CheckoutState, ctx: &mut JobCtx) -> JobResult {
//!     Ok(json!({ "sent": args.order }))
//! }
//!
//! # async fn run(pool: sqlx::PgPool) -> gen_durable::Result<()> {
//! gen_durable::migrate_schema(&pool).await?;
//! let gd = Client::new(pool.clone());
//! let id = gd.insert::<Checkout>(CheckoutState { order: 42, ..Default::default() })
//!     .partition_key("order:42")
//!     .await?;
//! gd.signal(id, "payment_confirmed", json!({ "amount": 100 })).dedup_key("evt-7").await?;
//! gd.insert::<SendWelcome>(CheckoutState { order: 42, paid: None }).await?;
//!
//! let engine = Engine::builder(pool).queue("checkout", 5).queue("mail", 10).start().await?;
//! let report = engine.shutdown(Duration::from_secs(30)).await; // graceful drain
//! # Ok(()) }
//! ```
//!
//! # A map of the API
//!
//! | to… | start at |
//! |---|---|
//! | declare a workflow | [`durable_fsm`], [`durable_steps`], [`durable_job`]; a step returns a [`Step`] |
//! | insert, signal, wait, explain | [`Client`] ([`Client::insert`], [`Client::signal`], [`Client::wait`], [`Client::explain`]) |
//! | run the steps | [`Engine::builder`], [`QueueConfig`], [`Engine::shutdown`] |
//! | limit what runs | partition keys and gates ([`Gate`], [`LimitKey`]), [`RateLimit`], [`Client::pause_queue`] |
//! | run on a timetable | [`Schedule`] |
//! | change a workflow in flight | [`Migration`], [`durable_migration`], [`Client::migrate_instances`] |
//! | see what happened | [`Client::history`], [`Client::fork`], [`Event`] |
//! | act as an operator | [`Client::cancel`], [`Client::retry`], [`Client::restart`], [`Filter`] |
//! | test | the `gen_durable_testkit` crate: the same FSMs in memory on a virtual clock |
//! | handle errors | [`Error`]: each variant says what was wrong, and nothing was written |
//!
//! The guide (`docs/guide/` in the repository) covers each topic in prose: FSMs and steps,
//! flow control, schedules, instance migrations, history, testing, telemetry, operating,
//! the dashboard, configuration, deployment and scaling. `docs/design/reliability.md`
//! states the guarantees and the test behind each.
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub, missing_debug_implementations)]

mod client;
mod engine;
mod flow;
mod model;
mod ops;
mod runtime;
mod store;
mod telemetry;

// Prometheus metrics (feature `metrics`).
#[cfg(feature = "metrics")]
pub use ops::metrics;

// Not part of the stable API: the door for gen_durable_ops and gen_durable_testkit.
#[doc(hidden)]
pub mod backend;

/// A time zone for [`Schedule::with_timezone`] (`chrono_tz::Tz`): `Tz::Europe__Paris`, or
/// `"Europe/Paris".parse::<Tz>()`.
pub use chrono_tz::Tz;
pub use client::reads::HISTORY_PAGE_MAX;
pub use client::sharded::{ShardedClient, ShardedId, ShardedInsert, SHARD_ACQUIRE_TIMEOUT};
pub use client::wait::{Awaiting, Settled, Wait, DEFAULT_WAIT, DEFAULT_WAIT_TICK};
pub use client::{
    Client, Entry, Insert, InsertAll, InsertJson, SignalSend, DEFAULT_MAX_SIGNAL_PAYLOAD,
};
pub use engine::{DrainReport, Engine, EngineBuilder, QueueConfig, QueueDrain, WakeListener};
pub use flow::schedule::{fire_key, CatchUp, Schedule};
pub use model::answers::{Cancelled, Delivery};
pub use model::clock::Clock;
pub use model::error::{Error, Result};
pub use model::explain::{
    ChildState, Count, Explanation, Heartbeat, Holder, Reason, Trouble, EXPLAIN_COUNT_LIMIT,
    EXPLAIN_HISTORY_LIMIT, EXPLAIN_LIST_LIMIT,
};
pub use model::gate::{Gate, GateUse, LimitKey, MAX_GATE_SIZE};
pub use model::history::{HistoryEntry, HistoryKind, HistoryLevel, HistoryPage};
pub use model::inbox::{ChildInfo, Signal};
pub use model::options::InsertOptions;
pub use model::rate_limit::{BucketUse, RateLimit};
pub use model::rows::{Migrated, QueuePause};
pub use model::state::{cast_field, json_kind, CastError, DurableState};
pub use model::status::Status;
pub use model::step::OutcomeKind;
pub use model::target::{Key, Target};
pub use model::transition::{StepRate, YieldReason};
pub use model::validate::{MAX_DELAY, MAX_KEY_BYTES};
pub use ops::migrate_instances::{BatchOutcome, BulkPass, MigrateOptions, MigrationReport};
pub use ops::schema::migrate_schema;
pub use ops::{BulkReport, Filter, BULK_BATCH};
pub use runtime::ctx::{Ctx, JobCtx, StepContext};
pub use runtime::fsm::{
    backoff, backoff_capped, Child, Fsm, Step, StepError, StepErrorKind, StepFuture, StepResult,
};
pub use runtime::instance_migration::{Migration, MigrationEntry, MigrationError};
pub use runtime::job::{JobError, JobResult, RetryPolicy};
pub use runtime::registry::{FsmEntry, Registry};
pub use store::pooler::Pooler;
pub use telemetry::{Event, EventHandler};

pub use gen_durable_macros::*;

/// The usual imports: `use gen_durable::prelude::*;`
pub mod prelude {
    pub use crate::{
        backoff, Child, Client, Ctx, DurableState, Engine, Fsm, JobCtx, JobError, JobResult, Key,
        Migration, MigrationError, Settled, Signal, Status, Step, StepError, StepResult,
    };
    pub use gen_durable_macros::{durable_fsm, durable_job, durable_migration, durable_steps};
    pub use serde::{Deserialize, Serialize};
    pub use serde_json::json;
    pub use std::time::Duration;
}

#[doc(hidden)]
pub mod __private;

/// The README's tour, compiled by `cargo test --doc` so that it cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeTour;
