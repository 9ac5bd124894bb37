//! Results the way nccl-tests prints them: one row per case with size,
//! count, type, redop, GPU time per call (p50/p99 over the timed calls of
//! the slowest rank in each call), algbw = size / time, busbw = algbw ×
//! the operation's factor, and NCCL's same call from the same run beside
//! it. A table on stdout, JSON and CSV.

use std::path::Path as FsPath;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use super::case::Case;
use super::plan::RunConfig;
use crate::stats::Summary;

/// One rank's timings: ns per timed call of every case (run order), and
/// of NCCL's call of every group (`None`: the baseline did not run).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RankTimes {
    pub rank: u32,
    pub cases: Vec<Vec<f64>>,
    /// In-kernel time of the same calls (block 0's clock), ns.
    pub kernel: Vec<Vec<f64>>,
    /// The same calls from block 0's start to the last block's end, ns.
    #[serde(default)]
    pub kernel_last: Vec<Vec<f64>>,
    /// Where block 0's phase 0 went in the same calls (setup, push,
    /// signal, wait), ns.
    #[serde(default)]
    pub phases: Vec<Vec<[f64; 4]>>,
    pub nccl: Vec<Option<Vec<f64>>>,
    /// Each case's batch: back-to-back calls between two events, mean ns
    /// per call (nccl-tests' time).
    #[serde(default)]
    pub batch: Vec<f64>,
    /// NCCL's batch of every group, as `batch`.
    #[serde(default)]
    pub nccl_batch: Vec<Option<f64>>,
    /// The launch floor, timed as the calls are (`None`: not measured).
    #[serde(default)]
    pub floor: Option<FloorTimes>,
}

/// One rank's launch floor (the session's `measure_floor`): an empty
/// kernel of one block with a call's parameters, launched and timed as the
/// calls.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct FloorTimes {
    /// Each call between its own two events, ns.
    pub per_call: Vec<f64>,
    /// A batch back to back between two events, mean ns per call.
    pub batch: f64,
}

/// The launch floor as the report gives it: the slowest rank's, µs. A
/// call's time less the floor's is what the call itself adds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Floor {
    pub time_p50_us: f64,
    pub time_p99_us: f64,
    pub batch_us: f64,
}

/// The floor from every rank's (`None` when a rank has none): each rank's
/// launches summarised on their own (the k-th launch of two ranks has
/// nothing to do with each other, unlike a call), then the largest p50,
/// p99 and batch mean over the ranks.
pub fn floor(all: &[RankTimes]) -> Option<Floor> {
    let each: Option<Vec<&FloorTimes>> = all.iter().map(|t| t.floor.as_ref()).collect();
    let each = each.filter(|e| !e.is_empty())?;
    let most = |f: &dyn Fn(&FloorTimes) -> f64| each.iter().map(|t| f(t)).fold(0.0, f64::max) / 1e3;
    Some(Floor {
        time_p50_us: most(&|t| Summary::of(&t.per_call).p50_ns),
        time_p99_us: most(&|t| Summary::of(&t.per_call).p99_ns),
        batch_us: most(&|t| t.batch),
    })
}

/// The report's line for the floor, below the table.
/// `launched`: how the calls were launched, in words.
pub fn floor_line(f: &Floor, launched: &str) -> String {
    format!(
        "# launch floor: an empty kernel (one block, a call's parameters), launched as the calls ({launched}) and timed \
         the same two ways: {:.2} us per call (p99 {:.2}), {:.2} us batched; a call's time less these is what the \
         call itself adds",
        f.time_p50_us, f.time_p99_us, f.batch_us
    )
}

/// One line of the table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Row {
    pub size_bytes: u64,
    pub count: u64,
    #[serde(rename = "type")]
    pub dtype: String,
    pub redop: String,
    pub op: String,
    pub algo: String,
    pub path: String,
    pub in_place: bool,
    pub blocks: u32,
    pub time_p50_us: f64,
    pub time_p99_us: f64,
    /// Block 0's first instruction to its end, p50 of the slowest rank:
    /// what the call costs inside the kernel, launch gaps excluded.
    pub kernel_p50_us: f64,
    /// Block 0's first instruction to the end of the call's last block
    /// (`%globaltimer`), p50 of the slowest rank: where it exceeds
    /// `kernel_p50_us`, blocks ended unevenly.
    #[serde(default)]
    pub kernel_last_p50_us: f64,
    /// Block 0's phase 0, p50 per step over the calls of rank 0: looking
    /// up peer pointers, pushing the data, fence and signals, waiting for
    /// every peer's signal, µs.
    pub phases_p50_us: [f64; 4],
    pub algbw_gbps: f64,
    pub busbw_gbps: f64,
    pub nccl_p50_us: Option<f64>,
    pub nccl_p99_us: Option<f64>,
    pub nccl_busbw_gbps: Option<f64>,
    /// Our p50 over NCCL's p50 (below 1: faster).
    pub time_vs_nccl: Option<f64>,
    /// nccl-tests' time: a batch of back-to-back calls between two events,
    /// mean per call, the slowest rank's, µs; NCCL's the same way; ours
    /// over NCCL's.
    #[serde(default)]
    pub batch_us: f64,
    #[serde(default)]
    pub nccl_batch_us: Option<f64>,
    #[serde(default)]
    pub batch_vs_nccl: Option<f64>,
}

