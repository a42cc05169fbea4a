//! The FSMs the scenarios run: hand-written (`test_fsm!`), so the suite depends on the
//! engine's contract only, not on the macros.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use gen_durable::{Child, DurableState, Registry, Status, Step, StepError};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::backend::mailer;
use crate::test_fsm;

// The state of every FSM here. `tag` names the scenario (and backend), for the logs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct S {
    pub n: i64,
    #[serde(default)]
    pub log: Vec<String>,
    #[serde(default)]
    pub tag: String,
}

impl DurableState for S {
    const TYPE_NAME: &'static str = "S";
}

impl S {
    pub fn tagged(tag: &str) -> S {
        S {
            tag: tag.to_string(),
            ..S::default()
        }
    }
    pub fn n(n: i64) -> S {
        S { n, ..S::default() }
    }
}

// A log shared by every instance of one scenario (steps of different instances write
// it, so the order they ran in can be checked).
static LOG: LazyLock<Mutex<HashMap<String, Vec<String>>>> = LazyLock::new(Default::default);

pub fn log(tag: &str, line: impl Into<String>) {
    LOG.lock()
        .unwrap()
        .entry(tag.to_string())
        .or_default()
        .push(line.into());
}

pub fn logged(tag: &str) -> Vec<String> {
    LOG.lock().unwrap().get(tag).cloned().unwrap_or_default()
}

// Steps of one partition currently running, and the most ever at once, per tag.
static RUNNING: LazyLock<Mutex<HashMap<String, (usize, usize)>>> = LazyLock::new(Default::default);

pub fn most_at_once(tag: &str) -> usize {
    RUNNING.lock().unwrap().get(tag).map_or(0, |r| r.1)
}

fn enter(tag: &str) {
    let mut m = RUNNING.lock().unwrap();
    let r = m.entry(tag.to_string()).or_default();
    r.0 += 1;
    r.1 = r.1.max(r.0);
}

fn exit(tag: &str) {
    RUNNING.lock().unwrap().get_mut(tag).unwrap().0 -= 1;
}

test_fsm!(Counter, state = S, queue = "conf", version = 1, {
    A => "a" |ctx| { ctx.state.n += 1; ctx.state.log.push(format!("a@{}", ctx.attempt())); Ok(Step::next(Counter::B)) },
    B => "b" |ctx| { ctx.state.n += 10; ctx.state.log.push(format!("b@{}", ctx.attempt())); Ok(Step::next(Counter::C)) },
    C => "c" |ctx| { ctx.state.n += 100; Ok(Step::done(json!({ "total": ctx.state.n }))) },
});

test_fsm!(Replayer, state = S, queue = "conf", version = 1, {
    Go => "go" |ctx| {
        ctx.state.log.push(format!("go@{}", ctx.attempt()));
        if ctx.attempt() < 2 { Ok(Step::replay(Duration::from_secs(10))) } else { Ok(Step::next(Replayer::Fin)) }
    },
    Fin => "fin" |ctx| { Ok(Step::done(json!({ "attempt_at_fin": ctx.attempt(), "log": ctx.state.log }))) },
});

// `max_reaps = 2`: the model test's lost leases fail it on the second.
test_fsm!(Waiter, state = S, queue = "conf", version = 1, {
    Park => "park" |_ctx| { Ok(Step::await_signal(["go"], Waiter::Use)) },
    Use => "use" |ctx| {
        let v = ctx.awaited().first().map(|s| s.payload()["v"].clone());
        Ok(Step::done(json!({ "v": v, "attempt": ctx.attempt(), "awaited": ctx.awaited().len() })))
    },
}, max_reaps = 2);

