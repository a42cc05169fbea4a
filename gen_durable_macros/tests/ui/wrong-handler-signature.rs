use gen_durable::prelude::*;
use gen_durable::{durable_fsm, durable_steps};

#[derive(DurableState, Serialize, Deserialize, Default, Debug, Clone)]
struct OrderState {
    order: u64,
}

#[durable_fsm(state = OrderState)]
enum Checkout {
    #[initial]
    Reserve,
    Pay,
    Ship,
    Notify,
}

#[durable_steps]
impl Checkout {
    // An extra argument.
    async fn reserve(_ctx: &mut Ctx<Self>, _order: u64) -> StepResult<Self> {
        Ok(Step::next(Checkout::Pay))
    }
    // The wrong context type.
    async fn pay(_ctx: &mut OrderState) -> StepResult<Self> {
        Ok(Step::next(Checkout::Ship))
    }
    // The wrong return type.
    async fn ship(_ctx: &mut Ctx<Self>) -> Result<(), String> {
        Ok(())
    }
    // Not async.
    fn notify(_ctx: &mut Ctx<Self>) -> StepResult<Self> {
        Ok(Step::done(json!({})))
    }
}

fn main() {}
