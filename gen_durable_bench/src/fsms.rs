//! The FSMs the scenarios run, and the probe their steps report to.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use gen_durable::prelude::*;
use gen_durable::Child;
use tokio::sync::mpsc;

/// Where steps record when they start, so the harness can time from the first step.
#[derive(Debug, Default)]
pub(crate) struct Probe {
    pub(crate) first_start: Option<Instant>,
    pub(crate) starts: HashMap<i64, Instant>,
    pub(crate) runs: u64,
    pub(crate) record_starts: bool,
    pub(crate) woken: Option<mpsc::UnboundedSender<(i64, Instant)>>,
}

pub(crate) static PROBE: Mutex<Option<Probe>> = Mutex::new(None);

/// Resets the probe for a new scenario.
pub(crate) fn reset_probe(record_starts: bool) {
    *PROBE.lock().expect("probe") = Some(Probe {
        record_starts,
        ..Probe::default()
    });
}

fn started(id: i64) {
    let now = Instant::now();
    let mut g = PROBE.lock().expect("probe");
    if let Some(p) = g.as_mut() {
        p.first_start.get_or_insert(now);
        p.runs += 1;
        if p.record_starts {
            p.starts.insert(id, now);
        }
    }
}

/// The state of every bench FSM.
#[derive(DurableState, Serialize, Deserialize, Default, Debug, Clone)]
pub(crate) struct BenchState {
    /// Which instance of the batch this is.
    pub(crate) i: i64,
    /// Steps taken (five_step) or children to spawn (fan_out).
    #[durable(default)]
    pub(crate) n: i64,
    /// Padding (`--state-bytes`).
    #[durable(default)]
    #[serde(skip_serializing_if = "String::is_empty")]
    pub(crate) pad: String,
}

/// The padding of the states `--state-bytes` asks for.
static PAD: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Sets the padding of every state made by [`BenchState::new`] from now on.
pub(crate) fn pad_states(bytes: usize) {
    let _ = PAD.set("x".repeat(bytes));
}

impl BenchState {
    /// Instance `i`'s state, with `n` and the padding `--state-bytes` asked for.
    pub(crate) fn new(i: i64, n: i64) -> Self {
        BenchState {
            i,
            n,
            pad: PAD.get().cloned().unwrap_or_default(),
        }
    }
}

/// One no-op step: done with its own `i`.
#[durable_fsm(state = BenchState, queue = "bench", version = 1)]
pub(crate) enum Noop {
    /// The only step.
    #[initial]
    Run,
}

#[durable_steps]
impl Noop {
    async fn run(ctx: &mut Ctx<Self>) -> StepResult<Self> {
        started(ctx.id());
        Ok(Step::done(json!(ctx.state.i)))
    }
}

/// Five steps, each adding one to `n`; done with `n` (5). Run-ahead: one claim runs
/// all five, each step's outcome still committed before the next runs.
#[durable_fsm(state = BenchState, queue = "bench", version = 1, run_ahead = true)]
pub(crate) enum Five {
    /// Step 1.
    #[initial]
    S1,
    /// Step 2.
    S2,
    /// Step 3.
    S3,
    /// Step 4.
    S4,
    /// Step 5.
    S5,
}

#[durable_steps]
impl Five {
    async fn s1(ctx: &mut Ctx<Self>) -> StepResult<Self> {
        started(ctx.id());
        ctx.state.n += 1;
        Ok(Step::next(Five::S2))
    }
    async fn s2(ctx: &mut Ctx<Self>) -> StepResult<Self> {
        started(ctx.id());
        ctx.state.n += 1;
        Ok(Step::next(Five::S3))
    }
    async fn s3(ctx: &mut Ctx<Self>) -> StepResult<Self> {
        started(ctx.id());
        ctx.state.n += 1;
        Ok(Step::next(Five::S4))
    }
    async fn s4(ctx: &mut Ctx<Self>) -> StepResult<Self> {
        started(ctx.id());
        ctx.state.n += 1;
        Ok(Step::next(Five::S5))
    }
    async fn s5(ctx: &mut Ctx<Self>) -> StepResult<Self> {
        started(ctx.id());
        ctx.state.n += 1;
        Ok(Step::done(json!(ctx.state.n)))
    }
}

/// Parks on `go`; the woken step reports the instant it starts.
#[durable_fsm(state = BenchState, queue = "bench", version = 1)]
pub(crate) enum Waiter {
    /// Parks.
    #[initial]
    Park,
    /// Runs on `go`.
    Woken,
}

#[durable_steps]
impl Waiter {
    async fn park(_ctx: &mut Ctx<Self>) -> StepResult<Self> {
        Ok(Step::await_signal(["go"], Waiter::Woken))
    }
    async fn woken(ctx: &mut Ctx<Self>) -> StepResult<Self> {
        let now = Instant::now();
        if let Some(tx) = PROBE
            .lock()
            .expect("probe")
            .as_ref()
            .and_then(|p| p.woken.clone())
        {
            let _ = tx.send((ctx.id(), now));
        }
        let got = ctx.awaited().len();
        Ok(Step::done(json!(got)))
    }
}

/// A leaf child: done with its `i`.
#[durable_fsm(state = BenchState, queue = "bench", version = 1)]
pub(crate) enum Leaf {
    /// The only step.
    #[initial]
    Run,
}

#[durable_steps]
impl Leaf {
    async fn run(ctx: &mut Ctx<Self>) -> StepResult<Self> {
        Ok(Step::done(json!(ctx.state.i)))
    }
}

/// Spawns `n` leaves, then sums what they returned.
#[durable_fsm(state = BenchState, queue = "bench", version = 1)]
pub(crate) enum FanParent {
    /// Fan-out.
    #[initial]
    Spawn,
    /// Fan-in.
    Sum,
}

#[durable_steps]
impl FanParent {
    async fn spawn(ctx: &mut Ctx<Self>) -> StepResult<Self> {
        started(ctx.id());
        let kids: Vec<Child> = (0..ctx.state.n)
            .map(|i| Child::new::<Leaf>(BenchState::new(i, 0)))
            .collect();
        Ok(Step::schedule_children(kids, FanParent::Sum))
    }
    async fn sum(ctx: &mut Ctx<Self>) -> StepResult<Self> {
        let total = ctx.children().len();
        let done = ctx
            .children()
            .iter()
            .filter(|c| c.status == Status::Done)
            .count();
        let sum: i64 = ctx
            .children()
            .iter()
            .filter_map(|c| c.result.as_ref().and_then(|r| r.as_i64()))
            .sum();
        Ok(Step::done(
            json!({ "total": total, "done": done, "sum": sum }),
        ))
    }
}