test_fsm!(Failing, state = S, queue = "conf", version = 1, {
    Fails => "fails" |_ctx| { Err(StepError::new("boom")) },
    Panics => "panics" |_ctx| { panic!("kaboom") },
    HandleFails => "handle_fails" |_ctx| { Err(StepError::new("first")) },
    Mutates => "mutates" |ctx| { ctx.state.n = 99; Err(StepError::new("after mutating")) },
}, handle |err, ctx| {
    if ctx.step() == "handle_fails" { return Err(StepError::new("handle broke")); }
    Ok(Step::done(json!({ "handled": err.to_string(), "panic": err.is_panic(), "n": ctx.state.n })))
});

test_fsm!(Plain, state = S, queue = "conf", version = 1, {
    Only => "only" |_ctx| { Err(StepError::new("bad input")) },
});

test_fsm!(Guarded, state = S, queue = "conf", version = 1, {
    Only => "only" |_ctx| { Ok(Step::done(json!("ran"))) },
}, handle |_err, _ctx| { Ok(Step::done(json!("handle must not run"))) });

test_fsm!(Stopper, state = S, queue = "conf", version = 1, {
    Go => "go" |ctx| {
        if ctx.attempt() == 0 { Ok(Step::replay(Duration::ZERO)) } else { Ok(Step::stop("gave up")) }
    },
});

test_fsm!(Branch, state = S, queue = "conf", version = 1, {
    Park => "park" |_ctx| { Ok(Step::await_signal(["approve", "reject"], Branch::Decide)) },
    Decide => "decide" |ctx| { Ok(Step::done(json!(ctx.awaited()[0].name.clone()))) },
});

test_fsm!(Acc, state = S, queue = "conf", version = 1, {
    Park => "park" |_ctx| { Ok(Step::await_signal(["a", "b", "c"], Acc::Add)) },
    Add => "add" |ctx| {
        ctx.state.log.push(format!("woke with {}", ctx.awaited().len()));
        let got = ctx.awaited();
        if got.len() < 3 { return Ok(Step::await_signal(["a", "b", "c"], Acc::Add)); }
        let sum: i64 = got.iter().map(|s| s.payload()["x"].as_i64().unwrap()).sum();
        Ok(Step::done(json!({ "sum": sum, "count": got.len() })))
    },
});

test_fsm!(Timed, state = S, queue = "conf", version = 1, {
    Park => "park" |_ctx| {
        Ok(Step::await_signal(["late"], Timed::After).timeout(Duration::from_secs(3600)))
    },
    After => "after" |ctx| {
        Ok(Step::done(json!({ "awaited": ctx.awaited().len(), "attempt": ctx.attempt(), "inbox": ctx.inbox().len() })))
    },
});

test_fsm!(ReplayAwait, state = S, queue = "conf", version = 1, {
    Park => "park" |_ctx| { Ok(Step::await_signal(["go"], ReplayAwait::Use)) },
    Use => "use" |ctx| {
        if ctx.attempt() == 0 { return Ok(Step::replay(Duration::from_secs(5))); }
        Ok(Step::done(json!({ "awaited": ctx.awaited().len(), "attempt": ctx.attempt() })))
    },
});

test_fsm!(MidStep, state = S, queue = "conf", version = 1, {
    Park => "park" |_ctx| { Ok(Step::await_signal(["go"], MidStep::Use)) },
    Use => "use" |ctx| {
        // A second "go" arrives while this step runs, after it read its inbox.
        mailer(&ctx.state.tag).send(ctx.id(), "go", json!({ "n": 2 })).await;
        let saw: Vec<_> = ctx.awaited().iter().map(|s| s.payload()["n"].clone()).collect();
        ctx.state.log.push(format!("use saw {}", json!(saw)));
        Ok(Step::next(MidStep::Again))
    },
    Again => "again" |_ctx| { Ok(Step::await_signal(["go"], MidStep::Last)) },
    Last => "last" |ctx| {
        let got: Vec<_> = ctx.awaited().iter().map(|s| s.payload()["n"].clone()).collect();
        Ok(Step::done(json!({ "first": ctx.state.log, "then": got })))
    },
});

