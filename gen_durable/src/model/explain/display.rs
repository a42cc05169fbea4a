//! An explanation in English: one line (`Display`), and the evidence behind it.

use std::fmt;

use serde_json::Value;

use super::time::{at, count, relative};
use super::{Explanation, Heartbeat, Reason, Trouble};

/// The most characters of a result or an error a line shows.
const SHOWN_CHARS: usize = 80;

impl fmt::Display for Explanation {
    /// One line: `awaiting signal "paid" until 2026-12-02 14:00:00 UTC (in 3 min); 1
    /// unrelated signal in the inbox: "shipped"`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.reason_line(f)?;
        // A failed instance's line shows its error already: the history adds what the
        // error does not say (earlier failures, lost leases).
        let failed = matches!(self.reason, Reason::Failed { .. });
        match &self.trouble {
            Some(t) if !(failed && t.failures <= 1 && t.leases_lost == 0) => {
                write!(f, "; {}", trouble(t, !failed))
            }
            _ => Ok(()),
        }
    }
}

/// What the history says of the step: `failed 3 times at "charge" (last: card declined),
/// lost its lease once`.
fn trouble(t: &Trouble, with_error: bool) -> String {
    let times = |n: i64| match n {
        1 => "once".to_string(),
        2 => "twice".to_string(),
        n => format!("{n} times"),
    };
    let mut parts = Vec::new();
    if t.failures > 0 {
        let mut p = format!("failed {} at {:?}", times(t.failures), t.step);
        if let Some(e) = t.last_error.as_ref().filter(|_| with_error) {
            p.push_str(&format!(" (last: {})", shorten(e)));
        }
        parts.push(p);
    }
    if t.leases_lost > 0 {
        parts.push(format!("lost its lease {} there", times(t.leases_lost)));
    }
    parts.join(", ")
}

