//! Every Rust block of `docs/guide/` compiles here, word for word (`tests/docs.rs` checks
//! that each block's lines appear in this file or in an example), with the declarations
//! around it the guide leaves out. The testing guide's snippets also run. FSMs declared
//! outside a snippet carry a name of their own, so that the kit's registry (one per
//! binary) finds the right one.
#![allow(dead_code)]

use gen_durable::prelude::*;

/// `steps.md`'s and others' shared state.
#[derive(DurableState, Serialize, Deserialize, Default, Debug, Clone)]
pub struct CheckoutState {
    pub order: u64,
    #[durable(default)]
    pub tenant: String,
}

/// One-step FSMs for the snippets that only insert.
#[durable_fsm(state = CheckoutState, name = "GuideCharge")]
pub enum Charge {
    #[initial]
    Run,
}

#[durable_steps]
impl Charge {
    async fn run(_ctx: &mut Ctx<Self>) -> StepResult<Self> {
        Ok(Step::done(json!(null)))
    }
}

#[durable_fsm(state = CheckoutState, name = "GuideDigest")]
pub enum Digest {
    #[initial]
    Run,
}

#[durable_steps]
impl Digest {
    async fn run(_ctx: &mut Ctx<Self>) -> StepResult<Self> {
        Ok(Step::done(json!(null)))
    }
}

mod flow_control {
    use super::*;
    use gen_durable::{Gate, LimitKey, RateLimit};
    use sqlx::PgPool;

    async fn gates(
        pool: PgPool,
        gd: Client,
        state: CheckoutState,
        tenant_id: String,
    ) -> gen_durable::Result<()> {
        let engine = Engine::builder(pool.clone())
            .queue("default", 64)
            .gate("stripe", Gate::new(100)) // K per key of gate "stripe"
            .start()
            .await?;
        gd.insert::<Charge>(state.clone())
            .gate(("stripe", tenant_id))
            .await?; // key `tenant_id`
        gd.insert::<Digest>(state)
            .gate(LimitKey::global("smtp"))
            .await?; // one key: K for everything
        drop(engine);
        Ok(())
    }

    #[rustfmt::skip]
    async fn rate_limits(
        pool: PgPool,
        gd: Client,
        state: CheckoutState,
        tenant_id: String,
    ) -> gen_durable::Result<()> {
        let engine = Engine::builder(pool.clone())
            .queue("default", 64)
            .rate_limit("stripe", RateLimit::per(100, Duration::from_secs(60)).burst(150))
            .start()
            .await?;
        gd.insert::<Charge>(state.clone()).rate_limit(("stripe", tenant_id)).weight(5.0).await?;
        gd.insert::<Digest>(state).rate_limit("smtp").await?; // the limit's one global bucket
        drop(engine);
        Ok(())
    }

    #[durable_fsm(state = CheckoutState, name = "GuideFlowCheckout")]
    pub enum Checkout {
        #[initial]
        Reserve,
        Charge,
        Ship,
    }

    #[durable_steps]
    impl Checkout {
        async fn reserve(ctx: &mut Ctx<Self>) -> StepResult<Self> {
            // From `charge` on: key `tenant` of gate "stripe", and 5 tokens of its limit.
            Ok(Step::next(Checkout::Charge)
                .gate(("stripe", ctx.state.tenant.clone()))
                .rate_limit(("stripe", ctx.state.tenant.clone()))
                .weight(5.0))
        }
        async fn charge(_ctx: &mut Ctx<Self>) -> StepResult<Self> {
            Ok(Step::next(Checkout::Ship).release_partition()) // no key from here on
        }
        #[step(rate_limit = "carrier", key = tenant)] // every run of `ship` pays
        async fn ship(_ctx: &mut Ctx<Self>) -> StepResult<Self> {
            Ok(Step::done(json!("shipped")))
        }
    }
}

mod history {
    use super::*;
    use gen_durable_testkit::TestKit;

    #[durable_fsm(state = CheckoutState, history = "full")] // "full" | "steps" (default) | "off"
    pub enum Checkout {
        #[initial]
        Reserve,
        Charge,
        Ship,
    }

    #[durable_steps]
    impl Checkout {
        async fn reserve(_ctx: &mut Ctx<Self>) -> StepResult<Self> {
            Ok(Step::next(Checkout::Charge))
        }
        async fn charge(_ctx: &mut Ctx<Self>) -> StepResult<Self> {
            Ok(Step::next(Checkout::Ship))
        }
        async fn ship(_ctx: &mut Ctx<Self>) -> StepResult<Self> {
            Ok(Step::done(json!("shipped")))
        }
    }

    #[tokio::test]
    async fn assert_steps_reads_the_history() {
        let mut kit = TestKit::new();
        let id = kit
            .insert::<Checkout>(CheckoutState::default())
            .await
            .unwrap();
        kit.run_until_idle().await;
        kit.assert_steps(id, ["reserve", "charge", "ship"]);
    }
}

