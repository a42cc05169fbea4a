//! Procedural macros for [gen_durable](https://docs.rs/gen_durable): `#[durable_fsm]`,
//! `#[durable_steps]`, `#[durable_job]` and `#[derive(DurableState)]`.
//!
//! Use them through `gen_durable` (`use gen_durable::prelude::*;`), never directly:
//! the generated code names `::gen_durable::__private::…`.
//!
//! Each macro parses its input into a typed AST (`parse`), checks it (`validate`) and
//! writes the output (`expand`). Every misuse is a compile error on the user's own
//! token that says how to fix it; all errors are reported at once, and the item is
//! still emitted so the rest of the crate keeps type-checking.
//!
//! # The checkout example
//!
//! ```
//! use gen_durable::prelude::*;
//! # use gen_durable::{durable_fsm, durable_steps};
//! # async fn reserve_stock(_order: u64) -> Result<(), std::io::Error> { Ok(()) }
//!
//! #[derive(DurableState, Serialize, Deserialize, Default, Debug, Clone)]
//! pub struct CheckoutState {
//!     pub order: u64,
//!     #[durable(default)]
//!     pub paid: Option<u64>,
//! }
//!
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
//!         reserve_stock(ctx.state.order).await?;
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
//! assert_eq!(Checkout::NAME, "Checkout");
//! assert_eq!(Checkout::VERSION, 2);
//! assert_eq!(Checkout::QUEUE, "checkout");
//! assert_eq!(Checkout::STEPS, ["reserve", "ship"]);
//! assert_eq!(Checkout::initial(), Checkout::Reserve);
//! assert_eq!(Checkout::from_step_name("ship"), Some(Checkout::Ship));
//!
//! let state = CheckoutState::cast(&json!({ "order": 42 })).unwrap();
//! assert_eq!((state.order, state.paid), (42, None));
//! let err = CheckoutState::cast(&json!({ "order": "42" })).unwrap_err();
//! assert_eq!(err.to_string(), "state.order: expected u64, found string");
//! ```
//!
//! # The job form
//!
//! ```
//! use gen_durable::prelude::*;
//! # use gen_durable::durable_job;
//!
//! #[derive(Serialize, Deserialize, Debug, Clone)]
//! pub struct WelcomeArgs { pub email: String }
//! # impl DurableState for WelcomeArgs { const TYPE_NAME: &'static str = "WelcomeArgs"; }
//!
//! #[durable_job(queue = "mail", max_attempts = 20)]
//! async fn send_welcome(args: WelcomeArgs, ctx: &mut JobCtx) -> JobResult {
//!     let _ = (&args.email, ctx.attempt());
//!     Ok(json!({ "sent": true }))
//! }
//!
//! assert_eq!(SendWelcome::NAME, "SendWelcome");
//! assert_eq!(SendWelcome::STEPS, ["run"]);
//! assert_eq!(SendWelcome::RETRY_POLICY.max_attempts, 20);
//! ```
use proc_macro::TokenStream;

mod common;
mod fsm;
mod job;
mod migration;
mod state;
mod steps;

/// Declares a durable FSM on a fieldless enum: the variants are the steps.
///
/// Keys: `state = Type` (required), `name = "…"` (default: the enum's name),
/// `version = N` (a positive integer literal, default 1), `queue = "…"` (default
/// `"default"`), `max_reaps = N` (default 10), `run_ahead = true` (default false),
/// `history = "full" | "steps" | "off"` (default `"steps"`: an entry per step, without
/// its state; `"full"` keeps the state each step began with). Mark the starting variant `#[initial]`;
/// a variant's stored name is its snake_case name unless `#[step(name = "…")]`.
///
/// Generates `impl Fsm` (dispatching each variant to the same-named snake_case
/// handler of the `#[durable_steps]` block), registers the type with the engine,
/// and derives `Clone, Copy, Debug, PartialEq, Eq, Hash` (those the enum does not
/// derive itself).
#[proc_macro_attribute]
pub fn durable_fsm(attr: TokenStream, item: TokenStream) -> TokenStream {
    fsm::expand(attr.into(), item.into()).into()
}

/// Marks the impl block holding an FSM's step handlers: one
/// `async fn <snake_case variant>(ctx: &mut Ctx<Self>) -> StepResult<Self>` per
/// variant, and optionally `async fn handle(err: StepError, ctx: &mut Ctx<Self>) -> StepResult<Self>`.
///
/// Every `async fn` without `self` in the block is a handler; put async helpers in
/// another `impl` block. Each handler is kept (renamed) and wrapped in a same-named
/// function returning a boxed `Send` future, which is what the FSM dispatches to.
#[proc_macro_attribute]
pub fn durable_steps(attr: TokenStream, item: TokenStream) -> TokenStream {
    steps::expand(attr.into(), item.into()).into()
}

/// Turns `async fn send_welcome(args: Args, ctx: &mut JobCtx) -> JobResult` into a
/// one-step FSM named after the function (`SendWelcome`, step `"run"`).
///
/// Keys: `queue` (default `"default"`), `max_attempts` (default 20),
/// `max_backoff_secs` (default 300), `name` (default: the generated type's name),
/// `version` (default 1), `max_reaps` (default 10). The state type is the first
/// argument's type; it must be `Clone` (each run gets a copy).
#[proc_macro_attribute]
pub fn durable_job(attr: TokenStream, item: TokenStream) -> TokenStream {
    job::expand(attr.into(), item.into()).into()
}

/// Registers an instance migration: put it on `impl Migration for NewVersion { … }`.
///
/// The impl is kept as written; the migration is submitted to the engine's registry
/// (like an FSM), so every node that links it migrates old-version rows it claims, and
/// `gen_durable migrate-instances` run from the user's binary can apply it in bulk.
#[proc_macro_attribute]
pub fn durable_migration(attr: TokenStream, item: TokenStream) -> TokenStream {
    migration::expand(attr.into(), item.into()).into()
}

/// Implements `DurableState` with field-path cast errors.
///
/// On a struct with named fields: the value must be an object; each field is cast
/// from its key (`#[serde(rename)]`/`rename_all` respected) with errors like
/// `state.order: expected u64, found string`; an absent key is an error unless the
/// field is `#[durable(default)]` (→ `Default::default()`), `#[serde(default)]` or an
/// `Option` (→ `None`). Unknown keys are ignored. `TYPE_NAME` is the type's name
/// without its module path. Other types get the serde-based default cast.
#[proc_macro_derive(DurableState, attributes(durable))]
pub fn derive_durable_state(item: TokenStream) -> TokenStream {
    state::expand(item.into()).into()
}
