//! What a run measured: one row per size × level, printed as a table for
//! people and written as JSON or CSV for programs, with the run's
//! configuration (GPUs, driver, NIXL and UCX versions, environment).

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;

use super::baseline::Baselines;
use super::initiator_role::RunResult;
use super::initiator_role::rounds::RoundResult;
use super::protocol::Verdict;
use crate::cli::fmt_bytes;
use crate::gpu::GpuInfo;
use crate::results::RunEnv;
use crate::stats::Summary;

/// One round as measured. Times in ns or µs as named, rates in GB/s (1e9 B/s).
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub round: usize,
    /// `bandwidth` or `pingpong`.
    pub mode: &'static str,
    pub size_bytes: u64,
    pub level: &'static str,
    /// `put` (nixlPut) or `store` (stores through nixlGetPtr).
    pub path: &'static str,
    /// Bytes per round-robin chunk; 0 = one contiguous slice per group.
    pub chunk: u64,
    pub blocks: u32,
    pub threads: u32,
    pub warmup: u32,
    pub iters: u32,
    /// Bandwidth: GPU time from the first timed put to the initiator's GPU
    /// seeing the target's final acknowledgement (`%globaltimer`), which
    /// includes one acknowledgement latency. Ping-pong: the timed round trips.
    pub gpu_ns: u64,
    /// `gpu_ns` per timed iteration, µs.
    pub us_per_iter: f64,
    /// Payload bytes delivered per second over the timed iterations
    /// (bandwidth mode).
    pub gb_per_s: f64,
    /// Bytes that crossed the link per second: `gb_per_s` times the path's
    /// wire factor (2 on the LL path, whose lines are half flags).
    pub wire_gb_per_s: f64,
    /// Per-iteration intervals as the target's GPU saw them complete.
    pub recv: Option<Summary>,
    /// Ping-pong round trips (put + signal there, acknowledgement back).
    pub rtt: Option<Summary>,
    /// Half of each round trip: the one-way figure latency tools report.
    pub half_rtt: Option<Summary>,
    /// Ping-pong: half round trip p50 over the same run's floor row's (a
    /// bare flag between the same processes; see [`apply_floor`]).
    pub floor_ratio: Option<f64>,
    /// CUDA-event time of the whole kernel, warm-up and launch included, µs.
    pub kernel_event_us: f64,
    pub baselines: Baselines,
    /// `gb_per_s` over the best same-run baseline.
    pub ratio: Option<f64>,
    pub verified: bool,
    /// The target's verdict, verbatim.
    pub verdict: String,
}

impl Row {
    /// The report's view of one round.
    pub fn of(r: &RoundResult) -> Self {
        let round = &r.round;
        let iters = round.iters.max(1) as f64;
        let gb_per_s = if round.pingpong || r.gpu_ns == 0 {
            0.0
        } else {
            round.size as f64 * iters / r.gpu_ns as f64
        };
        let baselines = r.baselines.unwrap_or_default();
        let ratio = match (round.pingpong, baselines.best()) {
            (false, Some(best)) if best > 0.0 => Some(gb_per_s / best),
            _ => None,
        };
        let recv = match &r.verdict {
            Verdict::Ok { arrivals, .. } => *arrivals,
            Verdict::Mismatch { .. } => None,
        };
        Self {
            round: r.index,
            mode: round.mode(),
            size_bytes: round.size,
            level: round.level.name(),
            path: round.path.name(),
            chunk: round.chunk,
            blocks: round.blocks,
            threads: round.threads,
            warmup: round.warmup,
            iters: round.iters,
            gpu_ns: r.gpu_ns,
            us_per_iter: r.gpu_ns as f64 / 1e3 / iters,
            gb_per_s,
            wire_gb_per_s: gb_per_s * round.path.wire_factor(),
            recv,
            half_rtt: r.rtt.map(|s| s.scaled(0.5)),
            floor_ratio: None,
            rtt: r.rtt,
            kernel_event_us: r.event_us,
            baselines,
            ratio,
            verified: r.verdict.ok(),
            verdict: r.verdict_text(),
        }
    }

    /// Whether this is the floor row (a bare flag, no data).
    pub fn is_floor(&self) -> bool {
        self.path == "flag"
    }

    /// The floor's half round trip p50, ns, if this is a measured floor row.
    pub fn floor_ns(&self) -> Option<f64> {
        self.half_rtt
            .filter(|_| self.is_floor())
            .map(|h| h.p50_ns)
            .filter(|&ns| ns > 0.0)
    }

