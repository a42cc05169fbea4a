//! The metadata `#[durable_fsm]` generates (names, versions, queues, steps both
//! ways), registration of every linked FSM (an old version beside a new one), and
//! dispatch to the handlers and to `handle`, run through the engine's step runner (with
//! what it makes of a child that would not insert).

use gen_durable::backend::{run_erased, Outcome, StepInput};
use gen_durable::prelude::*;
use gen_durable::{durable_fsm, durable_steps, Registry};

#[derive(DurableState, Serialize, Deserialize, Default, Debug, Clone)]
struct OrderState {
    order: u64,
}

/// A three-step FSM with every key but `state` at its default.
#[durable_fsm(state = OrderState)]
enum Fulfil {
    Pick,
    #[initial]
    PackBox,
    ShipHTTPLabel,
}

#[durable_steps]
impl Fulfil {
    async fn pick(_ctx: &mut Ctx<Self>) -> StepResult<Self> {
        Ok(Step::next(Fulfil::PackBox))
    }
    async fn pack_box(ctx: &mut Ctx<Self>) -> StepResult<Self> {
        if ctx.state.order == 0 {
            return Err(StepError::new("no order"));
        }
        ctx.state.order += 1;
        Ok(Step::next(Fulfil::ShipHTTPLabel))
    }
    async fn ship_http_label(ctx: &mut Ctx<Self>) -> StepResult<Self> {
        Ok(Step::done(json!({ "order": ctx.state.order })))
    }
}

/// The current version, with a renamed step and a `handle`.
#[durable_fsm(state = OrderState, queue = "checkout", version = 2, max_reaps = 3)]
enum Checkout {
    #[initial]
    #[step(name = "reserve_stock")]
    Reserve,
    Ship,
}

#[durable_steps]
impl Checkout {
    async fn reserve(_ctx: &mut Ctx<Self>) -> StepResult<Self> {
        panic!("stock service down");
    }
    async fn ship(_ctx: &mut Ctx<Self>) -> StepResult<Self> {
        Ok(Step::done(json!(null)))
    }
    async fn handle(err: StepError, ctx: &mut Ctx<Self>) -> StepResult<Self> {
        if ctx.attempt() < 2 {
            Ok(Step::replay(backoff(ctx.attempt())))
        } else {
            Ok(Step::stop(err))
        }
    }
}

/// The old version keeps running by keeping its type.
#[durable_fsm(name = "Checkout", version = 1, state = OrderState, queue = "checkout")]
enum CheckoutV1 {
    #[initial]
    Reserve,
}

#[durable_steps]
impl CheckoutV1 {
    async fn reserve(_ctx: &mut Ctx<Self>) -> StepResult<Self> {
        Ok(Step::done(json!("v1")))
    }
}

/// Sets its state, then schedules a child at a step the child's FSM does not have.
#[durable_fsm(state = OrderState)]
enum Spawn {
    #[initial]
    Start,
    Sum,
}

#[durable_steps]
impl Spawn {
    async fn start(ctx: &mut Ctx<Self>) -> StepResult<Self> {
        ctx.state.order = 9;
        let child = Child::new::<Fulfil>(OrderState::default()).step("nope");
        Ok(Step::schedule_children(vec![child], Spawn::Sum))
    }
    async fn sum(_ctx: &mut Ctx<Self>) -> StepResult<Self> {
        Ok(Step::done(json!(null)))
    }
}

#[test]
fn three_step_defaults() {
    assert_eq!(Fulfil::NAME, "Fulfil");
    assert_eq!(Fulfil::VERSION, 1);
    assert_eq!(Fulfil::QUEUE, "default");
    assert_eq!(Fulfil::MAX_REAPS, 10);
    assert_eq!(Fulfil::STEPS, ["pick", "pack_box", "ship_http_label"]);
    assert_eq!(Fulfil::initial(), Fulfil::PackBox);
    for (i, step) in [Fulfil::Pick, Fulfil::PackBox, Fulfil::ShipHTTPLabel]
        .into_iter()
        .enumerate()
    {
        assert_eq!(step.step_name(), Fulfil::STEPS[i]);
        assert_eq!(Fulfil::from_step_name(Fulfil::STEPS[i]), Some(step));
    }
    assert_eq!(Fulfil::from_step_name("Pick"), None);
    assert_eq!(Fulfil::from_step_name(""), None);
}

