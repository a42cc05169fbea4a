//! Test support for gen_durable's own suites: the FSMs the reliability tests and the
//! chaos soak run in separate worker processes, and small shared helpers. The
//! integration tests live in `tests/` and the runnable examples in `examples/`.

pub mod fsms;
pub mod scratch;
pub mod worker;
