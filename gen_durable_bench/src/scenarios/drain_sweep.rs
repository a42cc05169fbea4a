//! The `drain_sweep` scenario: the drain under several engine settings.

use super::drain::drain;
use super::{EngineCfg, R};
use crate::{Bench, Report};

/// `drain_sweep`: the drain under several engine settings, to choose the defaults.
pub(super) async fn drain_sweep(b: &Bench) -> R<Vec<Report>> {
    let mut out = Vec::new();
    // (concurrency, prefetch, min_demand, commit_batch, pool)
    let settings: &[(usize, usize, usize, usize, u32)] = if b.smoke() {
        &[(8, 0, 1, 512, 4), (16, 16, 16, 512, 8)]
    } else {
        &[
            (32, 32, 32, 512, 10),
            (64, 0, 32, 512, 10),
            (64, 64, 64, 512, 10),
            (64, 64, 64, 512, 20),
            (128, 128, 128, 512, 20),
            (128, 128, 64, 512, 20),
            (256, 256, 256, 1024, 20),
        ]
    };
    for &(concurrency, prefetch, min_demand, commit_batch, pool) in settings {
        let cfg = EngineCfg {
            concurrency,
            prefetch,
            min_demand,
            commit_batch,
            pool,
            ..EngineCfg::from_args(b)
        };
        out.push(drain(b, &cfg, false).await?);
    }
    Ok(out)
}