/// Per call, the slowest rank's time; summarised over the calls.
pub fn slowest(per_rank: &[&Vec<f64>]) -> Summary {
    let calls = per_rank.iter().map(|v| v.len()).min().unwrap_or(0);
    let worst: Vec<f64> = (0..calls)
        .map(|i| per_rank.iter().map(|v| v[i]).fold(0.0, f64::max))
        .collect();
    Summary::of(&worst)
}

/// The row of `case` from its times and NCCL's (ns summaries).
pub fn row(
    case: &Case,
    ranks: u32,
    blocks: u32,
    ours: &Summary,
    kernel: &Summary,
    phases: &[[f64; 4]],
    nccl: Option<&Summary>,
) -> Row {
    let bytes = case.bytes(ranks);
    let gbps = |ns: f64| if ns > 0.0 { bytes as f64 / ns } else { 0.0 };
    let op = case.op.spec();
    let factor = op.bus_factor(ranks);
    Row {
        size_bytes: bytes,
        count: case.count,
        dtype: case.dtype.name().into(),
        redop: op.redop().into(),
        op: op.name().into(),
        algo: op.algo_column(case.algo).into(),
        path: case.path.name().into(),
        in_place: case.in_place,
        blocks,
        time_p50_us: ours.p50_ns / 1e3,
        time_p99_us: ours.p99_ns / 1e3,
        kernel_p50_us: kernel.p50_ns / 1e3,
        kernel_last_p50_us: 0.0,
        phases_p50_us: std::array::from_fn(|i| {
            Summary::of(&phases.iter().map(|p| p[i]).collect::<Vec<_>>()).p50_ns / 1e3
        }),
        algbw_gbps: gbps(ours.p50_ns),
        busbw_gbps: gbps(ours.p50_ns) * factor,
        nccl_p50_us: nccl.map(|s| s.p50_ns / 1e3),
        nccl_p99_us: nccl.map(|s| s.p99_ns / 1e3),
        nccl_busbw_gbps: nccl.map(|s| gbps(s.p50_ns) * factor),
        time_vs_nccl: nccl
            .filter(|s| s.p50_ns > 0.0)
            .map(|s| ours.p50_ns / s.p50_ns),
        batch_us: 0.0,
        nccl_batch_us: None,
        batch_vs_nccl: None,
    }
}

impl Row {
    /// Sets the batch figures from ours and NCCL's, ns per call.
    pub fn set_batch(&mut self, ours_ns: f64, nccl_ns: Option<f64>) {
        self.batch_us = ours_ns / 1e3;
        self.nccl_batch_us = nccl_ns.map(|n| n / 1e3);
        self.batch_vs_nccl = nccl_ns.filter(|&n| n > 0.0).map(|n| ours_ns / n);
    }
}

/// The slowest rank's batch mean, ns; `None` when a rank has none.
pub fn slowest_batch(per_rank: &[Option<f64>]) -> Option<f64> {
    per_rank.iter().try_fold(0.0f64, |m, v| v.map(|v| m.max(v)))
}

fn opt(v: Option<f64>, prec: usize) -> String {
    v.map_or("-".into(), |x| format!("{x:.prec$}"))
}

/// The table, nccl-tests' columns first. `time` is per call, between
/// events around each call; `batch` is nccl-tests' time, a batch of
/// back-to-back calls between two events over the calls. NCCL's columns
/// are its same call timed the same two ways.
pub fn table(rows: &[Row]) -> String {
    let mut s = format!(
        "{:>12} {:>10} {:>8} {:>5} {:>14} {:>8} {:>5} {:>5} {:>4} {:>9} {:>9} {:>8} {:>8} {:>19} {:>7} {:>7} {:>9} {:>7} {:>6} {:>9} {:>9} {:>6}\n",
        "size(B)",
        "count",
        "type",
        "redop",
        "op",
        "algo",
        "path",
        "place",
        "blks",
        "time(us)",
        "p99(us)",
        "kern(us)",
        "last(us)",
        "setup/push/sig/wait",
        "algbw",
        "busbw",
        "nccl(us)",
        "n.busbw",
        "ours/n",
        "batch(us)",
        "n.batch",
        "b.o/n"
    );
    for r in rows {
        s += &format!(
            "{:>12} {:>10} {:>8} {:>5} {:>14} {:>8} {:>5} {:>5} {:>4} {:>9.2} {:>9.2} {:>8.2} {:>8.2} {:>19} {:>7.2} {:>7.2} {:>9} {:>7} {:>6} {:>9.2} {:>9} {:>6}\n",
            r.size_bytes,
            r.count,
            r.dtype,
            r.redop,
            r.op,
            r.algo,
            r.path,
            if r.in_place { "in" } else { "out" },
            r.blocks,
            r.time_p50_us,
            r.time_p99_us,
            r.kernel_p50_us,
            r.kernel_last_p50_us,
            r.phases_p50_us.map(|x| format!("{x:.1}")).join("/"),
            r.algbw_gbps,
            r.busbw_gbps,
            opt(r.nccl_p50_us, 2),
            opt(r.nccl_busbw_gbps, 2),
            opt(r.time_vs_nccl, 2),
            r.batch_us,
            opt(r.nccl_batch_us, 2),
            opt(r.batch_vs_nccl, 2),
        );
    }
    s
}

