//! What the engine's background services have in common: one pass at a time, a wait
//! between passes, and a stop of their own.
//!
//! A service (the reaper, the await-timeout sweep, the collector, the heartbeat) is a
//! struct holding its validated config and what it needs of the engine. Its
//! [`Service::run_once`] does one pass and returns a report — tests call it directly on a
//! real database — and [`start`] runs it on the engine's task tracker until its token is
//! cancelled: the engine's shutdown cancels them all, [`ServiceHandle::stop`] one. A pass
//! that fails or panics is logged, and the service goes on after its error wait.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures_util::FutureExt;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::model::error::Result;
use crate::runtime::panic_message;

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
        wait = pass(&service).await;
    }
}

/// One pass and its report; the wait before the next. A panic in the pass (a bug, or an
/// event handler that `after` calls) is caught and logged as an error, and the service
/// goes on after its error wait: the task runs for the engine's lifetime, and nothing
/// would restart it, so a pass that unwinds out of it would end the service silently
/// while the engine looks healthy.
async fn pass<S: Service>(service: &S) -> Duration {
    let pass = async {
        match service.run_once().await {
            Ok(report) => service.after(report),
            Err(e) => {
                tracing::warn!(target: "gen_durable::service", service = S::NAME, error = %e, "pass failed");
                service.after_error()
            }
        }
    };
    // The service's state is its config and handles; a pass that unwound left nothing
    // half-done that the next pass reads (a transaction it held was rolled back on drop).
    match AssertUnwindSafe(pass).catch_unwind().await {
        Ok(wait) => wait,
        Err(panic) => {
            tracing::error!(target: "gen_durable::service", service = S::NAME, panic = %panic_message(panic), "pass panicked; the service goes on");
            service.after_error()
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::*;

    /// A service whose first pass panics, as a bug in a pass (or in an event handler its
    /// `after` calls) would.
    struct FirstPassPanics {
        passes: Arc<AtomicUsize>,
    }

    impl Service for FirstPassPanics {
        const NAME: &'static str = "first_pass_panics";
        type Report = ();

        async fn run_once(&self) -> Result<()> {
            if self.passes.fetch_add(1, Ordering::SeqCst) == 0 {
                panic!("a bug in the first pass");
            }
            Ok(())
        }

        fn after(&self, _: ()) -> Duration {
            Duration::from_millis(1)
        }

        fn after_error(&self) -> Duration {
            Duration::from_millis(1)
        }
    }

    #[tokio::test]
    async fn r4b_3_a_panicking_pass_is_reported_and_the_service_goes_on() {
        let passes = Arc::new(AtomicUsize::new(0));
        let tracker = TaskTracker::new();
        let handle = start(
            FirstPassPanics {
                passes: passes.clone(),
            },
            &tracker,
        );
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while passes.load(Ordering::SeqCst) < 3 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the service stopped after its panic: {} pass(es)",
                passes.load(Ordering::SeqCst)
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        handle.stop();
        tracker.close();
        tracker.wait().await;
    }
}
