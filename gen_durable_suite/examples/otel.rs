//! OpenTelemetry: every step runs inside a `gen_durable.step` span carrying the instance
//! `id`, its `fsm`, `step` and `attempt`; `tracing-opentelemetry` turns those spans into
//! OpenTelemetry spans, exported here over OTLP/HTTP (JSON) to a collector you run.
//!
//! ```sh
//! # a collector listening for OTLP/HTTP on :4318 (e.g. the OpenTelemetry Collector, Jaeger):
//! OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4318 cargo run --example otel
//! cargo run --example otel -- --check   # against a stand-in collector it starts and checks
//! ```
//! With `--check` (the CI smoke) the example receives the export itself and checks that
//! each instance's steps arrived as spans with their attributes.
//! Uses `DATABASE_URL`'s server (default: the local one) and its own database there,
//! `gen_durable_examples`, which it creates and migrates.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use gen_durable::prelude::*;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, SpanExporter, WithExportConfig};
use opentelemetry_sdk::trace::SdkTracerProvider;
use serde_json::Value;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

#[derive(DurableState, Serialize, Deserialize, Default, Debug, Clone)]
pub struct Greeting {
    pub name: String,
}

#[durable_fsm(state = Greeting, queue = "otel")]
pub enum Greet {
    #[initial]
    Hello,
    World,
}

#[durable_steps]
impl Greet {
    async fn hello(_ctx: &mut Ctx<Self>) -> StepResult<Self> {
        Ok(Step::next(Self::World))
    }
    async fn world(ctx: &mut Ctx<Self>) -> StepResult<Self> {
        Ok(Step::done(json!(format!("hello, {}", ctx.state.name))))
    }
}

/// The OTLP/HTTP request bodies a stand-in collector received.
type Received = Arc<Mutex<Vec<Value>>>;

/// A stand-in collector on a free local port: it keeps what is POSTed to `/v1/traces`.
async fn stand_in_collector() -> Result<(String, Received), Box<dyn std::error::Error>> {
    let received = Received::default();
    let keep = received.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            let keep = keep.clone();
            async move {
                if let Ok(v) = serde_json::from_slice(&body) {
                    keep.lock().unwrap().push(v);
                }
                ""
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok((url, received))
}

/// `(span name, attributes as key → value text)` of every span in the received bodies.
fn spans(received: &Received) -> Vec<(String, Vec<(String, String)>)> {
    let bodies = received.lock().unwrap().clone();
    let mut out = Vec::new();
    let all = |v: &Value, key: &str| v[key].as_array().cloned().unwrap_or_default();
    for body in &bodies {
        for rs in all(body, "resourceSpans") {
            for ss in all(&rs, "scopeSpans") {
                for span in all(&ss, "spans") {
                    let attrs = all(&span, "attributes")
                        .iter()
                        .map(|a| {
                            let v = &a["value"];
                            let text = v["stringValue"]
                                .as_str()
                                .map(str::to_string)
                                .or_else(|| v["intValue"].as_str().map(str::to_string))
                                .unwrap_or_else(|| v["intValue"].to_string());
                            (a["key"].as_str().unwrap_or("").to_string(), text)
                        })
                        .collect();
                    out.push((span["name"].as_str().unwrap_or("").to_string(), attrs));
                }
            }
        }
    }
    out
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let check = std::env::args().any(|a| a == "--check");
    let (endpoint, received) = if check {
        let (url, received) = stand_in_collector().await?;
        (url, Some(received))
    } else {
        let url = std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT")
            .unwrap_or_else(|_| "http://localhost:4318".into());
        (url, None)
    };
    // Without a collector every span would be dropped in silence: say so and stop.
    if let Err(e) = reachable(&endpoint).await {
        eprintln!(
            "no OpenTelemetry collector at {endpoint} ({e}): the spans would be dropped.\n\
             Start one listening for OTLP/HTTP (e.g. `docker run -p 4318:4318 \
             otel/opentelemetry-collector`, or Jaeger), set OTEL_EXPORTER_OTLP_ENDPOINT to \
             yours, or run `cargo run --example otel -- --check` to see the spans arrive at \
             a stand-in collector."
        );
        std::process::exit(1);
    }
    let exporter = SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpJson)
        .with_endpoint(format!("{}/v1/traces", endpoint.trim_end_matches('/')))
        .build()?;
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .build();
    tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("gen_durable")))
        .init();
    println!("exporting spans to {endpoint}/v1/traces");

    let pool = common::connect().await?;
    let engine = Engine::builder(pool.clone())
        .queue("otel", 4)
        .start()
        .await?;
    let gd = Client::new(pool);
    let mut ids = Vec::new();
    for name in ["ada", "grace", "edsger"] {
        ids.push(gd.insert::<Greet>(Greeting { name: name.into() }).await?);
    }
    for &id in &ids {
        let settled = gd.wait(id).timeout(Duration::from_secs(30)).await?;
        println!("  instance {id}: {settled:?}");
    }
    engine.shutdown(Duration::from_secs(10)).await;
    // The batch exporter sends from its own thread: flush it off the async runtime.
    let flushed = tokio::task::spawn_blocking(move || {
        let flushed = provider.force_flush();
        provider.shutdown()?;
        flushed
    })
    .await?;
    if let Err(e) = flushed {
        eprintln!("the spans could not be exported to {endpoint}: {e}");
        std::process::exit(1);
    }

    if let Some(received) = received {
        let steps: Vec<_> = spans(&received)
            .into_iter()
            .filter(|(name, _)| name == "gen_durable.step")
            .collect();
        for &id in &ids {
            for step in ["hello", "world"] {
                let found = steps.iter().any(|(_, attrs)| {
                    let has = |k: &str, v: &str| attrs.iter().any(|(ak, av)| ak == k && av == v);
                    has("id", &id.to_string())
                        && has("fsm", "Greet")
                        && has("step", step)
                        && has("attempt", "0")
                });
                assert!(found, "no span for instance {id} step {step}: {steps:?}");
            }
        }
        println!(
            "the stand-in collector received {} step spans, each with id, fsm, step and attempt",
            steps.len()
        );
    }
    Ok(())
}

/// Whether something listens at the endpoint's host and port (`http://host:port/…`; port
/// 4318, OTLP/HTTP's, when the URL names none).
async fn reachable(endpoint: &str) -> std::io::Result<()> {
    let authority = endpoint
        .split_once("://")
        .map_or(endpoint, |(_, rest)| rest)
        .split('/')
        .next()
        .unwrap_or_default();
    let address = if authority.contains(':') {
        authority.to_string()
    } else {
        format!("{authority}:4318")
    };
    let connect = tokio::net::TcpStream::connect(address);
    match tokio::time::timeout(Duration::from_secs(3), connect).await {
        Ok(connected) => connected.map(drop),
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "no answer in 3 s",
        )),
    }
}
