//! Flow control through a client: gates and rate limits declared or changed at run time,
//! and their use read back. (Schedules move here next.)

mod gate;
mod rate_limit;
