//! The wake-up listener: one LISTEN connection per engine. A notification names a queue;
//! its picker picks at once. A `gd_cancel` notification names an instance whose running
//! step should see `ctx.cancelled()` resolve. Polling stays the source of truth, so a lost
//! notification (or a dropped listener connection) only costs one poll interval.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use sqlx::PgPool;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::engine::service::ServiceHandle;
use crate::engine::shared::Claims;
use crate::model::error::Result;
use crate::store::pg::{CANCEL_CHANNEL, WAKE_CHANNEL};
use crate::telemetry::{Event, Telemetry};

/// The listener's settings.
#[derive(Debug, Clone)]
pub(crate) struct ListenerConfig {
    /// Where it listens.
    pub(crate) on: WakeListener,
    /// The first wait before connecting again after a failure; it doubles up to
    /// `max_backoff`.
    pub(crate) backoff: Duration,
    pub(crate) max_backoff: Duration,
}

/// Where an engine LISTENs for its wake-ups (`EngineBuilder::with_listener`). A wake-up
/// only shortens a picker's wait — polling stays the source of truth — so each choice
/// trades latency, never correctness.
#[derive(Debug, Clone, Default)]
pub enum WakeListener {
    /// On a connection of its own, made with the pool's options (the default).
    #[default]
    Pool,
    /// On a connection made with these options: the database itself, when the pool
    /// goes through a pooler in transaction mode (PgBouncer), where a LISTEN does not
    /// outlive its transaction. [`WakeListener::direct`] builds it.
    Direct(Box<PgConnectOptions>),
    /// No LISTEN at all: pickers find new rows by polling
    /// (`QueueConfig::with_poll_interval`, backing off to `with_max_poll_interval` when
    /// idle) and a cancelled running step learns of it at the next heartbeat.
    Off,
}

/// The listener service. Unlike the periodic services it holds a connection, so it has
/// a loop of its own; [`Listener::run_once`] handles one notification.
#[derive(Debug)]
pub(crate) struct Listener {
    pub(crate) cfg: ListenerConfig,
    pub(crate) pool: PgPool,
    pub(crate) telemetry: Telemetry,
    pub(crate) claims: Arc<Claims>,
    /// Each queue's picker, woken by a notification naming it.
    pub(crate) queues: HashMap<String, Arc<Notify>>,
}

/// What one notification did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Heard {
    /// Woke the picker of this queue (or of no queue of this node).
    Queue(String),
    /// Resolved `ctx.cancelled()` of this instance's step, if it runs here.
    Cancel(i64),
    /// The connection dropped: every picker was woken (notifications may have been lost);
    /// sqlx reconnects at the next call.
    Dropped,
    /// A cancellation whose payload is not an id.
    Ignored,
}

impl WakeListener {
    /// Listen on a connection made with `options` (the database itself).
    pub fn direct(options: PgConnectOptions) -> Self {
        WakeListener::Direct(Box::new(options))
    }
}

impl Listener {
    /// A LISTEN connection on both channels.
    pub(crate) async fn connect(&self) -> Result<PgListener> {
        let mut l = match &self.cfg.on {
            WakeListener::Direct(options) => {
                let direct = PgPoolOptions::new()
                    .max_connections(1)
                    .connect_lazy_with((**options).clone());
                PgListener::connect_with(&direct).await?
            }
            WakeListener::Pool | WakeListener::Off => PgListener::connect_with(&self.pool).await?,
        };
        l.listen_all([WAKE_CHANNEL, CANCEL_CHANNEL]).await?;
        Ok(l)
    }

    /// Waits for one notification on `conn` and acts on it.
    pub(crate) async fn run_once(&self, conn: &mut PgListener) -> Result<Heard> {
        Ok(match conn.try_recv().await? {
            Some(n) if n.channel() == CANCEL_CHANNEL => match n.payload().parse::<i64>() {
                Ok(id) => {
                    self.claims.cancel_step(id);
                    Heard::Cancel(id)
                }
                Err(_) => Heard::Ignored,
            },
            Some(n) => {
                if let Some(wake) = self.queues.get(n.payload()) {
                    wake.notify_one();
                }
                Heard::Queue(n.payload().to_string())
            }
            None => {
                self.wake_all();
                Heard::Dropped
            }
        })
    }

    fn wake_all(&self) {
        self.queues.values().for_each(|n| n.notify_one());
    }

    /// Runs the listener on `tracker` until its handle stops it.
    pub(crate) fn start(self, tracker: &TaskTracker) -> ServiceHandle {
        let stop = CancellationToken::new();
        tracker.spawn(self.run(stop.clone()));
        ServiceHandle::new(stop)
    }

    async fn run(self, stop: CancellationToken) {
        let mut backoff = self.cfg.backoff;
        let mut connects = 0;
        loop {
            let mut conn = match self.connect().await {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(target: "gen_durable::listener", error = %e, "cannot LISTEN; polling only for now");
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(self.cfg.max_backoff);
                    continue;
                }
            };
            backoff = self.cfg.backoff;
            connects += 1;
            self.telemetry.emit(Event::ListenerConnected {
                reconnect: connects > 1,
            });
            // Anything may have been missed while we were not listening.
            self.wake_all();
            loop {
                let heard = tokio::select! {
                    _ = stop.cancelled() => return,
                    h = self.run_once(&mut conn) => h,
                };
                if let Err(e) = heard {
                    tracing::warn!(target: "gen_durable::listener", error = %e, "listener failed; reconnecting");
                    break;
                }
            }
        }
    }
}
