//! Concurrency gates: at most K steps of one key running at once, across every node.
//!
//! A gate is declared by name with its limit ([`crate::EngineBuilder::gate`],
//! [`crate::Client::set_gate`]) and stored in `gd_gates`; a row joins one of its keys with
//! the insert option `gate((name, key))`. The name is always explicit: a key never joins
//! a gate because of how it is spelled, and a `partition_key` is a K = 1 key whatever
//! gates exist. Each full key (`("stripe", "acme")`, `("stripe", "beta")`) has its own
//! K slots; one global semaphore is one key (`LimitKey::global("smtp")`).
//!
//! The database enforces the limit: a claimed row holds a slot below K, and a unique
//! index over the executing rows' (gate, key, slot) makes a second holder impossible to
//! commit. Changing K takes effect at the next pick of every node. After a decrease, rows
//! admitted under the old limit finish their step; no new row is admitted until fewer
//! than the new K run, and the key's running rows never exceed the larger of the two.

use std::fmt;

use serde::Serialize;

use crate::model::error::{Error, Result};
use crate::model::validate;

/// The largest limit a gate can have (its slots are a `smallint`).
pub const MAX_GATE_SIZE: u32 = 32_767;

/// A gate's configuration: how many steps of one key may run at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gate {
    size: u32,
}

impl Gate {
    /// At most `limit` steps of one key at once (1 ..= [`MAX_GATE_SIZE`]; checked when
    /// the gate is declared).
    pub fn new(limit: u32) -> Self {
        Gate { size: limit }
    }

    /// The limit K.
    pub fn limit(&self) -> u32 {
        self.size
    }

    /// Checks gate `name` with this limit as `start` and `Client::set_gate` do: a name of
    /// 1 to 255 bytes without NUL, a limit in range (`Error::InvalidConfig`).
    pub fn check(&self, name: &str) -> Result<()> {
        gate_name(name)?;
        if self.size == 0 || self.size > MAX_GATE_SIZE {
            return Err(Error::InvalidConfig(format!(
                "gate {name:?}: the limit must be between 1 and {MAX_GATE_SIZE}, got {}",
                self.size
            )));
        }
        Ok(())
    }
}

/// The full key a row runs under in a gate or a rate limit: the limit's name and the key
/// within it. Each full key has its own K slots (a gate) or its own bucket (a rate limit).
/// A `(name, key)` tuple converts into one; a bare name is its limit's one global key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LimitKey {
    pub(crate) name: String,
    pub(crate) key: String,
}

impl LimitKey {
    /// Key `key` of limit `name`.
    pub fn new(name: impl Into<String>, key: impl Into<String>) -> Self {
        LimitKey {
            name: name.into(),
            key: key.into(),
        }
    }

    /// The one key of limit `name` (the empty key): one gate or bucket for everything in it.
    pub fn global(name: impl Into<String>) -> Self {
        LimitKey::new(name, "")
    }

    /// The limit's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The key within the limit.
    pub fn key(&self) -> &str {
        &self.key
    }
}

impl fmt::Display for LimitKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[{}]", self.name, self.key)
    }
}

impl From<&str> for LimitKey {
    fn from(name: &str) -> Self {
        LimitKey::global(name)
    }
}

impl From<String> for LimitKey {
    fn from(name: String) -> Self {
        LimitKey::global(name)
    }
}

impl<N: Into<String>, K: Into<String>> From<(N, K)> for LimitKey {
    fn from((name, key): (N, K)) -> Self {
        LimitKey::new(name, key)
    }
}

/// A row's concurrency key: a K = 1 partition key, or a key of a gate. (Public only for
/// the insert-option setters that macros expand in other crates.)
#[doc(hidden)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConcurrencyKey {
    /// A K = 1 key.
    Partition(String),
    /// A key of a gate.
    Gate(LimitKey),
}

impl ConcurrencyKey {
    /// As stored: (`partition_key`, `gate`).
    pub(crate) fn columns(&self) -> (String, Option<String>) {
        match self {
            ConcurrencyKey::Partition(k) => (k.clone(), None),
            ConcurrencyKey::Gate(g) => (g.key.clone(), Some(g.name.clone())),
        }
    }
}

/// One key of a gate in use, or a declared gate with no key in use (`key` None), as
/// [`Client::gates`](crate::Client::gates) and `gen_durable status` show them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GateUse {
    /// The gate.
    pub name: String,
    /// Its limit K.
    pub limit: u32,
    /// The key.
    pub key: Option<String>,
    /// Rows of the key executing now (claimed, buffered or running), holding slots.
    pub running: i64,
    /// Runnable rows of the key waiting (due or not).
    pub waiting: i64,
}

/// A gate name: 1 to 255 bytes, no NUL.
pub(crate) fn gate_name(name: &str) -> Result<()> {
    if name.is_empty() || name.len() > 255 {
        return Err(Error::InvalidInput {
            what: "gate name",
            reason: format!("must be 1 to 255 bytes, got {}", name.len()),
        });
    }
    validate::text("gate name", name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_out_of_range_are_refused_with_the_gate_named() {
        assert!(Gate::new(1).check("g").is_ok());
        assert!(Gate::new(MAX_GATE_SIZE).check("g").is_ok());
        let e = Gate::new(0).check("stripe").unwrap_err().to_string();
        assert!(
            e.contains("\"stripe\"") && e.contains("between 1 and"),
            "{e}"
        );
        assert!(Gate::new(MAX_GATE_SIZE + 1).check("g").is_err());
        assert!(Gate::new(3).check("").is_err());
    }

    #[test]
    fn a_tuple_names_the_gate_then_the_key() {
        let k: LimitKey = ("stripe", String::from("acme")).into();
        assert_eq!((k.name(), k.key()), ("stripe", "acme"));
        assert_eq!(LimitKey::global("smtp").key(), "");
        assert_eq!(k.to_string(), "stripe[acme]");
    }
}
