//! Group insert: concurrent `client.insert(..).await` calls of one [`Client`] share a
//! statement, as outcomes share a group commit.
//!
//! Each call through the pool costs a round trip for the statement and another for the
//! ping sqlx sends when the connection goes back to the pool (a third when the pool also
//! pings before an acquire). Under concurrency most of a single insert is that overhead.
//! So an awaited insert joins a queue; while one statement runs, the next calls queue up,
//! and the task running them takes the whole queue in one `insert_all`-shaped statement.
//! An insert alone runs at once, in a one-row statement: batching adds no delay when idle.
//!
//! Every call still returns after its own row is committed, with its own id. Only rows
//! without a unique key are grouped (a grouped row is never dropped, so the ids come back
//! in the rows' order); a keyed insert, or one given an executor with `.execute(..)`
//! (a transaction), runs alone. If the server rejects a grouped statement, its rows are
//! inserted again one by one, so each call gets its own error; any other failure (the
//! connection) is reported to every call of the group, as it would be to a lone insert.
//!
//! [`Client`]: crate::Client

use std::sync::{Arc, Mutex};

use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, PgPool, Postgres};
use tokio::sync::oneshot;
use tokio_util::task::TaskTracker;

use crate::model::answers::inserted;
use crate::model::clock::Clock;
use crate::model::error::{Error, Result};
use crate::model::insert::NewInstance;
use crate::store::notify::Notifier;
use crate::store::pg::insert::{insert_one, insert_rows};
use crate::store::pool::can_spare;
use crate::store::pooler::Pooler;

/// The most rows one grouped statement carries.
const MAX_GROUP: usize = 1_000;

/// Statements in flight at once: a call that finds them all busy waits for the next.
const RUNNERS: usize = 2;

/// What the task running the statements needs from its client.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) pool: PgPool,
    pub(crate) pooler: Pooler,
    pub(crate) clock: Clock,
    pub(crate) notifier: Arc<Notifier>,
    /// The client's tracker, which `Client::flush` waits on.
    pub(crate) tasks: TaskTracker,
}

/// The queue of one client's awaited inserts.
#[derive(Debug, Default)]
pub(crate) struct GroupInsert {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    queue: Vec<Waiting>,
    /// Tasks running statements; each takes the whole queue when it is free.
    running: usize,
}

#[derive(Debug)]
struct Waiting {
    row: NewInstance,
    reply: oneshot::Sender<Result<i64>>,
}

impl GroupInsert {
    /// Inserts `row` (which has no unique key) with whatever other calls are waiting.
    pub(crate) async fn insert(self: &Arc<Self>, target: &Target, row: NewInstance) -> Result<i64> {
        debug_assert!(row.unique_key.is_none(), "keyed rows are inserted alone");
        let (reply, rx) = oneshot::channel();
        let start = {
            let mut s = self.state.lock().expect("group insert");
            s.queue.push(Waiting { row, reply });
            let start = s.running < RUNNERS;
            s.running += usize::from(start);
            start
        };
        if start {
            // A task of its own, so that a caller who stops waiting does not strand the
            // others' rows.
            target.tasks.spawn(run(self.clone(), target.clone()));
        }
        rx.await.unwrap_or_else(|_| {
            Err(Error::Database(sqlx::Error::Protocol(
                "the task inserting this row stopped (its runtime shut down); \
                 the row may or may not be committed"
                    .into(),
            )))
        })
    }
}

/// Runs statements until the queue is empty, on one connection kept meanwhile (no pool
/// round trips between statements) while the pool can spare it.
async fn run(group: Arc<GroupInsert>, target: Target) {
    let mut guard = Running {
        group: &group,
        finished: false,
    };
    let mut conn: Option<PoolConnection<Postgres>> = None;
    loop {
        let batch: Vec<Waiting> = {
            let mut s = group.state.lock().expect("group insert");
            if s.queue.is_empty() {
                s.running -= 1;
                guard.finished = true;
                return;
            }
            let n = s.queue.len().min(MAX_GROUP);
            s.queue.drain(..n).collect()
        };
        let (rows, replies): (Vec<NewInstance>, Vec<_>) =
            batch.into_iter().map(|w| (w.row, w.reply)).unzip();
        let results = match &mut conn {
            Some(c) => insert_group(&target, c, &rows).await,
            None => match target.pool.acquire().await {
                Ok(c) => insert_group(&target, conn.insert(c), &rows).await,
                Err(e) => rows
                    .iter()
                    .map(|_| Err(Error::Database(copy_sqlx(&e))))
                    .collect(),
            },
        };
        let broken = results.iter().any(
            |r| matches!(r, Err(Error::Database(e)) if !matches!(e, sqlx::Error::Database(_))),
        );
        if broken || !can_spare(&target.pool) {
            // A connection that may be broken goes back for the pool to check; so does one
            // the pool needs for another caller.
            conn = None;
        }
        for (reply, result) in replies.into_iter().zip(results) {
            let _ = reply.send(result);
        }
    }
}

