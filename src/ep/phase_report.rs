//! What an elastic run (`ep --plan`) measured, phase by phase: who was
//! there, how long connecting the newcomers took, for a kill how long each
//! survivor took to detect it and the survivors to agree, dispatch and
//! combine p50/p99 before the fault and after the agreement, steps lost to
//! the fault, and wrong values (always 0: a wrong value ends the run with
//! exit 3). Printed as a table, written as JSON and CSV.
//!
//! Times of a step are the slowest rank's (the step is done when every rank
//! has everything), GPU time, ns; host-clock figures are ms.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::config::Path;
use crate::stats::Summary;

/// One detection on one rank: its GPU masked `rank` during a step.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Detection {
    pub rank: u32,
    /// Host clock: from the launcher's kill to the end of the step in
    /// which this rank's GPU masked it, ms (None: no kill time known, e.g. a
    /// rank that died unplanned).
    pub after_kill_ms: Option<f64>,
    /// GPU time from the start of the wait that gave up to the masking, ms
    /// (the fault timeout, plus the poll period).
    pub wait_ms: f64,
}

/// One path's timed steps of one phase on one rank.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PhaseSteps {
    pub path: Path,
    /// Replayed from a CUDA graph (the table shows the stream launches).
    #[serde(default)]
    pub graph: bool,
    /// Global step numbers, verified ones only (lost steps left out).
    pub steps: Vec<u32>,
    pub dispatch_ns: Vec<f64>,
    pub combine_ns: Vec<f64>,
    /// Per step: how many agreements that removed ranks came before it in
    /// this phase (0 = before any fault).
    pub epoch: Vec<u32>,
}

/// What one rank measured in one phase, published when the phase ends.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PhaseResult {
    pub phase: usize,
    pub rank: u32,
    /// Host clock from the phase's begin to the members' barrier after
    /// connecting the newcomers, ms (a joiner's wait for the phase before
    /// to end left out).
    pub connect_ms: f64,
    /// Host clock this rank spent connecting to the phase's newcomers
    /// ahead of its begin (between the steps of the phase before, or, a
    /// joiner, while waiting for it to end), ms.
    #[serde(default)]
    pub ahead_ms: f64,
    pub paths: Vec<PhaseSteps>,
    pub detected: Vec<Detection>,
    /// Per agreement that removed ranks: host clock from this rank's report
    /// to the decision, ms.
    pub agree_ms: Vec<f64>,
    /// The ranks the survivors agreed are gone, in this phase.
    pub gone: Vec<u32>,
    /// Steps whose checks failed while the mask changed under them (a rank
    /// died mid-step): reported, never counted as verified.
    pub lost_steps: u32,
    /// Steps after a decision whose kernels masked a rank it had already
    /// removed (they waited on it again): 0 when the mask is honoured.
    #[serde(default)]
    pub waits_on_gone: u64,
}

/// p50 and p99 of a set of step times, µs; None when there are none.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct P50P99 {
    pub p50_us: f64,
    pub p99_us: f64,
    pub steps: usize,
}

/// One (phase, path) over every rank of the phase.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PhaseRow {
    pub phase: usize,
    pub ranks: Vec<u32>,
    pub joined: Vec<u32>,
    pub killed: Vec<u32>,
    pub gone: Vec<u32>,
    pub path: Path,
    /// Slowest rank, ms: how long the phase's begin held it.
    pub connect_ms: f64,
    /// Slowest rank, ms: connecting ahead of the begin.
    pub ahead_ms: f64,
    /// Fastest and slowest survivor, ms from the kill (host clock, to the
    /// end of the step that masked it).
    pub detect_ms: Option<(f64, f64)>,
    /// Longest GPU wait from its start to the masking, ms (the fault
    /// timeout plus the poll period).
    pub wait_ms: Option<f64>,
    /// Slowest survivor, ms from its report to the decision.
    pub agree_ms: Option<f64>,
    pub dispatch_before: Option<P50P99>,
    pub dispatch_after: Option<P50P99>,
    pub combine_before: Option<P50P99>,
    pub combine_after: Option<P50P99>,
    pub lost_steps: u32,
    pub wrong_values: u64,
}

