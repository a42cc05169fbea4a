//! A migration is between two versions of one FSM (the same name).
use gen_durable::prelude::*;
use gen_durable::{durable_fsm, durable_migration, durable_steps};

mod v1 {
    use gen_durable::prelude::*;
    use gen_durable::{durable_fsm, durable_steps};
    #[derive(DurableState, Serialize, Deserialize, Default, Debug, Clone)]
    pub struct S {
        pub n: u64,
    }
    #[durable_fsm(state = S, name = "order", version = 1)]
    pub enum Order {
        #[initial]
        Reserve,
        Notify,
    }
    #[durable_steps]
    impl Order {
        async fn reserve(_ctx: &mut Ctx<Self>) -> StepResult<Self> {
            Ok(Step::next(Order::Notify))
        }
        async fn notify(_ctx: &mut Ctx<Self>) -> StepResult<Self> {
            Ok(Step::done(json!({})))
        }
    }
}

#[durable_fsm(state = v1::S, name = "invoice", version = 2)]
enum Order {
    #[initial]
    Reserve,
    Email,
}

#[durable_steps]
impl Order {
    async fn reserve(_ctx: &mut Ctx<Self>) -> StepResult<Self> {
        Ok(Step::next(Order::Email))
    }
    async fn email(_ctx: &mut Ctx<Self>) -> StepResult<Self> {
        Ok(Step::done(json!({})))
    }
}

#[durable_migration]
impl Migration for Order {
    type From = v1::Order;
    fn migrate_state(old: v1::S) -> Result<v1::S, MigrationError> {
        Ok(old)
    }
    fn migrate_step(old: v1::Order) -> Self {
        match old {
            v1::Order::Reserve => Order::Reserve,
            v1::Order::Notify => Order::Email,
        }
    }
}

fn main() {}