mod testing {
    use super::*;
    use gen_durable_testkit::TestKit;

    #[derive(DurableState, Serialize, Deserialize, Default, Debug, Clone)]
    pub struct CheckoutState {
        pub order: u64,
    }

    #[durable_fsm(state = CheckoutState, name = "GuideTestingCheckout")]
    pub enum Checkout {
        #[initial]
        Reserve,
        Ship,
    }

    #[durable_steps]
    impl Checkout {
        async fn reserve(_ctx: &mut Ctx<Self>) -> StepResult<Self> {
            Ok(Step::await_signal(["payment_confirmed"], Checkout::Ship)
                .timeout(Duration::from_secs(3600)))
        }
        async fn ship(ctx: &mut Ctx<Self>) -> StepResult<Self> {
            match ctx.awaited().first() {
                Some(paid) => Ok(Step::done(json!({ "paid": paid.payload()["amount"] }))),
                None => Ok(Step::stop("payment timed out")),
            }
        }
    }

    #[tokio::test]
    async fn the_guides_test_passes() -> Result<(), Box<dyn std::error::Error>> {
        let mut kit = TestKit::new();
        let paid = kit.insert::<Checkout>(CheckoutState { order: 1 }).await?;
        let late = kit.insert::<Checkout>(CheckoutState { order: 2 }).await?;
        assert_eq!(
            kit.run_until_idle().await.to_string(),
            "{await: 2, steps: 2}"
        );
        kit.assert_awaiting(paid, ["payment_confirmed"]);
        kit.signal(paid, "payment_confirmed", json!({ "amount": 100 }))
            .await?;
        kit.run_until_idle().await;
        kit.assert_done(paid, json!({ "paid": 100 }));
        kit.advance(Duration::from_secs(3600)); // past the timeout
        kit.run_until_idle().await;
        kit.assert_failed(late, "payment timed out");
        Ok(())
    }
}

mod instance_migrations {
    use gen_durable::prelude::*;

    pub mod v1 {
        use gen_durable::prelude::*;

        #[derive(DurableState, Serialize, Deserialize, Debug, Clone)]
        pub struct Sub {
            pub customer: String,
            pub plan: String,
            pub log: Vec<String>,
        }

        #[durable_fsm(state = Sub, name = "GuideSubscription", version = 1)]
        pub enum Subscription {
            #[initial]
            Charge,
            Notify,
        }

        #[durable_steps]
        impl Subscription {
            async fn charge(_ctx: &mut Ctx<Self>) -> StepResult<Self> {
                Ok(Step::next(Self::Notify))
            }
            async fn notify(_ctx: &mut Ctx<Self>) -> StepResult<Self> {
                Ok(Step::done(json!(null)))
            }
        }
    }

    #[derive(DurableState, Serialize, Deserialize, Debug, Clone)]
    pub struct Sub {
        pub customer: String,
        pub cents: u64,
        pub log: Vec<String>,
    }

    #[durable_fsm(state = Sub, name = "GuideSubscription", version = 2)]
    pub enum Subscription {
        #[initial]
        Charge,
        Email,
    }

    #[durable_steps]
    impl Subscription {
        async fn charge(_ctx: &mut Ctx<Self>) -> StepResult<Self> {
            Ok(Step::next(Self::Email))
        }
        async fn email(_ctx: &mut Ctx<Self>) -> StepResult<Self> {
            Ok(Step::done(json!(null)))
        }
    }

    fn price_of(plan: &str) -> Option<u64> {
        (plan == "basic").then_some(500)
    }

    #[rustfmt::skip]
    #[durable_migration]
    impl Migration for Subscription {            // v2
        type From = v1::Subscription;            // the same FSM name, a lower version

        fn migrate_state(old: v1::Sub) -> Result<Sub, MigrationError> {
            let cents = price_of(&old.plan).ok_or_else(|| MigrationError::new("no price"))?;
            Ok(Sub { customer: old.customer, cents, log: old.log })
        }

        fn migrate_step(old: v1::Subscription) -> Self {   // exhaustive: checked by the compiler
            match old {
                v1::Subscription::Charge => Self::Charge,
                v1::Subscription::Notify => Self::Email,   // a removed step must be mapped
            }
        }
    }
}

mod schedules {
    use gen_durable::prelude::*;
    use gen_durable::{durable_job, JobCtx, JobResult};
    use sqlx::PgPool;

    #[derive(DurableState, Serialize, Deserialize, Default, Debug, Clone)]
    pub struct ReportArgs {
        pub period: String,
    }

    #[durable_job(queue = "reports", name = "GuideBuildReport")]
    async fn build_report(args: ReportArgs, _ctx: &mut JobCtx) -> JobResult {
        Ok(json!(args.period))
    }