// Consumes one "go" by moving on, then waits for another.
test_fsm!(Twice, state = S, queue = "conf", version = 1, {
    Park => "park" |_ctx| { Ok(Step::await_signal(["go"], Twice::Use)) },
    Use => "use" |ctx| { ctx.state.n = ctx.awaited()[0].payload()["v"].as_i64().unwrap(); Ok(Step::next(Twice::Park2)) },
    Park2 => "park2" |_ctx| { Ok(Step::await_signal(["go"], Twice::Fin)) },
    Fin => "fin" |ctx| { Ok(Step::done(json!({ "first": ctx.state.n, "second": ctx.awaited()[0].payload()["v"] }))) },
});

test_fsm!(Clocked, state = S, queue = "conf", version = 1, {
    Only => "only" |ctx| { Ok(Step::done(json!(ctx.now().to_rfc3339()))) },
});

test_fsm!(Logger, state = S, queue = "conf", version = 1, {
    Only => "only" |ctx| { log(&ctx.state.tag, ctx.state.log[0].clone()); Ok(Step::done(json!(null))) },
});

test_fsm!(Kid, state = S, queue = "conf", version = 1, {
    Only => "only" |ctx| {
        if ctx.state.n < 0 { Ok(Step::stop("kid failed")) } else { Ok(Step::done(json!({ "kid": ctx.state.n }))) }
    },
});

// Fans out `n` kids (kid `i` fails if `log` holds `"fail:i"`; all share a unique key
// if `log` holds `"same-key"`), then reports what they did.
test_fsm!(Parent, state = S, queue = "conf", version = 1, {
    Spawn => "spawn" |ctx| {
        let kids = (0..ctx.state.n).map(|i| {
            let fail = ctx.state.log.contains(&format!("fail:{i}"));
            let child = Child::new::<Kid>(S { n: if fail { -1 } else { i }, ..S::default() });
            if ctx.state.log.iter().any(|l| l == "same-key") {
                child.unique_key(format!("{}:kid", ctx.state.tag))
            } else {
                child
            }
        }).collect();
        Ok(Step::schedule_children(kids, Parent::Sum))
    },
    Sum => "sum" |ctx| {
        let c = ctx.children();
        let done = c.iter().filter(|c| c.status == Status::Done).count();
        let failed = c.iter().filter(|c| c.status == Status::Failed).count();
        Ok(Step::done(json!({ "total": c.len(), "done": done, "failed": failed })))
    },
});

// Two levels: two `Parent`s of two kids each.
test_fsm!(Grand, state = S, queue = "conf", version = 1, {
    Spawn => "spawn" |_ctx| {
        Ok(Step::schedule_children(vec![Child::new::<Parent>(S::n(2)), Child::new::<Parent>(S::n(2))], Grand::Sum))
    },
    Sum => "sum" |ctx| {
        let results: Vec<_> = ctx.children().iter().map(|c| c.result.clone()).collect();
        Ok(Step::done(json!({ "children": results })))
    },
});

// Parks its two `Waiter` children forever: a parent to cancel.
test_fsm!(Holder, state = S, queue = "conf", version = 1, {
    Spawn => "spawn" |_ctx| {
        Ok(Step::schedule_children(vec![Child::new::<Waiter>(S::default()), Child::new::<Waiter>(S::default())], Holder::Sum))
    },
    Sum => "sum" |_ctx| { Ok(Step::done(json!("children finished"))) },
});

// One parked `Waiter` child and one `Kid` that fails: after a run the parent still awaits
// one child while the other has failed — the state in which a retry re-arms the barrier.
test_fsm!(Mixed, state = S, queue = "conf", version = 1, {
    Spawn => "spawn" |_ctx| {
        Ok(Step::schedule_children(vec![Child::new::<Waiter>(S::default()), Child::new::<Kid>(S::n(-1))], Mixed::Sum))
    },
    Sum => "sum" |ctx| {
        let failed = ctx.children().iter().filter(|c| c.status == Status::Failed).count();
        Ok(Step::done(json!({ "failed": failed })))
    },
});

