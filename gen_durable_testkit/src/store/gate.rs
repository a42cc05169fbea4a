//! Gates in memory (`gen_durable::store::pg::gate`, `gd_gates`): declaring them, and the
//! claim's admission of a row against its concurrency key.

use gen_durable::Status;

use super::{Row, Store};

impl Store {
    /// Whether `r`'s concurrency key lets it run now: a K = 1 key with no executing
    /// (ungated) row, or a gate key with fewer executing rows than its gate's K.
    pub(crate) fn admits(&self, r: &Row) -> bool {
        let Some(key) = r.partition_key.as_ref() else {
            return true;
        };
        let running = |gate: Option<&String>| {
            self.rows
                .values()
                .filter(|e| {
                    e.status == Status::Executing
                        && e.partition_key.as_ref() == Some(key)
                        && e.gate.as_ref() == gate
                })
                .count()
        };
        match r.gate.as_ref() {
            None => running(None) == 0,
            Some(g) => running(Some(g)) < self.gate(g).unwrap_or(0) as usize,
        }
    }

    /// The limit of gate `name`, if declared.
    pub(crate) fn gate(&self, name: &str) -> Option<u32> {
        self.gates.get(name).copied()
    }

    /// DECLARE: adds gate `name` or changes its limit; true if written.
    pub(crate) fn set_gate(&mut self, name: &str, size: u32) -> bool {
        self.gates.insert(name.to_string(), size) != Some(size)
    }
}
