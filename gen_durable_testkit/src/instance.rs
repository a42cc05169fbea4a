//! A snapshot of one instance — its row, its inbox and its children — and the
//! assertions tests make on it. The same type comes from the in-memory kit
//! ([`crate::TestKit::instance`]) and from Postgres ([`Instance::load`]), so one
//! assertion works on both.

use chrono::{DateTime, Utc};
use gen_durable::{Signal, Status};
use serde_json::Value;
use sqlx::{PgPool, Row};

/// One instance as stored: the columns of `gd_instances` a test cares about, its
/// inbox (signals in id order) and its children's ids.
#[derive(Debug, Clone, PartialEq)]
pub struct Instance {
    /// Id.
    pub id: i64,
    /// FSM name.
    pub fsm: String,
    /// FSM version.
    pub fsm_version: i32,
    /// Stored name of the step it runs next (or ran last, once terminal).
    pub step: String,
    /// Status.
    pub status: Status,
    /// State, as stored.
    pub state: Value,
    /// Result, once `done`.
    pub result: Option<Value>,
    /// The last error recorded.
    pub last_error: Option<String>,
    /// Re-executions of the current step.
    pub attempt: i32,
    /// The names the last `await_signal` named (kept by `replay`).
    pub awaits: Vec<String>,
    /// When a parked await gives up.
    pub await_deadline: Option<DateTime<Utc>>,
    /// When it may run (if `runnable`).
    pub eligible_at: DateTime<Utc>,
    /// Queue.
    pub queue: String,
    /// Priority (lower first).
    pub priority: i16,
    /// Partition key: a K = 1 key, or the key within `gate`.
    pub partition_key: Option<String>,
    /// The gate `partition_key` is a key of.
    pub gate: Option<String>,
    /// Unique key.
    pub unique_key: Option<String>,
    /// Parent, for a child.
    pub parent_id: Option<i64>,
    /// Children not yet terminal (after `schedule_children`).
    pub children_pending: i32,
    /// The inbox, in id order.
    pub inbox: Vec<Signal>,
    /// Every child's id, ascending.
    pub children: Vec<i64>,
}

