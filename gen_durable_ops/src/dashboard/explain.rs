//! The instance page's "explain" line: why an instance is where it is
//! ([`gen_durable::Client::explain`]'s `Display`).

use sqlx::PgPool;

use gen_durable::Client;

/// One line saying why instance `id` is where it is, or `None` when it cannot be read
/// (the row went away meanwhile, or the database failed: the page shows the rest).
pub(crate) async fn explain_line(pool: &PgPool, id: i64) -> Option<String> {
    let explained = Client::new(pool.clone()).explain(id).await;
    explained.ok().map(|e| e.to_string())
}
