//! `#[durable_job]` on a user's async fn: the generated type's queue and retry policy.
// A user's crate, built as a test target of this package: the workspace's lints (a doc
// on every public item) are for our own crates, not for this one.
#![allow(missing_docs)]

use gen_durable::durable_job;
use gen_durable::prelude::*;

#[derive(DurableState, Serialize, Deserialize, Debug, Clone)]
pub struct WelcomeArgs {
    pub email: String,
}

async fn send(_email: &str) -> Result<(), std::io::Error> {
    Ok(())
}

#[durable_job(queue = "mail", max_attempts = 5, max_backoff_secs = 60, version = 2)]
pub async fn send_welcome(args: WelcomeArgs, ctx: &mut JobCtx) -> JobResult {
    if ctx.is_cancelled() {
        return Err(JobError::fail("shutting down"));
    }
    send(&args.email).await.map_err(JobError::retry)?;
    Ok(json!({ "sent": true }))
}

fn main() {
    assert_eq!(<SendWelcome as Fsm>::QUEUE, "mail");
    assert_eq!(SendWelcome::RETRY_POLICY.max_attempts, 5);
}
