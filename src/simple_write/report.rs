//! What a run measured: one row per size × level, printed as a table for
//! people and written as JSON or CSV for programs, with the run's
//! configuration (GPUs, driver, NIXL and UCX versions, environment).

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;

use super::baseline::Baselines;
use super::initiator_role::RunResult;
use super::initiator_role::rounds::{Breakdown, RoundResult};
use super::protocol::Verdict;
use crate::cli::fmt_bytes;
use crate::gpu::GpuInfo;
use crate::gpu::copy::CopyPath;
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
    /// Ping-pong with `--breakdown`: where the round trips' time went.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub breakdown: Option<Breakdown>,
    /// CUDA-event time of the whole kernel, warm-up and launch included, µs.
    pub kernel_event_us: f64,
    pub baselines: Baselines,
    /// `gb_per_s` over the best same-run baseline.
    pub ratio: Option<f64>,
    /// Bytes each source cycles through: the size, or with `--hbm` all
    /// its slots ([`crate::simple_write::plan::Round::span`]).
    pub span_bytes: u64,
    /// Bandwidth rows: bytes the round's iterations cycle through on the
    /// busiest GPU (see [`mark_cache`]).
    pub working_set_bytes: Option<u64>,
    /// Bandwidth rows: whether that working set fits in the GPU's L2 cache,
    /// so the rate is the cache's rather than HBM's ([`mark_cache`]).
    pub l2_resident: Option<bool>,
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
            breakdown: r.breakdown,
            rtt: r.rtt,
            kernel_event_us: r.event_us,
            baselines,
            ratio,
            span_bytes: round.span(),
            working_set_bytes: None,
            l2_resident: None,
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

