//! A model-based test: random sequences of inserts (plain, fanning out, with parked and
//! failing children), signals, cancels, retries, lost leases taken back by the reaper,
//! and runs, applied to both backends side
//! by side. After every operation both must answer alike and hold the same instances,
//! and each must keep the invariants: a row's `children_pending` equals its children that
//! are not terminal (never negative), no finished instance keeps a signal, and nothing is
//! executing between runs (no row claimed without a worker). `proptest` shrinks a failing
//! sequence to a short one.
//!
//! ```sh
//! cargo test --test conformance model::   # PROPTEST_CASES=200 for a longer search
//! ```

use std::fmt::Write as _;

use gen_durable::{Error, Status};
use proptest::prelude::*;
use serde_json::json;

use crate::backend::{Backend, Kit, Opts, Pg};
use crate::fsms::{Holder, Mixed, Parent, Waiter, S};

/// One operation; targets index the instances known so far (roots in insertion order,
/// each followed by its descendants), so both backends hit the same instance.
#[derive(Debug, Clone)]
enum Op {
    /// A `Parent` of `kids` children; kid `i` fails if bit `i` of `fail` is set.
    Parent {
        kids: i64,
        fail: u8,
    },
    /// A parent of two parked `Waiter`s.
    Holder,
    /// A parent of a parked `Waiter` and a failing `Kid`.
    Mixed,
    /// A lone `Waiter`.
    Waiter,
    /// Signal "go" (wakes a `Waiter`) or "stray" (stays in the inbox).
    Signal {
        target: usize,
        go: bool,
    },
    Cancel(usize),
    Retry(usize),
    /// A worker claims the instance and dies; the reaper takes it back.
    LoseLease(usize),
    /// Run everything that is due.
    Run,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0i64..=3, 0u8..8).prop_map(|(kids, fail)| Op::Parent { kids, fail }),
        Just(Op::Holder),
        Just(Op::Mixed),
        Just(Op::Waiter),
        (0usize..16, any::<bool>()).prop_map(|(target, go)| Op::Signal { target, go }),
        (0usize..16).prop_map(Op::Cancel),
        (0usize..16).prop_map(Op::Retry),
        (0usize..16).prop_map(Op::LoseLease),
        Just(Op::Run),
        Just(Op::Run),
    ]
}

/// The error's variant name, e.g. `ParentMovedOn`: what both backends must agree on.
fn answer<T>(r: gen_durable::Result<T>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(e) => format!("{e:?}")
            .split([' ', '{', '('])
            .next()
            .unwrap_or_default()
            .to_string(),
    }
}

/// Every instance: roots in insertion order, each followed by its descendants.
async fn known<B: Backend>(b: &mut B, roots: &[i64]) -> Vec<i64> {
    let mut out = Vec::new();
    let mut stack: Vec<i64> = roots.iter().rev().copied().collect();
    while let Some(id) = stack.pop() {
        out.push(id);
        let children = b.get(id).await.children;
        stack.extend(children.into_iter().rev());
    }
    out
}

/// Checks the invariants on `b` and returns what both backends must agree on: per
/// instance, its FSM, status, step, counter, children, inbox and error.
async fn snapshot<B: Backend>(b: &mut B, roots: &[i64], ctx: &str) -> String {
    let ids = known(b, roots).await;
    let mut out = String::new();
    for (pos, &id) in ids.iter().enumerate() {
        let i = b.get(id).await;
        let mut live = 0;
        for &c in &i.children {
            if !b.get(c).await.status.is_terminal() {
                live += 1;
            }
        }
        assert!(i.children_pending >= 0, "{ctx}: #{id} children_pending < 0");
        assert_eq!(
            i.children_pending, live,
            "{ctx}: #{id} ({} {}) counts {} pending children, {live} are live",
            i.fsm, i.status, i.children_pending
        );
        assert_ne!(
            i.status,
            Status::Executing,
            "{ctx}: #{id} executing between runs"
        );
        if i.status.is_terminal() {
            assert!(
                i.inbox.is_empty(),
                "{ctx}: finished #{id} keeps {:?}",
                i.inbox
            );
        }
        let inbox: Vec<&str> = i.inbox.iter().map(|s| s.name.as_str()).collect();
        // The engine names the lost node and epoch in this message; the kit has neither.
        let error = match i.last_error {
            Some(e) if e.starts_with("lease lost on ") => Some("lease lost; retrying".into()),
            e => e,
        };
        let _ = writeln!(
            out,
            "{pos}: {} {} at {} attempt={} pending={} children={} inbox={inbox:?} error={error:?} result={}",
            i.fsm,
            i.status,
            i.step,
            i.attempt,
            i.children_pending,
            i.children.len(),
            i.result.unwrap_or(json!(null)),
        );
    }
    out
}