    /// Sets [`Row::floor_ratio`] against a floor of `floor_ns` (half round
    /// trip p50); ping-pong rows only.
    pub fn set_floor(&mut self, floor_ns: Option<f64>) {
        self.floor_ratio = match (self.half_rtt, floor_ns) {
            (Some(h), Some(f)) => Some(h.p50_ns / f),
            _ => None,
        };
    }

    /// One human line, printed as each round finishes.
    pub fn line(&self) -> String {
        let floor = self
            .floor_ratio
            .filter(|_| !self.is_floor())
            .map_or(String::new(), |r| format!(", {r:.2}× the floor"));
        match &self.half_rtt {
            Some(h) if self.is_floor() => format!(
                "floor (a bare flag each way, no data), {} round trips: half round trip p50 {:.2} µs, p99 {:.2} µs, \
                 min {:.2} µs",
                self.iters,
                h.p50_ns / 1e3,
                h.p99_ns / 1e3,
                h.min_ns / 1e3
            ),
            Some(h) => format!(
                "{} {} {} ping-pong, {} round trips: half round trip p50 {:.2} µs, p99 {:.2} µs, min {:.2} µs{floor}",
                fmt_bytes(self.size_bytes),
                self.level,
                self.path,
                self.iters,
                h.p50_ns / 1e3,
                h.p99_ns / 1e3,
                h.min_ns / 1e3
            ),
            None => format!(
                "{} B, {} level, {} path, {}×{} threads, {} iterations ({} warm-up): {:.2} µs/iteration, {:.2} GB/s \
                 payload, {:.2} GB/s on the wire (GPU time to the target's acknowledgement)",
                self.size_bytes,
                self.level,
                self.path,
                self.blocks,
                self.threads,
                self.iters,
                self.warmup,
                self.us_per_iter,
                self.gb_per_s,
                self.wire_gb_per_s
            ),
        }
    }
}

/// Sets every ping-pong row's ratio to the run's floor row (the first row
/// on the flag path), if the run measured one.
pub fn apply_floor(rows: &mut [Row]) {
    let floor = rows.iter().find_map(Row::floor_ns);
    for r in rows.iter_mut() {
        r.set_floor(floor);
    }
}

/// The run's configuration, recorded with every figure.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RunInfo {
    /// Tool, command line, time, host, versions, environment.
    #[serde(flatten)]
    pub run_env: RunEnv,
    pub seed: u64,
    pub initiator_gpu: Option<GpuInfo>,
    pub target_gpu: Option<GpuInfo>,
    pub same_gpu: bool,
    /// Whether the initiator's context is an MPS client (the two processes'
    /// kernels can then run at once on a shared GPU).
    pub mps: bool,
    /// How each side waited: `kernel` (spinning) or `stream` (cuStreamWaitValue64).
    pub initiator_wait: Option<&'static str>,
    /// Scope of the release between data and signal on the put and store
    /// paths: `gpu` (both processes on one GPU) or `system`.
    pub fence_scope: Option<&'static str>,
}

impl RunInfo {
    /// The configuration of a finished run, and what the process can know
    /// about itself.
    pub fn of(run: &RunResult) -> Self {
        Self {
            seed: run.plan.seed,
            initiator_gpu: Some(run.initiator_gpu.clone()),
            target_gpu: Some(run.target_gpu.clone()),
            same_gpu: run.same_gpu,
            mps: run.initiator_gpu.mps,
            initiator_wait: Some(run.wait.name()),
            fence_scope: Some(run.fence.name()),
            run_env: RunEnv::capture("simple_write"),
        }
    }
}

