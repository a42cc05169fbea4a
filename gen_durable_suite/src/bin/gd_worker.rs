//! A gen_durable worker process for the reliability suite; see `gen_durable_suite::worker`.

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    gen_durable_suite::worker::run(gen_durable_suite::worker::Args::parse(
        std::env::args().skip(1),
    ))
    .await
}
