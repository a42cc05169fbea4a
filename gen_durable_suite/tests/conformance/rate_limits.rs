//! Rate limits on both engines, on the manual clock: the burst, then one row per token
//! interval, each row waiting for its reserved tokens without an attempt; what pays (the
//! limited step, each time it runs) and what does not (the steps after it); bad input.

use std::time::Duration;

use chrono::Duration as Span;
use gen_durable::{Error, Gate, RateLimit, Status};
use serde_json::json;

use crate::backend::{Backend, Opts};
use crate::fsms::*;

pub async fn a_rate_limit_admits_its_burst_then_one_row_per_token<B: Backend>(b: &mut B) {
    burst_then_one_row_per_token(b).await;
}

/// The same while a gate is declared (none of these rows names it): PostgreSQL's claim
/// then takes the gates' path (`gd_claim`), not the one for rate limits alone
/// (`gd_claim_rated`, migration 0020), and its tokens must come out the same.
pub async fn a_rate_limit_admits_the_same_while_a_gate_is_declared<B: Backend>(b: &mut B) {
    b.set_gate("conf-rl-gate", Gate::new(2)).await.unwrap();
    burst_then_one_row_per_token(b).await;
}

async fn burst_then_one_row_per_token<B: Backend>(b: &mut B) {
    let t0 = b.now();
    // 2 a second, burst 3.
    let limit = RateLimit::per(2, Duration::from_secs(1)).burst(3);
    assert!(b.set_rate_limit("conf-rl", limit).await.unwrap());
    assert!(
        !b.set_rate_limit("conf-rl", limit).await.unwrap(),
        "unchanged"
    );
    let mut ids = Vec::new();
    for _ in 0..6 {
        let o = Opts::default().rate_limit("conf-rl");
        ids.push(b.insert::<Counter>(S::default(), o).await.unwrap());
    }
    // The burst runs now; only the first step pays, so those three finish.
    assert_eq!(b.run().await.to_string(), "{next: 6, done: 3, steps: 9}");
    for (n, &id) in ids[3..].iter().enumerate() {
        let i = b.get(id).await;
        i.assert_status(Status::Runnable).assert_step("a");
        assert_eq!(i.attempt, 0, "waiting for tokens burns no attempt");
        let due = t0 + Span::milliseconds(500 * (n as i64 + 1));
        assert_eq!(i.eligible_at, due, "row {n} of the three owed tokens");
    }
    b.advance(Duration::from_millis(500)).await;
    assert_eq!(b.run().await.to_string(), "{next: 2, done: 1, steps: 3}");
    b.advance(Duration::from_millis(1000)).await;
    assert_eq!(b.run().await.to_string(), "{next: 4, done: 2, steps: 6}");
    for id in ids {
        b.get(id).await.assert_done(json!({ "total": 111 }));
    }
}

pub async fn a_replay_of_the_limited_step_pays_again<B: Backend>(b: &mut B) {
    let t0 = b.now();
    // One token every 32 s, burst 1 (binary fractions: the due times are exact).
    let limit = RateLimit::per(1, Duration::from_secs(32));
    b.set_rate_limit("conf-slow", limit).await.unwrap();
    let o = Opts::default().rate_limit(("conf-slow", "k"));
    let id = b.insert::<Replayer>(S::default(), o).await.unwrap();
    assert_eq!(b.run().await.to_string(), "{replay: 1, steps: 1}");
    // The replay is due at 10 s, its token at 32 s.
    b.advance(Duration::from_secs(10)).await;
    assert_eq!(b.run().await.to_string(), "{steps: 0}");
    let i = b.get(id).await;
    assert_eq!((i.attempt, i.eligible_at), (1, t0 + Span::seconds(32)));
    b.advance(Duration::from_secs(22)).await;
    assert_eq!(b.run().await.to_string(), "{replay: 1, steps: 1}");
    b.advance(Duration::from_secs(10)).await;
    assert_eq!(b.run().await.to_string(), "{steps: 0}");
    assert_eq!(b.get(id).await.eligible_at, t0 + Span::seconds(64));
    b.advance(Duration::from_secs(22)).await;
    // `fin` is not limited: it runs at once after the last `go`.
    assert_eq!(b.run().await.to_string(), "{next: 1, done: 1, steps: 2}");
    b.get(id).await.assert_done(json!({
        "attempt_at_fin": 0, "log": ["go@0", "go@1", "go@2"]
    }));
}

