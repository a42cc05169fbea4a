use gen_durable::prelude::*;
use gen_durable::{durable_fsm, durable_steps};

#[derive(DurableState, Serialize, Deserialize, Default, Debug, Clone)]
struct OrderState {
    tenant: String,
}

#[durable_fsm(state = OrderState)]
enum Checkout {
    #[initial]
    Reserve,
    Charge,
    Ship,
    Refund,
}

#[durable_steps]
impl Checkout {
    #[step(key = tenant)]
    async fn reserve(_ctx: &mut Ctx<Self>) -> StepResult<Self> {
        Ok(Step::next(Checkout::Charge))
    }
    #[step(rate_limit = "stripe", key = "tenant", weight = 0)]
    async fn charge(_ctx: &mut Ctx<Self>) -> StepResult<Self> {
        Ok(Step::next(Checkout::Ship))
    }
    #[step(rate_limit = "stripe", per = 10)]
    async fn ship(_ctx: &mut Ctx<Self>) -> StepResult<Self> {
        Ok(Step::next(Checkout::Refund))
    }
    #[step(rate_limit = "stripe", key = customer)]
    async fn refund(_ctx: &mut Ctx<Self>) -> StepResult<Self> {
        Ok(Step::done(json!({})))
    }
}

fn main() {}
