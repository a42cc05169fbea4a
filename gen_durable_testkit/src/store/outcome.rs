//! The kit's APPLY (`gen_durable::store::pg::outcome`): one outcome of an executing row
//! committed with the effects of `gd_commit_outcomes` (children first, then the row, the
//! consumed signals, the inbox of a finished row and the parent's fan-in), or committed
//! as `stop` when the database would refuse it.

use chrono::{DateTime, Utc};
use gen_durable::backend::ConcurrencyKey;
use gen_durable::backend::{refused, KeyChange, Outcome, StepOutput};
use gen_durable::{Error, HistoryKind, HistoryLevel, OutcomeKind, Status};

use super::history::Extra;
use super::{after, Store, KIT_NODE};

impl Store {
    /// What the database refuses of an outcome: a child it would insert, or the gate or
    /// limit its transition names (the committer then stops the instance instead).
    fn outcome_refusal(&self, out: &StepOutput) -> Option<Error> {
        if let Outcome::ScheduleChildren { children, .. } = &out.outcome {
            if let Some(e) = children.iter().find_map(|c| self.refusal_of(c)) {
                return Some(e);
            }
        }
        let t = &out.transition;
        let gate = match &t.key {
            KeyChange::Set(ConcurrencyKey::Gate(g)) => Some(g.name()),
            _ => None,
        };
        let rate = t.rate.as_ref().map(|r| (r.key.name(), r.weight));
        self.refusal(gate, rate)
    }