pub async fn an_unknown_limit_or_a_weight_above_the_burst_is_refused_and_writes_nothing<
    B: Backend,
>(
    b: &mut B,
) {
    let o = Opts::default().rate_limit("nowhere");
    let e = b.insert::<Counter>(S::default(), o).await.unwrap_err();
    assert!(
        matches!(&e, Error::UnknownRateLimit { name } if name == "nowhere"),
        "{e:?}"
    );
    let limit = RateLimit::per(1, Duration::from_secs(1)).burst(2);
    b.set_rate_limit("conf-w", limit).await.unwrap();
    for w in [3.0, 0.0, -1.0, f64::NAN] {
        let o = Opts::default().rate_limit("conf-w").weight(w);
        let e = b.insert::<Counter>(S::default(), o).await.unwrap_err();
        assert!(
            matches!(
                e,
                Error::InvalidInput {
                    what: "rate limit weight",
                    ..
                }
            ),
            "weight {w}: {e:?}"
        );
    }
    let bad = RateLimit::per(0, Duration::from_secs(1));
    assert!(matches!(
        b.set_rate_limit("conf-w", bad).await,
        Err(Error::InvalidConfig(_))
    ));
    assert_eq!(
        b.run().await.to_string(),
        "{steps: 0}",
        "nothing was written"
    );
    // A weight of 2 fits the burst: it takes both tokens.
    let o = Opts::default().rate_limit("conf-w").weight(2.0);
    let heavy = b.insert::<Counter>(S::default(), o).await.unwrap();
    let o = Opts::default().rate_limit("conf-w");
    let light = b.insert::<Counter>(S::default(), o).await.unwrap();
    assert_eq!(b.run().await.to_string(), "{next: 2, done: 1, steps: 3}");
    b.get(heavy).await.assert_status(Status::Done);
    assert_eq!(
        b.get(light).await.eligible_at,
        b.now() + Span::seconds(1),
        "the next token is a second away"
    );
}

/// Each key of a rate limit has its own bucket.
pub async fn each_key_of_a_rate_limit_has_its_own_bucket<B: Backend>(b: &mut B) {
    let t0 = b.now();
    let limit = RateLimit::per(1, Duration::from_secs(4));
    b.set_rate_limit("conf-keys", limit).await.unwrap();
    let o = |k: &'static str| Opts::default().rate_limit(("conf-keys", k));
    let mut ids = Vec::new();
    for k in ["a", "a", "b", "b"] {
        ids.push(b.insert::<Counter>(S::default(), o(k)).await.unwrap());
    }
    // One token per key now: the first row of each key runs.
    assert_eq!(b.run().await.to_string(), "{next: 4, done: 2, steps: 6}");
    b.get(ids[0]).await.assert_status(Status::Done);
    b.get(ids[2]).await.assert_status(Status::Done);
    for id in [ids[1], ids[3]] {
        assert_eq!(b.get(id).await.eligible_at, t0 + Span::seconds(4));
    }
}

/// Tokens go in the pick's order: a row of higher priority inserted later takes the
/// token before a lower one inserted first.
pub async fn tokens_go_to_rows_in_priority_order<B: Backend>(b: &mut B) {
    let t0 = b.now();
    let limit = RateLimit::per(1, Duration::from_secs(4));
    b.set_rate_limit("conf-prio", limit).await.unwrap();
    let o = |p: i16| Opts::default().rate_limit("conf-prio").priority(p);
    let low = b.insert::<Counter>(S::default(), o(5)).await.unwrap();
    let high = b.insert::<Counter>(S::default(), o(0)).await.unwrap();
    assert_eq!(b.run().await.to_string(), "{next: 2, done: 1, steps: 3}");
    b.get(high).await.assert_status(Status::Done);
    let waiting = b.get(low).await;
    waiting.assert_status(Status::Runnable);
    assert_eq!(waiting.eligible_at, t0 + Span::seconds(4));
}

