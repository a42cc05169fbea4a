//! Sharing the caller's pool: the committer and a client's group insert keep a connection
//! between statements (no acquire, and none of sqlx's pings, per statement), but only
//! while the pool can still serve everyone else.

use sqlx::PgPool;

/// Whether the pool can serve another caller without the connections held back: it has
/// an idle one, or room to open one. When it has neither, a held connection goes back,
/// so that a claim, a step or the other holder is not left waiting for it.
pub(crate) fn can_spare(pool: &PgPool) -> bool {
    pool.num_idle() > 0 || pool.size() < pool.options().get_max_connections()
}
