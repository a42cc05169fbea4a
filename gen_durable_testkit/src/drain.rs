//! [`drain`]: run everything runnable in a Postgres database to a standstill, in one call,
//! through the production engine — for tests that insert through a `Client` and want the
//! result without running an engine of their own. And [`fire_timeouts`].

use std::fmt;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gen_durable::{Engine, Event, QueueConfig, Registry};
use sqlx::PgPool;

use crate::tally::Tally;

/// The default `with_max_steps` of a drain: 1,000.
pub const DEFAULT_DRAIN_STEPS: usize = 1_000;

/// Starts a drain of `pool`'s database: every runnable row of the FSMs linked into the
/// test binary (or those of `.with_registry(..)`), on every queue they use (or those of
/// `.queue(..)`), runs until none is runnable, children and timeouts included — except on
/// a queue an operator paused (`Client::pause_queue`), whose rows no node claims, as in
/// production. `.await` it: the committed outcomes by kind.
///
/// It runs through the engine — the same claim, step runner and group commit as in
/// production — started for the call and drained before it returns, with one step at a
/// time. Rows scheduled for later are pulled forward to now unless
/// `.with_scheduled(false)`. More than `with_max_steps` steps (default 1,000) is a
/// [`DrainError::MaxSteps`]: a workflow that loops.
///
/// ```no_run
/// # async fn demo(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// let tally = gen_durable_testkit::drain(&pool).await?;
/// assert_eq!(tally.done, 1);
/// # Ok(()) }
/// ```
pub fn drain(pool: &PgPool) -> Drain {
    Drain {
        pool: pool.clone(),
        registry: None,
        queues: Vec::new(),
        with_scheduled: true,
        max_steps: DEFAULT_DRAIN_STEPS,
    }
}

/// Fires every armed await timeout now: each instance parked on a signal with a timeout
/// runs its timeout step at the next drain (or engine pass). Returns how many it armed.
pub async fn fire_timeouts(pool: &PgPool) -> sqlx::Result<u64> {
    let done = sqlx::query(
        "UPDATE gd_instances SET await_deadline = now()
          WHERE status = 'awaiting_signal' AND await_deadline > now()",
    )
    .execute(pool)
    .await?;
    Ok(done.rows_affected())
}

/// A pending [`drain`].
#[derive(Debug)]
#[must_use = "a drain does nothing until awaited"]
pub struct Drain {
    pool: PgPool,
    registry: Option<Registry>,
    queues: Vec<String>,
    with_scheduled: bool,
    max_steps: usize,
}

/// Why a drain stopped short.
#[derive(Debug)]
pub enum DrainError {
    /// More steps than `with_max_steps` ran: a workflow that never settles.
    MaxSteps {
        /// The limit.
        max: usize,
        /// What had run meanwhile.
        tally: Tally,
    },
    /// The engine or the database failed.
    Engine(gen_durable::Error),
}

impl fmt::Display for DrainError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DrainError::MaxSteps { max, tally } => write!(
                f,
                "drain: more than {max} steps without going idle — a runaway loop? {tally}; \
                 raise with_max_steps if this is expected"
            ),
            DrainError::Engine(e) => write!(f, "drain: {e}"),
        }
    }
}

impl std::error::Error for DrainError {}

impl From<gen_durable::Error> for DrainError {
    fn from(e: gen_durable::Error) -> Self {
        DrainError::Engine(e)
    }
}

impl From<sqlx::Error> for DrainError {
    fn from(e: sqlx::Error) -> Self {
        DrainError::Engine(gen_durable::Error::Database(e))
    }
}

impl Drain {
    /// Runs only these FSMs (default: every FSM linked into the binary).
    pub fn with_registry(mut self, registry: Registry) -> Self {
        self.registry = Some(registry);
        self
    }