/// A row's weight is the tokens it takes: heavier rows wait longer, and rows behind them
/// wait for their own tokens after theirs.
pub async fn a_heavier_row_takes_more_tokens_and_waits_longer<B: Backend>(b: &mut B) {
    let t0 = b.now();
    // One token every 4 s, burst 3.
    let limit = RateLimit::per(1, Duration::from_secs(4)).burst(3);
    b.set_rate_limit("conf-weight", limit).await.unwrap();
    let o = |w: f64| Opts::default().rate_limit("conf-weight").weight(w);
    let all = b.insert::<Counter>(S::default(), o(3.0)).await.unwrap();
    let two = b.insert::<Counter>(S::default(), o(2.0)).await.unwrap();
    let one = b.insert::<Counter>(S::default(), o(1.0)).await.unwrap();
    assert_eq!(b.run().await.to_string(), "{next: 2, done: 1, steps: 3}");
    b.get(all).await.assert_status(Status::Done);
    assert_eq!(b.get(two).await.eligible_at, t0 + Span::seconds(8));
    assert_eq!(b.get(one).await.eligible_at, t0 + Span::seconds(12));
}

/// A row cancelled while it waits for its tokens fails at once; the tokens it reserved
/// are not given back, so the rows behind it keep their times.
pub async fn a_row_cancelled_while_waiting_for_tokens_fails_and_keeps_the_others_times<
    B: Backend,
>(
    b: &mut B,
) {
    let t0 = b.now();
    let limit = RateLimit::per(1, Duration::from_secs(4));
    b.set_rate_limit("conf-cancel", limit).await.unwrap();
    let o = || Opts::default().rate_limit("conf-cancel");
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(b.insert::<Counter>(S::default(), o()).await.unwrap());
    }
    assert_eq!(b.run().await.to_string(), "{next: 2, done: 1, steps: 3}");
    b.cancel(ids[1]).await.unwrap();
    b.get(ids[1]).await.assert_status(Status::Failed);
    assert_eq!(b.get(ids[2]).await.eligible_at, t0 + Span::seconds(8));
    b.advance(Duration::from_secs(8)).await;
    assert_eq!(b.run().await.to_string(), "{next: 2, done: 1, steps: 3}");
    b.get(ids[2]).await.assert_status(Status::Done);
}

/// R4-1: reserved rows made due now by an operator (a restart at the limited step, a
/// cancel then a retry) do not start for free: they start only when their bucket holds
/// their tokens, one per token interval. "1 per 4 s, burst 1" started all five rows at
/// once before migration 0031.
pub async fn r4_1_a_restart_or_a_cancel_and_retry_of_reserved_rows_starts_none_early<B: Backend>(
    b: &mut B,
) {
    let t0 = b.now();
    let limit = RateLimit::per(1, Duration::from_secs(4));
    b.set_rate_limit("conf-r41", limit).await.unwrap();
    let mut ids = Vec::new();
    for _ in 0..5 {
        let o = Opts::default().rate_limit(("conf-r41", "k"));
        ids.push(b.insert::<Counter>(S::default(), o).await.unwrap());
    }
    assert_eq!(b.run().await.to_string(), "{next: 2, done: 1, steps: 3}");
    b.restart(ids[1], "a").await.unwrap();
    b.restart(ids[2], "a").await.unwrap();
    for &id in &ids[3..] {
        b.cancel(id).await.unwrap();
        b.retry(id).await.unwrap();
    }
    assert_eq!(
        b.run().await.to_string(),
        "{steps: 0}",
        "nothing starts early"
    );
    for &id in &ids[1..] {
        let i = b.get(id).await;
        i.assert_status(Status::Runnable);
        assert!(i.eligible_at > t0, "{id} waits for its tokens");
    }
    // Then one row per token. (When a reserved row is due again depends on the claims'
    // batches: a row woken before its tokens waits again.)
    for _ in 0..4 {
        b.advance(Duration::from_secs(4)).await;
        assert_eq!(b.run().await.to_string(), "{next: 2, done: 1, steps: 3}");
    }
}

