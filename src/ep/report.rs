//! What an `ep` run measured: each rank's raw results, gathered by rank 0
//! into one row per (method, phase) — method `put`, `store` or `nccl` — with
//! p50/p99 GPU time, bandwidth counted two ways, and the ratios to the same
//! run's NCCL and to simple_write's put bandwidth when given; printed as
//! lines and a table, written as JSON and CSV.
//!
//! Time per iteration is the slowest rank's (the phase is done when every
//! rank has everything); bytes are the mean over ranks of what each
//! receives; bandwidth = bytes / p50 time, GB/s = 1e9 B/s.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path as FsPath;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use super::config::{Grid, Mode, Path, RunConfig};
use super::layout::PhaseBytes;
pub use crate::ranks::nccl::NcclStatus;
use crate::results::RunEnv;
use crate::stats::Summary;

/// NCCL's per-iteration times of one run, ns (warm-up excluded).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct NcclTimes {
    pub version: String,
    pub dispatch_ns: Vec<f64>,
    pub combine_ns: Vec<f64>,
}

/// One rank as it introduced itself.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankInfo {
    pub rank: u32,
    pub host: String,
    pub pid: u32,
    pub gpu_ordinal: usize,
    pub gpu_name: String,
    pub gpu_uuid: String,
    pub sm_count: u32,
    /// Phase-kernel blocks one SM holds at once.
    pub blocks_per_sm: u32,
    /// Ranks of this machine on the same GPU (this one included).
    pub ranks_on_gpu: u32,
    /// Whether this rank's CUDA context is an MPS client
    /// (`CU_DEVICE_ATTRIBUTE_MPS_ENABLED`): ranks sharing its GPU then run
    /// their kernels at the same time instead of time-slicing.
    pub mps: bool,
    pub nccl: NcclStatus,
}

impl RankInfo {
    /// Where this rank ran ([`crate::ranks::info::placement`]).
    pub fn seat(&self) -> crate::ranks::info::Seat<'_> {
        crate::ranks::info::Seat {
            rank: self.rank,
            host: &self.host,
            gpu_ordinal: self.gpu_ordinal,
            gpu_uuid: &self.gpu_uuid,
        }
    }
}

/// One path's per-iteration GPU times on one rank, ns (warm-up excluded).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PathTimes {
    pub path: Path,
    /// Replayed from a CUDA graph (else launched on the stream).
    #[serde(default)]
    pub graph: bool,
    /// Host wall time of each step (launch, wait, checks), ns.
    #[serde(default)]
    pub wall_ns: Vec<f64>,
    pub dispatch_ns: Vec<f64>,
    pub combine_ns: Vec<f64>,
    /// The calibration of block 0's cycle counter against `%globaltimer`.
    pub ns_per_cycle: f64,
}

/// Everything one rank measured, published for rank 0.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RankResult {
    pub rank: u32,
    pub grid: Grid,
    pub dispatch_bytes: PhaseBytes,
    pub combine_bytes: PhaseBytes,
    pub paths: Vec<PathTimes>,
    pub nccl: Option<NcclTimes>,
    /// `--graph`: per path, the host's wall time per step of dispatch +
    /// combine back to back, unchecked, (stream launches, graph replays), ns.
    #[serde(default)]
    pub launch_cost: Vec<(Path, f64, f64)>,
}

/// One (method, phase) over all ranks.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub mode: Mode,
    /// `put`, `store` or `nccl`.
    pub method: String,
    /// `dispatch` or `combine`.
    pub phase: &'static str,
    pub iters: usize,
    /// Per iteration, the slowest rank's time, ns.
    pub time: Summary,
    /// Each rank's p50, µs.
    pub rank_p50_us: Vec<f64>,
    /// Mean over ranks of the bytes each receives ([`PhaseBytes`]).
    pub bytes: PhaseBytes,
    /// DeepEP's count (activations received, local share included) / p50.
    pub deepep_gbps: f64,
    /// Bytes crossing the wire into a rank / p50.
    pub wire_gbps: f64,
    /// `wire_gbps` over NCCL's for the same phase (same bytes).
    pub vs_nccl: Option<f64>,
    /// `wire_gbps` over simple_write's put bandwidth at the same message
    /// size (`ep --ref-put-gbps`), the device API's own point-to-point rate.
    pub vs_put: Option<f64>,
    pub verified: bool,
}

