//! # gen_durable_ops
//!
//! The operator tools of [`gen_durable`]: the `gen_durable` command line
//! (`migrate`, `status`, `inspect`, `explain`, `signal`, `cancel`, `retry`, `restart`,
//! `pause`, `resume`, `migrate-instances`, `gc`, `dashboard`) and the web [`dashboard`].
//!
//! `cargo install gen_durable_ops` installs the `gen_durable` binary. It links no FSM and
//! no instance migration, so `gen_durable migrate-instances` needs a binary of your own
//! that links them: its `main` calls [`main`].
//!
//! ```no_run
//! // src/bin/gen_durable.rs of your application, next to the FSMs and their
//! // `#[durable_migration]`s (linked in by using your crate).
//! use my_app as _;
//!
//! fn main() -> std::process::ExitCode {
//!     gen_durable_ops::main()
//! }
//! # mod my_app {}
//! ```
//!
//! The dashboard also runs inside your own axum server:
//! [`dashboard::router`]`(pool)` for read-only pages, [`dashboard::router_with`] and an
//! operator token for a dashboard that can act.
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub, missing_debug_implementations)]

mod cli;
pub mod dashboard;
mod store;

use std::process::ExitCode;

/// Runs the `gen_durable` command line on the process's arguments and environment, and
/// returns its exit code (`gen_durable --help` lists the commands and the codes).
///
/// Call it from your own binary's `main` when it must know your FSMs: `migrate-instances`
/// applies the instance migrations linked into the binary that runs it, and `restart`
/// checks a step against the FSMs this process registers when no live node announces
/// them. It starts its own single-threaded tokio runtime, so call it outside one.
pub fn main() -> ExitCode {
    cli::main()
}
