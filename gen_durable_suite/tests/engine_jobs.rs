//! The job form through the engine, on a manual clock so backoffs pass
//! without waiting.

mod common;

use std::time::Duration;

use chrono::Utc;
use common::{column, eventually, finished, status};
use gen_durable::prelude::*;
use gen_durable::{Clock, QueueConfig, Registry};
use gen_durable_testkit::TestDb;

#[derive(DurableState, Serialize, Deserialize, Debug, Clone)]
struct MailArgs {
    mode: String,
}

#[durable_job(queue = "mail", max_attempts = 3)]
async fn send_mail(args: MailArgs, ctx: &mut JobCtx) -> JobResult {
    match args.mode.as_str() {
        "ok" => Ok(json!(null)),
        "result" => Ok(json!({ "sent": true })),
        "second-time" if ctx.attempt() == 0 => Err(JobError::retry("smtp timeout")),
        "second-time" => Ok(json!({ "attempt": ctx.attempt() })),
        "always" => Err(JobError::retry("smtp down")),
        "panic" if ctx.attempt() == 0 => panic!("mailer bug"),
        "panic" => Ok(json!("recovered")),
        "bad" => Err(JobError::fail("no such address")),
        other => Err(JobError::fail(format!("unknown mode {other}"))),
    }
}

fn args(mode: &str) -> MailArgs {
    MailArgs { mode: mode.into() }
}

#[tokio::test]
async fn jobs_finish_retry_with_backoff_give_up_and_cancel() {
    let db = TestDb::new().await;
    let clock = Clock::manual(Utc::now());
    let gd = Client::new(db.pool().clone()).with_clock(clock.clone());
    let mut reg = Registry::new();
    reg.register::<SendMail>();
    let engine = Engine::builder(db.pool().clone())
        .with_registry(reg)
        .with_clock(clock.clone())
        .queue_with(
            "mail",
            QueueConfig::new(4).with_poll_interval(Duration::from_millis(20)),
        )
        .start()
        .await
        .unwrap();
    let p = db.pool();
    let ok = gd.insert::<SendMail>(args("ok")).await.unwrap();
    let result = gd.insert::<SendMail>(args("result")).await.unwrap();
    let second = gd.insert::<SendMail>(args("second-time")).await.unwrap();
    let always = gd.insert::<SendMail>(args("always")).await.unwrap();
    let panics = gd.insert::<SendMail>(args("panic")).await.unwrap();
    let bad = gd.insert::<SendMail>(args("bad")).await.unwrap();

    assert_eq!(finished(p, ok, 10).await, "done");
    assert_eq!(column(p, ok, "result").await.as_deref(), Some("null"));
    assert_eq!(finished(p, result, 10).await, "done");
    assert_eq!(
        column(p, result, "result").await.as_deref(),
        Some(r#"{"sent": true}"#)
    );
    assert_eq!(finished(p, bad, 10).await, "failed");
    assert_eq!(
        column(p, bad, "last_error").await.as_deref(),
        Some("no such address")
    );
    assert_eq!(
        column(p, bad, "attempt").await.as_deref(),
        Some("0"),
        "cancelled at once"
    );

    // First failure: replay after 1 s (on the manual clock), error recorded.
    for id in [second, always, panics] {
        eventually(10, "first run failed", || async move {
            column(p, id, "attempt").await.as_deref() == Some("1")
        })
        .await;
        assert_eq!(status(p, id).await, "runnable");
    }
    assert_eq!(
        column(p, second, "last_error").await.as_deref(),
        Some("smtp timeout")
    );
    let delay: f64 = sqlx::query_scalar("SELECT extract(epoch FROM eligible_at - updated_at)::float8 FROM gd_instances WHERE id = $1")
        .bind(always)
        .fetch_one(p)
        .await
        .unwrap();
    assert_eq!(delay, 1.0, "1 s · 2^0");

    clock.advance(Duration::from_secs(1));
    engine.wake();
    assert_eq!(finished(p, second, 10).await, "done");
    assert_eq!(
        column(p, second, "result").await.as_deref(),
        Some(r#"{"attempt": 1}"#)
    );
    assert_eq!(finished(p, panics, 10).await, "done");
    assert_eq!(
        column(p, panics, "result").await.as_deref(),
        Some(r#""recovered""#)
    );

    // The third failure of three allowed attempts gives up (after a 2 s backoff).
    eventually(10, "second run failed", || async {
        column(p, always, "attempt").await.as_deref() == Some("2")
    })
    .await;
    clock.advance(Duration::from_secs(2));
    engine.wake();
    assert_eq!(finished(p, always, 10).await, "failed");
    let err = column(p, always, "last_error").await.unwrap();
    assert!(
        err.contains("gave up after 3 attempts") && err.contains("smtp down"),
        "{err}"
    );
    engine.shutdown(Duration::from_secs(5)).await;
    db.close().await;
}
