//! The job form: the generated type, its constants, and the retry/backoff schedule
//! its runs follow (run through the engine's step runner).

use std::time::Duration;

use gen_durable::backend::{run_erased, Outcome, StepInput};
use gen_durable::prelude::*;
use gen_durable::{durable_job, Registry, RetryPolicy};

#[derive(DurableState, Serialize, Deserialize, Debug, Clone)]
struct WelcomeArgs {
    email: String,
}

/// Fails with `retry` for "flaky", `cancel` for "bad", panics for "panic".
#[durable_job(queue = "mail", max_attempts = 4, max_backoff_secs = 5)]
async fn send_welcome(args: WelcomeArgs, ctx: &mut JobCtx) -> JobResult {
    match args.email.as_str() {
        "flaky" => Err(JobError::retry("smtp timeout")),
        "bad" => Err(JobError::fail("no such address")),
        "panic" => panic!("mailer bug"),
        _ => Ok(json!({ "sent": args.email, "attempt": ctx.attempt() })),
    }
}

#[durable_job]
async fn defaults(_args: serde_json::Value, _ctx: &mut JobCtx) -> JobResult {
    Ok(json!(null))
}

#[durable_job(name = "mail.digest", version = 3, max_reaps = 1)]
async fn digest(_args: serde_json::Value, _ctx: &mut JobCtx) -> JobResult {
    Ok(json!(null))
}

fn input(email: &str, attempt: i32) -> StepInput {
    StepInput {
        attempt,
        ..StepInput::new(9, "run", json!({ "email": email }), chrono::Utc::now())
    }
}

#[test]
fn metadata() {
    assert_eq!(SendWelcome::NAME, "SendWelcome");
    assert_eq!(SendWelcome::QUEUE, "mail");
    assert_eq!(SendWelcome::VERSION, 1);
    assert_eq!(SendWelcome::STEPS, ["run"]);
    assert_eq!(SendWelcome::initial().step_name(), "run");
    assert_eq!(SendWelcome::from_step_name("run"), Some(SendWelcome));
    assert_eq!(SendWelcome::from_step_name("send_welcome"), None);
    assert_eq!(
        SendWelcome::RETRY_POLICY,
        RetryPolicy {
            max_attempts: 4,
            max_backoff: Duration::from_secs(5),
            backoff: None,
        }
    );
    assert_eq!(Defaults::RETRY_POLICY, RetryPolicy::default());
    assert_eq!((Defaults::NAME, Defaults::QUEUE), ("Defaults", "default"));
    assert_eq!(
        (Digest::NAME, Digest::VERSION, Digest::MAX_REAPS),
        ("mail.digest", 3, 1)
    );
    assert!(Registry::linked().get("SendWelcome", 1).is_some());
    assert!(Registry::linked().get("mail.digest", 3).is_some());
}

#[test]
fn backoff_schedule_is_capped_exponential() {
    let p = SendWelcome::RETRY_POLICY;
    let delays: Vec<u64> = (0..6).map(|a| p.delay(a).as_secs()).collect();
    assert_eq!(delays, [1, 2, 4, 5, 5, 5]);
    let d = Defaults::RETRY_POLICY;
    let delays: Vec<u64> = (0..10).map(|a| d.delay(a).as_secs()).collect();
    assert_eq!(delays, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300]);
}

#[tokio::test]
async fn success_is_done_with_the_result() {
    let out = run_erased::<SendWelcome>(input("a@b.c", 2)).await;
    assert!(
        matches!(&out.outcome, Outcome::Done { result } if result == &json!({ "sent": "a@b.c", "attempt": 2 })),
        "{out:?}"
    );
}

#[tokio::test]
async fn retry_replays_with_backoff_until_max_attempts() {
    // Runs 1..=3 of 4 replay after 1 s, 2 s, 4 s; the 4th run fails the job.
    for (attempt, secs) in [(0, 1), (1, 2), (2, 4)] {
        let out = run_erased::<SendWelcome>(input("flaky", attempt)).await;
        match out.outcome {
            Outcome::Replay { delay } => assert_eq!(delay, Duration::from_secs(secs)),
            other => panic!("attempt {attempt}: {other:?}"),
        }
        assert_eq!(out.error.as_deref(), Some("smtp timeout"));
    }
    let out = run_erased::<SendWelcome>(input("flaky", 3)).await;
    assert!(
        matches!(&out.outcome, Outcome::Stop { reason } if reason == "gave up after 4 attempts: smtp timeout"),
        "{out:?}"
    );
}

#[tokio::test]
async fn cancel_fails_at_once() {
    let out = run_erased::<SendWelcome>(input("bad", 0)).await;
    assert!(
        matches!(&out.outcome, Outcome::Stop { reason } if reason == "no such address"),
        "{out:?}"
    );
}

#[tokio::test]
async fn a_panic_is_retried_like_an_error() {
    let out = run_erased::<SendWelcome>(input("panic", 0)).await;
    assert!(
        matches!(out.outcome, Outcome::Replay { delay } if delay == Duration::from_secs(1)),
        "{out:?}"
    );
    let out = run_erased::<SendWelcome>(input("panic", 3)).await;
    assert!(
        matches!(&out.outcome, Outcome::Stop { reason } if reason.contains("mailer bug")),
        "{out:?}"
    );
}

fn linear(attempt: i32) -> Duration {
    Duration::from_secs(10 * (attempt as u64 + 1))
}

#[durable_job(max_attempts = 5, max_backoff_secs = 25, backoff = linear)]
async fn custom_backoff(_args: serde_json::Value, _ctx: &mut JobCtx) -> JobResult {
    Err(JobError::retry("always"))
}

#[test]
fn a_custom_backoff_replaces_the_default_and_keeps_the_cap() {
    let p = CustomBackoff::RETRY_POLICY;
    let delays: Vec<u64> = (0..4).map(|a| p.delay(a).as_secs()).collect();
    assert_eq!(delays, vec![10, 20, 25, 25]);
}
