//! What the engine's background services have in common: one pass at a time, a wait
//! between passes, and a stop of their own.
//!
//! A service (the reaper, the await-timeout sweep, the collector, the heartbeat) is a
//! struct holding its validated config and what it needs of the engine. Its
//! [`Service::run_once`] does one pass and returns a report — tests call it directly on a
//! real database — and [`start`] runs it on the engine's task tracker until its token is
//! cancelled: the engine's shutdown cancels them all, [`ServiceHandle::stop`] one.

use std::future::Future;
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::error::Result;

/// A background service of the engine.
pub(crate) trait Service: Send + Sync + Sized + 'static {
    /// Its name in logs (`gen_durable::<NAME>` is the tracing target of its warnings).
    const NAME: &'static str;
    /// What one pass did.
    type Report: Send;

    /// One pass: the statements it runs, until it has nothing left to do right now.
    fn run_once(&self) -> impl Future<Output = Result<Self::Report>> + Send;

    /// After a successful pass: emits the service's event, and says how long to wait
    /// before the next pass.
    fn after(&self, report: Self::Report) -> Duration;

    /// The wait after a failed pass (logged as a warning).
    fn after_error(&self) -> Duration;

    /// The wait before the first pass (default none).
    fn first_wait(&self) -> Duration {
        Duration::ZERO
    }

    /// Wakes the service before its wait is over (default: nothing does).
    fn woken(&self) -> Option<&Notify> {
        None
    }
}

/// A running service, stopped by [`ServiceHandle::stop`].
#[derive(Debug)]
pub(crate) struct ServiceHandle {
    stop: CancellationToken,
}

impl ServiceHandle {
    pub(crate) fn new(stop: CancellationToken) -> Self {
        ServiceHandle { stop }
    }

    /// Stops the service after its current pass.
    pub(crate) fn stop(&self) {
        self.stop.cancel();
    }
}

/// Runs `service` on `tracker` until its handle stops it.
pub(crate) fn start<S: Service>(service: S, tracker: &TaskTracker) -> ServiceHandle {
    let stop = CancellationToken::new();
    tracker.spawn(run(service, stop.clone()));
    ServiceHandle::new(stop)
}

async fn run<S: Service>(service: S, stop: CancellationToken) {
    let mut wait = service.first_wait();
    loop {
        if !wait.is_zero() || service.woken().is_some() {
            let woken = async {
                match service.woken() {
                    Some(n) => n.notified().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = woken => {}
                _ = tokio::time::sleep(wait) => {}
            }
        } else if stop.is_cancelled() {
            return;
        }
        wait = match service.run_once().await {
            Ok(report) => service.after(report),
            Err(e) => {
                tracing::warn!(target: "gen_durable::service", service = S::NAME, error = %e, "pass failed");
                service.after_error()
            }
        };
    }
}
