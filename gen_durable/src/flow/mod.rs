//! Flow control through a client: gates and rate limits declared or changed at run time,
//! and their use read back. and the periodic schedules a node declares and fires.

mod gate;
mod rate_limit;
pub(crate) mod schedule;
