//! The committer's loop: gathers the requests into batches, runs up to [`IN_FLIGHT`]
//! group commits at once, sends deferred outcomes again (at once, after the commit
//! beside them, or backing off), and keeps a connection between commits.

use std::sync::Arc;
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::Postgres;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::{CommitRequest, Committer};
use crate::store::pool::can_spare;

/// Commits running at once. A second starts beside the first only for a batch of at
/// least [`BESIDE`] outcomes, so that batches stay large while the commit path keeps
/// both the database's cores busy.
const IN_FLIGHT: usize = 2;

/// The smallest batch that starts while another commit runs.
const BESIDE: usize = 32;

/// How often an outcome is deferred (its row or its parent held by a caller's
/// transaction) before it is given up as not committed: about 20 s of tries.
pub(crate) const MAX_DEFERRALS: u32 = 100;

/// How often an outcome is deferred and tried again without waiting: the first times,
/// when the lock it met was most likely another commit of this engine's (two batches with
/// children of one parent), which has ended by then.
const FAST_DEFERRALS: u32 = 3;

/// When a deferred outcome is tried again after its fast tries: soon, then backing off to
/// 200 ms.
pub(crate) fn defer_delay(deferrals: u32) -> Duration {
    Duration::from_millis((2u64 << deferrals.min(7)).min(200))
}

/// A committer's connection, kept while commits follow each other (no pool acquire, and
/// no ping, per batch) and handed back to the pool after [`HOLD`] without one, or at
/// once when the pool has nothing else to give.
pub(super) type Held = Option<PoolConnection<Postgres>>;

/// How long the committer keeps its connection with nothing to commit.
const HOLD: Duration = Duration::from_millis(250);

impl Committer {
    /// The loop: runs until `stop` and its channel is drained.
    pub(super) async fn run(
        self: Arc<Self>,
        mut rx: mpsc::Receiver<CommitRequest>,
        stop: CancellationToken,
    ) {
        let max = self.cfg.batch;
        let mut pending: Vec<CommitRequest> = Vec::with_capacity(max);
        // Outcomes to try again once `later_at` has passed.
        let mut later: Vec<CommitRequest> = Vec::new();
        let mut later_at = tokio::time::Instant::now();
        // Outcomes deferred while another commit of ours ran: most often that commit held
        // their rows' parent (two batches of one fan-in). Tried again when it ends.
        let mut after_flight: Vec<CommitRequest> = Vec::new();
        // The last commit that ended deferred some of its rows: commit one batch at a time
        // until one ends without, so that two batches do not keep meeting on one parent.
        let mut contended = false;
        // Connections kept between commits, and the commits running.
        let mut idle: Vec<PoolConnection<Postgres>> = Vec::new();
        let mut flying: JoinSet<(Held, Vec<CommitRequest>)> = JoinSet::new();
        let mut open = true;
        loop {
            while !pending.is_empty()
                && (flying.is_empty()
                    || (flying.len() < IN_FLIGHT
                        && !contended
                        && (pending.len() >= BESIDE || !open)))
            {
                let batch = std::mem::replace(&mut pending, Vec::with_capacity(max));
                flying.spawn(self.clone().run_once(idle.pop(), batch));
            }
            if !open
                && pending.is_empty()
                && flying.is_empty()
                && later.is_empty()
                && after_flight.is_empty()
            {
                return;
            }
            tokio::select! {
                r = next_request(&mut rx, &stop), if open && pending.len() < max => match r {
                    Some(r) => {
                        pending.push(r);
                        while pending.len() < max {
                            match rx.try_recv() {
                                Ok(r) => pending.push(r),
                                Err(_) => break,
                            }
                        }
                    }
                    None => open = false,
                },
                Some(done) = flying.join_next(), if !flying.is_empty() => {
                    // A commit ended: what waited for it goes again now.
                    pending.append(&mut after_flight);
                    if let Ok((held, deferred)) = done {
                        contended = !deferred.is_empty();
                        // Keep the connection for the next commit unless a claim or a step
                        // could be left waiting for it (a small pool).
                        if let Some(conn) = held {
                            if can_spare(&self.db.pool) {
                                idle.push(conn);
                            }
                        }
                        // Deferred for the first times: at once if no commit of ours is
                        // running any more (it may have held them), or when the one still
                        // running ends. Often deferred: a caller's transaction holds them,
                        // so back off.
                        let (fast, deferred): (Vec<_>, Vec<_>) =
                            deferred.into_iter().partition(|r| r.deferrals <= FAST_DEFERRALS);
                        if flying.is_empty() {
                            pending.extend(fast);
                        } else {
                            after_flight.extend(fast);
                        }
                        if let Some(n) = deferred.iter().map(|r| r.deferrals).max() {
                            let at = tokio::time::Instant::now() + defer_delay(n);
                            later_at = if later.is_empty() { at } else { later_at.min(at) };
                            later.extend(deferred);
                        }
                    }
                }
                _ = tokio::time::sleep_until(later_at), if !later.is_empty() => {
                    pending.append(&mut later);
                }
                // Idle: give the connections back.
                _ = tokio::time::sleep(HOLD), if flying.is_empty() && pending.is_empty() && !idle.is_empty() => {
                    idle.clear();
                }
            }
        }
    }
}

/// The next request, or None once the engine stops and every request is handled.
async fn next_request(
    rx: &mut mpsc::Receiver<CommitRequest>,
    stop: &CancellationToken,
) -> Option<CommitRequest> {
    tokio::select! {
        biased;
        r = rx.recv() => r,
        _ = stop.cancelled() => {
            // Steps still running report through their own channel clone; when the
            // engine stops us every sender is gone, so drain what is left.
            rx.close();
            rx.recv().await
        }
    }
}
