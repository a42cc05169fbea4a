//! Testing support for gen_durable.
//!
//! - [`TestKit`]: the in-memory engine on a virtual clock. It runs your FSM and job
//!   types through the same step runner as the Postgres engine and commits each outcome
//!   with the same effects (one conformance suite holds the two to the same behaviour).
//!   Nothing sleeps: schedules, replays and await timeouts fire when the test
//!   [`advance`](TestKit::advance)s the clock. Steps run one at a time in the pick's
//!   order, so a test gives the same result every time.
//! - [`Instance`]: a snapshot of one instance (row, inbox, children) with assertions
//!   whose failure messages show its status, step and last error — from the kit or,
//!   through [`Instance::load`], from Postgres.
//! - [`TestDb`]: a fresh, migrated Postgres database per test, so tests run in
//!   parallel without sharing rows. Use it in your own test suites too.
//!
//! # Testing a workflow with the kit
//!
//! ```
//! # use gen_durable::prelude::*;
//! # #[derive(DurableState, Serialize, Deserialize, Default, Debug, Clone)]
//! # pub struct CheckoutState { pub order: u64 }
//! # #[durable_fsm(state = CheckoutState, queue = "checkout")]
//! # pub enum Checkout { #[initial] Reserve, Ship }
//! # #[durable_steps]
//! # impl Checkout {
//! #     async fn reserve(_ctx: &mut Ctx<Self>) -> StepResult<Self> {
//! #         Ok(Step::await_signal(["payment_confirmed"], Checkout::Ship).timeout(Duration::from_secs(3600)))
//! #     }
//! #     async fn ship(ctx: &mut Ctx<Self>) -> StepResult<Self> {
//! #         match ctx.awaited().first() {
//! #             Some(s) => Ok(Step::done(json!({ "paid": s.payload()["amount"] }))),
//! #             None => Ok(Step::stop("payment timed out")),
//! #         }
//! #     }
//! # }
//! use gen_durable_testkit::TestKit;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> gen_durable::Result<()> {
//! let mut kit = TestKit::new();
//! let paid = kit.insert::<Checkout>(CheckoutState { order: 1 }).await?;
//! let late = kit.insert::<Checkout>(CheckoutState { order: 2 }).await?;
//! assert_eq!(kit.run_until_idle().await.to_string(), "{await: 2, steps: 2}");
//! kit.assert_awaiting(paid, ["payment_confirmed"]);
//!
//! kit.signal(paid, "payment_confirmed", json!({ "amount": 100 })).await?;
//! kit.run_until_idle().await;
//! kit.assert_done(paid, json!({ "paid": 100 }));
//!
//! kit.advance(Duration::from_secs(3600)); // past the timeout
//! kit.run_until_idle().await;
//! kit.assert_failed(late, "payment timed out");
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub, missing_debug_implementations)]

mod builders;
mod drain;
mod instance;
mod kit;
pub mod pg;
pub mod statements;
mod store;
mod tally;

pub use builders::{KitInsert, KitInsertJson, KitSignal, KitWait, SignalSender};
pub use drain::{drain, fire_timeouts, Drain, DrainError, DEFAULT_DRAIN_STEPS};
pub use instance::Instance;
pub use kit::{epoch, TestKit, DEFAULT_MAX_STEPS};
pub use pg::TestDb;
pub use store::{KIT_ACTOR, KIT_LEASE, KIT_NODE};
pub use tally::Tally;
