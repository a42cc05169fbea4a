//! The README's checkout example, verbatim but for the imports and rustfmt's line breaks.
// A user's crate, built as a test target of this package: the workspace's lints (a doc
// on every public item) are for our own crates, not for this one.
#![allow(missing_docs)]
use gen_durable::prelude::*;
use gen_durable::{durable_fsm, durable_steps};

async fn reserve_stock(_order: u64) -> Result<(), std::io::Error> {
    Ok(())
}

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
        reserve_stock(ctx.state.order).await?;
        Ok(Step::await_signal(["payment_confirmed"], Checkout::Ship)
            .timeout(Duration::from_secs(3600)))
    }

    async fn ship(ctx: &mut Ctx<Self>) -> StepResult<Self> {
        let paid = ctx.awaited().first().map(|s| s.payload()["amount"].clone());
        Ok(Step::done(json!({ "shipped": true, "paid": paid })))
    }

    /// Optional: what a failed step (an `Err` or a panic) turns into.
    async fn handle(err: StepError, ctx: &mut Ctx<Self>) -> StepResult<Self> {
        if ctx.attempt() < 5 {
            Ok(Step::replay(backoff(ctx.attempt())))
        } else {
            Ok(Step::stop(err))
        }
    }
}

fn main() {
    assert_eq!(<Checkout as Fsm>::NAME, "Checkout");
}
