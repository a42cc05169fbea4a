//! The workload: `Steady`, the three-step FSM with a signal that every instance runs.

use gen_durable::prelude::*;

/// One step, another, a park on `go`, done.
#[durable_fsm(state = (), queue = "steady")]
pub(crate) enum Steady {
    /// Goes on at once.
    #[initial]
    One,
    /// Parks until `go`.
    Two,
    /// Done.
    Finish,
}

#[durable_steps]
impl Steady {
    async fn one(_ctx: &mut Ctx<Self>) -> StepResult<Self> {
        Ok(Step::next(Steady::Two))
    }

    async fn two(_ctx: &mut Ctx<Self>) -> StepResult<Self> {
        Ok(Step::await_signal(["go"], Steady::Finish))
    }

    async fn finish(ctx: &mut Ctx<Self>) -> StepResult<Self> {
        Ok(Step::done(json!({ "go": ctx.awaited().len() })))
    }
}
