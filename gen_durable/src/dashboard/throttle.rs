//! A limit on wrong operator tokens: after [`MAX_FAILURES`] wrong tokens from one client
//! address within [`WINDOW`], every POST from that address (sign-in and actions alike) is
//! answered `429 Too Many Requests` with a `Retry-After` until the oldest of those
//! failures leaves the window. Pages (GET) are still served.
//!
//! A failure is a token that was presented and is wrong: a sign-in with the wrong token,
//! or an action whose `Bearer` token or sign-in cookie does not match (the handlers mark
//! their answer with [`TokenRejected`]). A request with no token at all is not a guess.
//!
//! The client address is the TCP peer (`axum::extract::ConnectInfo<SocketAddr>`, which
//! `gen_durable dashboard` provides; serve your own router with
//! `into_make_service_with_connect_info::<SocketAddr>()` for the same). Without it, or
//! behind a reverse proxy, all clients share one address: a guesser then locks everyone
//! out of acting for a minute, which is the safe side. Forwarded headers are not trusted.
//!
//! The state is a small map in memory, per router, pruned as it is used and bounded to
//! [`MAX_TRACKED`] addresses (past it, new addresses share one entry).

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Request, State};
use axum::http::header::RETRY_AFTER;
use axum::http::{HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::AppState;

/// Wrong tokens allowed from one address within [`WINDOW`].
pub(crate) const MAX_FAILURES: usize = 5;

/// How long a wrong token counts.
pub(crate) const WINDOW: Duration = Duration::from_secs(60);

/// The most addresses tracked at once.
const MAX_TRACKED: usize = 10_000;

/// The address every client shares when the peer is unknown or the map is full.
const SHARED: IpAddr = IpAddr::V4(Ipv4Addr::UNSPECIFIED);

/// Put in a response's extensions by a handler that refused a wrong token.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TokenRejected;

/// Recent wrong tokens by client address.
#[derive(Debug, Default)]
pub(crate) struct Throttle {
    failures: Mutex<HashMap<IpAddr, VecDeque<Instant>>>,
}

impl Throttle {
    /// How long `addr` must wait before its next attempt, at `now`; `None`: it may try.
    pub(crate) fn wait(&self, addr: IpAddr, now: Instant) -> Option<Duration> {
        let mut map = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let times = map.get_mut(&addr)?;
        forget_old(times, now);
        if times.len() < MAX_FAILURES {
            return None;
        }
        let oldest = *times.front()?;
        Some(WINDOW.saturating_sub(now.duration_since(oldest)))
    }

    /// Counts a wrong token from `addr` at `now`.
    pub(crate) fn fail(&self, addr: IpAddr, now: Instant) {
        let mut map = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        if !map.contains_key(&addr) && map.len() >= MAX_TRACKED {
            map.retain(|_, times| {
                forget_old(times, now);
                !times.is_empty()
            });
        }
        let key = if map.contains_key(&addr) || map.len() < MAX_TRACKED {
            addr
        } else {
            SHARED
        };
        let times = map.entry(key).or_default();
        forget_old(times, now);
        times.push_back(now);
        // Only the newest MAX_FAILURES matter for the decision.
        while times.len() > MAX_FAILURES {
            times.pop_front();
        }
    }
}

fn forget_old(times: &mut VecDeque<Instant>, now: Instant) {
    while times
        .front()
        .is_some_and(|t| now.duration_since(*t) >= WINDOW)
    {
        times.pop_front();
    }
}

/// The client's address, as the server saw the connection.
fn client(req: &Request) -> IpAddr {
    req.extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map_or(SHARED, |c| c.0.ip())
}

/// Refuses a POST from an address that is locked out; counts the wrong tokens the
/// handlers report.
pub(crate) async fn limit(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if req.method() != Method::POST || state.token.is_none() {
        return next.run(req).await;
    }
    let addr = client(&req);
    if let Some(wait) = state.throttle.wait(addr, Instant::now()) {
        return too_many(wait);
    }
    let res = next.run(req).await;
    if res.extensions().get::<TokenRejected>().is_some() {
        state.throttle.fail(addr, Instant::now());
    }
    res
}

fn too_many(wait: Duration) -> Response {
    // Whole seconds, rounded up: a client that waits as told is let in.
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    let mut res = (
        StatusCode::TOO_MANY_REQUESTS,
        format!("too many wrong operator tokens from this address: try again in {secs} s"),
    )
        .into_response();
    if let Ok(v) = HeaderValue::from_str(&secs.max(1).to_string()) {
        res.headers_mut().insert(RETRY_AFTER, v);
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_is_locked_after_five_failures_until_the_oldest_leaves_the_window() {
        let t = Throttle::default();
        let (a, b) = (IpAddr::from([10, 0, 0, 1]), IpAddr::from([10, 0, 0, 2]));
        let t0 = Instant::now();
        for i in 0..MAX_FAILURES as u64 {
            assert_eq!(t.wait(a, t0), None);
            t.fail(a, t0 + Duration::from_secs(i));
        }
        let at = t0 + Duration::from_secs(10);
        assert_eq!(t.wait(a, at), Some(Duration::from_secs(50)));
        assert_eq!(t.wait(b, at), None, "another address is not locked");
        // The first failure leaves the window at t0 + 60 s: one more try is allowed.
        assert!(t.wait(a, t0 + Duration::from_secs(59)).is_some());
        assert_eq!(t.wait(a, t0 + WINDOW), None);
        t.fail(a, t0 + WINDOW);
        assert_eq!(
            t.wait(a, t0 + WINDOW),
            Some(Duration::from_secs(1)),
            "locked again until the second failure leaves the window"
        );
    }

    #[test]
    fn the_map_stays_bounded() {
        let t = Throttle::default();
        let now = Instant::now();
        for i in 1..(MAX_TRACKED as u32 + 10) {
            t.fail(IpAddr::from(i.to_be_bytes()), now);
        }
        let map = t.failures.lock().unwrap();
        assert!(map.len() <= MAX_TRACKED + 1, "{}", map.len());
        assert!(map.contains_key(&SHARED));
    }
}
