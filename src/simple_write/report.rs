//! What a run measured: one row per size × level, printed as a table for
//! people and written as JSON or CSV for programs, with the run's
//! configuration (GPUs, driver, NIXL and UCX versions, environment).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;

use super::baseline::Baselines;
use super::initiator::RunResult;
use super::protocol::Verdict;
use super::rounds::RoundResult;
use crate::cli::fmt_bytes;
use crate::gpu::GpuInfo;
use crate::stats::Summary;

/// One round as measured. Times in ns or µs as named, rates in GB/s (1e9 B/s).
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub round: usize,
    /// `bandwidth` or `pingpong`.
    pub mode: &'static str,
    pub size_bytes: u64,
    pub level: &'static str,
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
    /// Bytes delivered per second over the timed iterations (bandwidth mode).
    pub gb_per_s: f64,
    /// Per-iteration intervals as the target's GPU saw them complete.
    pub recv: Option<Summary>,
    /// Ping-pong round trips (put + signal there, acknowledgement back).
    pub rtt: Option<Summary>,
    /// Half of each round trip: the one-way figure latency tools report.
    pub half_rtt: Option<Summary>,
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
            blocks: round.blocks,
            threads: round.threads,
            warmup: round.warmup,
            iters: round.iters,
            gpu_ns: r.gpu_ns,
            us_per_iter: r.gpu_ns as f64 / 1e3 / iters,
            gb_per_s,
            recv,
            half_rtt: r.rtt.map(|s| s.scaled(0.5)),
            rtt: r.rtt,
            kernel_event_us: r.event_us,
            baselines,
            ratio,
            verified: r.verdict.ok(),
            verdict: r.verdict_text(),
        }
    }

    /// One human line, printed as each round finishes.
    pub fn line(&self) -> String {
        match &self.half_rtt {
            Some(h) => format!(
                "{} {} ping-pong, {} round trips: half round trip p50 {:.2} µs, p99 {:.2} µs, min {:.2} µs",
                fmt_bytes(self.size_bytes),
                self.level,
                self.iters,
                h.p50_ns / 1e3,
                h.p99_ns / 1e3,
                h.min_ns / 1e3
            ),
            None => format!(
                "{} B, {} level, {}×{} threads, {} iterations ({} warm-up): {:.2} µs/iteration, {:.2} GB/s \
                 (GPU time to the target's acknowledgement)",
                self.size_bytes,
                self.level,
                self.blocks,
                self.threads,
                self.iters,
                self.warmup,
                self.us_per_iter,
                self.gb_per_s
            ),
        }
    }
}

/// The run's configuration, recorded with every figure.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RunInfo {
    pub tool: String,
    pub command_line: Vec<String>,
    pub unix_time: u64,
    pub seed: u64,
    pub initiator_gpu: Option<GpuInfo>,
    pub target_gpu: Option<GpuInfo>,
    pub same_gpu: bool,
    /// How each side waited: `kernel` (spinning) or `stream` (cuStreamWaitValue64).
    pub initiator_wait: Option<&'static str>,
    pub driver_version: Option<String>,
    pub nixl_version: Option<String>,
    pub nixl_lib_dir: Option<String>,
    pub ucx_version: Option<String>,
    pub hostname: Option<String>,
    /// `UCX_*`, `NIXL_*`, `CUDA_*` variables in effect.
    pub env: BTreeMap<String, String>,
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
            initiator_wait: Some(run.wait.name()),
            ..Self::collect()
        }
    }

    /// What the process can know about itself.
    fn collect() -> Self {
        let env = std::env::vars()
            .filter(|(k, _)| {
                k.starts_with("UCX_") || k.starts_with("NIXL_") || k.starts_with("CUDA_")
            })
            .collect();
        let rt = crate::nixl::runtime::load().ok();
        Self {
            tool: format!("simple_write {}", env!("CARGO_PKG_VERSION")),
            command_line: std::env::args().collect(),
            unix_time: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            driver_version: crate::gpu::context::driver_version(),
            nixl_version: rt.as_ref().and_then(|r| r.nixl_version()),
            nixl_lib_dir: rt.as_ref().map(|r| r.lib_dir.display().to_string()),
            ucx_version: rt.as_ref().and_then(|r| r.ucx_version()),
            hostname: std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|s| s.trim().to_string()),
            env,
            ..Default::default()
        }
    }
}

fn opt(v: Option<f64>, scale: f64, prec: usize) -> String {
    v.map(|x| format!("{:.*}", prec, x * scale))
        .unwrap_or_else(|| "-".into())
}

