//! [`Target`]: how a caller names an instance — by id, or by its correlation key.

use std::fmt;

/// An instance, named by its id or by its correlation key. Functions that address an
/// instance (`Client::signal`, `Client::wait`, the testkit's) take `impl Into<Target>`,
/// so an `i64` id and a [`Key`] both work.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Target {
    /// The instance with this id.
    Id(i64),
    /// The one instance holding this correlation key: a live one, or a finished one
    /// whose key's scope includes its terminal status.
    Key(String),
}

/// A correlation key as a [`Target`]: `gd.signal(Key("order:42"), "paid", payload)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Key<S>(pub S);

impl From<i64> for Target {
    fn from(id: i64) -> Self {
        Target::Id(id)
    }
}

impl<S: Into<String>> From<Key<S>> for Target {
    fn from(key: Key<S>) -> Self {
        Target::Key(key.0.into())
    }
}

impl Target {
    /// The id, when the target names one.
    pub fn id(&self) -> Option<i64> {
        match self {
            Target::Id(id) => Some(*id),
            Target::Key(_) => None,
        }
    }

    /// The key, when the target names one.
    pub fn key(&self) -> Option<&str> {
        match self {
            Target::Id(_) => None,
            Target::Key(k) => Some(k),
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Id(id) => write!(f, "instance {id}"),
            Target::Key(k) => write!(f, "key {k:?}"),
        }
    }
}