/// A table column: its header and how a row fills it.
type Column = (&'static str, fn(&Row) -> String);

fn opt(v: Option<f64>, scale: f64, prec: usize) -> String {
    v.map(|x| format!("{:.*}", prec, x * scale))
        .unwrap_or_else(|| "-".into())
}

fn us(ns: Option<f64>) -> String {
    opt(ns, 1e-3, 2)
}

const ROUND: [Column; 4] = [
    ("size", |r| r.size_bytes.to_string()),
    ("level", |r| r.level.to_string()),
    ("path", |r| r.path.to_string()),
    ("grid", |r| format!("{}x{}", r.blocks, r.threads)),
];

const BANDWIDTH: [Column; 9] = [
    ("iters", |r| r.iters.to_string()),
    ("p50 µs", |r| us(r.recv.map(|s| s.p50_ns))),
    ("p99 µs", |r| us(r.recv.map(|s| s.p99_ns))),
    ("GB/s", |r| format!("{:.2}", r.gb_per_s)),
    ("wire GB/s", |r| format!("{:.2}", r.wire_gb_per_s)),
    ("CE GB/s", |r| opt(r.baselines.copy_engine_gbps, 1.0, 1)),
    ("NIXL GB/s", |r| opt(r.baselines.nixl_write_gbps, 1.0, 1)),
    ("ratio", |r| opt(r.ratio, 1.0, 3)),
    ("ok", |r| if r.verified { "✓" } else { "✗" }.into()),
];

const PINGPONG: [Column; 8] = [
    ("iters", |r| r.iters.to_string()),
    ("RTT p50µs", |r| us(r.rtt.map(|s| s.p50_ns))),
    ("RTT p99µs", |r| us(r.rtt.map(|s| s.p99_ns))),
    ("half p50", |r| us(r.half_rtt.map(|s| s.p50_ns))),
    ("×floor", |r| opt(r.floor_ratio, 1.0, 2)),
    ("half p99", |r| us(r.half_rtt.map(|s| s.p99_ns))),
    ("half min", |r| us(r.half_rtt.map(|s| s.min_ns))),
    ("ok", |r| if r.verified { "✓" } else { "✗" }.into()),
];

/// Right-aligned columns, 10 wide (wider where a cell needs it).
fn render(out: &mut String, columns: &[Column], rows: &[&Row]) {
    let width = |c: &Column| {
        rows.iter()
            .map(|r| (c.1)(r).chars().count())
            .chain([c.0.chars().count(), 6])
            .max()
    };
    let widths: Vec<usize> = columns.iter().map(|c| width(c).unwrap_or(6)).collect();
    let line = |cells: Vec<String>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:>w$}"))
            .collect();
        padded.join("  ")
    };
    let _ = writeln!(
        out,
        "{}",
        line(columns.iter().map(|c| c.0.to_string()).collect())
    );
    for r in rows {
        let _ = writeln!(out, "{}", line(columns.iter().map(|c| (c.1)(r)).collect()));
    }
}

/// The results table: bandwidth rows, then ping-pong rows, nccl-tests style.
pub fn table(rows: &[Row]) -> String {
    let mut out = String::new();
    let bw: Vec<&Row> = rows.iter().filter(|r| r.mode == "bandwidth").collect();
    let pp: Vec<&Row> = rows.iter().filter(|r| r.mode == "pingpong").collect();
    if !bw.is_empty() {
        render(&mut out, &[&ROUND[..], &BANDWIDTH[..]].concat(), &bw);
    }
    if !pp.is_empty() {
        if !out.is_empty() {
            out.push('\n');
        }
        render(&mut out, &[&ROUND[..], &PINGPONG[..]].concat(), &pp);
    }
    out
}

/// Writes `{"run": …, "rows": […]}` to `path`.
pub fn write_json(path: &Path, info: &RunInfo, rows: &[Row]) -> Result<()> {
    #[derive(Serialize)]
    struct Doc<'a> {
        run: &'a RunInfo,
        rows: &'a [Row],
    }
    let text = serde_json::to_string_pretty(&Doc { run: info, rows })?;
    std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))
}

/// Writes one CSV line per row, the columns [`Row`]'s fields as the JSON
/// has them ([`crate::results`]), the run's configuration as leading
/// `# key: value` comment lines. Times in ns (µs where named), rates in GB/s.
pub fn write_csv(path: &Path, info: &RunInfo, rows: &[Row]) -> Result<()> {
    crate::results::write_csv(path, info, rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(path: &'static str, half_p50_ns: Option<f64>) -> Row {
        let s = half_p50_ns.map(|ns| Summary::of(&[ns]));
        Row {
            round: 0,
            mode: if s.is_some() { "pingpong" } else { "bandwidth" },
            size_bytes: 8,
            level: "warp",
            path,
            chunk: 0,
            blocks: 1,
            threads: 32,
            warmup: 1,
            iters: 1,
            gpu_ns: 0,
            us_per_iter: 0.0,
            gb_per_s: 0.0,
            wire_gb_per_s: 0.0,
            recv: None,
            rtt: s,
            half_rtt: s,
            floor_ratio: None,
            kernel_event_us: 0.0,
            baselines: Baselines::default(),
            ratio: None,
            verified: true,
            verdict: String::new(),
        }
    }

    #[test]
    fn every_latency_row_is_read_against_the_floor() {
        let mut rows = vec![
            row("flag", Some(300.0)),
            row("ll", Some(450.0)),
            row("put", None),
        ];
        apply_floor(&mut rows);
        let ratios: Vec<Option<f64>> = rows.iter().map(|r| r.floor_ratio).collect();
        assert_eq!(ratios, [Some(1.0), Some(1.5), None]);
        assert!(table(&rows).contains("×floor"));
        // No floor row in the run: no ratios.
        let mut rows = vec![row("ll", Some(450.0))];
        apply_floor(&mut rows);
        assert_eq!(rows[0].floor_ratio, None);
    }
}
