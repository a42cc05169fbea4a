//! The table of medians printed after the last round.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::Args;

fn median(mut xs: Vec<f64>) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    xs.sort_by(|a, b| a.total_cmp(b));
    let m = xs.len() / 2;
    if xs.len() % 2 == 1 {
        xs[m]
    } else {
        (xs[m - 1] + xs[m]) / 2.0
    }
}

fn at(v: &Value, path: &[&str]) -> f64 {
    path.iter()
        .fold(v, |v, k| &v[*k])
        .as_f64()
        .unwrap_or(f64::NAN)
}

/// One Markdown table: per candidate, the medians over the rounds; throughput also as the
/// median of its ratio to graphile's (or v1's) in the same round.
pub(crate) fn print(lines: &[Value], args: &Args) {
    let mut order: Vec<String> = Vec::new();
    let mut by: BTreeMap<String, Vec<&Value>> = BTreeMap::new();
    for l in lines {
        let name = l["candidate"].as_str().unwrap_or("?").to_string();
        if !order.contains(&name) {
            order.push(name.clone());
        }
        by.entry(name).or_default().push(l);
    }
    let rate_in = |name: &str, round: u64| -> Option<f64> {
        lines
            .iter()
            .find(|l| l["candidate"] == name && l["round"].as_u64() == Some(round))
            .map(|l| at(l, &["steps_per_s"]))
    };
    let anchor = if by.contains_key("graphile") {
        "graphile"
    } else {
        "v1"
    };
    println!(
        "\n{} instances × {} step(s), {} clients, batch {}, {} round(s); medians (throughput: median, min–max)\n",
        args.n, args.steps, args.clients, args.batch, args.rounds
    );
    println!("| candidate | steps/s | × {anchor} | server CPU µs/step | claim + commit latency µs/step | WAL B/step | heap writes/step (WAL) | index entries/step (WAL) | HOT % | retention µs/instance | retention WAL B/instance |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for name in &order {
        let runs = &by[name];
        let m = |path: &[&str]| median(runs.iter().map(|l| at(l, path)).collect());
        let rates: Vec<f64> = runs.iter().map(|l| at(l, &["steps_per_s"])).collect();
        let lo = rates.iter().cloned().fold(f64::INFINITY, f64::min);
        let hi = rates.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let ratio = median(
            runs.iter()
                .filter_map(|l| {
                    let a = rate_in(anchor, l["round"].as_u64()?)?;
                    Some(at(l, &["steps_per_s"]) / a)
                })
                .collect(),
        );
        let heap = m(&["wal_per_step", "heap_insert"])
            + m(&["wal_per_step", "heap_update"])
            + m(&["wal_per_step", "heap_hot_update"])
            + m(&["wal_per_step", "heap_delete"])
            + m(&["wal_per_step", "heap_lock"]);
        println!(
            "| {name} | {:.0} ({:.0}–{:.0}) | {:.2} | {:.1} | {:.1} + {:.1} | {:.0} | {:.2} | {:.2} | {:.0} | {:.1} | {:.0} |",
            m(&["steps_per_s"]),
            lo,
            hi,
            ratio,
            m(&["server_cpu_us_per_step"]),
            m(&["claim_latency_us_per_step"]),
            m(&["commit_latency_us_per_step"]),
            m(&["wal_bytes_per_step"]),
            heap,
            m(&["wal_per_step", "index_insert"]),
            m(&["hot_ratio"]) * 100.0,
            m(&["gc", "server_cpu_us_per_instance"]),
            m(&["gc", "wal_bytes_per_instance"]),
        );
    }
}