    /// Adds a queue to drain; with none, every queue the FSMs use.
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queues.push(queue.into());
        self
    }

    /// Whether rows scheduled for later (and replays in backoff) are pulled forward to
    /// now (default true); if false they are left for later.
    pub fn with_scheduled(mut self, pull_forward: bool) -> Self {
        self.with_scheduled = pull_forward;
        self
    }

    /// The most steps the drain may run before it stops with [`DrainError::MaxSteps`].
    pub fn with_max_steps(mut self, n: usize) -> Self {
        self.max_steps = n;
        self
    }

    async fn run(self) -> Result<Tally, DrainError> {
        let registry = self.registry.unwrap_or_else(Registry::linked);
        let mut queues = self.queues;
        if queues.is_empty() {
            queues = registry.iter().map(|e| e.queue.to_string()).collect();
        }
        queues.sort();
        queues.dedup();
        let fsms: Vec<String> = registry.iter().map(|e| e.name.to_string()).collect();

        let tally = Arc::new(Mutex::new(Tally::default()));
        let seen = tally.clone();
        // One step at a time in the pick's order, as the in-memory kit runs them: no
        // hand-off of gate slots, which would run a key's next row ahead of older rows.
        let quick = QueueConfig::new(1)
            .with_poll_interval(Duration::from_millis(5))
            .with_gate_handoff(false);
        let mut builder = Engine::builder(self.pool.clone())
            .with_registry(registry)
            .with_timeout_interval(Duration::from_millis(5))
            .on_event(move |e| {
                if let Event::StepStop { kind, .. } = e {
                    seen.lock().expect("tally").record(*kind);
                }
            });
        for q in &queues {
            builder = builder.queue_with(q.clone(), quick.clone());
        }
        let engine = builder.start().await?;
        let outcome = loop {
            if self.with_scheduled {
                sqlx::query(
                    "UPDATE gd_instances SET eligible_at = now()
                      WHERE status = 'runnable' AND eligible_at > now()
                        AND queue = ANY ($1) AND fsm = ANY ($2)",
                )
                .bind(&queues)
                .bind(&fsms)
                .execute(&self.pool)
                .await?;
            }
            let steps = tally.lock().expect("tally").steps;
            if steps > self.max_steps {
                break Err(self.max_steps);
            }
            if !busy(&self.pool, &queues, &fsms).await? {
                break Ok(());
            }
            engine.wake();
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        engine.shutdown(Duration::from_secs(10)).await;
        let tally = *tally.lock().expect("tally");
        match outcome {
            Ok(()) => Ok(tally),
            Err(max) => Err(DrainError::MaxSteps { max, tally }),
        }
    }
}

/// Whether any row of these queues and FSMs is executing, runnable and due (on a queue
/// that is not paused: the engine claims nothing there), or parked with its await timeout
/// due.
///
/// "Due" is judged by `clock_timestamp()`, not `now()`: a commit's `eligible_at` is its
/// own statement's start, which can be later than this statement's start although the
/// commit is visible to it (it committed between the two). Against `now()` such a row
/// looks scheduled for the future and the drain stopped one step early.
async fn busy<'c>(
    db: impl sqlx::PgExecutor<'c>,
    queues: &[String],
    fsms: &[String],
) -> sqlx::Result<bool> {
    sqlx::query_scalar(
        "SELECT EXISTS (
           SELECT 1 FROM gd_instances
            WHERE queue = ANY ($1) AND fsm = ANY ($2)
              AND (status = 'executing'
                   OR (status = 'runnable' AND eligible_at <= clock_timestamp()
                       AND queue NOT IN (SELECT queue FROM gd_queue_pauses))
                   OR (status = 'awaiting_signal' AND await_deadline <= clock_timestamp())))",
    )
    .bind(queues)
    .bind(fsms)
    .fetch_one(db)
    .await
}

impl IntoFuture for Drain {
    type Output = Result<Tally, DrainError>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send>>;
    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.run())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestDb;

    /// The race CI met once in ~150 loaded runs, held open: the check's transaction starts,
    /// then a row is committed runnable "now" by another session. The check sees the row;
    /// it must count it as due.
    #[tokio::test]
    async fn a_row_committed_after_the_check_began_is_due() {
        let db = TestDb::new().await;
        let (queues, fsms) = (vec!["q".to_string()], vec!["f".to_string()]);
        let mut check = db.pool().begin().await.unwrap();
        sqlx::query("SELECT now()")
            .execute(&mut *check)
            .await
            .unwrap();
        sqlx::query(
            "INSERT INTO gd_instances (fsm, fsm_version, queue, step, state, eligible_at)
             VALUES ('f', 1, 'q', 's', '{}', statement_timestamp())",
        )
        .execute(db.pool())
        .await
        .unwrap();
        assert!(busy(&mut *check, &queues, &fsms).await.unwrap());
        check.rollback().await.unwrap();
        db.close().await;
    }
}
