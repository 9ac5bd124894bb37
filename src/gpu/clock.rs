//! GPU time from SM cycles. A kernel stamps `clock64` (cheap, but per SM
//! and in cycles) around what it times and `%globaltimer` (nanoseconds, the
//! same on every SM, but coarse) at the ends of its whole run; the host
//! scales the cycles by the timer's nanoseconds per cycle over the run.
//! simple_write's ping-pong, ep's phases and collectives' calls all do.

use anyhow::{Result, bail};

/// One timed span: `clock64` cycles and `%globaltimer` ns at its start
/// and end.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Span {
    pub clock_start: u64,
    pub clock_end: u64,
    pub gt_start: u64,
    pub gt_end: u64,
}

/// `%globaltimer` nanoseconds per `clock64` cycle over all `spans` (the
/// timer's long-run accuracy with the cycles' resolution). Errors: the
/// cycle counters did not move (no span ran).
pub fn ns_per_cycle(spans: impl IntoIterator<Item = Span>) -> Result<f64> {
    let (mut cycles, mut ns) = (0u64, 0u64);
    for s in spans {
        cycles += s.clock_end.wrapping_sub(s.clock_start);
        ns += s.gt_end.saturating_sub(s.gt_start);
    }
    if cycles == 0 {
        bail!("the kernels' cycle counters did not move: no timed span ran to its end");
    }
    Ok(ns as f64 / cycles as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scales_by_the_whole_runs_ratio_and_refuses_no_cycles() {
        let s = |c0, c1, g0, g1| Span {
            clock_start: c0,
            clock_end: c1,
            gt_start: g0,
            gt_end: g1,
        };
        let k = ns_per_cycle([s(0, 1000, 0, 500), s(5000, 7000, 900, 1900)]).unwrap();
        assert!((k - 0.5).abs() < 1e-12);
        assert!(ns_per_cycle([s(7, 7, 0, 10)]).is_err());
        assert!(ns_per_cycle([]).is_err());
    }
}