/// Applies `op` to `b`; returns its answer.
async fn apply<B: Backend>(b: &mut B, roots: &mut Vec<i64>, op: &Op) -> String {
    let target = |ids: &[i64], t: usize| ids.get(t % ids.len().max(1)).copied();
    match op {
        Op::Parent { kids, fail } => {
            let mut s = S::n(*kids);
            s.log = (0..*kids)
                .filter(|i| fail & (1 << i) != 0)
                .map(|i| format!("fail:{i}"))
                .collect();
            insert::<Parent, B>(b, roots, s).await
        }
        Op::Holder => insert::<Holder, B>(b, roots, S::default()).await,
        Op::Mixed => insert::<Mixed, B>(b, roots, S::default()).await,
        Op::Waiter => insert::<Waiter, B>(b, roots, S::default()).await,
        Op::Run => {
            let t = b.run().await;
            format!("ran {t:?}")
        }
        Op::Signal { target: t, go } => {
            let ids = known(b, roots).await;
            let Some(id) = target(&ids, *t) else {
                return "none".into();
            };
            let name = if *go { "go" } else { "stray" };
            answer(b.signal(id, name, json!({ "v": 1 })).await)
        }
        Op::Cancel(t) => {
            let ids = known(b, roots).await;
            let Some(id) = target(&ids, *t) else {
                return "none".into();
            };
            match b.cancel(id).await {
                Ok(c) => format!("cancelled {} {}", c.failed, c.after_current_step),
                Err(e) => answer::<()>(Err(e)),
            }
        }
        Op::Retry(t) => {
            let ids = known(b, roots).await;
            let Some(id) = target(&ids, *t) else {
                return "none".into();
            };
            answer(b.retry(id).await)
        }
        Op::LoseLease(t) => {
            let ids = known(b, roots).await;
            let Some(id) = target(&ids, *t) else {
                return "none".into();
            };
            answer(b.lose_lease(id).await)
        }
    }
}

async fn insert<F, B>(b: &mut B, roots: &mut Vec<i64>, s: S) -> String
where
    F: gen_durable::Fsm<State = S>,
    B: Backend,
{
    match b.insert::<F>(s, Opts::default()).await {
        Ok(id) => {
            roots.push(id);
            "ok".into()
        }
        Err(e) => answer::<()>(Err::<(), Error>(e)),
    }
}

/// Runs `ops` on both backends, comparing after every operation.
async fn check(ops: Vec<Op>) {
    let mut kit = Kit::new("model");
    let mut pg = Pg::new("model").await;
    let (mut kit_roots, mut pg_roots) = (Vec::new(), Vec::new());
    let mut trail = String::new();
    for (n, op) in ops.iter().chain([&Op::Run]).enumerate() {
        let a = apply(&mut kit, &mut kit_roots, op).await;
        let p = apply(&mut pg, &mut pg_roots, op).await;
        let _ = writeln!(trail, "{n}: {op:?} -> {a}");
        assert_eq!(a, p, "answers differ after\n{trail}");
        let ctx = format!("after\n{trail}");
        let ks = snapshot(&mut kit, &kit_roots, &format!("kit {ctx}")).await;
        let ps = snapshot(&mut pg, &pg_roots, &format!("pg {ctx}")).await;
        assert_eq!(ks, ps, "the backends hold different instances {ctx}");
    }
    // Postgres, beyond what the kit can show: no row claimed, no signal of a finished row.
    let stray: i64 = sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM gd_instances i
                  WHERE gd_status_of(i) = 'executing' OR locked_by IS NOT NULL)
              + (SELECT count(*) FROM gd_signals s JOIN gd_instances i ON i.id = s.target_id
                  WHERE i.status IN ('done', 'failed'))",
    )
    .fetch_one(pg.pool())
    .await
    .unwrap();
    assert_eq!(stray, 0, "claimed rows or orphan signals after\n{trail}");
    kit.close().await;
    pg.close().await;
}

/// Found by the model in CI: a retry gives a failed instance a fresh reap budget on both
/// backends (the kit kept the reaps of the failed run, and failed the retried instance at
/// its next lost lease).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_gives_a_fresh_reap_budget() {
    check(vec![
        Op::Waiter,
        Op::LoseLease(0),
        Op::Cancel(0),
        Op::Retry(0),
        Op::LoseLease(0),
    ])
    .await;
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 24,
        max_shrink_iters: 64,
        ..ProptestConfig::default()
    })]

    #[test]
    fn both_backends_keep_the_invariants_under_random_operations(ops in prop::collection::vec(op(), 1..14)) {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
            .block_on(check(ops));
    }
}