/// The results table: bandwidth rows, then ping-pong rows, nccl-tests style.
pub fn table(rows: &[Row]) -> String {
    let mut out = String::new();
    let bw: Vec<&Row> = rows.iter().filter(|r| r.mode == "bandwidth").collect();
    let pp: Vec<&Row> = rows.iter().filter(|r| r.mode == "pingpong").collect();
    if !bw.is_empty() {
        let _ = writeln!(
            out,
            "{:>10} {:>6} {:>10} {:>6} {:>10} {:>10} {:>9} {:>9} {:>9} {:>6} {:>3}",
            "size",
            "level",
            "grid",
            "iters",
            "p50 µs",
            "p99 µs",
            "GB/s",
            "CE GB/s",
            "NIXL GB/s",
            "ratio",
            "ok"
        );
        for r in bw {
            let _ = writeln!(
                out,
                "{:>10} {:>6} {:>10} {:>6} {:>10} {:>10} {:>9.2} {:>9} {:>9} {:>6} {:>3}",
                r.size_bytes,
                r.level,
                format!("{}x{}", r.blocks, r.threads),
                r.iters,
                opt(r.recv.map(|s| s.p50_ns), 1e-3, 2),
                opt(r.recv.map(|s| s.p99_ns), 1e-3, 2),
                r.gb_per_s,
                opt(r.baselines.copy_engine_gbps, 1.0, 1),
                opt(r.baselines.nixl_write_gbps, 1.0, 1),
                opt(r.ratio, 1.0, 3),
                if r.verified { "✓" } else { "✗" }
            );
        }
    }
    if !pp.is_empty() {
        if !out.is_empty() {
            out.push('\n');
        }
        let _ = writeln!(
            out,
            "{:>10} {:>6} {:>10} {:>6} {:>10} {:>10} {:>10} {:>10} {:>10} {:>3}",
            "size",
            "level",
            "grid",
            "iters",
            "RTT p50µs",
            "RTT p99µs",
            "half p50",
            "half p99",
            "half min",
            "ok"
        );
        for r in pp {
            let (rtt, half) = (r.rtt.unwrap_or_default(), r.half_rtt.unwrap_or_default());
            let _ = writeln!(
                out,
                "{:>10} {:>6} {:>10} {:>6} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>3}",
                r.size_bytes,
                r.level,
                format!("{}x{}", r.blocks, r.threads),
                r.iters,
                rtt.p50_ns / 1e3,
                rtt.p99_ns / 1e3,
                half.p50_ns / 1e3,
                half.p99_ns / 1e3,
                half.min_ns / 1e3,
                if r.verified { "✓" } else { "✗" }
            );
        }
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

/// Writes one CSV line per row, the run's configuration as leading
/// `# key: value` comment lines.
pub fn write_csv(path: &Path, info: &RunInfo, rows: &[Row]) -> Result<()> {
    let mut out = String::new();
    if let serde_json::Value::Object(m) = serde_json::to_value(info)? {
        for (k, v) in m {
            let _ = writeln!(out, "# {k}: {v}");
        }
    }
    out += "round,mode,size_bytes,level,blocks,threads,warmup,iters,gpu_ns,us_per_iter,gb_per_s,\
            recv_p50_ns,recv_p99_ns,recv_min_ns,recv_avg_ns,rtt_p50_ns,rtt_p99_ns,rtt_min_ns,rtt_avg_ns,\
            half_rtt_p50_ns,half_rtt_p99_ns,kernel_event_us,copy_engine_gb_per_s,nixl_write_gb_per_s,ratio,verified\n";
    let f = |v: Option<f64>| v.map(|x| format!("{x:.3}")).unwrap_or_default();
    for r in rows {
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{},{},{},{:.4},{:.4},{},{},{},{},{},{},{},{},{},{},{:.2},{},{},{},{}",
            r.round,
            r.mode,
            r.size_bytes,
            r.level,
            r.blocks,
            r.threads,
            r.warmup,
            r.iters,
            r.gpu_ns,
            r.us_per_iter,
            r.gb_per_s,
            f(r.recv.map(|s| s.p50_ns)),
            f(r.recv.map(|s| s.p99_ns)),
            f(r.recv.map(|s| s.min_ns)),
            f(r.recv.map(|s| s.avg_ns)),
            f(r.rtt.map(|s| s.p50_ns)),
            f(r.rtt.map(|s| s.p99_ns)),
            f(r.rtt.map(|s| s.min_ns)),
            f(r.rtt.map(|s| s.avg_ns)),
            f(r.half_rtt.map(|s| s.p50_ns)),
            f(r.half_rtt.map(|s| s.p99_ns)),
            r.kernel_event_us,
            f(r.baselines.copy_engine_gbps),
            f(r.baselines.nixl_write_gbps),
            f(r.ratio),
            r.verified
        );
    }
    std::fs::write(path, out).with_context(|| format!("writing {}", path.display()))
}