fn mean_bytes(results: &[RankResult], phase: &str) -> PhaseBytes {
    let n = results.len().max(1) as u64;
    let mut b = PhaseBytes::default();
    for r in results {
        let p = if phase == "dispatch" {
            r.dispatch_bytes
        } else {
            r.combine_bytes
        };
        b.deepep += p.deepep;
        b.wire += p.wire;
        b.meta += p.meta;
        b.per_expert += p.per_expert;
    }
    PhaseBytes {
        deepep: b.deepep / n,
        wire: b.wire / n,
        meta: b.meta / n,
        per_expert: b.per_expert / n,
    }
}

/// One row from every rank's per-iteration times of one (method, phase).
fn row(
    mode: Mode,
    method: &str,
    phase: &'static str,
    per_rank: &[&[f64]],
    bytes: PhaseBytes,
) -> Row {
    let iters = per_rank.iter().map(|v| v.len()).min().unwrap_or(0);
    let slowest: Vec<f64> = (0..iters)
        .map(|i| per_rank.iter().map(|v| v[i]).fold(0.0, f64::max))
        .collect();
    let time = Summary::of(&slowest);
    let gbps = |b: u64| {
        if time.p50_ns > 0.0 {
            b as f64 / time.p50_ns
        } else {
            0.0
        }
    };
    Row {
        mode,
        method: method.to_string(),
        phase,
        iters,
        rank_p50_us: per_rank
            .iter()
            .map(|v| Summary::of(v).p50_ns / 1e3)
            .collect(),
        bytes,
        deepep_gbps: gbps(bytes.deepep),
        wire_gbps: gbps(bytes.wire),
        time,
        vs_nccl: None,
        vs_put: None,
        verified: method != "nccl",
    }
}

/// The rows of a run: every path's dispatch and combine, then NCCL's.
pub fn rows(cfg: &RunConfig, results: &[RankResult]) -> Vec<Row> {
    let mut out = Vec::new();
    let runs = results.first().map_or(&[][..], |r| &r.paths[..]);
    for (i, run) in runs.iter().enumerate() {
        let method = match run.graph {
            true => format!("{} graph", run.path.name()),
            false => run.path.name().to_string(),
        };
        for phase in ["dispatch", "combine"] {
            let times: Vec<&[f64]> = results
                .iter()
                .map(|r| {
                    if phase == "dispatch" {
                        &r.paths[i].dispatch_ns[..]
                    } else {
                        &r.paths[i].combine_ns[..]
                    }
                })
                .collect();
            out.push(row(
                cfg.mode,
                &method,
                phase,
                &times,
                mean_bytes(results, phase),
            ));
        }
    }
    if results.iter().all(|r| r.nccl.is_some()) && !results.is_empty() {
        for phase in ["dispatch", "combine"] {
            let times: Vec<&[f64]> = results
                .iter()
                .map(|r| {
                    let n = r.nccl.as_ref().unwrap();
                    if phase == "dispatch" {
                        &n.dispatch_ns[..]
                    } else {
                        &n.combine_ns[..]
                    }
                })
                .collect();
            out.push(row(
                cfg.mode,
                "nccl",
                phase,
                &times,
                mean_bytes(results, phase),
            ));
        }
        let nccl: BTreeMap<&str, f64> = out
            .iter()
            .filter(|r| r.method == "nccl")
            .map(|r| (r.phase, r.wire_gbps))
            .collect();
        for r in out.iter_mut().filter(|r| r.method != "nccl") {
            r.vs_nccl = nccl
                .get(r.phase)
                .filter(|&&v| v > 0.0)
                .map(|v| r.wire_gbps / v);
        }
    }
    out
}

/// Sets every device-API row's ratio to simple_write's put bandwidth
/// (`ref_put_gbps`, GB/s, at the same message size); NCCL's rows keep none.
pub fn set_vs_put(rows: &mut [Row], ref_put_gbps: Option<f64>) {
    for r in rows.iter_mut().filter(|r| r.method != "nccl") {
        r.vs_put = ref_put_gbps.filter(|&p| p > 0.0).map(|p| r.wire_gbps / p);
    }
}

/// One line per row, as the run prints them.
pub fn line(r: &Row, ranks: usize) -> String {
    let mut s = format!(
        "[ep] {} {} {}: p50 {:.2} µs, p99 {:.2} µs (slowest of {ranks} ranks, {} iterations); {:.1} GB/s wire, {:.1} GB/s \
         as DeepEP counts",
        r.mode.name(),
        r.method,
        r.phase,
        r.time.p50_ns / 1e3,
        r.time.p99_ns / 1e3,
        r.iters,
        r.wire_gbps,
        r.deepep_gbps
    );
    if let Some(x) = r.vs_nccl {
        let _ = write!(s, "; {x:.2}× NCCL");
    }
    if let Some(x) = r.vs_put {
        let _ = write!(s, "; {x:.2}× simple_write's put");
    }
    if r.method != "nccl" {
        s += if r.verified { " ✓" } else { " ✗" };
    }
    s
}

