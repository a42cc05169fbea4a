//! `gen_durable::metrics`: an engine's events recorded through the `metrics` facade and
//! the queue gauges, scraped from the Prometheus recorder and parsed.

use std::time::Duration;

use gen_durable::durable_job;
use gen_durable::prelude::*;
use gen_durable_testkit::TestDb;

/// The job's argument.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct TickArgs {
    /// Echoed as the result.
    pub n: u64,
}
impl DurableState for TickArgs {
    const TYPE_NAME: &'static str = "TickArgs";
}

#[durable_job(queue = "metered")]
async fn tick(args: TickArgs, _ctx: &mut JobCtx) -> JobResult {
    match args.n {
        13 => Err(JobError::fail("unlucky")),
        n => Ok(json!(n)),
    }
}

/// A parked workflow's state.
#[derive(DurableState, Serialize, Deserialize, Default, Debug, Clone)]
pub struct Parked {
    /// Children to schedule (0: await a signal instead).
    pub children: u32,
}

/// Parks: on a signal that never comes, or on children that park on one.
#[durable_fsm(state = Parked, queue = "metered", version = 1)]
pub enum Park {
    /// Awaits "go", or schedules children.
    #[initial]
    Start,
    /// Never reached.
    End,
}

#[durable_steps]
impl Park {
    async fn start(ctx: &mut Ctx<Self>) -> StepResult<Self> {
        if ctx.state.children == 0 {
            return Ok(Step::await_signal(["go"], Park::End));
        }
        let kids = (0..ctx.state.children)
            .map(|_| Child::new::<Park>(Parked::default()))
            .collect();
        Ok(Step::schedule_children(kids, Park::End))
    }
    async fn end(_ctx: &mut Ctx<Self>) -> StepResult<Self> {
        Ok(Step::done(json!(null)))
    }
}

/// The value of the sample named `name` whose labels include every one of `labels`
/// (`key="value"`), from a Prometheus text exposition.
fn sample(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .find(|(series, _)| {
            let metric = series.split('{').next().unwrap_or("");
            metric == name && labels.iter().all(|want| series.contains(want))
        })
        .map(|(_, value)| value.parse().expect("a sample value is a number"))
}

#[tokio::test]
async fn an_engines_steps_and_its_queues_are_scraped_as_prometheus_metrics() {
    let prometheus = gen_durable::metrics::install_prometheus().unwrap();
    assert!(
        gen_durable::metrics::install_prometheus().is_err(),
        "a second recorder is refused"
    );
    let db = TestDb::new().await;
    let gd = Client::new(db.pool().clone());
    // Rows nobody serves: two due now (lag), three scheduled for later (not ready).
    for n in 0..2 {
        gd.insert::<Tick>(TickArgs { n })
            .queue("idle")
            .await
            .unwrap();
    }
    for n in 0..3 {
        gd.insert::<Tick>(TickArgs { n })
            .queue("idle")
            .schedule_in(Duration::from_secs(3600))
            .await
            .unwrap();
    }
    let engine = Engine::builder(db.pool().clone())
        .queue("metered", 4)
        .on_event(gen_durable::metrics::record)
        .start()
        .await
        .unwrap();
    let mut ids = Vec::new();
    for n in 0..10 {
        ids.push(gd.insert::<Tick>(TickArgs { n }).await.unwrap());
    }
    for id in ids {
        let settled = gd.wait(id).timeout(Duration::from_secs(10)).await.unwrap();
        assert!(matches!(settled, Settled::Done(_)), "{settled:?}");
    }
    // One failed job; one parent parked on two children, each parked on a signal.
    let failed = gd.insert::<Tick>(TickArgs { n: 13 }).await.unwrap();
    let parent = gd.insert::<Park>(Parked { children: 2 }).await.unwrap();
    for (id, terminal) in [(failed, true), (parent, false)] {
        let w = gd.wait(id).timeout(Duration::from_secs(10));
        let settled = if terminal {
            w.until_terminal().await
        } else {
            w.await
        };
        assert!(
            matches!(settled, Ok(Settled::Failed(_)) | Ok(Settled::Parked { .. })),
            "{settled:?}"
        );
    }
    let children: Vec<i64> = sqlx::query_scalar("SELECT id FROM gd_instances WHERE parent_id = $1")
        .bind(parent)
        .fetch_all(db.pool())
        .await
        .unwrap();
    for id in children {
        let settled = gd.wait(id).timeout(Duration::from_secs(10)).await;
        assert!(matches!(settled, Ok(Settled::Parked { .. })), "{settled:?}");
    }
    engine.shutdown(Duration::from_secs(5)).await;

    gen_durable::metrics::observe_queues(db.pool())
        .await
        .unwrap();
    let text = prometheus.render();
    let done = [r#"fsm="Tick""#, r#"kind="done""#];
    assert_eq!(
        sample(&text, "gen_durable_steps_total", &done),
        Some(10.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "gen_durable_step_duration_seconds_count", &done),
        Some(10.0),
        "{text}"
    );
    assert!(sample(
        &text,
        "gen_durable_step_duration_seconds_bucket",
        &[r#"le="60""#]
    )
    .is_some());
    let picks = sample(&text, "gen_durable_picks_total", &[r#"queue="metered""#]).unwrap();
    let picked = sample(
        &text,
        "gen_durable_picked_rows_total",
        &[r#"queue="metered""#],
    )
    .unwrap();
    assert!(
        picks >= 1.0 && picked == 14.0,
        "picks {picks}, rows {picked}"
    );
    let outcomes = sample(&text, "gen_durable_committed_outcomes_total", &[]).unwrap();
    assert_eq!(
        outcomes, 14.0,
        "10 done, 1 failed, 1 parent and 2 children parked"
    );
    assert!(sample(&text, "gen_durable_commits_total", &[]).unwrap() >= 1.0);
    let idle = |status: &str| {
        let label = format!(r#"status="{status}""#);
        sample(
            &text,
            "gen_durable_queue_depth",
            &[r#"queue="idle""#, &label],
        )
    };
    assert_eq!(idle("runnable"), Some(5.0));
    assert_eq!(idle("ready"), Some(2.0));
    assert_eq!(idle("executing"), Some(0.0));
    // Parked and finished rows, by status: exact, since this table is smaller than the
    // sample (which then reads every page).
    let metered = |status: &str| {
        let label = format!(r#"status="{status}""#);
        sample(
            &text,
            "gen_durable_queue_depth",
            &[r#"queue="metered""#, &label],
        )
    };
    assert_eq!(metered("done"), Some(10.0), "{text}");
    assert_eq!(metered("failed"), Some(1.0));
    assert_eq!(metered("awaiting_signal"), Some(2.0));
    assert_eq!(metered("awaiting_children"), Some(1.0));
    assert_eq!(metered("runnable"), Some(0.0));
    assert_eq!(metered("executing"), Some(0.0));
    assert_eq!(idle("done"), Some(0.0));
    assert_eq!(
        sample(&text, "gen_durable_queue_depth_sample_ratio", &[]),
        Some(1.0)
    );
    let lag = sample(&text, "gen_durable_queue_lag_seconds", &[r#"queue="idle""#]).unwrap();
    assert!(lag > 0.0 && lag < 60.0, "lag {lag}");
    db.close().await;
}
