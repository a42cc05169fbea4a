use gen_durable::durable_job;
use gen_durable::prelude::*;

#[derive(DurableState, Serialize, Deserialize, Debug, Clone)]
struct WelcomeArgs {
    email: String,
}

#[durable_job(queue = "mail")]
fn send_welcome(args: WelcomeArgs, _ctx: &mut JobCtx) -> JobResult {
    Ok(json!({ "sent": args.email }))
}

fn main() {}
