//! Gates on a client: declaring one (or changing its limit) and reading its keys in use.
//! What a gate is, and its limits, are the contract's (`model::gate`).

use crate::model::error::Result;
use crate::model::gate::{Gate, GateUse};
use crate::store::pg;
use crate::Client;

impl Client {
    /// Declares gate `name` with `gate`'s limit, or changes its limit (see [`Gate`] for
    /// what a change does to rows already running). Returns true if it was written (new
    /// or changed). Lets a client insert into a gate before any engine declared it.
    pub async fn set_gate(&self, name: &str, gate: Gate) -> Result<bool> {
        gate.check(name)?;
        let gates = [(name.to_string(), gate.limit() as i32)];
        let db = self.pooler().pool(self.pool());
        Ok(pg::gate::declare(db, &gates, self.clock().now_param()).await? > 0)
    }

    /// Every declared gate with its keys in use, busiest first.
    pub async fn gates(&self) -> Result<Vec<GateUse>> {
        let rows = pg::gate::usage(self.pooler().pool(self.pool())).await?;
        Ok(rows
            .into_iter()
            .map(|r| GateUse {
                name: r.name,
                limit: r.size as u32,
                key: r.key,
                running: r.running,
                waiting: r.waiting,
            })
            .collect())
    }
}
