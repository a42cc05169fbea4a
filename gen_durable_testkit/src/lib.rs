//! Testing support for gen_durable.
//!
//! - [`pg::TestDb`]: a fresh, migrated Postgres database per test, so tests run in
//!   parallel without sharing rows. Use it in your own test suites too.
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub, missing_debug_implementations)]

pub mod pg;

pub use pg::TestDb;
