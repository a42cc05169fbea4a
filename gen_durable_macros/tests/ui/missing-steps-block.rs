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
    Ship,
}

fn main() {}