impl Explanation {
    /// The reason's part of the line.
    fn reason_line(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let now = self.at;
        match &self.reason {
            Reason::Done { result } => write!(f, "done: {}", shorten(&json(result))),
            Reason::Failed { last_error } => write!(
                f,
                "failed at step {:?} (attempt {}): {}",
                self.step,
                self.attempt + 1,
                shorten(last_error.as_deref().unwrap_or("no error recorded"))
            ),
            Reason::Executing {
                node,
                since,
                lease_until,
                heartbeat,
                lease_expired,
                cancel_requested,
                ..
            } => {
                write!(
                    f,
                    "executing step {:?} on node {node:?} since {}, ",
                    self.step,
                    at(*since, now)
                )?;
                if *lease_expired {
                    write!(f, "lease expired at {}", at(*lease_until, now))?;
                } else {
                    write!(f, "lease until {}", at(*lease_until, now))?;
                }
                write!(f, ", heartbeat {}", heartbeat_name(*heartbeat))?;
                if *lease_expired {
                    f.write_str(": the reaper will take it back")?;
                }
                if *cancel_requested {
                    f.write_str("; cancel requested: it fails after this step")?;
                }
                Ok(())
            }
            Reason::AwaitingSignals {
                names,
                deadline,
                unrelated,
                unrelated_names,
            } => {
                let which = if names.len() == 1 {
                    "signal"
                } else {
                    "signals"
                };
                write!(f, "awaiting {which} {}", quoted(names, " or "))?;
                match deadline {
                    Some(d) if *d <= now => write!(
                        f,
                        ", deadline {} passed: the timeout sweep wakes it",
                        at(*d, now)
                    )?,
                    Some(d) => write!(f, " until {}", at(*d, now))?,
                    None => f.write_str(" (no deadline)")?,
                }
                if unrelated.n > 0 {
                    let s = if unrelated.n == 1 && !unrelated.capped {
                        "signal"
                    } else {
                        "signals"
                    };
                    write!(
                        f,
                        "; {} unrelated {s} in the inbox: {}",
                        count(*unrelated),
                        quoted(unrelated_names, ", ")
                    )?;
                }
                Ok(())
            }
            Reason::AwaitingChildren {
                pending,
                total,
                waiting_on,
            } => {
                write!(
                    f,
                    "awaiting {pending} of {} children before step {:?}",
                    count(*total),
                    self.step
                )?;
                if !waiting_on.is_empty() {
                    let listed: Vec<String> = waiting_on
                        .iter()
                        .map(|c| format!("{} {}", c.id, c.status))
                        .collect();
                    write!(f, ": {}", listed.join(", "))?;
                    let more = i64::from(*pending) - waiting_on.len() as i64;
                    if more > 0 {
                        write!(f, " and {more} more")?;
                    }
                }
                Ok(())
            }
            Reason::QueuePaused { since, why } => {
                write!(
                    f,
                    "queue {:?} is paused since {}",
                    self.queue,
                    at(*since, now)
                )?;
                match why {
                    Some(why) => write!(f, ": {}", shorten(why)),
                    None => Ok(()),
                }
            }
            Reason::RateLimited { limit, key, due } => write!(
                f,
                "waiting for its rate limit {limit:?} (key {key:?}): its tokens are due at {}",
                at(*due, now)
            ),
            Reason::GateFull {
                gate,
                key,
                limit,
                running,
            } => write!(
                f,
                "gate {gate:?} is full for key {key:?} ({running}/{limit} running)"
            ),
            Reason::Scheduled { at: t } => write!(f, "scheduled for {}", at(*t, now)),
            Reason::Backoff { until, last_error } => {
                write!(
                    f,
                    "in backoff after attempt {} until {}",
                    self.attempt,
                    at(*until, now)
                )?;
                match last_error {
                    Some(e) => write!(f, "; last error: {}", shorten(e)),
                    None => Ok(()),
                }
            }
            Reason::PartitionBlocked { key, holder } => {
                write!(
                    f,
                    "blocked by partition key {key:?} held by instance {} (its step {:?}",
                    holder.id, holder.step
                )?;
                if let Some(node) = &holder.node {
                    write!(f, " on node {node:?}")?;
                }
                if let Some(t) = holder.lease_until {
                    write!(f, ", lease until {}", at(t, now))?;
                }
                f.write_str(")")
            }
            Reason::NoNodeForQueue { live_nodes } => {
                write!(f, "no live node serves queue {:?}", self.queue)?;
                if live_nodes.is_empty() {
                    f.write_str(" (no node is live at all)")
                } else {
                    write!(f, " (live nodes: {})", quoted(live_nodes, ", "))
                }
            }
            Reason::NoNodeForVersion {
                nodes_on_queue,
                versions_served,
            } => {
                write!(
                    f,
                    "no live node has FSM {:?} v{} registered (nodes on queue {:?}: {}",
                    self.fsm,
                    self.version,
                    self.queue,
                    quoted(nodes_on_queue, ", ")
                )?;
                if versions_served.is_empty() {
                    f.write_str("; they run no version of it)")
                } else {
                    let v: Vec<String> = versions_served.iter().map(|v| format!("v{v}")).collect();
                    write!(f, "; they run {})", v.join(", "))
                }
            }
            Reason::Runnable { rows_ahead } => {
                write!(f, "runnable now at step {:?}, ", self.step)?;
                if rows_ahead.n == 0 {
                    write!(f, "first in line in queue {:?}", self.queue)
                } else {
                    let s = if rows_ahead.n == 1 && !rows_ahead.capped {
                        "row"
                    } else {
                        "rows"
                    };
                    // A capped count already says "at least".
                    let about = if rows_ahead.capped { "" } else { "~" };
                    write!(
                        f,
                        "{about}{} {s} ahead of it in queue {:?}",
                        count(*rows_ahead),
                        self.queue
                    )
                }
            }
        }
    }
}