test_fsm!(Flaky, state = S, queue = "conf", version = 1, {
    Go => "go" |ctx| {
        if logged(&ctx.state.tag).iter().any(|l| l == "fixed") {
            Ok(Step::done(json!({ "attempt": ctx.attempt() })))
        } else {
            Err(StepError::new("flaky dependency down"))
        }
    },
});

// Awaits "go" (for an hour at most), then fails until the tag's log holds "fixed": a
// step woken by a signal, or by its timeout, that fails — the instance to retry.
test_fsm!(FlakyAfterAwait, state = S, queue = "conf", version = 1, {
    Park => "park" |_ctx| {
        Ok(Step::await_signal(["go"], FlakyAfterAwait::Use).timeout(Duration::from_secs(3600)))
    },
    Use => "use" |ctx| {
        if !logged(&ctx.state.tag).iter().any(|l| l == "fixed") {
            return Err(StepError::new("payment service down"));
        }
        let v = ctx.awaited().first().map(|s| s.payload()["v"].clone());
        Ok(Step::done(json!({ "v": v, "awaited": ctx.awaited().len() })))
    },
});

// Three steps on the concurrent queue, each yielding while it runs, so that two
// instances of one partition would overlap if the engine let them.
test_fsm!(Parted, state = S, queue = "par", version = 1, {
    One => "one" |ctx| { step_in_partition(ctx.id(), &ctx.state.tag, "one").await; Ok(Step::next(Parted::Two)) },
    Two => "two" |ctx| { step_in_partition(ctx.id(), &ctx.state.tag, "two").await; Ok(Step::next(Parted::Three)) },
    Three => "three" |ctx| { step_in_partition(ctx.id(), &ctx.state.tag, "three").await; Ok(Step::done(json!(null))) },
});

async fn step_in_partition(id: i64, tag: &str, step: &str) {
    let keyed = !tag.ends_with(":free");
    if keyed {
        enter(tag);
    }
    log(tag, format!("{id}:{step}"));
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    if keyed {
        exit(tag);
    }
}

// The entries of a history at level full: a next, a retry with its error, an await and
// the next that consumes its signal, a done.
test_fsm!(Journey, state = S, queue = "conf", version = 1, {
    A => "a" |ctx| { ctx.state.n += 1; Ok(Step::next(Journey::B)) },
    B => "b" |ctx| {
        if ctx.attempt() == 0 {
            return Ok(Step::replay(Duration::ZERO).with_error("flaky"));
        }
        ctx.state.n += 10;
        Ok(Step::next(Journey::C))
    },
    C => "c" |_ctx| { Ok(Step::await_signal(["go"], Journey::D)) },
    D => "d" |ctx| { ctx.state.n += 100; Ok(Step::next(Journey::E)) },
    E => "e" |ctx| { Ok(Step::done(json!({ "total": ctx.state.n }))) },
}, history = gen_durable::HistoryLevel::Full);

pub fn registry() -> Registry {
    let mut r = Registry::new();
    r.register::<Counter>();
    r.register::<Journey>();
    r.register::<Replayer>();
    r.register::<Waiter>();
    r.register::<Failing>();
    r.register::<Plain>();
    r.register::<Guarded>();
    r.register::<Stopper>();
    r.register::<Branch>();
    r.register::<Acc>();
    r.register::<Timed>();
    r.register::<ReplayAwait>();
    r.register::<MidStep>();
    r.register::<Twice>();
    r.register::<Clocked>();
    r.register::<Logger>();
    r.register::<Kid>();
    r.register::<Parent>();
    r.register::<Grand>();
    r.register::<Holder>();
    r.register::<Mixed>();
    r.register::<Flaky>();
    r.register::<FlakyAfterAwait>();
    r.register::<Parted>();
    r.register::<KeyedParent>();
    r.register::<Switch>();
    r.register::<Hop>();
    r.register::<Declared>();
    r.register::<GatedParent>();
    r
}

