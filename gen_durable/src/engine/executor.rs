//! The executor: runs a claimed row's step — or, with run-ahead, the chain of `next`
//! steps one claim allows — and hands each outcome to the committer. It never writes to
//! the database itself: the committer does, fenced by the claim's lease.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::engine::committer::HeldKey;
use crate::engine::shared::Shared;
use crate::engine::upgrade::{upgrade, Upgraded};
use crate::model::step::{Outcome, OutcomeKind};
use crate::model::transition::KeyChange;
use crate::runtime::registry::FsmEntry;
use crate::runtime::StepInput;
use crate::store::pg::claim;
use crate::telemetry::Event;

/// How a claim ended, for its picker.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Ended {
    /// The delay of a committed `replay`, so the picker can pick it up on time rather
    /// than at the next poll.
    pub(crate) replay: Option<Duration>,
    /// The gate slot it held went to its key's next row in the commit that ended it.
    pub(crate) handed_off: bool,
    /// Its outcome committed, or its claim was found lost (the row moved on): not a
    /// commit that failed, after which the row waits for its lease to expire.
    pub(crate) settled: bool,
}

/// Runs one claimed row's step and commits its outcome; with run-ahead, goes on with
/// the next steps under the same claim while they return `next`.
pub(crate) async fn run_step(
    shared: Arc<Shared>,
    row: claim::Claimed,
    cancel: CancellationToken,
    draining: CancellationToken,
    queue: Arc<str>,
) -> Ended {
    let (id, epoch) = (row.id, row.lease_epoch);
    let resolved = match upgrade(&shared, &queue, row).await {
        Ok(upgraded) => upgraded,
        Err(row) => match shared.registry.get(&row.fsm, row.fsm_version).copied() {
            Some(entry) => Upgraded::Run(entry, row),
            None => {
                // Claims only ask for pairs this node runs or migrates; if this happens,
                // leave it to the reaper.
                tracing::error!(target: "gen_durable::step", id, fsm = %row.fsm, "claimed a row of an unregistered FSM");
                Upgraded::Stop(None)
            }
        },
    };
    let ended = match resolved {
        Upgraded::Run(entry, row) => {
            let input = StepInput {
                id,
                step: row.step,
                state: row.state,
                attempt: row.attempt,
                awaits: row.awaits,
                inbox: row.inbox.0,
                children: row.children.0,
                now: row.now,
                cancel: cancel.clone(),
                pool: Some(shared.db.pool.clone()),
            };
            let key = row.partition_key.map(|key| HeldKey {
                gate: row.gate,
                key,
                slot: row.gate_slot,
            });
            run_chain(&shared, &queue, entry, epoch, input, key, &draining).await
        }
        Upgraded::Stop(delay) => Ended {
            replay: delay,
            handed_off: false,
            settled: false,
        },
    };
    shared.claims.unhold(id, epoch, ended.settled);
    ended
}

/// The steps one claim runs: one, or several with run-ahead.
async fn run_chain(
    shared: &Shared,
    queue: &Arc<str>,
    entry: FsmEntry,
    epoch: i64,
    mut input: StepInput,
    mut key: Option<HeldKey>,
    draining: &CancellationToken,
) -> Ended {
    let id = input.id;
    loop {
        let step = input.step.clone();
        let span = tracing::info_span!("gen_durable.step", id, fsm = entry.name, step = %step, attempt = input.attempt);
        // What a run-ahead step after this one will see of the inbox and children.
        let (inbox, children, cancel) = (
            input.inbox.clone(),
            input.children.clone(),
            input.cancel.clone(),
        );
        let output = entry.run(input).instrument(span).await;
        let kind = output.outcome.kind();
        let parks_with_timeout = matches!(
            output.outcome,
            Outcome::Await {
                timeout: Some(_),
                ..
            }
        );
        let replay_after = match output.outcome {
            Outcome::Replay { delay } => Some(delay),
            _ => None,
        };
        // Never run ahead into a drain or a cancellation, nor into a step that needs what
        // the claim does not hold (a new key, tokens): hand the row back instead.
        let held = key
            .as_ref()
            .map_or((None, None), |k| (Some(&*k.key), k.gate.as_deref()));
        let yielded = match output.outcome {
            Outcome::Next { step: to } if output.run_ahead => {
                output.transition.yields(held).map(|reason| (to, reason))
            }
            _ => None,
        };
        let run_ahead = output.run_ahead
            && yielded.is_none()
            && !draining.is_cancelled()
            && !cancel.is_cancelled();
        let next = match (&output.outcome, run_ahead) {
            (Outcome::Next { step }, true) => {
                Some((*step, output.state.clone(), output.awaited.clone()))
            }
            _ => None,
        };
        if let (Some(_), KeyChange::Release) = (&next, &output.transition.key) {
            key = None;
        }
        let duration = output.duration;
        let held = key.clone();
        match shared
            .committer
            .commit(queue, id, epoch, output, run_ahead, held, entry.history)
            .await
        {
            Ok(reply) if reply.committed => {
                if parks_with_timeout {
                    shared.timeouts_wake.notify_one();
                }
                if let Some((to, reason)) = yielded {
                    shared.telemetry.emit(Event::RunAheadYield {
                        id,
                        fsm: entry.name,
                        step: step.clone(),
                        to,
                        reason,
                    });
                }
                if let (Some((to, ..)), true) = (&next, reply.continued) {
                    shared.telemetry.emit(Event::RunAheadContinue {
                        id,
                        fsm: entry.name,
                        from: step.clone(),
                        to,
                    });
                }
                shared.telemetry.emit(Event::StepStop {
                    duration,
                    id,
                    fsm: entry.name,
                    step,
                    kind,
                });
                if !matches!(kind, OutcomeKind::Next | OutcomeKind::Replay) {
                    crate::client::wait::wake(id);
                }
                match next {
                    Some((step, state, consumed)) if reply.continued => {
                        let now = reply.now.unwrap_or_else(chrono::Utc::now);
                        input = StepInput {
                            inbox: inbox
                                .into_iter()
                                .filter(|s| !consumed.contains(&s.id))
                                .collect(),
                            children,
                            cancel,
                            pool: Some(shared.db.pool.clone()),
                            ..StepInput::new(id, step, state, now)
                        };
                    }
                    _ => {
                        return Ended {
                            replay: replay_after,
                            handed_off: reply.handed_off,
                            settled: true,
                        }
                    }
                }
            }
            Ok(_) => {
                shared.telemetry.emit(Event::LeaseLost {
                    id,
                    fsm: entry.name,
                    step,
                    kind,
                });
                return Ended {
                    settled: true,
                    ..Ended::default()
                };
            }
            Err(e) => {
                tracing::error!(target: "gen_durable::step", id, error = %e,
                    "outcome not committed; the step will run again once its lease expires");
                return Ended::default();
            }
        }
    }
}