/// What the plan said of a phase: members, newcomers, kills.
#[derive(Clone, Debug, Default)]
pub struct PhaseMembers {
    pub ranks: Vec<u32>,
    pub joined: Vec<u32>,
    pub killed: Vec<u32>,
}

/// The rows of a run: for every phase, one per path, from every rank's
/// results of that phase.
pub fn rows(phases: &[PhaseMembers], paths: &[Path], results: &[PhaseResult]) -> Vec<PhaseRow> {
    let mut out = Vec::new();
    for (i, m) in phases.iter().enumerate() {
        let of_phase: Vec<&PhaseResult> = results.iter().filter(|r| r.phase == i).collect();
        for &path in paths {
            out.push(row(i, m, path, &of_phase));
        }
    }
    out
}

fn row(i: usize, m: &PhaseMembers, path: Path, rs: &[&PhaseResult]) -> PhaseRow {
    let max = |v: Vec<f64>| v.into_iter().reduce(f64::max);
    let min = |v: Vec<f64>| v.into_iter().reduce(f64::min);
    let detect: Vec<f64> = rs
        .iter()
        .flat_map(|r| r.detected.iter().filter_map(|d| d.after_kill_ms))
        .collect();
    let gone: BTreeSet<u32> = rs.iter().flat_map(|r| r.gone.iter().copied()).collect();
    let steps: Vec<&PhaseSteps> = rs
        .iter()
        .flat_map(|r| r.paths.iter().filter(|p| p.path == path && !p.graph))
        .collect();
    let last = steps.iter().flat_map(|s| s.epoch.iter().copied()).max();
    let split = |d: bool, after: bool| {
        let want = if after { last.unwrap_or(0) } else { 0 };
        // A phase without a fault has only "before".
        let skip = after && want == 0;
        (!skip).then(|| slowest(&steps, d, want)).flatten()
    };
    PhaseRow {
        phase: i,
        ranks: m.ranks.clone(),
        joined: m.joined.clone(),
        killed: m.killed.clone(),
        gone: gone.into_iter().collect(),
        path,
        connect_ms: max(rs.iter().map(|r| r.connect_ms).collect()).unwrap_or(0.0),
        ahead_ms: max(rs.iter().map(|r| r.ahead_ms).collect()).unwrap_or(0.0),
        detect_ms: min(detect.clone()).zip(max(detect)),
        wait_ms: max(rs
            .iter()
            .flat_map(|r| r.detected.iter().map(|d| d.wait_ms))
            .collect()),
        agree_ms: max(rs.iter().flat_map(|r| r.agree_ms.iter().copied()).collect()),
        dispatch_before: split(true, false),
        dispatch_after: split(true, true),
        combine_before: split(false, false),
        combine_after: split(false, true),
        lost_steps: rs.iter().map(|r| r.lost_steps).sum(),
        wrong_values: 0,
    }
}

/// p50/p99 over the steps of `epoch`, each step the slowest rank's time.
fn slowest(steps: &[&PhaseSteps], dispatch: bool, epoch: u32) -> Option<P50P99> {
    let mut by_step: BTreeMap<u32, f64> = BTreeMap::new();
    for s in steps {
        let times = if dispatch {
            &s.dispatch_ns
        } else {
            &s.combine_ns
        };
        for ((&n, &t), &e) in s.steps.iter().zip(times).zip(&s.epoch) {
            if e == epoch {
                let slot = by_step.entry(n).or_insert(0.0);
                *slot = slot.max(t);
            }
        }
    }
    let v: Vec<f64> = by_step.into_values().collect();
    (!v.is_empty()).then(|| {
        let s = Summary::of(&v);
        P50P99 {
            p50_us: s.p50_ns / 1e3,
            p99_us: s.p99_ns / 1e3,
            steps: v.len(),
        }
    })
}