impl Instance {
    /// Reads the instance correlation key `key` names: its holder or, once none holds
    /// it, the newest instance inserted with it (so a finished instance can still be
    /// asserted on by key).
    pub async fn load_by_key(pool: &PgPool, key: &str) -> sqlx::Result<Option<Instance>> {
        let id: Option<i64> = sqlx::query_scalar(
            "SELECT coalesce((SELECT id FROM gd_instances WHERE unique_guard = $1),
                             (SELECT max(id) FROM gd_instances WHERE unique_key = $1))",
        )
        .bind(key)
        .fetch_one(pool)
        .await?;
        match id {
            Some(id) => Instance::load(pool, id).await,
            None => Ok(None),
        }
    }

    /// Reads instance `id` from a gen_durable database (e.g. a [`crate::TestDb`]'s pool).
    pub async fn load(pool: &PgPool, id: i64) -> sqlx::Result<Option<Instance>> {
        let Some(row) = sqlx::query(
            "SELECT id, fsm, fsm_version, step, status::text AS status, state, result, last_error, attempt, awaits,
                    await_deadline, eligible_at, queue, priority, partition_key, gate, unique_key,
                    parent_id, children_pending
               FROM gd_instances WHERE id = $1",
        )
        .bind(id)
        .fetch_optional(pool)
        .await?
        else {
            return Ok(None);
        };
        let inbox = sqlx::query_as::<_, (i64, String, Value, Option<String>, DateTime<Utc>)>(
            "SELECT id, name, payload, dedup_key, inserted_at FROM gd_signals
              WHERE target_id = $1 ORDER BY id",
        )
        .bind(id)
        .fetch_all(pool)
        .await?
        .into_iter()
        .map(|(id, name, payload, dedup_key, inserted_at)| Signal {
            id,
            name,
            payload,
            dedup_key,
            inserted_at,
        })
        .collect();
        let children =
            sqlx::query_scalar("SELECT id FROM gd_instances WHERE parent_id = $1 ORDER BY id")
                .bind(id)
                .fetch_all(pool)
                .await?;
        Ok(Some(Instance {
            id: row.try_get("id")?,
            fsm: row.try_get("fsm")?,
            fsm_version: row.try_get("fsm_version")?,
            step: row.try_get("step")?,
            status: row.try_get("status")?,
            state: row.try_get("state")?,
            result: row.try_get("result")?,
            last_error: row.try_get("last_error")?,
            attempt: row.try_get("attempt")?,
            awaits: row.try_get("awaits")?,
            await_deadline: row.try_get("await_deadline")?,
            eligible_at: row.try_get("eligible_at")?,
            queue: row.try_get("queue")?,
            priority: row.try_get("priority")?,
            partition_key: row.try_get("partition_key")?,
            gate: row.try_get("gate")?,
            unique_key: row.try_get("unique_key")?,
            parent_id: row.try_get("parent_id")?,
            children_pending: row.try_get("children_pending")?,
            inbox,
            children,
        }))
    }

    /// The inbox's signal names, in id order.
    pub fn inbox_names(&self) -> Vec<&str> {
        self.inbox.iter().map(|s| s.name.as_str()).collect()
    }

    /// One line saying where the instance is, for failure messages.
    pub fn describe(&self) -> String {
        format!(
            "instance {} ({} v{}): status {}, step {:?}, attempt {}, last_error {:?}, awaits {:?}, result {}, inbox {:?}",
            self.id,
            self.fsm,
            self.fsm_version,
            self.status,
            self.step,
            self.attempt,
            self.last_error,
            self.awaits,
            self.result
                .as_ref()
                .map_or_else(|| "none".to_string(), Value::to_string),
            self.inbox_names(),
        )
    }

    /// Panics unless the instance is in `status`.
    #[track_caller]
    pub fn assert_status(&self, status: Status) -> &Self {
        if self.status != status {
            panic!("expected {status}, but {}", self.describe());
        }
        self
    }

    /// Panics unless the instance is `done` with exactly `result`.
    #[track_caller]
    pub fn assert_done(&self, result: impl Into<Value>) -> &Self {
        let result = result.into();
        if self.status != Status::Done {
            panic!("expected done with {result}, but {}", self.describe());
        }
        if self.result.as_ref() != Some(&result) {
            panic!("expected done with {result}, but {}", self.describe());
        }
        self
    }

    /// Panics unless the instance is `failed` with a `last_error` containing `message`.
    #[track_caller]
    pub fn assert_failed(&self, message: &str) -> &Self {
        let matches = self
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains(message));
        if self.status != Status::Failed || !matches {
            panic!(
                "expected failed with an error containing {message:?}, but {}",
                self.describe()
            );
        }
        self
    }

    /// Panics unless the instance is parked in `awaiting_signal` on exactly `names`
    /// (in any order).
    #[track_caller]
    pub fn assert_awaiting<I, S>(&self, names: I) -> &Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut want: Vec<String> = names.into_iter().map(|s| s.as_ref().to_string()).collect();
        let mut have = self.awaits.clone();
        want.sort();
        have.sort();
        if self.status != Status::AwaitingSignal || want != have {
            panic!(
                "expected awaiting_signal on {want:?}, but {}",
                self.describe()
            );
        }
        self
    }

    /// Panics unless the instance's current (or last, once terminal) step is `step`.
    #[track_caller]
    pub fn assert_step(&self, step: &str) -> &Self {
        if self.step != step {
            panic!("expected step {step:?}, but {}", self.describe());
        }
        self
    }

    /// Panics unless the stored state equals `state`.
    #[track_caller]
    pub fn assert_state(&self, state: impl Into<Value>) -> &Self {
        let state = state.into();
        if self.state != state {
            panic!(
                "expected state {state}, but the state is {} and {}",
                self.state,
                self.describe()
            );
        }
        self
    }

    /// Panics unless the inbox holds exactly these signal names, in delivery order.
    #[track_caller]
    pub fn assert_inbox<I, S>(&self, names: I) -> &Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let want: Vec<String> = names.into_iter().map(|s| s.as_ref().to_string()).collect();
        if self.inbox_names() != want {
            panic!("expected inbox {want:?}, but {}", self.describe());
        }
        self
    }
}