/// The results table.
pub fn table(rows: &[Row]) -> String {
    let mut out = format!(
        "{:>4} {:>6} {:>9} {:>9} {:>9} {:>11} {:>10} {:>10} {:>12} {:>6} {:>6} {:>3}\n",
        "mode",
        "method",
        "phase",
        "p50 µs",
        "p99 µs",
        "DeepEP GB/s",
        "wire GB/s",
        "wire MB",
        "per-expert MB",
        "×NCCL",
        "×put",
        "ok"
    );
    for r in rows {
        let _ = writeln!(
            out,
            "{:>4} {:>6} {:>9} {:>9.2} {:>9.2} {:>11.1} {:>10.1} {:>10.2} {:>12.2} {:>6} {:>6} {:>3}",
            r.mode.name(),
            r.method,
            r.phase,
            r.time.p50_ns / 1e3,
            r.time.p99_ns / 1e3,
            r.deepep_gbps,
            r.wire_gbps,
            r.bytes.wire as f64 / 1e6,
            r.bytes.per_expert as f64 / 1e6,
            ratio(r.vs_nccl),
            ratio(r.vs_put),
            if r.method == "nccl" {
                ""
            } else if r.verified {
                "✓"
            } else {
                "✗"
            }
        );
    }
    out
}

fn ratio(x: Option<f64>) -> String {
    x.map(|x| format!("{x:.2}")).unwrap_or_else(|| "-".into())
}

/// The run's configuration, recorded with every figure.
#[derive(Clone, Debug, Serialize)]
pub struct RunInfo {
    /// Tool, command line, time, host, versions, environment (rank 0's).
    #[serde(flatten)]
    pub run_env: RunEnv,
    pub config: RunConfig,
    pub ranks: Vec<RankInfo>,
    pub window_bytes: u64,
}

impl RunInfo {
    pub fn collect(config: &RunConfig, ranks: Vec<RankInfo>, window_bytes: u64) -> Self {
        Self {
            run_env: RunEnv::capture("ep"),
            config: config.clone(),
            ranks,
            window_bytes,
        }
    }
}

/// Writes `{"run", "rows", "ranks"}` to `path`.
pub fn write_json(
    path: &FsPath,
    info: &RunInfo,
    rows: &[Row],
    results: &[RankResult],
) -> Result<()> {
    let doc = serde_json::json!({ "run": info, "rows": rows, "ranks": results });
    let text = serde_json::to_string_pretty(&doc)?;
    std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))
}

/// Writes one CSV line per row, the columns [`Row`]'s fields as the JSON
/// has them ([`crate::results`]: `time_p50_ns`, `bytes_wire`, ...), the
/// configuration (shape, routing) as `# key: value` lines.
pub fn write_csv(path: &FsPath, info: &RunInfo, rows: &[Row]) -> Result<()> {
    crate::results::write_csv(path, info, rows)
}

/// Host wall time per step (launch, wait, checks; the slowest rank's p50),
/// stream launches beside graph replays of the same path, when `--graph`
/// ran both.
pub fn wall_lines(results: &[RankResult]) -> Vec<String> {
    let p50 = |i: usize| {
        results
            .iter()
            .map(|r| Summary::of(&r.paths[i].wall_ns).p50_ns / 1e3)
            .fold(0.0, f64::max)
    };
    let Some(first) = results.first() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (n, (path, _, _)) in first.launch_cost.iter().enumerate() {
        let max = |f: fn(&(Path, f64, f64)) -> f64| {
            results
                .iter()
                .map(|r| f(&r.launch_cost[n]) / 1e3)
                .fold(0.0, f64::max)
        };
        let (stream, graph) = (max(|c| c.1), max(|c| c.2));
        out.push(format!(
            "[ep] {} path, dispatch + combine back to back (unchecked), host wall time per step (slowest rank): \
             {stream:.1} µs launched on the stream, {graph:.1} µs replayed from a CUDA graph ({:.2}×)",
            path.name(),
            graph / stream
        ));
    }
    for (i, run) in first.paths.iter().enumerate().filter(|(_, r)| r.graph) {
        let Some(j) = first
            .paths
            .iter()
            .position(|s| s.path == run.path && !s.graph)
        else {
            continue;
        };
        let (stream, graph) = (p50(j), p50(i));
        out.push(format!(
            "[ep] {} path, host wall time per step (launch, wait, checks; slowest rank's p50): {stream:.1} µs launched \
             on the stream, {graph:.1} µs replayed from a CUDA graph ({:.2}×)",
            run.path.name(),
            graph / stream
        ));
    }
    out
}
