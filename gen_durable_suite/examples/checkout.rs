//! The spec's checkout workflow: reserve stock, wait for `payment_confirmed` with a
//! timeout, ship. A simulated payment provider confirms some orders and lets the others
//! time out. Prints each step as it commits and a summary table at the end; Ctrl-C drains.
//!
//! ```sh
//! cargo run --example checkout                 # 20 orders
//! cargo run --example checkout -- 5            # 5 orders
//! ```
//! Uses `DATABASE_URL`'s server (default: the local one) and its own database there,
//! `gen_durable_examples`, which it creates and migrates.

use std::time::Duration;

mod common;

use gen_durable::prelude::*;
use gen_durable::Event;

#[derive(DurableState, Serialize, Deserialize, Default, Debug, Clone)]
pub struct CheckoutState {
    pub order: u64,
    #[durable(default)]
    pub paid: Option<u64>,
}

#[durable_fsm(state = CheckoutState, queue = "checkout", version = 2)]
pub enum Checkout {
    #[initial]
    Reserve,
    Ship,
}

#[durable_steps]
impl Checkout {
    async fn reserve(ctx: &mut Ctx<Self>) -> StepResult<Self> {
        println!(
            "  order {:>3}: stock reserved, waiting for payment",
            ctx.state.order
        );
        Ok(Step::await_signal(["payment_confirmed"], Checkout::Ship)
            .timeout(Duration::from_secs(2)))
    }

    async fn ship(ctx: &mut Ctx<Self>) -> StepResult<Self> {
        let paid = ctx
            .awaited()
            .first()
            .and_then(|s| s.payload()["amount"].as_u64());
        ctx.state.paid = paid;
        match paid {
            Some(amount) => {
                println!("  order {:>3}: paid {amount}, shipped", ctx.state.order);
                Ok(Step::done(json!({ "shipped": true, "paid": amount })))
            }
            None => {
                println!(
                    "  order {:>3}: no payment in time, released the stock",
                    ctx.state.order
                );
                Ok(Step::stop("payment timed out"))
            }
        }
    }

    async fn handle(err: StepError, ctx: &mut Ctx<Self>) -> StepResult<Self> {
        if ctx.attempt() < 5 {
            Ok(Step::replay(backoff(ctx.attempt())))
        } else {
            Ok(Step::stop(err))
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let orders: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(20);
    let pool = common::connect().await?;

    let engine = Engine::builder(pool.clone())
        .queue("checkout", 10)
        .on_event(|e| {
            if let Event::StepStop { id, step, kind, .. } = e {
                println!("  [{id}] {step} -> {kind}");
            }
        })
        .start()
        .await?;

    let gd = Client::new(pool.clone());
    println!("inserting {orders} orders");
    let mut ids = Vec::new();
    for order in 1..=orders {
        let id = gd
            .insert::<Checkout>(CheckoutState { order, paid: None })
            .partition_key(format!("order:{order}"))
            .await?;
        ids.push((order, id));
    }

    // The payment provider confirms two orders in three, after a short while; the
    // confirmation is idempotent thanks to its dedup key.
    let provider = {
        let gd = gd.clone();
        let ids = ids.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            for (order, id) in ids.into_iter().filter(|(o, _)| o % 3 != 0) {
                let payment = json!({ "amount": 100 + order });
                let key = format!("payment-{order}");
                // Providers redeliver: the second copy stores nothing, or finds the
                // order already shipped.
                for _ in 0..2 {
                    match gd
                        .signal(id, "payment_confirmed", payment.clone())
                        .dedup_key(&key)
                        .await
                    {
                        Ok(_) | Err(gen_durable::Error::Finished { .. }) => {}
                        Err(e) => return Err(e),
                    }
                }
            }
            Ok::<_, gen_durable::Error>(())
        })
    };

    let finished = async {
        loop {
            let open: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM gd_instances WHERE id = ANY($1) AND status NOT IN ('done', 'failed')",
            )
            .bind(ids.iter().map(|(_, id)| *id).collect::<Vec<_>>())
            .fetch_one(&pool)
            .await?;
            if open == 0 {
                return Ok::<_, sqlx::Error>(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::select! {
        r = finished => r?,
        _ = tokio::signal::ctrl_c() => println!("Ctrl-C: draining"),
    }
    provider.await??;
    let report = engine.shutdown(Duration::from_secs(10)).await;
    println!(
        "drained: released {}, in flight {}",
        report.released(),
        report.in_flight()
    );

    let rows: Vec<(i64, String, Option<String>, Option<String>)> = sqlx::query_as(
        "SELECT (state->>'order')::int8, status::text, result::text, last_error
           FROM gd_instances WHERE id = ANY($1) ORDER BY 1",
    )
    .bind(ids.iter().map(|(_, id)| *id).collect::<Vec<_>>())
    .fetch_all(&pool)
    .await?;
    println!("\n{:>5}  {:<7}  result / error", "order", "status");
    for (order, status, result, error) in &rows {
        println!(
            "{order:>5}  {status:<7}  {}",
            result.clone().or(error.clone()).unwrap_or_default()
        );
    }
    let shipped = rows.iter().filter(|r| r.1 == "done").count();
    println!("\n{shipped} shipped, {} timed out", rows.len() - shipped);
    Ok(())
}
