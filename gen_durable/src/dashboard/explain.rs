//! The instance page's "explain" line: why an instance is where it is.
//!
//! `Client::explain(id) -> Result<Explanation>` (with a `Display`) is being built on
//! another branch; once merged, this function returns its line, and the page shows it.
//! Until then there is no line, and the page shows nothing in its place.

use sqlx::PgPool;

/// One line saying why instance `id` is where it is, or `None` when none can be given.
pub(crate) async fn explain_line(pool: &PgPool, id: i64) -> Option<String> {
    let _ = (pool, id);
    None
}
