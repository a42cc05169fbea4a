//! What a step reads besides its state: the signals in its inbox, and its children once
//! they have all ended.

use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::model::status::Status;

/// A signal in an instance's inbox.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Signal {
    /// Its id: consumption is by id, never by name.
    pub id: i64,
    /// Its name.
    pub name: String,
    /// Its JSON payload.
    pub payload: Value,
    /// Its dedup key, if it was sent with one.
    pub dedup_key: Option<String>,
    /// When it was stored (database clock).
    pub inserted_at: DateTime<Utc>,
}

impl Signal {
    /// The payload.
    pub fn payload(&self) -> &Value {
        &self.payload
    }
}

/// A child instance as its parent sees it after `schedule_children`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ChildInfo {
    /// The child's id.
    pub id: i64,
    /// The child's FSM name.
    pub fsm: String,
    /// Its status when the parent's step was claimed.
    pub status: Status,
    /// Its state.
    pub state: Value,
    /// Its result, if `done`.
    pub result: Option<Value>,
    /// Its error, if `failed`.
    pub last_error: Option<String>,
}