impl Explanation {
    /// The evidence behind the line, a few `label: value` lines for an operator: the
    /// instance, then what its reason rests on.
    pub fn evidence(&self) -> Vec<String> {
        let now = self.at;
        let mut out = vec![
            format!(
                "instance: {} ({} v{}) in queue {:?}",
                self.id, self.fsm, self.version, self.queue
            ),
            format!(
                "status: {} at step {:?}, attempt {}",
                self.status,
                self.step,
                self.attempt + 1
            ),
        ];
        let mut add = |label: &str, value: String| out.push(format!("{label}: {value}"));
        match &self.reason {
            Reason::Done { result } => add("result", shorten(&json(result))),
            Reason::Failed { last_error } => {
                add("last error", last_error.clone().unwrap_or_default())
            }
            Reason::Executing {
                node,
                since,
                lease_until,
                node_seen_at,
                heartbeat,
                ..
            } => {
                add("node", format!("{node:?}"));
                add("claimed", at(*since, now));
                add("lease until", at(*lease_until, now));
                add(
                    "node last seen",
                    node_seen_at.map_or("never (not announced)".into(), |t| at(t, now)),
                );
                add("heartbeat", heartbeat_name(*heartbeat).to_string());
            }
            Reason::AwaitingSignals {
                names,
                deadline,
                unrelated,
                unrelated_names,
            } => {
                add("awaits", quoted(names, ", "));
                add("deadline", deadline.map_or("none".into(), |d| at(d, now)));
                add(
                    "unrelated signals",
                    format!("{} {}", count(*unrelated), quoted(unrelated_names, ", ")),
                );
            }
            Reason::AwaitingChildren {
                pending,
                total,
                waiting_on,
            } => {
                add(
                    "children",
                    format!("{pending} unfinished of {}", count(*total)),
                );
                for c in waiting_on {
                    add(
                        "  child",
                        format!("{} ({}) {} at step {:?}", c.id, c.fsm, c.status, c.step),
                    );
                }
            }
            Reason::QueuePaused { since, why } => {
                add("paused since", at(*since, now));
                add("reason", why.clone().unwrap_or_else(|| "none given".into()));
            }
            Reason::RateLimited { limit, key, due } => {
                add("rate limit", format!("{limit:?} key {key:?}"));
                add("tokens due at", at(*due, now));
            }
            Reason::GateFull {
                gate,
                key,
                limit,
                running,
            } => {
                add("gate", format!("{gate:?} key {key:?}"));
                add("running", format!("{running} of {limit}"));
            }
            Reason::Scheduled { at: t } => add("eligible at", at(*t, now)),
            Reason::Backoff { until, last_error } => {
                add("eligible at", at(*until, now));
                add("last error", last_error.clone().unwrap_or_default());
            }
            Reason::PartitionBlocked { key, holder } => {
                add("partition key", format!("{key:?}"));
                add(
                    "held by",
                    format!("instance {} at step {:?}", holder.id, holder.step),
                );
                add(
                    "its node",
                    format!("{:?}", holder.node.as_deref().unwrap_or("")),
                );
                add(
                    "its lease until",
                    holder.lease_until.map_or("none".into(), |t| at(t, now)),
                );
            }
            Reason::NoNodeForQueue { live_nodes } => add("live nodes", quoted(live_nodes, ", ")),
            Reason::NoNodeForVersion {
                nodes_on_queue,
                versions_served,
            } => {
                add("nodes on its queue", quoted(nodes_on_queue, ", "));
                let v: Vec<String> = versions_served.iter().map(|v| format!("v{v}")).collect();
                add("versions they run", v.join(", "));
            }
            Reason::Runnable { rows_ahead } => add("rows ahead", count(*rows_ahead)),
        }
        if let Reason::Scheduled { at: t } | Reason::Backoff { until: t, .. } = &self.reason {
            out.push(format!("runs: {}", relative(*t, now)));
        }
        if let Some(t) = &self.trouble {
            out.push(format!("history: {}", trouble(t, true)));
        }
        out
    }
}

