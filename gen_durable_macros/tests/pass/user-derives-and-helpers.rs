//! The enum already derives some of the traits the macro adds; the steps block holds
//! sync helpers and methods besides the handlers; everything is spelled with full paths.
#![deny(warnings)]

#[derive(gen_durable::DurableState, serde::Serialize, serde::Deserialize, Debug, Clone)]
struct Counter {
    n: u32,
}

#[gen_durable::durable_fsm(state = Counter, name = "counter", version = 3, queue = "q", max_reaps = 2)]
#[derive(Debug, Clone, Copy)]
enum Count {
    #[initial]
    #[step(name = "count-up")]
    Up,
    /// Finishes.
    Done,
}

#[gen_durable::durable_steps]
impl Count {
    const LIMIT: u32 = 3;

    fn over(n: u32) -> bool {
        n >= Self::LIMIT
    }

    /// Counts up to the limit.
    pub async fn up(ctx: &mut gen_durable::Ctx<Self>) -> gen_durable::StepResult<Self> {
        ctx.state.n += 1;
        if Self::over(ctx.state.n) {
            return Ok(gen_durable::Step::next(Count::Done));
        }
        Ok(gen_durable::Step::replay(std::time::Duration::ZERO))
    }

    async fn done(ctx: &mut gen_durable::Ctx<Self>) -> gen_durable::StepResult<Self> {
        Ok(gen_durable::Step::done(serde_json::json!(ctx.state.n)))
    }
}

fn main() {
    use gen_durable::Fsm;
    assert_eq!(Count::STEPS, ["count-up", "done"]);
    assert_eq!(Count::MAX_REAPS, 2);
    assert_eq!(Count::Up, Count::initial());
}
