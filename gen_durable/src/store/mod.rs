//! Persistence. Every SQL statement gen_durable runs lives under `store::pg`.

pub(crate) mod pg;
