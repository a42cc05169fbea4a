//! The status of an instance.

use std::fmt;
use std::str::FromStr;

/// Where an instance is in its life. Stored as the Postgres enum `gd_status`; on the wire
/// it is text (`status::text` out, `$n::gd_status` in), so that no statement of the
/// engine needs sqlx to look the enum's type up (see [`Pooler`](crate::Pooler)).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Runs its step once `eligible_at <= now()`.
    Runnable,
    /// A worker holds its lease.
    Executing,
    /// Parked until a signal named in `awaits` arrives, or the deadline passes.
    AwaitingSignal,
    /// Parked until every child is terminal.
    AwaitingChildren,
    /// Finished with a result (terminal).
    Done,
    /// Stopped for good with `last_error` (terminal).
    Failed,
}

impl Status {
    /// Every status, in the order an instance can reach them.
    pub const ALL: [Status; 6] = [
        Status::Runnable,
        Status::Executing,
        Status::AwaitingSignal,
        Status::AwaitingChildren,
        Status::Done,
        Status::Failed,
    ];

    /// Every status that is not terminal: the default unique scope.
    pub const NON_TERMINAL: [Status; 4] = [
        Status::Runnable,
        Status::Executing,
        Status::AwaitingSignal,
        Status::AwaitingChildren,
    ];

    /// `done` or `failed`.
    pub fn is_terminal(self) -> bool {
        matches!(self, Status::Done | Status::Failed)
    }

    /// The stored name, e.g. `awaiting_signal`.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Runnable => "runnable",
            Status::Executing => "executing",
            Status::AwaitingSignal => "awaiting_signal",
            Status::AwaitingChildren => "awaiting_children",
            Status::Done => "done",
            Status::Failed => "failed",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Status {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Status::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| format!("unknown status {s:?}"))
    }
}

impl sqlx::Type<sqlx::Postgres> for Status {
    fn type_info() -> sqlx::postgres::PgTypeInfo {
        <&str as sqlx::Type<sqlx::Postgres>>::type_info()
    }

    fn compatible(ty: &sqlx::postgres::PgTypeInfo) -> bool {
        <&str as sqlx::Type<sqlx::Postgres>>::compatible(ty)
    }
}

impl<'r> sqlx::Decode<'r, sqlx::Postgres> for Status {
    fn decode(value: sqlx::postgres::PgValueRef<'r>) -> Result<Self, sqlx::error::BoxDynError> {
        Ok(<&str as sqlx::Decode<sqlx::Postgres>>::decode(value)?.parse()?)
    }
}
