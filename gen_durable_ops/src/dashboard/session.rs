//! Sign-in sessions: what the `gd_session` cookie names once an operator signed in.
//!
//! A session is 32 random bytes from the operating system's CSPRNG (`getrandom`); the
//! cookie holds their hex, never the operator token, and the server keeps when the
//! session expires. Sign-out forgets it, so a copied cookie stops working then, and at
//! the expiry in any case.
//!
//! The id's first 16 bytes find the session in the map; the other 16 are compared in
//! constant time, so that how long a lookup takes says nothing about a live id.
//!
//! The store is in memory, per router, and bounded to [`MAX_SESSIONS`]: a new session
//! first drops the expired ones, then, if the store is still full, the one that expires
//! first (the oldest sign-in), whose operator signs in again. A restart signs everyone
//! out, and replicas do not share sessions (the bearer header works on any).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use subtle::ConstantTimeEq;

/// The most sessions kept at once; only a right token makes one, so only operators
/// fill it.
pub(crate) const MAX_SESSIONS: usize = 1_024;

/// Bytes that find a session.
const SELECTOR: usize = 16;
/// Bytes that prove it.
const VERIFIER: usize = 16;

#[derive(Debug)]
struct Session {
    verifier: [u8; VERIFIER],
    expires: Instant,
}

/// The live sessions.
#[derive(Debug, Default)]
pub(crate) struct Sessions {
    by_selector: Mutex<HashMap<[u8; SELECTOR], Session>>,
}

impl Sessions {
    /// Opens a session lasting `ttl` from `now`: the cookie's value. `None` when the
    /// operating system gives no random bytes.
    pub(crate) fn open(&self, now: Instant, ttl: Duration) -> Option<String> {
        let mut id = [0u8; SELECTOR + VERIFIER];
        getrandom::getrandom(&mut id).ok()?;
        let (selector, verifier) = split(&id);
        let mut map = self.lock();
        if map.len() >= MAX_SESSIONS {
            map.retain(|_, s| s.expires > now);
        }
        if map.len() >= MAX_SESSIONS {
            let soonest = map.iter().min_by_key(|(_, s)| s.expires).map(|(k, _)| *k);
            if let Some(k) = soonest {
                map.remove(&k);
            }
        }
        map.insert(
            selector,
            Session {
                verifier,
                expires: now + ttl,
            },
        );
        Some(hex(&id))
    }

    /// Whether `cookie` names a session that is live at `now` (an expired one is
    /// forgotten on the way).
    pub(crate) fn is_live(&self, cookie: &str, now: Instant) -> bool {
        let Some((selector, verifier)) = parse(cookie) else {
            return false;
        };
        let mut map = self.lock();
        let Some(s) = map.get(&selector) else {
            return false;
        };
        if !bool::from(s.verifier.ct_eq(&verifier)) {
            return false;
        }
        if s.expires <= now {
            map.remove(&selector);
            return false;
        }
        true
    }

    /// Forgets the session `cookie` names, if it is one.
    pub(crate) fn close(&self, cookie: &str) {
        let Some((selector, verifier)) = parse(cookie) else {
            return;
        };
        let mut map = self.lock();
        if map
            .get(&selector)
            .is_some_and(|s| bool::from(s.verifier.ct_eq(&verifier)))
        {
            map.remove(&selector);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; SELECTOR], Session>> {
        self.by_selector.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn split(id: &[u8; SELECTOR + VERIFIER]) -> ([u8; SELECTOR], [u8; VERIFIER]) {
    let mut selector = [0u8; SELECTOR];
    let mut verifier = [0u8; VERIFIER];
    selector.copy_from_slice(&id[..SELECTOR]);
    verifier.copy_from_slice(&id[SELECTOR..]);
    (selector, verifier)
}

/// The id a cookie value holds, if it is one (64 hex digits).
fn parse(cookie: &str) -> Option<([u8; SELECTOR], [u8; VERIFIER])> {
    let digits = cookie.as_bytes();
    if digits.len() != 2 * (SELECTOR + VERIFIER) {
        return None;
    }
    let mut id = [0u8; SELECTOR + VERIFIER];
    for (byte, pair) in id.iter_mut().zip(digits.chunks_exact(2)) {
        let pair = std::str::from_utf8(pair).ok()?;
        *byte = u8::from_str_radix(pair, 16).ok()?;
    }
    Some(split(&id))
}

/// Lower-case hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);

    #[test]
    fn a_session_lives_until_it_expires_or_is_closed() {
        let s = Sessions::default();
        let t0 = Instant::now();
        let a = s.open(t0, HOUR).unwrap();
        let b = s.open(t0, HOUR).unwrap();
        assert_ne!(a, b);
        assert!(s.is_live(&a, t0 + HOUR - Duration::from_millis(1)));
        assert!(!s.is_live(&a, t0 + HOUR), "expired at its end");
        assert!(!s.is_live(&a, t0), "and forgotten");
        s.close(&b);
        assert!(!s.is_live(&b, t0));
    }

    #[test]
    fn only_the_whole_id_opens_a_session() {
        let s = Sessions::default();
        let t0 = Instant::now();
        let a = s.open(t0, HOUR).unwrap();
        let mut forged = a[..2 * SELECTOR].to_string();
        forged.push_str(&"0".repeat(2 * VERIFIER));
        assert!(
            !s.is_live(&forged, t0),
            "the right selector, a wrong verifier"
        );
        s.close(&forged);
        assert!(s.is_live(&a, t0), "a wrong verifier does not sign it out");
        for junk in [
            "",
            "zz",
            &a[1..],
            &format!("{a}0"),
            &a.replace(&a[..2], "g0"),
        ] {
            assert!(!s.is_live(junk, t0), "{junk:?}");
        }
    }

    #[test]
    fn the_store_stays_bounded_dropping_the_expired_then_the_oldest() {
        let s = Sessions::default();
        let t0 = Instant::now();
        let ids: Vec<String> = (0..MAX_SESSIONS as u64)
            .map(|i| s.open(t0 + Duration::from_secs(i), HOUR).unwrap())
            .collect();
        let at = t0 + Duration::from_secs(MAX_SESSIONS as u64);
        let newest = s.open(at, HOUR).unwrap();
        assert_eq!(s.lock().len(), MAX_SESSIONS);
        assert!(!s.is_live(&ids[0], at), "the oldest made room");
        assert!(s.is_live(&ids[1], at) && s.is_live(&newest, at));
        // Once some have expired, they make room first.
        let later = t0 + HOUR + Duration::from_secs(10);
        s.open(later, HOUR).unwrap();
        assert_eq!(s.lock().len(), MAX_SESSIONS - 10 + 1);
    }
}