fn heartbeat_name(h: Heartbeat) -> &'static str {
    match h {
        Heartbeat::Fresh => "fresh",
        Heartbeat::Stale => "stale",
    }
}

/// `"a" or "b"`; `none` for an empty list.
fn quoted(names: &[String], sep: &str) -> String {
    if names.is_empty() {
        return "none".to_string();
    }
    names
        .iter()
        .map(|n| format!("{n:?}"))
        .collect::<Vec<_>>()
        .join(sep)
}

fn json(v: &Value) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

/// The first [`SHOWN_CHARS`] characters, with `…` if there were more.
fn shorten(s: &str) -> String {
    match s.char_indices().nth(SHOWN_CHARS) {
        Some((cut, _)) => format!("{}…", &s[..cut]),
        None => s.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::explain::Count;
    use crate::Status;
    use chrono::{TimeZone, Utc};

    fn explanation(reason: Reason) -> Explanation {
        Explanation {
            id: 7,
            fsm: "Checkout".into(),
            version: 2,
            queue: "checkout".into(),
            status: Status::AwaitingSignal,
            step: "ship".into(),
            attempt: 0,
            at: Utc.with_ymd_and_hms(2026, 12, 2, 13, 57, 0).unwrap(),
            reason,
            trouble: None,
        }
    }

    /// The history's part: how often the current step failed and lost its lease since
    /// the instance came to it, the newest error; nothing before that counts.
    #[test]
    fn the_line_cites_the_history_of_the_current_step() {
        use crate::HistoryKind::*;
        let e = |kind, step: &str, error: Option<&str>| {
            (kind, step.to_string(), error.map(str::to_string))
        };
        // Newest first: two failures and a lost lease at `ship` since `pack` went on to it.
        let recent = vec![
            e(Retry, "ship", Some("carrier down")),
            e(LeaseLost, "ship", Some("lease lost on n1")),
            e(Retry, "ship", Some("timeout")),
            e(Next, "pack", None),
            e(Retry, "pack", Some("older, not counted")),
        ];
        let t = Trouble::of("ship", &recent).unwrap();
        assert_eq!((t.failures, t.leases_lost), (2, 1));
        let mut x = explanation(Reason::Runnable {
            rows_ahead: Count::bounded(0),
        });
        x.trouble = Some(t);
        assert!(
            x.to_string().ends_with(
                "; failed twice at \"ship\" (last: carrier down), lost its lease once there"
            ),
            "{x}"
        );
        assert!(x
            .evidence()
            .last()
            .unwrap()
            .starts_with("history: failed twice"));
        assert_eq!(
            Trouble::of("ship", &recent[3..]),
            None,
            "went on: nothing to cite"
        );
    }

    #[test]
    fn the_line_names_the_reason_and_its_evidence() {
        let e = explanation(Reason::AwaitingSignals {
            names: vec!["paid".into()],
            deadline: Some(Utc.with_ymd_and_hms(2026, 12, 2, 14, 0, 0).unwrap()),
            unrelated: Count::bounded(1),
            unrelated_names: vec!["shipped".into()],
        });
        assert_eq!(
            e.to_string(),
            "awaiting signal \"paid\" until 2026-12-02 14:00:00 UTC (in 3 min); \
             1 unrelated signal in the inbox: \"shipped\""
        );
        let r = explanation(Reason::Runnable {
            rows_ahead: Count::bounded(10_000),
        });
        assert_eq!(
            r.to_string(),
            "runnable now at step \"ship\", ≥10,000 rows ahead of it in queue \"checkout\""
        );
        let long = explanation(Reason::Done {
            result: Value::String("x".repeat(200)),
        });
        assert!(long.to_string().ends_with('…'), "{long}");
        assert_eq!(long.to_string().chars().count(), "done: ".len() + 81);
    }
}
