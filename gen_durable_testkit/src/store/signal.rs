//! The kit's DELIVER (`gen_durable::store::pg::signal`): store the signal unless its
//! dedup key is in, and wake the target only on a name it awaits.

use chrono::{DateTime, Utc};
use gen_durable::backend::DeliveryFound;
use gen_durable::{Signal, Status, Target};
use serde_json::Value;

use super::{Store, StoredSignal};

impl Store {
    /// DELIVER: store the signal unless its dedup key is already stored for this target;
    /// wake the target only if it is `awaiting_signal` on this name. Nothing is stored
    /// for an unknown or terminal target.
    pub(crate) fn deliver(
        &mut self,
        to: &Target,
        name: &str,
        payload: Value,
        dedup_key: Option<String>,
        now: DateTime<Utc>,
    ) -> DeliveryFound {
        let nothing = |target: Option<i64>, status: Option<Status>| DeliveryFound {
            id: target,
            status,
            signal_id: None,
            woke: false,
        };
        let Some(target) = self.resolve(to) else {
            return nothing(None, None);
        };
        let status = self.rows[&target].status;
        if status.is_terminal() {
            return nothing(Some(target), Some(status));
        }
        let duplicate = dedup_key.as_ref().is_some_and(|k| {
            self.signals
                .values()
                .any(|s| s.target == target && s.signal.dedup_key.as_ref() == Some(k))
        });
        if duplicate {
            return nothing(Some(target), Some(status));
        }
        self.last_signal += 1;
        let id = self.last_signal;
        self.signals.insert(
            id,
            StoredSignal {
                target,
                signal: Signal {
                    id,
                    name: name.to_string(),
                    payload,
                    dedup_key,
                    inserted_at: now,
                },
            },
        );
        let row = self.rows.get_mut(&target).expect("resolved above");
        let woke = row.status == Status::AwaitingSignal && row.awaits.iter().any(|a| a == name);
        if woke {
            row.status = Status::Runnable;
            row.eligible_at = now;
            row.await_deadline = None;
            row.updated_at = now;
        }
        DeliveryFound {
            id: Some(target),
            status: Some(status),
            signal_id: Some(id),
            woke,
        }
    }
}