    /// APPLY one outcome of the executing row `id`, exactly as the SQL does: children
    /// first (so the counter is what was inserted), then the row, then consumed signals,
    /// the inbox of a finished row, and the parent's fan-in.
    ///
    /// At a `level` other than off, the history gets the outcome's entry, as the commit's
    /// `told` writes it: the step and attempt it ran, where it leads, its error, the
    /// signals it consumed, its children, and at level full the state it began with. The
    /// kit's steps take no virtual time: an entry starts when it commits.
    pub(crate) fn apply(
        &mut self,
        id: i64,
        out: &StepOutput,
        level: HistoryLevel,
        now: DateTime<Utc>,
    ) {
        if let Some(e) = self.outcome_refusal(out) {
            let mut stop = StepOutput::stopped(refused(&e));
            stop.state = self.rows[&id].state.clone();
            return self.apply(id, &stop, level, now);
        }
        let was = {
            let row = &self.rows[&id];
            (
                row.step.clone(),
                row.attempt,
                (level == HistoryLevel::Full).then(|| row.state.clone()),
            )
        };
        let mut spawned = 0;
        if let Outcome::ScheduleChildren { children, .. } = &out.outcome {
            let rows = children.iter().cloned().map(|c| (c, Some(id))).collect();
            spawned = self.insert(rows, now).len() as i32;
        }
        let kind = out.outcome.kind();
        // An await commits runnable at once if a matching signal the step did not
        // already see is in the inbox.
        let news = match &out.outcome {
            Outcome::Await { names, .. } => self.signals.values().any(|s| {
                s.target == id
                    && names.contains(&s.signal.name)
                    && !out.awaited.contains(&s.signal.id)
            }),
            _ => false,
        };
        let row = self.rows.get_mut(&id).expect("the executing row exists");
        let (step, delay) = match &out.outcome {
            Outcome::Next { step }
            | Outcome::Await { step, .. }
            | Outcome::ScheduleChildren { step, .. } => (Some(*step), None),
            Outcome::Replay { delay } => (None, Some(*delay)),
            Outcome::Done { .. } | Outcome::Stop { .. } => (None, None),
        };
        if let Some(step) = step {
            row.step = step.to_string();
            // A transition: its key, and the limit of the step it leads to.
            match &out.transition.key {
                KeyChange::Keep => {}
                KeyChange::Release => (row.partition_key, row.gate) = (None, None),
                KeyChange::Set(ConcurrencyKey::Partition(k)) => {
                    (row.partition_key, row.gate) = (Some(k.clone()), None)
                }
                KeyChange::Set(ConcurrencyKey::Gate(g)) => {
                    (row.partition_key, row.gate) = (Some(g.key().into()), Some(g.name().into()))
                }
            }
            let rate = out.transition.rate.as_ref();
            row.rate_limit = rate.map(|r| (r.key.name().into(), r.key.key().into()));
            row.rate_weight = rate.map_or(1.0, |r| r.weight);
            row.rate_step = rate.map(|_| step.to_string());
            row.rate_paid = false;
        }
        row.state = out.state.clone();
        row.updated_at = now;
        // The outcome's own status, unless a signal or no children make it runnable at once.
        row.status = match &out.outcome {
            Outcome::Await { .. } if news => Status::Runnable,
            Outcome::ScheduleChildren { .. } if spawned == 0 => Status::Runnable,
            outcome => outcome.status(),
        };
        if let Outcome::Done { result } = &out.outcome {
            row.result = Some(result.clone());
        }
        row.last_error = match (&out.error, kind) {
            (Some(e), _) => Some(e.clone()),
            (None, OutcomeKind::Replay) => row.last_error.take(),
            (None, _) => None,
        };
        match &out.outcome {
            Outcome::Await { names, timeout, .. } => {
                row.awaits = names.clone();
                row.await_deadline = timeout.map(|t| after(now, t));
            }
            Outcome::Replay { .. } => {}
            // A failure keeps what the step was woken for: its retry awaits it again.
            Outcome::Stop { .. } => row.await_deadline = None,
            _ => {
                row.awaits.clear();
                row.await_deadline = None;
            }
        }
        row.eligible_at = after(now, delay.unwrap_or_default());
        row.attempt = match kind {
            OutcomeKind::Replay => row.attempt + 1,
            OutcomeKind::Done | OutcomeKind::Stop => row.attempt,
            _ => 0,
        };
        if kind.progresses() || kind == OutcomeKind::Await {
            row.reaps = 0;
        }
        if kind == OutcomeKind::ScheduleChildren {
            row.children_pending = spawned;
        }
        let (status, parent) = (row.status, row.parent_id);

        let mut consumed = Vec::new();
        if kind.progresses() {
            for sid in &out.awaited {
                if self.signals.remove(sid).is_some() {
                    consumed.push(*sid);
                }
            }
        }
        if level != HistoryLevel::Off {
            consumed.sort_unstable();
            let (hkind, children) = match &out.outcome {
                Outcome::Next { .. } => (HistoryKind::Next, None),
                Outcome::Replay { .. } => (HistoryKind::Retry, None),
                Outcome::Await { .. } => (HistoryKind::Await, None),
                Outcome::ScheduleChildren { children, .. } => {
                    (HistoryKind::Children, Some(children.len() as i32))
                }
                Outcome::Done { .. } => (HistoryKind::Done, None),
                Outcome::Stop { .. } => (HistoryKind::Failed, None),
            };
            let (step_was, attempt, state) = was;
            self.note(
                id,
                now,
                hkind,
                &step_was,
                attempt + 1,
                Extra {
                    started_at: Some(now),
                    next_step: step.map(str::to_string),
                    node: Some(KIT_NODE.to_string()),
                    error: out.error.clone(),
                    signals: consumed,
                    children,
                    state,
                    ..Extra::default()
                },
            );
        }
        if status.is_terminal() {
            self.finished(id, parent, now);
        }
    }

    /// What every terminal commit does besides the row: the whole inbox goes, and the
    /// parent counts one child less, waking at zero.
    pub(super) fn finished(&mut self, id: i64, parent: Option<i64>, now: DateTime<Utc>) {
        self.signals.retain(|_, s| s.target != id);
        if let Some(p) = parent.and_then(|p| self.rows.get_mut(&p)) {
            p.children_pending -= 1;
            p.updated_at = now;
            if p.status == Status::AwaitingChildren && p.children_pending == 0 {
                p.status = Status::Runnable;
                p.eligible_at = now;
            }
        }
    }
}
