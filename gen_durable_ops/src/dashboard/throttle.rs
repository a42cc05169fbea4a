//! A limit on wrong operator tokens: after [`MAX_FAILURES`] wrong tokens from one client
//! address within [`WINDOW`], every POST from that address (sign-in and actions alike) is
//! answered `429 Too Many Requests` with a `Retry-After` until the oldest of those
//! failures leaves the window. Pages (GET) are still served.
//!
//! A failure is a token that was presented and is wrong: a sign-in with the wrong token,
//! or an action whose `Bearer` token does not match (the handlers mark their answer with
//! [`TokenRejected`]). A request with no token at all is not a guess, nor is a session
//! cookie that names no live session (a random 256-bit id is not guessed).
//!
//! The client address is the TCP peer (`axum::extract::ConnectInfo<SocketAddr>`, which
//! `gen_durable dashboard` provides; serve your own router with
//! `into_make_service_with_connect_info::<SocketAddr>()` for the same). Without it, or
//! behind a reverse proxy, all clients share one address: a guesser then locks everyone
//! out of acting for a minute, which is the safe side. Forwarded headers are not trusted.
//!
//! The state is a map in memory, per router, bounded to [`MAX_TRACKED`] addresses and
//! pruned of addresses whose failures all left the window. It never forgets an address
//! with a failure inside the window: an evict-the-oldest map would let an attacker with
//! more addresses than it holds have each forgotten before its next turn. When it is
//! full of such addresses, it fails closed: a wrong token from an address it has no room
//! for cannot be counted on its own, so every address the map does not track is
//! answered 429 until that failure leaves the window (tracked ones keep their own
//! counts). No address gets more than [`MAX_FAILURES`] wrong tokens through per window,
//! however many addresses are used; the price is that, while someone keeps 10,000
//! addresses failing, a new address cannot act.

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

/// The address every client shares when the peer is unknown.
const SHARED: IpAddr = IpAddr::V4(Ipv4Addr::UNSPECIFIED);

/// Put in a response's extensions by a handler that refused a wrong token.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TokenRejected;

/// Recent wrong tokens by client address.
#[derive(Debug, Default)]
pub(crate) struct Throttle {
    state: Mutex<Failures>,
}

#[derive(Debug, Default)]
struct Failures {
    /// The newest failures (at most [`MAX_FAILURES`]) of each tracked address.
    by_addr: HashMap<IpAddr, VecDeque<Instant>>,
    /// The last failure of an address the map had no room for: until it leaves the
    /// window, every untracked address waits.
    untracked: Option<Instant>,
}

impl Throttle {
    /// How long `addr` must wait before its next attempt, at `now`; `None`: it may try.
    pub(crate) fn wait(&self, addr: IpAddr, now: Instant) -> Option<Duration> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let oldest = match state.by_addr.get_mut(&addr) {
            Some(times) => {
                forget_old(times, now);
                if times.len() < MAX_FAILURES {
                    return None;
                }
                *times.front()?
            }
            // Its failures may have gone uncounted while the map was full.
            None => state.untracked?,
        };
        let left = WINDOW.saturating_sub(now.duration_since(oldest));
        (!left.is_zero()).then_some(left)
    }

    /// Counts a wrong token from `addr` at `now`.
    pub(crate) fn fail(&self, addr: IpAddr, now: Instant) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let map = &mut state.by_addr;
        if !map.contains_key(&addr) && map.len() >= MAX_TRACKED {
            map.retain(|_, times| {
                forget_old(times, now);
                !times.is_empty()
            });
        }
        if !map.contains_key(&addr) && map.len() >= MAX_TRACKED {
            // Every tracked address still counts: forgetting one would let it guess
            // again, so this failure closes the door to all untracked addresses instead.
            state.untracked = Some(now);
            return;
        }
        let times = map.entry(addr).or_default();
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
    if let Some(wait) = state.throttle.wait(addr, state.now.now()) {
        return too_many(wait);
    }
    let res = next.run(req).await;
    if res.extensions().get::<TokenRejected>().is_some() {
        state.throttle.fail(addr, state.now.now());
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

    /// How many wrong tokens `addr` gets through at `now` before it is told to wait
    /// (stops counting at `cap`).
    fn guesses_let_through(t: &Throttle, addr: IpAddr, now: Instant, cap: usize) -> usize {
        let mut n = 0;
        while n < cap && t.wait(addr, now).is_none() {
            t.fail(addr, now);
            n += 1;
        }
        n
    }

    /// R4-4: once the map tracked MAX_TRACKED addresses, a new address's failures went to
    /// an entry `wait` never read, so it could guess without limit.
    #[test]
    fn r4_4_a_new_address_is_throttled_when_the_map_is_full() {
        let t = Throttle::default();
        let now = Instant::now();
        for i in 0..MAX_TRACKED as u32 {
            t.fail(IpAddr::from((0x0a00_0000 + i).to_be_bytes()), now);
        }
        let attacker = IpAddr::from([203, 0, 113, 7]);
        let through = guesses_let_through(&t, attacker, now, 1_000);
        assert!(
            through <= MAX_FAILURES,
            "{through} wrong tokens let through from one address with the map full"
        );
        assert!(t.state.lock().unwrap().by_addr.len() <= MAX_TRACKED);
    }

    /// R4-4, the rule rather than the case: however many addresses take turns (more than
    /// the map holds, so that an evict-the-oldest map would forget each before its next
    /// turn), no address gets more than MAX_FAILURES wrong tokens within the window.
    #[test]
    fn r4_4_no_address_gets_more_than_five_guesses_whatever_the_map_holds() {
        let t = Throttle::default();
        let now = Instant::now();
        let addrs: Vec<IpAddr> = (0..MAX_TRACKED as u32 + 500)
            .map(|i| IpAddr::from((0x0a00_0000 + i).to_be_bytes()))
            .collect();
        let mut through = vec![0usize; addrs.len()];
        for _round in 0..MAX_FAILURES + 2 {
            for (i, a) in addrs.iter().enumerate() {
                if t.wait(*a, now).is_none() {
                    t.fail(*a, now);
                    through[i] += 1;
                }
            }
        }
        let worst = through.iter().max().copied().unwrap_or(0);
        assert!(
            worst <= MAX_FAILURES,
            "an address got {worst} wrong tokens through"
        );
        assert!(t.state.lock().unwrap().by_addr.len() <= MAX_TRACKED);
    }

    #[test]
    fn the_map_stays_bounded_and_forgets_only_expired_addresses() {
        let t = Throttle::default();
        let t0 = Instant::now();
        for i in 1..=MAX_TRACKED as u32 {
            t.fail(IpAddr::from(i.to_be_bytes()), t0);
        }
        let late = IpAddr::from([198, 51, 100, 1]);
        t.fail(late, t0 + Duration::from_secs(1));
        assert_eq!(t.state.lock().unwrap().by_addr.len(), MAX_TRACKED);
        assert_eq!(
            t.wait(late, t0 + Duration::from_secs(1)),
            Some(WINDOW),
            "an untracked address waits"
        );
        assert_eq!(
            t.wait(IpAddr::from(1u32.to_be_bytes()), t0),
            None,
            "a tracked address keeps its own count"
        );
        // Once the first failures leave the window, their addresses make room.
        t.fail(late, t0 + WINDOW);
        let state = t.state.lock().unwrap();
        assert_eq!(state.by_addr.len(), 1);
        assert!(state.by_addr.contains_key(&late));
    }
}