    #[rustfmt::skip]
    async fn nightly(pool: PgPool) -> gen_durable::Result<()> {
        use gen_durable::{CatchUp, Entry, Schedule, Tz};

        let nightly = Schedule::cron("nightly-report", "0 2 * * *", |fire| {
            Entry::<BuildReport>::new(ReportArgs { period: fire.to_rfc3339() })
        })?
        .with_timezone(Tz::Europe__Paris)
        .with_catch_up(CatchUp::RunOnce);
        let engine = Engine::builder(pool).queue("reports", 4).schedule(nightly).start().await?;
        drop(engine);
        Ok(())
    }
}

mod telemetry {
    use gen_durable::prelude::*;
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_otlp::{Protocol, WithExportConfig};
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use sqlx::PgPool;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;

    fn otel() -> Result<(), Box<dyn std::error::Error>> {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpJson)
            .with_endpoint("http://localhost:4318/v1/traces")
            .build()?;
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .build();
        tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("gen_durable")))
            .init();
        Ok(())
    }

    async fn prometheus(pool: PgPool) -> Result<(), Box<dyn std::error::Error>> {
        let prometheus = gen_durable::metrics::install_prometheus()?;
        let engine = Engine::builder(pool.clone())
            .queue("default", 16)
            .on_event(gen_durable::metrics::record)
            .start()
            .await?;
        // in your /metrics handler:
        gen_durable::metrics::observe_queues(&pool).await?; // queue depth and lag gauges
        let body = prometheus.render();
        drop((engine, body));
        Ok(())
    }
}

mod deployment {
    use gen_durable::prelude::*;
    use gen_durable::{Pooler, WakeListener};
    use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

    async fn behind_pgbouncer() -> Result<(), Box<dyn std::error::Error>> {
        let pool = PgPoolOptions::new()
            .connect("postgres://app@pgbouncer:6432/app")
            .await?;
        let direct: PgConnectOptions = "postgres://app@db:5432/app".parse()?;
        let gd = Client::new(pool.clone()).with_pooler(Pooler::Transaction);
        let engine = Engine::builder(pool)
            .with_pooler(Pooler::Transaction)
            .with_listener(WakeListener::direct(direct)) // or WakeListener::Off: poll only
            .queue("default", 50)
            .start()
            .await?;
        drop((gd, engine));
        Ok(())
    }
}

mod scaling {
    use super::flow_control::Checkout;
    use super::CheckoutState;
    use gen_durable::prelude::*;
    use sqlx::PgPool;

    #[rustfmt::skip]
    async fn sharded(
        pool_a: PgPool,
        pool_b: PgPool,
        state: CheckoutState,
    ) -> gen_durable::Result<()> {
        use gen_durable::{Client, Key, Settled, ShardedClient, ShardedId};

        let gd = ShardedClient::new(vec![Client::new(pool_a), Client::new(pool_b)])?; // empty: Error::InvalidConfig

        // On the shard "order:42" hashes to, with "order:42" as its correlation key.
        let at: ShardedId = gd.insert::<Checkout>("order:42", state).priority(1).await?;

        // Routed by key: the routed Client's own builders (`SignalSend`, `Wait`).
        gd.signal(Key("order:42"), "payment_confirmed", json!({ "amount": 100 })).dedup_key("evt-7").await?;
        let settled = gd.wait(Key("order:42")).until_terminal().await?;

        // By id: the id names its shard. A shard this client lacks is Error::InvalidInput.
        gd.wait_id(at)?.await?;
        gd.signal_id(at, "payment_confirmed", json!({}))?.await?;
        gd.cancel(at).await?;
        gd.retry(at).await?;

        // Everything else on one shard's Client: insert_all, an insert in your transaction,
        // a child's key (it lives on its root's shard).
        gd.client("order:42").signal(Key("order:42/refund"), "go", json!({})).await?;
        let shard = gd.shard_of("order:42"); // usize, the same on every process and release
        let c: Option<&Client> = gd.shard(1);
        let _: (Settled, usize, Option<&Client>) = (settled, shard, c);
        Ok(())
    }
}

/// `signals.md`: sending a signal, and waiting for an answer.
mod signals {
    use gen_durable::prelude::*;

    #[rustfmt::skip]
    async fn send_and_wait(gd: Client, id: i64) -> gen_durable::Result<()> {
        gd.signal(id, "payment_confirmed", json!({ "amount": 100 }))
            .dedup_key("evt-7")
            .await?;

        match gd.wait(Key("order:43")).until_terminal().timeout(Duration::from_secs(2)).await? {
            Settled::Done(result) => println!("done: {result}"),
            Settled::Failed(error) => println!("failed: {error}"),
            other => println!("not yet: {other:?}"),
        }
        Ok(())
    }
}
