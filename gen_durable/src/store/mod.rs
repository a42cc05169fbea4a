//! Persistence, above the contract and below everything else: every SQL statement
//! gen_durable runs (`pg`), statements through a transaction-mode pooler (`pooler`), a
//! connection shared with the caller's pool (`pool`), and the coalescing of wake-ups
//! (`notify`). It imports only `model`.

pub(crate) mod notify;
pub(crate) mod pg;
pub(crate) mod pool;
pub(crate) mod pooler;