/// Marks the bandwidth rows whose working set fits in L2. Every iteration
/// rewrites the same bytes (two alternating sources, one destination), so
/// once they fit in the L2 cache the rate measured is the cache's, and a
/// ratio to a copy engine that pays its per-copy setup says little. The
/// working set is all three (3 × span) when both processes use one GPU,
/// else the two sources on the initiator's GPU (2 × span); the span is the
/// size, or with `--hbm` every slot, at least twice the L2. `l2` is that
/// GPU's L2 in bytes (0: unknown, rows stay unmarked).
pub fn mark_cache(rows: &mut [Row], l2: u64, same_gpu: bool) {
    let copies = if same_gpu { 3 } else { 2 };
    for r in rows.iter_mut().filter(|r| r.mode == "bandwidth") {
        let set = r.span_bytes.max(r.size_bytes).saturating_mul(copies);
        r.working_set_bytes = Some(set);
        r.l2_resident = (l2 > 0).then_some(set <= l2);
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
    /// What the CE and NIXL columns measured ([`baselines_note`]).
    pub baselines: String,
}

/// What the baseline columns measured: which GPU to which, one direction,
/// or why they are empty (the target's GPU is not visible here).
pub fn baselines_note(run: &RunResult) -> String {
    let dst = crate::gpu::context::find_gpu(&run.target_gpu.uuid);
    describe_baselines(run.initiator_gpu.ordinal, dst)
}

/// The baseline columns' description for an initiator on GPU `src` and a
/// target on `dst` as the initiator numbers it (`None`: not visible).
pub fn describe_baselines(src: usize, dst: Option<usize>) -> String {
    match dst {
        Some(dst) => format!(
            "CE: {}; NIXL: a host-API WRITE GPU {src} -> GPU {dst}, timed on the host; \
             from: L2 when the working set fits in GPU {src}'s L2",
            CopyPath::route_between(src, dst)
        ),
        None => "CE, NIXL: not measured (the target's GPU is not visible to the initiator)".into(),
    }
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
            baselines: baselines_note(run),
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

const BANDWIDTH: [Column; 10] = [
    ("iters", |r| r.iters.to_string()),
    ("p50 µs", |r| us(r.recv.map(|s| s.p50_ns))),
    ("p99 µs", |r| us(r.recv.map(|s| s.p99_ns))),
    ("GB/s", |r| format!("{:.2}", r.gb_per_s)),
    ("wire GB/s", |r| format!("{:.2}", r.wire_gb_per_s)),
    ("CE GB/s", |r| opt(r.baselines.copy_engine_gbps, 1.0, 1)),
    ("NIXL GB/s", |r| opt(r.baselines.nixl_write_gbps, 1.0, 1)),
    ("ratio", |r| opt(r.ratio, 1.0, 3)),
    ("from", |r| {
        match r.l2_resident {
            Some(true) => "L2",
            Some(false) => "HBM",
            None => "-",
        }
        .into()
    }),
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

const BREAKDOWN: [Column; 6] = [
    ("data ns", |r| opt(r.breakdown.map(|b| b.data_ns), 1.0, 0)),
    ("fence ns", |r| opt(r.breakdown.map(|b| b.fence_ns), 1.0, 0)),
    ("signal ns", |r| {
        opt(r.breakdown.map(|b| b.signal_ns), 1.0, 0)
    }),
    ("ack ns", |r| opt(r.breakdown.map(|b| b.ack_ns), 1.0, 0)),
    ("RTT p50 ns", |r| opt(r.rtt.map(|s| s.p50_ns), 1.0, 0)),
    ("send share", |r| {
        let send = r.breakdown.map(|b| b.data_ns + b.fence_ns + b.signal_ns);
        opt(send.zip(r.rtt).map(|(s, rtt)| s / rtt.p50_ns), 1.0, 2)
    }),
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
    let split: Vec<&Row> = pp.into_iter().filter(|r| r.breakdown.is_some()).collect();
    if !split.is_empty() {
        out.push_str(
            "\nwhere a round trip goes (--breakdown; the initiator's SM clock, p50 of each phase; send share: \
             data + fence + signal over the round trip)\n",
        );
        render(&mut out, &[&ROUND[..3], &BREAKDOWN[..]].concat(), &split);
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

    #[test]
    fn the_baseline_columns_name_both_gpus_and_one_direction() {
        let d = describe_baselines(0, Some(1));
        assert!(d.contains("CE: copy engine GPU 0 -> GPU 1"), "{d}");
        assert!(
            d.contains("one direction") && d.contains("WRITE GPU 0 -> GPU 1"),
            "{d}"
        );
        assert!(d.contains("L2"), "{d}");
        assert!(describe_baselines(0, None).contains("not measured"));
    }

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
            breakdown: None,
            kernel_event_us: 0.0,
            baselines: Baselines::default(),
            ratio: None,
            span_bytes: 8,
            working_set_bytes: None,
            l2_resident: None,
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

    #[test]
    fn a_breakdown_gets_its_own_table_whose_phases_sum_to_the_send_share() {
        let mut r = row("put", Some(1000.0));
        r.breakdown = Some(Breakdown {
            data_ns: 300.0,
            fence_ns: 100.0,
            signal_ns: 600.0,
            ack_ns: 0.0,
        });
        let t = table(&[row("flag", Some(300.0)), r]);
        let split = t
            .split("where a round trip goes")
            .nth(1)
            .expect("a breakdown table");
        let line = split.lines().find(|l| l.contains("put")).unwrap();
        // The helper's RTT p50 is 1000 ns; data + fence + signal = 1000 ns.
        assert!(line.trim_end().ends_with("1.00"), "{line}");
        assert!(
            !split.contains("flag"),
            "rows without a breakdown stay out:\n{split}"
        );
    }

    #[test]
    fn bandwidth_rows_whose_working_set_fits_in_l2_are_marked() {
        let mib = |n: u64| n << 20;
        let mut rows: Vec<Row> = [mib(1), mib(16), mib(17), mib(64)]
            .into_iter()
            .map(|size| Row {
                size_bytes: size,
                ..row("store", None)
            })
            .collect();
        rows.push(row("ll", Some(500.0)));
        mark_cache(&mut rows, mib(50), true);
        let marks: Vec<Option<bool>> = rows.iter().map(|r| r.l2_resident).collect();
        assert_eq!(
            marks,
            [Some(true), Some(true), Some(false), Some(false), None]
        );
        assert!(table(&rows).contains("HBM"));
        mark_cache(&mut rows, mib(50), false);
        assert_eq!(
            rows[2].l2_resident,
            Some(true),
            "across GPUs only the sources share an L2"
        );
        // --hbm: 1 MiB rotating through 101 MiB of slots is read from HBM.
        let mut rows = vec![Row {
            size_bytes: mib(1),
            span_bytes: mib(101),
            ..row("store", None)
        }];
        mark_cache(&mut rows, mib(50), true);
        assert_eq!(rows[0].l2_resident, Some(false));
        assert_eq!(rows[0].working_set_bytes, Some(mib(303)));
    }
}