/// A running task's place in the count. If the task is dropped before it finishes (its
/// runtime shut down), the count goes down all the same, and when no task is left the
/// calls still queued are answered with an error (their senders dropped) rather than
/// left waiting; the next insert starts a new task.
struct Running<'a> {
    group: &'a GroupInsert,
    finished: bool,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if !self.finished {
            let mut s = self.group.state.lock().unwrap_or_else(|e| e.into_inner());
            s.running -= 1;
            if s.running == 0 {
                s.queue.clear();
            }
        }
    }
}

/// Inserts `rows` in one statement; one result per row, in order.
async fn insert_group(
    t: &Target,
    conn: &mut PgConnection,
    rows: &[NewInstance],
) -> Vec<Result<i64>> {
    let now = t.clock.now_param();
    if let [row] = rows {
        return vec![alone(t, conn, row).await];
    }
    let mut queues: Vec<&str> = rows.iter().map(|r| r.queue.as_str()).collect();
    queues.sort_unstable();
    queues.dedup();
    let notify = t.notifier.claim(queues);
    match insert_rows(t.pooler.alone(&mut *conn), rows, &notify, now).await {
        // Keyless rows are all inserted, in order: the ids, ascending, are theirs.
        Ok(ids) if ids.len() == rows.len() => ids.into_iter().map(Ok).collect(),
        Ok(ids) => {
            let e = format!("{} of {} grouped rows came back", ids.len(), rows.len());
            rows.iter()
                .map(|_| Err(Error::Database(sqlx::Error::Protocol(e.clone()))))
                .collect()
        }
        // The server rejected the statement: nothing was written. Each row alone, so
        // each call gets its own answer.
        Err(Error::Database(sqlx::Error::Database(_))) => {
            let mut out = Vec::with_capacity(rows.len());
            for row in rows {
                out.push(alone(t, conn, row).await);
            }
            out
        }
        Err(e) => rows.iter().map(|_| Err(copy(&e))).collect(),
    }
}

/// One row in a one-row statement.
async fn alone(t: &Target, conn: &mut PgConnection, row: &NewInstance) -> Result<i64> {
    let notify = !t.notifier.claim([row.queue.as_str()]).is_empty();
    let id = insert_one(t.pooler.alone(&mut *conn), row, notify, t.clock.now_param()).await?;
    inserted(id, None)
}

/// The same failure, for every call of a group (errors are not `Clone`).
fn copy(e: &Error) -> Error {
    match e {
        Error::Database(e) => Error::Database(copy_sqlx(e)),
        other => Error::Database(sqlx::Error::Protocol(other.to_string())),
    }
}

fn copy_sqlx(e: &sqlx::Error) -> sqlx::Error {
    match e {
        sqlx::Error::Io(io) => sqlx::Error::Io(std::io::Error::new(io.kind(), io.to_string())),
        sqlx::Error::PoolTimedOut => sqlx::Error::PoolTimedOut,
        sqlx::Error::PoolClosed => sqlx::Error::PoolClosed,
        other => sqlx::Error::Protocol(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row() -> NewInstance {
        NewInstance {
            fsm: "F".into(),
            version: 1,
            step: "s".into(),
            state: serde_json::json!({}),
            queue: "q".into(),
            priority: 0,
            partition_key: None,
            gate: None,
            rate_limit: None,
            rate_weight: 1.0,
            unique_key: None,
            unique_scope: None,
            eligible_at: None,
            delay: None,
            max_reaps: 10,
        }
    }

    /// A task dropped mid-way (its runtime shut down) gives its place back, and the last
    /// one to go answers the calls still queued instead of leaving them waiting.
    #[test]
    fn a_dropped_task_gives_back_its_place_and_answers_the_queue() {
        let group = GroupInsert::default();
        let (reply, mut rx) = oneshot::channel();
        {
            let mut s = group.state.lock().unwrap();
            s.running = 2;
            s.queue.push(Waiting { row: row(), reply });
        }
        drop(Running {
            group: &group,
            finished: false,
        });
        assert_eq!(group.state.lock().unwrap().running, 1);
        assert!(
            rx.try_recv().is_err(),
            "another task still runs: the call waits"
        );
        drop(Running {
            group: &group,
            finished: false,
        });
        let s = group.state.lock().unwrap();
        assert_eq!((s.running, s.queue.len()), (0, 0));
        drop(s);
        assert!(
            matches!(rx.try_recv(), Err(oneshot::error::TryRecvError::Closed)),
            "the queued call is answered (its sender dropped)"
        );
    }

    #[test]
    fn a_finished_task_leaves_the_count_to_its_loop() {
        let group = GroupInsert::default();
        group.state.lock().unwrap().running = 1;
        drop(Running {
            group: &group,
            finished: true,
        });
        assert_eq!(group.state.lock().unwrap().running, 1);
    }
}
