//! `gen_durable explain ID` (or `--key K`): why an instance is not running, or what it is
//! doing — `Client::explain`'s line, then its evidence.

use std::fmt::Write as _;

use sqlx::PgPool;

use super::{CliError, Output};
use gen_durable::{Client, Target};

pub(crate) async fn run(pool: &PgPool, target: Target) -> Result<Output, CliError> {
    let why = Client::new(pool.clone()).explain(target).await?;
    let mut text = format!("{why}\n");
    for line in why.evidence() {
        let _ = writeln!(text, "  {line}");
    }
    let json = serde_json::to_value(&why).map_err(gen_durable::Error::from)?;
    Ok(Output { json, text })
}