/// The rows as a Markdown table.
pub fn table(rows: &[PhaseRow]) -> String {
    let list = |v: &[u32]| match v {
        [] => "-".to_string(),
        v => v.iter().map(u32::to_string).collect::<Vec<_>>().join(","),
    };
    let ms = |x: Option<f64>| x.map_or("-".into(), |x| format!("{x:.1}"));
    let us =
        |x: Option<P50P99>| x.map_or("-".into(), |x| format!("{:.1}/{:.1}", x.p50_us, x.p99_us));
    let mut out = String::from(
        "| phase | ranks | joined | killed | gone (agreed) | connect ms | ahead ms | detect ms | GPU wait ms | agree ms | path | dispatch p50/p99 µs before | after | combine p50/p99 µs before | after | lost steps | wrong |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let detect = r
            .detect_ms
            .map_or("-".into(), |(a, b)| format!("{a:.1}–{b:.1}"));
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {:.1} | {:.1} | {detect} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.phase,
            list(&r.ranks),
            list(&r.joined),
            list(&r.killed),
            list(&r.gone),
            r.connect_ms,
            r.ahead_ms,
            ms(r.wait_ms),
            ms(r.agree_ms),
            r.path.name(),
            us(r.dispatch_before),
            us(r.dispatch_after),
            us(r.combine_before),
            us(r.combine_after),
            r.lost_steps,
            r.wrong_values
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn steps(path: Path, n: &[u32], t: f64, epoch: &[u32]) -> PhaseSteps {
        PhaseSteps {
            path,
            graph: false,
            steps: n.to_vec(),
            dispatch_ns: n.iter().map(|_| t).collect(),
            combine_ns: n.iter().map(|_| 2.0 * t).collect(),
            epoch: epoch.to_vec(),
        }
    }

    #[test]
    fn a_kill_splits_the_phase_and_the_slowest_rank_counts() {
        let members = PhaseMembers {
            ranks: vec![0, 1, 2],
            joined: vec![],
            killed: vec![2],
        };
        let r = |rank, t, detect| PhaseResult {
            phase: 0,
            rank,
            connect_ms: 1.0 + f64::from(rank),
            ahead_ms: 0.5,
            paths: vec![steps(Path::Put, &[0, 1, 3, 4], t, &[0, 0, 1, 1])],
            detected: vec![Detection {
                rank: 2,
                after_kill_ms: Some(detect),
                wait_ms: 1000.2,
            }],
            agree_ms: vec![3.0 * f64::from(rank + 1)],
            gone: vec![2],
            lost_steps: 1,
            waits_on_gone: 0,
        };
        let rows = rows(
            &[members],
            &[Path::Put],
            &[r(0, 1000.0, 1001.0), r(1, 3000.0, 1004.0)],
        );
        let row = &rows[0];
        assert_eq!(row.gone, vec![2]);
        assert_eq!(row.connect_ms, 2.0);
        assert_eq!(row.detect_ms, Some((1001.0, 1004.0)));
        assert_eq!(row.agree_ms, Some(6.0));
        assert_eq!(row.lost_steps, 2);
        let before = row.dispatch_before.unwrap();
        assert_eq!((before.p50_us, before.steps), (3.0, 2));
        assert_eq!(row.combine_after.unwrap().p50_us, 6.0);
        assert!(
            table(&rows).contains(
                "| 0 | 0,1,2 | - | 2 | 2 | 2.0 | 0.5 | 1001.0–1004.0 | 1000.2 | 6.0 | put |"
            ),
            "{}",
            table(&rows)
        );
    }

    #[test]
    fn a_phase_without_a_fault_has_no_after() {
        let r = PhaseResult {
            paths: vec![steps(Path::Store, &[0, 1], 500.0, &[0, 0])],
            ..Default::default()
        };
        let rows = rows(&[PhaseMembers::default()], &[Path::Store], &[r]);
        assert!(rows[0].dispatch_after.is_none());
        assert_eq!(rows[0].dispatch_before.unwrap().steps, 2);
        assert_eq!(rows[0].detect_ms, None);
    }
}
