//! Shared test fixtures: hand-written FSMs (the engine's tests do not depend on the
//! macros) and small helpers.
#![allow(dead_code)]

use gen_durable::{Ctx, DurableState, Fsm, Step, StepFuture};
use serde::{Deserialize, Serialize};

/// A state with one required and one optional field.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Order {
    pub order: u64,
    #[serde(default)]
    pub paid: Option<u64>,
}

impl DurableState for Order {
    const TYPE_NAME: &'static str = "Order";
}

/// A two-step FSM whose steps are never run by the client tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checkout {
    Reserve,
    Ship,
}

impl Fsm for Checkout {
    type State = Order;
    const NAME: &'static str = "Checkout";
    const VERSION: i32 = 2;
    const QUEUE: &'static str = "checkout";
    const STEPS: &'static [&'static str] = &["reserve", "ship"];

    fn initial() -> Self {
        Checkout::Reserve
    }
    fn step_name(self) -> &'static str {
        match self {
            Checkout::Reserve => "reserve",
            Checkout::Ship => "ship",
        }
    }
    fn from_step_name(name: &str) -> Option<Self> {
        match name {
            "reserve" => Some(Checkout::Reserve),
            "ship" => Some(Checkout::Ship),
            _ => None,
        }
    }
    fn run_step<'a>(self, _ctx: &'a mut Ctx<Self>) -> StepFuture<'a, Self> {
        Box::pin(async move { Ok(Step::done(serde_json::json!({"shipped": true}))) })
    }
}

/// A registry with the fixtures, for `Client::with_registry`.
pub fn registry() -> gen_durable::Registry {
    let mut r = gen_durable::Registry::new();
    r.register::<Checkout>();
    r
}

/// One column of one instance, as text, for assertions.
pub async fn column(pool: &sqlx::PgPool, id: i64, col: &str) -> Option<String> {
    sqlx::query_scalar(&format!(
        "SELECT {col}::text FROM gd_instances WHERE id = $1"
    ))
    .bind(id)
    .fetch_one(pool)
    .await
    .expect("row exists")
}

pub async fn count(pool: &sqlx::PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql)
        .fetch_one(pool)
        .await
        .expect("count query")
}
