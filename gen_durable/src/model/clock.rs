//! Where "now" comes from. Production uses the database's `now()`; tests may pin a
//! manual clock that every time-dependent statement receives as `$now`
//! (`coalesce($now, now())`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};

/// The clock the client and engine hand to SQL. Cheap to clone; clones share time.
#[derive(Debug, Clone, Default)]
pub struct Clock {
    manual: Option<Arc<Mutex<DateTime<Utc>>>>,
}

impl Clock {
    /// The database's own `now()`: the default, and the only clock for production.
    pub fn database() -> Self {
        Clock { manual: None }
    }

    /// A clock pinned at `start` that moves only when told to.
    pub fn manual(start: DateTime<Utc>) -> Self {
        Clock {
            manual: Some(Arc::new(Mutex::new(start))),
        }
    }

    /// Moves a manual clock forward. No effect on the database clock.
    pub fn advance(&self, by: Duration) {
        if let Some(m) = &self.manual {
            let mut t = m.lock().expect("clock lock");
            *t += chrono::Duration::from_std(by).expect("duration in range");
        }
    }

    /// Sets a manual clock. No effect on the database clock.
    pub fn set(&self, at: DateTime<Utc>) {
        if let Some(m) = &self.manual {
            *m.lock().expect("clock lock") = at;
        }
    }

    /// The `$now` parameter: `None` means the database's `now()`.
    pub fn now_param(&self) -> Option<DateTime<Utc>> {
        self.manual.as_ref().map(|m| *m.lock().expect("clock lock"))
    }

    /// True for a manual clock.
    pub fn is_manual(&self) -> bool {
        self.manual.is_some()
    }
}
