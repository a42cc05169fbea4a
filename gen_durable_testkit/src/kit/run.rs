//! [`TestKit::run_until_idle`]: the due schedules fired, then each due step picked in the
//! engine's order, admitted against its rate limit, migrated if the kit migrates its
//! version, run through the FSM's entry and committed.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use gen_durable::backend::{StepInput, StepOutput};
use gen_durable::{Event, FsmEntry, OutcomeKind, Status};

use super::TestKit;
use crate::store::schedule::KitSchedule;
use crate::tally::Tally;

impl TestKit {
    /// Runs every step that is due, one at a time in the pick's order, until nothing is
    /// runnable at the current virtual time (rows of a paused queue are not picked);
    /// returns what was committed. Await timeouts
    /// that are due fire first. A claimed row of a version the kit migrates is moved first
    /// (see [`TestKit::migration`]; a failed migration is no step). Panics after
    /// `max_steps` steps, naming the instance that ran most, if a due instance belongs to
    /// an FSM the kit does not know, and if a migration's step map is invalid (where an
    /// engine fails to start: `Error::BadMigration`).
    pub async fn run_until_idle(&mut self) -> Tally {
        if let Err(e) = self.registry.check_migrations() {
            panic!("{e}");
        }
        let mut tally = Tally::default();
        let mut per_instance: HashMap<i64, usize> = HashMap::new();
        let mut last: Vec<(i64, String, OutcomeKind)> = Vec::new();
        self.fire_schedules();
        loop {
            self.deliver_deferred();
            let now = self.now();
            self.store.expire_awaits(now);
            let Some(id) = self.store.pick(now, &self.registry) else {
                break;
            };
            if !self.store.admit(id, now) {
                continue; // its tokens are not there yet: it reserved them and waits
            }
            if tally.steps >= self.max_steps {
                self.runaway(&per_instance, &last);
            }
            let Some((step, kind)) = self.run_one(id, now).await else {
                continue; // a failed migration: its row waits out its backoff
            };
            tally.record(kind);
            *per_instance.entry(id).or_default() += 1;
            last.push((id, step, kind));
            if last.len() > 8 {
                last.remove(0);
            }
        }
        let now = self.now();
        if let Some(r) = self.store.unrunnable(now, &self.registry).first() {
            panic!(
                "instance {} ({} v{}) is due at step {:?}, but this TestKit does not know {} v{}: \
                 register it with .register::<T>() or .with_registry(..)",
                r.id, r.fsm, r.version, r.step, r.fsm, r.version
            );
        }
        tally
    }

    fn runaway(&self, per_instance: &HashMap<i64, usize>, last: &[(i64, String, OutcomeKind)]) {
        let (id, n) = per_instance
            .iter()
            .max_by_key(|(id, n)| (**n, std::cmp::Reverse(**id)))
            .map(|(id, n)| (*id, *n))
            .unwrap_or_default();
        let which = self
            .store
            .snapshot(id)
            .map_or_else(|| format!("instance {id}"), |i| i.describe());
        let recent: Vec<String> = last
            .iter()
            .map(|(i, s, k)| format!("{i}:{s}->{k}"))
            .collect();
        panic!(
            "run_until_idle: {} steps without going idle — a runaway loop? {n} of them by {which}. \
             Last steps: {}. Raise TestKit::with_max_steps if this is expected.",
            self.max_steps,
            recent.join(", ")
        );
    }

    /// Claims `id`, migrates it if the kit migrates its version, runs its step through the
    /// FSM's entry, delivers signals sent while it ran, and commits its outcome. Returns
    /// the step and the committed kind; `None` if its migration failed (nothing ran).
    async fn run_one(&mut self, id: i64, now: DateTime<Utc>) -> Option<(String, OutcomeKind)> {
        let row = self.store.row_mut(id).expect("picked row exists");
        (row.status, row.updated_at) = (Status::Executing, now);
        let entry = self.upgrade(id, now)?;
        let row = self.store.row(id).expect("picked row exists");
        let input = StepInput {
            attempt: row.attempt,
            awaits: row.awaits.clone(),
            ..StepInput::new(id, row.step.clone(), row.state.clone(), now)
        };
        let input = StepInput {
            inbox: self.store.inbox_of(id),
            children: self.store.child_infos(id),
            ..input
        };
        let step = input.step.clone();
        let output = entry.run(input).await;
        self.deliver_deferred();
        let kind = output.outcome.kind();
        self.store.apply(id, &output, entry.history, now);
        self.events.push(Event::StepStop {
            duration: output.duration,
            id,
            fsm: entry.name,
            step: step.clone(),
            kind,
        });
        Some((step, kind))
    }

    /// The lazy instance migration of claimed row `id`, as the engine's (`engine::upgrade`):
    /// the entry to run it with — its own version's, or if the kit migrates that version,
    /// the chain's last, once the whole chain has moved the row there (version, state and
    /// step; `migration.applied`). If a transform fails or panics, the row stays on its
    /// version and its unchanged step is committed as a `replay` after
    /// `backoff(attempt)` with the error as `last_error` (`migration.failed`): `None`.
    fn upgrade(&mut self, id: i64, now: DateTime<Utc>) -> Option<FsmEntry> {
        let row = self.store.row_mut(id).expect("picked row exists");
        let from = row.version;
        let Some((to, migrated)) = self.registry.upgrade(&row.fsm, from, &row.state, &row.step)
        else {
            let entry = self.registry.get(&row.fsm, from);
            return Some(*entry.expect("pick only returns FSMs the kit runs or migrates"));
        };
        let entry = *self
            .registry
            .get(&row.fsm, to)
            .expect("a migration chain ends at a version the kit runs");
        let fsm = entry.name;
        match migrated {
            Ok(m) => {
                // The engine's MIGRATE_CLAIMED, recorded with the node that did it.
                self.store.migrate_row(id, m, false, now);
                self.events
                    .push(Event::InstanceMigrated { id, fsm, from, to });
                Some(entry)
            }
            Err(error) => {
                self.events.push(Event::MigrationFailed {
                    id,
                    fsm,
                    from,
                    to,
                    error: error.clone(),
                });
                let output = StepOutput::migration_failed(row.state.clone(), error, row.attempt);
                self.store.apply(id, &output, entry.history, now);
                None
            }
        }
    }

    /// Inserts the due fire times of every schedule (see [`TestKit::schedule`]).
    fn fire_schedules(&mut self) {
        let now = self.now();
        for i in 0..self.schedules.len() {
            let KitSchedule { schedule, next, .. } = &self.schedules[i];
            let Some(next) = *next else { continue };
            let plan = schedule.plan(next, now);
            let name = schedule.name().to_string();
            let policy = schedule.policy_reason();
            let built = schedule.build(&plan);
            self.schedules[i].next = plan.next;
            for (fire, row) in built.rows {
                let id = self.insert_rows(vec![row]).first().copied();
                if id.is_some() {
                    self.schedules[i].last_fire = Some(fire);
                }
                self.events.push(Event::ScheduleFired {
                    schedule: name.clone(),
                    fire_time: fire,
                    id,
                });
            }
            if plan.skipped > 0 {
                self.events.push(Event::ScheduleSkipped {
                    schedule: name.clone(),
                    count: plan.skipped,
                    reason: policy,
                });
            }
            if let Some(error) = built.error {
                self.events.push(Event::ScheduleSkipped {
                    schedule: name,
                    count: built.failed,
                    reason: error,
                });
            }
        }
    }
}
