//! The operator CLI as a user builds it into their own binary: `main` calls
//! `gen_durable_ops::main()`, and the FSMs and instance migrations linked here are the
//! ones `gen_durable migrate-instances` applies (the stock `gen_durable` binary links none).
//! `gen_durable_suite/tests/cli_migrate_instances.rs` runs it.

use gen_durable::durable_migration;
use gen_durable::prelude::*;

/// Version 1 of a plan's state.
pub mod v1 {
    use gen_durable::prelude::*;

    /// A plan by name.
    #[derive(DurableState, Serialize, Deserialize, Debug, Clone)]
    pub struct Plan {
        /// `basic` or `pro`; anything else has no price.
        pub plan: String,
    }

    /// Charges, then notifies.
    #[durable_fsm(state = Plan, name = "billing", version = 1, queue = "billing")]
    pub enum Billing {
        /// Charges.
        #[initial]
        Charge,
        /// Notifies.
        Notify,
    }

    #[durable_steps]
    impl Billing {
        async fn charge(_ctx: &mut Ctx<Self>) -> StepResult<Self> {
            Ok(Step::next(Self::Notify))
        }
        async fn notify(_ctx: &mut Ctx<Self>) -> StepResult<Self> {
            Ok(Step::done(json!(null)))
        }
    }
}

/// Version 2's state: a price.
#[derive(DurableState, Serialize, Deserialize, Debug, Clone)]
pub struct Priced {
    /// The price in cents.
    pub cents: u64,
}

/// Version 2: `notify` became `email`.
#[durable_fsm(state = Priced, name = "billing", version = 2, queue = "billing")]
pub enum Billing {
    /// Charges.
    #[initial]
    Charge,
    /// Emails.
    Email,
}

#[durable_steps]
impl Billing {
    async fn charge(_ctx: &mut Ctx<Self>) -> StepResult<Self> {
        Ok(Step::next(Self::Email))
    }
    async fn email(_ctx: &mut Ctx<Self>) -> StepResult<Self> {
        Ok(Step::done(json!(null)))
    }
}

#[durable_migration]
impl Migration for Billing {
    type From = v1::Billing;

    fn migrate_state(old: v1::Plan) -> Result<Priced, MigrationError> {
        match old.plan.as_str() {
            "basic" => Ok(Priced { cents: 500 }),
            "pro" => Ok(Priced { cents: 2_000 }),
            other => Err(MigrationError::new(format!("no price for plan {other:?}"))),
        }
    }

    fn migrate_step(old: v1::Billing) -> Self {
        match old {
            v1::Billing::Charge => Self::Charge,
            v1::Billing::Notify => Self::Email,
        }
    }
}

fn main() -> std::process::ExitCode {
    gen_durable_ops::main()
}