/// R4-2: reservations that were not claimed on time (the queue was paused) do not start
/// together on top of a refilled bucket: after the pause, the burst (1) starts, and the
/// other reserved rows, then the new one, follow one token apart (all four started at
/// once before migration 0031).
pub async fn r4_2_reservations_claimed_late_do_not_exceed_the_burst<B: Backend>(b: &mut B) {
    let limit = RateLimit::per(1, Duration::from_secs(4));
    b.set_rate_limit("conf-r42", limit).await.unwrap();
    let o = || Opts::default().rate_limit(("conf-r42", "k"));
    let mut ids = Vec::new();
    for _ in 0..4 {
        ids.push(b.insert::<Counter>(S::default(), o()).await.unwrap());
    }
    assert_eq!(b.run().await.to_string(), "{next: 2, done: 1, steps: 3}");
    assert!(b.pause_queue("conf", None).await.unwrap());
    b.advance(Duration::from_secs(40)).await;
    assert_eq!(b.run().await.to_string(), "{steps: 0}", "paused");
    ids.push(b.insert::<Counter>(S::default(), o()).await.unwrap());
    assert!(b.resume_queue("conf").await.unwrap());
    let t1 = b.now();
    assert_eq!(
        b.run().await.to_string(),
        "{next: 2, done: 1, steps: 3}",
        "one row: the burst"
    );
    b.get(ids[1]).await.assert_status(Status::Done);
    for &id in &ids[2..] {
        assert!(
            b.get(id).await.eligible_at > t1,
            "{id} waits for its tokens"
        );
    }
    for _ in 0..3 {
        b.advance(Duration::from_secs(4)).await;
        assert_eq!(b.run().await.to_string(), "{next: 2, done: 1, steps: 3}");
    }
}

/// R4-5: a reservation due further away than PostgreSQL's intervals reach (a limit
/// `RateLimit` accepts, rows of a weight it accepts) waits ~95 years instead of failing
/// every claim of its queue: the queue's other rows still run.
pub async fn r4_5_a_reservation_beyond_the_interval_range_does_not_stop_its_queue<B: Backend>(
    b: &mut B,
) {
    let t0 = b.now();
    let limit = RateLimit::per(1, Duration::from_secs(1_000_000_000)).burst(1_000_000);
    b.set_rate_limit("conf-r45", limit).await.unwrap();
    let heavy = || Opts::default().rate_limit(("conf-r45", "k")).weight(1e6);
    let first = b.insert::<Counter>(S::default(), heavy()).await.unwrap();
    let second = b.insert::<Counter>(S::default(), heavy()).await.unwrap();
    let free = b
        .insert::<Counter>(S::default(), Opts::default())
        .await
        .unwrap();
    assert_eq!(b.run().await.to_string(), "{next: 4, done: 2, steps: 6}");
    b.get(first).await.assert_status(Status::Done);
    b.get(free).await.assert_status(Status::Done);
    let waiting = b.get(second).await;
    waiting.assert_status(Status::Runnable);
    assert_eq!(waiting.eligible_at, t0 + Span::seconds(3_000_000_000));
}

/// A token interval that is not a whole number of microseconds (3 a second): a reserved
/// row is due when its token is whole (its due time rounded up), never a hair before,
/// where its claim would find 0.999999 tokens and wait again for no time at all.
pub async fn a_reservation_is_due_when_its_token_is_whole_not_a_microsecond_before<B: Backend>(
    b: &mut B,
) {
    let t0 = b.now();
    let limit = RateLimit::per(3, Duration::from_secs(1)).burst(1);
    b.set_rate_limit("conf-third", limit).await.unwrap();
    let o = || Opts::default().rate_limit("conf-third");
    let first = b.insert::<Counter>(S::default(), o()).await.unwrap();
    let second = b.insert::<Counter>(S::default(), o()).await.unwrap();
    assert_eq!(b.run().await.to_string(), "{next: 2, done: 1, steps: 3}");
    b.get(first).await.assert_status(Status::Done);
    let due = b.get(second).await.eligible_at;
    assert_eq!(due, t0 + Span::microseconds(333_334));
    b.advance(Duration::from_micros(333_333)).await;
    assert_eq!(b.run().await.to_string(), "{steps: 0}");
    b.advance(Duration::from_micros(1)).await;
    assert_eq!(b.run().await.to_string(), "{next: 2, done: 1, steps: 3}");
}
