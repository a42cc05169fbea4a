use gen_durable::prelude::*;
use gen_durable::{durable_fsm, durable_steps};

#[derive(DurableState, Serialize, Deserialize, Default, Debug, Clone)]
struct OrderState {
    order: u64,
}

#[durable_fsm(state = OrderState, history = "everything")]
enum Checkout {
    #[initial]
    Reserve,
    Ship,
}

#[durable_steps]
impl Checkout {
    async fn reserve(_ctx: &mut Ctx<Self>) -> StepResult<Self> {
        Ok(Step::next(Checkout::Ship))
    }
    async fn ship(_ctx: &mut Ctx<Self>) -> StepResult<Self> {
        Ok(Step::done(json!({})))
    }
}

fn main() {}