#[test]
fn explicit_keys_and_renamed_step() {
    assert_eq!(Checkout::NAME, "Checkout");
    assert_eq!(Checkout::VERSION, 2);
    assert_eq!(Checkout::QUEUE, "checkout");
    assert_eq!(Checkout::MAX_REAPS, 3);
    assert_eq!(Checkout::STEPS, ["reserve_stock", "ship"]);
    assert_eq!(Checkout::initial().step_name(), "reserve_stock");
    assert_eq!(
        Checkout::from_step_name("reserve_stock"),
        Some(Checkout::Reserve)
    );
    assert_eq!(Checkout::from_step_name("reserve"), None);
}

#[test]
fn old_and_new_versions_are_both_registered() {
    let reg = Registry::linked();
    let v1 = reg.resolve("Checkout", 1).expect("v1 registered");
    let v2 = reg.resolve("Checkout", 2).expect("v2 registered");
    assert_eq!(
        (v1.version, v1.initial(), v1.steps),
        (1, "reserve", &["reserve"][..])
    );
    assert_eq!(
        (v2.version, v2.initial(), v2.max_reaps),
        (2, "reserve_stock", 3)
    );
    assert_eq!(reg.latest("Checkout").map(|e| e.version), Some(2));
    assert!(reg.get("Fulfil", 1).is_some());
    assert!(v2.check_step("ship").is_ok());
    assert!(v2.check_step("reserve").is_err());
}

fn input(step: &str, state: serde_json::Value, attempt: i32) -> StepInput {
    StepInput {
        attempt,
        ..StepInput::new(1, step, state, chrono::Utc::now())
    }
}

#[tokio::test]
async fn run_step_dispatches_to_the_named_handler() {
    let out = run_erased::<Fulfil>(input("pack_box", json!({ "order": 7 }), 0)).await;
    assert!(
        matches!(
            out.outcome,
            Outcome::Next {
                step: "ship_http_label"
            }
        ),
        "{out:?}"
    );
    assert_eq!(out.state, json!({ "order": 8 }));

    let out = run_erased::<Fulfil>(input("ship_http_label", json!({ "order": 8 }), 0)).await;
    assert!(matches!(&out.outcome, Outcome::Done { result } if result == &json!({ "order": 8 })));
}

#[tokio::test]
async fn without_handle_a_failed_step_stops() {
    let out = run_erased::<Fulfil>(input("pack_box", json!({ "order": 0 }), 0)).await;
    assert!(
        matches!(&out.outcome, Outcome::Stop { reason } if reason == "no order"),
        "{out:?}"
    );
}

#[tokio::test]
async fn a_defined_handle_receives_panics() {
    let out = run_erased::<Checkout>(input("reserve_stock", json!({ "order": 1 }), 0)).await;
    assert!(matches!(out.outcome, Outcome::Replay { .. }), "{out:?}");
    assert_eq!(
        out.error.as_deref(),
        Some("step panicked: stock service down")
    );

    let out = run_erased::<Checkout>(input("reserve_stock", json!({ "order": 1 }), 2)).await;
    assert!(
        matches!(&out.outcome, Outcome::Stop { reason } if reason.contains("stock service down")),
        "{out:?}"
    );
}

#[tokio::test]
async fn an_uncastable_state_fails_the_step_with_the_path() {
    let out = run_erased::<Fulfil>(input("pick", json!({ "order": "x" }), 0)).await;
    assert!(
        matches!(&out.outcome, Outcome::Stop { reason } if reason.contains("state.order: expected u64, found string")),
        "{out:?}"
    );
}

#[tokio::test]
async fn a_child_that_would_not_insert_stops_the_parent_keeping_the_state_it_set() {
    let out = run_erased::<Spawn>(input("start", json!({ "order": 1 }), 0)).await;
    let Outcome::Stop { reason } = &out.outcome else {
        panic!("expected a stop: {out:?}");
    };
    assert!(
        reason.starts_with("child Fulfil: ") && reason.contains("nope"),
        "{reason}"
    );
    assert_eq!(out.error.as_ref(), Some(reason));
    assert_eq!(out.state, json!({ "order": 9 }));
}