// Spawns one `Counter` child under key `k` of the undeclared gate `conf-nogate`.
test_fsm!(GatedParent, state = S, queue = "conf", version = 1, {
    Spawn => "spawn" |_ctx| {
        let child = Child::new::<Counter>(S::default()).gate(("conf-nogate", "k"));
        Ok(Step::schedule_children(vec![child], GatedParent::Sum))
    },
    Sum => "sum" |_ctx| { Ok(Step::done(json!(null))) },
});

// Takes a key in a transition (`tag`: a K = 1 key, or with `n` = 2 a key of gate
// `conf-tg`, with 3 of the undeclared gate `conf-undeclared`), runs `work` under it (overlap counted per tag), releases it later; parks
// after each change so the row can be looked at.
test_fsm!(Switch, state = S, queue = "par", version = 1, {
    Enter => "enter" |ctx| {
        let to = Step::next(Switch::Work);
        let tag = ctx.state.tag.clone();
        Ok(match ctx.state.n {
            2 => to.gate(("conf-tg", tag)),
            3 => to.gate(("conf-undeclared", tag)),
            _ => to.partition_key(tag),
        })
    },
    Work => "work" |ctx| {
        step_in_partition(ctx.id(), &ctx.state.tag, "work").await;
        Ok(Step::await_signal(["go"], Switch::Leave))
    },
    Leave => "leave" |_ctx| { Ok(Step::next(Switch::Out).release_partition()) },
    Out => "out" |_ctx| { Ok(Step::await_signal(["go"], Switch::Fin)) },
    Fin => "fin" |_ctx| { Ok(Step::done(json!(null))) },
});

// `a` leads to `b` with a rate limit (`conf-tr`, key `tag`, weight `n` or 1), `b` to `c`
// without one; `c` loops back to `b` once, again without one. Logs each step.
test_fsm!(Hop, state = S, queue = "conf", version = 1, {
    A => "a" |ctx| {
        log(&ctx.state.tag, format!("{}:a", ctx.id()));
        let to = Step::next(Hop::B).rate_limit(("conf-tr", ctx.state.tag.clone()));
        Ok(if ctx.state.n > 0 { to.weight(ctx.state.n as f64) } else { to })
    },
    B => "b" |ctx| {
        log(&ctx.state.tag, format!("{}:b", ctx.id()));
        Ok(Step::next(Hop::C))
    },
    C => "c" |ctx| {
        log(&ctx.state.tag, format!("{}:c", ctx.id()));
        ctx.state.log.push("c".into());
        if ctx.state.log.len() < 2 { Ok(Step::next(Hop::B)) } else { Ok(Step::done(json!(null))) }
    },
});

// `pay` declares rate limit `conf-decl` (key `tag`), as `#[step(rate_limit = "conf-decl",
// key = tag)]` would; `start` leads to it with no options, `again` with weight 2.
test_fsm!(Declared, state = S, queue = "conf", version = 1, {
    Start => "start" |_ctx| { Ok(Step::next(Declared::Pay)) },
    Pay => "pay" |ctx| {
        log(&ctx.state.tag, format!("{}:pay", ctx.id()));
        ctx.state.n += 1;
        Ok(if ctx.state.n < 2 { Step::next(Declared::Pay).weight(2.0) } else { Step::done(json!(ctx.state.n)) })
    },
}, rates |step, state| {
    matches!(step, Declared::Pay).then(|| gen_durable::StepRate::new(("conf-decl", state.tag.clone()), 1.0))
});

// Spawns one `Waiter` child holding the key `child:<tag>`, and ends with its result.
test_fsm!(KeyedParent, state = S, queue = "conf", version = 1, {
    Spawn => "spawn" |ctx| {
        let key = format!("child:{}", ctx.state.tag);
        Ok(Step::schedule_children(vec![Child::new::<Waiter>(S::default()).correlation_key(key)], KeyedParent::Sum))
    },
    Sum => "sum" |ctx| { Ok(Step::done(ctx.children()[0].result.clone().unwrap_or_default())) },
});
