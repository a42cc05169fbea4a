//! The contract, at the bottom of the crate: what an instance is (its status, its target,
//! its state and how a stored one is cast), what a step's outcome is called, the errors,
//! the clock, and the answers a store gives the caller-facing code. It imports nothing
//! else of the crate; everything else imports it.

pub(crate) mod answers;
pub(crate) mod clock;
pub(crate) mod error;
pub(crate) mod explain;
pub(crate) mod gate;
pub(crate) mod history;
pub(crate) mod inbox;
pub(crate) mod insert;
pub(crate) mod options;
pub(crate) mod rate_limit;
pub(crate) mod rows;
pub(crate) mod state;
pub(crate) mod status;
pub(crate) mod step;
pub(crate) mod target;
pub(crate) mod transition;
pub(crate) mod validate;