/// What the JSON holds besides the rows.
#[derive(Clone, Debug, Serialize)]
pub struct RunInfo<'a> {
    pub config: &'a RunConfig,
    pub gpus: Vec<String>,
    pub mps: bool,
    pub max_blocks: u32,
    /// Whether our calls went by programmatic dependent launch (`--pdl`,
    /// and every rank on a GPU of its own).
    pub pdl: bool,
    pub window_bytes: u64,
    /// The launch floor ([`floor`]); `None`: not measured.
    pub floor: Option<Floor>,
    /// NCCL's version, or why the baseline did not run.
    pub nccl: String,
    /// Tool, command line, time, host, driver/NIXL/UCX versions, variables.
    #[serde(flatten)]
    pub run_env: crate::results::RunEnv,
}

pub fn write_json(path: &FsPath, info: &RunInfo, rows: &[Row]) -> Result<()> {
    let v = serde_json::json!({ "run": info, "rows": rows });
    std::fs::write(path, serde_json::to_vec_pretty(&v)?)
        .with_context(|| format!("writing {}", path.display()))
}

/// Writes one CSV line per row (the JSON rows' fields as columns, in
/// declaration order; `phases_p50_us` as one `setup;push;signal;wait`
/// cell), the configuration as `# key: value` lines above them.
pub fn write_csv(path: &FsPath, info: &RunInfo, rows: &[Row]) -> Result<()> {
    crate::results::write_csv(path, info, rows)
}

#[cfg(test)]
mod tests {
    use super::super::layout::{Algo, Dtype, Path};
    use super::super::ops::Op;
    use super::*;

    #[test]
    fn bandwidths_follow_nccl_tests() {
        let case = Case {
            op: Op::Allreduce,
            algo: Algo::TwoShot,
            path: Path::Store,
            dtype: Dtype::F32,
            in_place: false,
            count: 1 << 20,
        };
        let ours = Summary::of(&[1e6]); // 4 MiB in 1 ms
        let nccl = Summary::of(&[2e6]);
        let r = row(
            &case,
            4,
            8,
            &ours,
            &ours,
            &[[1e3, 2e3, 3e3, 4e3]],
            Some(&nccl),
        );
        assert_eq!(r.phases_p50_us, [1.0, 2.0, 3.0, 4.0]);
        assert!((r.algbw_gbps - 4.194304).abs() < 1e-9);
        assert!((r.busbw_gbps - 4.194304 * 1.5).abs() < 1e-9);
        assert_eq!(r.time_vs_nccl, Some(0.5));
        assert!(table(&[r]).contains("two-shot"));
        let a = vec![1.0, 5.0, 3.0];
        let b = vec![2.0, 4.0, 3.0];
        let s = slowest(&[&a, &b]);
        assert_eq!((s.min_ns, s.max_ns, s.n), (2.0, 5.0, 3));
    }

    #[test]
    fn the_floor_is_the_slowest_ranks_and_needs_every_rank() {
        let rank = |per_call: Vec<f64>, batch: f64| RankTimes {
            floor: Some(FloorTimes { per_call, batch }),
            ..Default::default()
        };
        let all = [
            rank(vec![3e3, 3e3, 3e3], 2e3),
            rank(vec![5e3, 1e3, 1e3], 1e3),
        ];
        let f = floor(&all).unwrap();
        // Each rank's p50 on its own (3 and 1 µs), the larger; not the p50
        // of the larger launch of each index (3, 3, 5: also 3, but 5 at
        // p99 where rank 0's p99 is 3 and rank 1's 5).
        assert_eq!((f.time_p50_us, f.batch_us), (3.0, 2.0), "{f:?}");
        assert!(f.time_p99_us >= 3.0, "{f:?}");
        assert!(floor_line(&f, "graph, PDL").contains("(graph, PDL)"));
        assert_eq!(floor(&[all[0].clone(), RankTimes::default()]), None);
        assert_eq!(floor(&[]), None);
    }
}
