//! What a run reports: every stage's figures gathered on rank 0, one row
//! per case (per-link and end-to-end throughput, one chunk's latency
//! through the chain, each stage's stall on credits, overwritten slots),
//! beside the same run's copy engine and, where NCCL runs, NCCL's
//! send/recv through the same chain ([`super::nccl`]); the table on stdout,
//! `--json`, `--csv`.
//!
//! Throughput is GB/s (1e9 B/s) of payload. A link's is measured where the
//! data lands: the receiving stage's clock from the arrival of the first
//! timed chunk to that of the last, over the chunks in between. End to end:
//! from stage 0's start of the first timed chunk to the last stage's end of
//! the last. Latency: channel 0's slice of a chunk, from stage 0's start
//! to the last stage's end of its check (`%globaltimer`; one GPU, so the
//! clocks agree; the channels run apart, so a spread over channels would
//! measure their drift, not the chain).

use std::path::Path;

use anyhow::Result;
use serde::{Deserialize, Serialize};

use super::config::{Case, Config};
use super::nccl::NcclTimes;
use crate::cli::fmt_bytes;
use std::sync::Arc;

use cudarc::driver::CudaContext;

use crate::gpu::copy::{CopyPath, enable_peer_access};
use crate::gpu::{DeviceBuffer, Gpu};
use crate::ranks::info::RankInfo;
use crate::say;
use crate::stats::Summary;

crate::json_value!(Vec<StageResult> => "stage results");

/// One stage's figures for one case.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StageResult {
    pub rank: u32,
    /// Waits for credits over the timed chunks, summed over channels, ns.
    pub stall_ns: u64,
    pub overwrites: u64,
    /// `%globaltimer`, ns: the first timed chunk and the last one arrived;
    /// the last one's work ended.
    pub arrive_first: u64,
    pub arrive_last: u64,
    pub done_ns: u64,
    pub checked: u64,
    /// Channel 0's handshakes over the run (every chunk, warm-up included).
    #[serde(default)]
    pub handshakes: u64,
    /// Stage 0: each stamped chunk's start; the last stage: its end.
    pub t_start: Vec<u64>,
    pub t_end: Vec<u64>,
}

/// One case's row.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub path: &'static str,
    pub level: &'static str,
    pub stages: u32,
    pub chunk_bytes: u64,
    pub slots: u32,
    /// The most chunks one handshake covers.
    pub batch: u32,
    /// Per stage: channel 0's chunks per handshake, the mean batch.
    pub chunks_per_handshake: Vec<f64>,
    /// Channels carrying data (thread groups, each its own ring words).
    pub channels: u32,
    /// Chunks timed (after the warm-up).
    pub timed_chunks: u64,
    /// Per link, into stage 1, 2, …: GB/s.
    pub link_gbps: Vec<f64>,
    pub min_link_gbps: f64,
    /// The same link's bytes on the wire, GB/s: the payload's, or on the
    /// line paths their lines' (LL ×2, LL128 ×128/120, flags included).
    pub min_link_wire_gbps: f64,
    /// The slowest link's time per chunk, ns: with one slot and two stages
    /// a round trip (the chunk there, its credit back).
    pub link_ns_per_chunk: f64,
    /// Payload over stage 0's first timed start to the last stage's end:
    /// `None` where the two stages are on different GPUs, whose
    /// `%globaltimer` clocks differ by an unknown offset (tens of µs on
    /// two H200s), so no difference of them means anything.
    pub e2e_gbps: Option<f64>,
    /// Channel 0's slice of a chunk: stage 0's start to the last stage's
    /// end of its check, ns; `None` as `e2e_gbps`.
    pub latency: Option<Summary>,
    /// Per stage: time one channel waited for credits, µs, and as a share
    /// of the timed run.
    pub stall_us: Vec<f64>,
    pub stall_share: Vec<f64>,
    /// Slots found overwritten, all stages.
    pub overwrites: u64,
    /// The copy engine's copy of one chunk from stage 0's GPU to stage 1's
    /// (the first link's GPUs), GB/s; the slowest link against it.
    pub ce_gbps: Option<f64>,
    /// What that copy measured: the GPUs, the direction, L2 or not.
    pub ce_path: Option<CopyPath>,
    pub link_vs_ce: Option<f64>,
    /// NCCL's ncclSend/ncclRecv chain at the same chunk size, per link
    /// (into stage 1, 2, …), GB/s; its slowest link; our slowest link
    /// against it (above 1: faster). `None`: NCCL did not run.
    pub nccl_link_gbps: Option<Vec<f64>>,
    pub nccl_gbps: Option<f64>,
    pub link_vs_nccl: Option<f64>,
}

/// What the report needs from the run.
pub struct Context<'a> {
    pub cfg: &'a Config,
    pub infos: &'a [RankInfo],
    pub gpu: &'a Gpu,
    /// Stage 1's GPU as this process numbers it, the copy engine's
    /// destination; `None`: not visible here (another host).
    pub ce_dst: Option<usize>,
    pub json: Option<&'a Path>,
    pub csv: Option<&'a Path>,
    /// The channels of a case that carry data.
    pub channels: Box<dyn Fn(&Case) -> u32 + 'a>,
    /// NCCL's version and call, or why its baseline did not run.
    pub nccl_note: String,
    /// Every rank's NCCL chain times (rank order), where it ran.
    pub nccl: Option<Vec<Vec<NcclTimes>>>,
}

/// One row from every stage's result of `case` (`stages[r]`: rank r's);
/// `one_clock`: stage 0 and the last stage share a GPU, so their stamps
/// come from one clock and the end-to-end figures can be taken.
pub fn row(
    cfg: &Config,
    case: &Case,
    channels: u32,
    stages: &[&StageResult],
    one_clock: bool,
) -> Row {
    let timed = cfg.chunks - cfg.warmup;
    let gbps = |bytes: u64, ns: u64| {
        if ns == 0 {
            0.0
        } else {
            bytes as f64 / ns as f64
        }
    };
    let link: Vec<f64> = (stages[1..].iter())
        .map(|s| {
            gbps(
                (timed - 1) * case.chunk,
                s.arrive_last.saturating_sub(s.arrive_first),
            )
        })
        .collect();
    let min_link = link.iter().copied().fold(f64::INFINITY, f64::min);
    let (first, last) = (stages[0], stages[stages.len() - 1]);
    let start = first.t_start.first().copied().unwrap_or(0);
    let span = last.done_ns.saturating_sub(start);
    let lat: Vec<f64> = (first.t_start.iter().zip(&last.t_end))
        .map(|(a, b)| b.saturating_sub(*a) as f64)
        .collect();
    let per_channel = |s: &StageResult| s.stall_ns as f64 / f64::from(channels.max(1));
    let per_chunk = (stages[1..].iter())
        .map(|s| s.arrive_last.saturating_sub(s.arrive_first) as f64 / (timed - 1).max(1) as f64)
        .fold(0.0, f64::max);
    Row {
        path: case.path.name(),
        level: case.level.name(),
        stages: stages.len() as u32,
        chunk_bytes: case.chunk,
        slots: case.slots,
        batch: case.batch,
        chunks_per_handshake: (stages.iter())
            .map(|s| cfg.chunks as f64 / s.handshakes.max(1) as f64)
            .collect(),
        channels,
        timed_chunks: timed,
        min_link_gbps: min_link,
        min_link_wire_gbps: min_link * case.path.wire_factor(),
        link_gbps: link,
        link_ns_per_chunk: per_chunk,
        e2e_gbps: one_clock.then(|| gbps(timed * case.chunk, span)),
        latency: one_clock.then(|| Summary::of(&lat)),
        stall_us: stages.iter().map(|s| per_channel(s) / 1e3).collect(),
        stall_share: stages
            .iter()
            .map(|s| per_channel(s) / span.max(1) as f64)
            .collect(),
        overwrites: stages.iter().map(|s| s.overwrites).sum(),
        ce_gbps: None,
        ce_path: None,
        link_vs_ce: None,
        nccl_link_gbps: None,
        nccl_gbps: None,
        link_vs_nccl: None,
    }
}

/// NCCL's per-link GB/s at `chunk` from every rank's times (`all[r]`):
/// each receiver's chunk bytes × timed chunks over its span.
pub fn nccl_links(all: &[Vec<NcclTimes>], chunk: u64) -> Option<Vec<f64>> {
    (all.iter().skip(1))
        .map(|rank| {
            let t = rank.iter().find(|t| t.chunk == chunk)?;
            (t.span_ns > 0.0).then(|| (t.chunk * t.timed) as f64 / t.span_ns)
        })
        .collect()
}

/// Sets the NCCL columns of `r` from every rank's times.
pub fn add_nccl(r: &mut Row, all: &[Vec<NcclTimes>]) {
    r.nccl_link_gbps = nccl_links(all, r.chunk_bytes);
    r.nccl_gbps =
        (r.nccl_link_gbps.as_ref()).map(|l| l.iter().copied().fold(f64::INFINITY, f64::min));
    r.link_vs_nccl = r.nccl_gbps.map(|n| r.min_link_gbps / n);
}

/// Rank 0: the rows (with the copy engine beside them), the table, the files.
pub fn publish(ctx: &Context, all: &[Vec<StageResult>]) -> Result<()> {
    let cfg = ctx.cfg;
    let mut rows = Vec::new();
    for (n, case) in cfg.cases().iter().enumerate() {
        let stages: Vec<&StageResult> = all.iter().map(|r| &r[n]).collect();
        rows.push(row(
            cfg,
            case,
            (ctx.channels)(case),
            &stages,
            one_clock(ctx.infos),
        ));
    }
    if let (true, Some(dst)) = (cfg.baseline, ctx.ce_dst) {
        let peer = peer_context(ctx.gpu, dst)?;
        // One measurement per chunk size: rows differ in slots and grids too.
        let mut measured: Vec<(u64, f64)> = Vec::new();
        for r in &mut rows {
            let ce = match measured.iter().find(|m| m.0 == r.chunk_bytes) {
                Some(&(_, ce)) => ce,
                None => {
                    let ce = copy_engine(ctx.gpu, &peer, r.chunk_bytes)?;
                    measured.push((r.chunk_bytes, ce));
                    ce
                }
            };
            r.ce_gbps = Some(ce);
            r.ce_path = Some(CopyPath::new(
                ctx.gpu.ordinal,
                dst,
                r.chunk_bytes,
                ctx.gpu.l2_bytes,
            ));
            r.link_vs_ce = Some(r.min_link_gbps / ce);
        }
    }
    if let Some(all) = &ctx.nccl {
        rows.iter_mut().for_each(|r| add_nccl(r, all));
    }
    print_table(ctx, &rows);
    write_files(ctx, &rows)
}

/// Whether stage 0 and the last stage run on one GPU (one `%globaltimer`).
fn one_clock(infos: &[RankInfo]) -> bool {
    infos.first().map(|i| &i.gpu_uuid) == infos.last().map(|i| &i.gpu_uuid)
}

/// The context of GPU `dst` (this process's ordinal), peer access enabled
/// both ways with `gpu`'s: stage 1's GPU, where the copy engine copies to.
fn peer_context(gpu: &Gpu, dst: usize) -> Result<Arc<CudaContext>> {
    if dst == gpu.ordinal {
        return Ok(gpu.ctx.clone());
    }
    let peer = CudaContext::new(dst)?;
    enable_peer_access(&gpu.ctx, &peer)?;
    enable_peer_access(&peer, &gpu.ctx)?;
    gpu.bind()?;
    Ok(peer)
}

/// The copy engine's rate for `bytes` from `gpu` to `peer`'s GPU, GB/s: 50
/// copies (at least 64 MiB in all) between events, after two untimed ones.
fn copy_engine(gpu: &Gpu, peer: &Arc<CudaContext>, bytes: u64) -> Result<f64> {
    let src = DeviceBuffer::zeroed(&gpu.ctx, bytes as usize)?;
    let dst = DeviceBuffer::zeroed(peer, bytes as usize)?;
    let iters = (64u64 << 20).div_ceil(bytes).clamp(50, 100_000) as u32;
    Ok(crate::gpu::copy::copy_rate(
        &dst,
        &src,
        bytes as usize,
        iters,
        &gpu.stream,
    )?)
}

fn print_table(ctx: &Context, rows: &[Row]) {
    let cfg = ctx.cfg;
    let gpu = ctx.infos.first().map_or("?", |i| i.gpu_name.as_str());
    say!(
        "# pipeline: {} stages on {gpu} (MPS {}), {} chunks per case ({} warm-up), slow stage {}",
        cfg.stages,
        ctx.infos.iter().all(|i| i.mps),
        cfg.chunks,
        cfg.warmup,
        match cfg.slow_stage {
            Some(k) => format!("{k} ({} us per chunk)", cfg.delay_us),
            None => "none".into(),
        }
    );
    let seats: Vec<_> = ctx.infos.iter().map(RankInfo::seat).collect();
    say!(
        "# {} (stage k is rank k)",
        crate::ranks::info::placement(&seats, false)
    );
    say!("# {}", ctx.nccl_note);
    say!(
        "{:>5} {:>6} {:>8} {:>5} {:>5} {:>5} {:>9} {:>8} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>5}  stall us \
         per stage (share; chunks a handshake)",
        "path",
        "level",
        "chunk",
        "slots",
        "batch",
        "chan",
        "link min",
        "wire",
        "us/chunk",
        "e2e",
        "ce GB/s",
        "link/ce",
        "nccl GB/s",
        "link/nccl",
        "lat p50",
        "lat p99",
        "ovw"
    );
    for r in rows {
        let stalls: Vec<String> = (r.stall_us.iter().zip(&r.stall_share))
            .zip(&r.chunks_per_handshake)
            .map(|((us, sh), b)| format!("{us:.0} ({:.0}%; {b:.2})", sh * 100.0))
            .collect();
        say!(
            "{:>5} {:>6} {:>8} {:>5} {:>5} {:>5} {:>9.2} {:>8.2} {:>8.3} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>5}  {}",
            r.path,
            r.level,
            fmt_bytes(r.chunk_bytes),
            r.slots,
            r.batch,
            r.channels,
            r.min_link_gbps,
            r.min_link_wire_gbps,
            r.link_ns_per_chunk / 1e3,
            r.e2e_gbps.map_or("-".into(), |v| format!("{v:.2}")),
            r.ce_gbps.map_or("-".into(), |v| format!("{v:.2}")),
            r.link_vs_ce.map_or("-".into(), |v| format!("{v:.2}")),
            r.nccl_gbps.map_or("-".into(), |v| format!("{v:.2}")),
            r.link_vs_nccl.map_or("-".into(), |v| format!("{v:.2}")),
            r.latency
                .as_ref()
                .map_or("-".into(), |l| format!("{:.2}", l.p50_ns / 1e3)),
            r.latency
                .as_ref()
                .map_or("-".into(), |l| format!("{:.2}", l.p99_ns / 1e3)),
            r.overwrites,
            stalls.join(", ")
        );
    }
    say!(
        "# link min: the slowest link's GB/s (1e9 B/s) of payload, wire: of its bytes on the wire (ll: lines twice \
         the payload, ll128: 128 bytes per 120), us/chunk its time per chunk; lat: channel 0's slice \
         of a chunk through the chain, us (lat and e2e read stage 0's clock against the last stage's: '-' where they are on \
         different GPUs, whose clocks differ); batch: the most chunks one handshake covers; stall: one channel's wait for credits over the timed \
         chunks, and its mean batch; ce: {}; nccl: NCCL's ncclSend/ncclRecv chain's slowest link (no \
         transform, no slow stage)",
        ce_note(ctx, rows)
    );
}

/// What the `ce` column measured, or why it is empty.
fn ce_note(ctx: &Context, rows: &[Row]) -> String {
    describe_ce(
        ctx.cfg.baseline,
        ctx.ce_dst,
        rows.first().and_then(|r| r.ce_path),
    )
}

/// The `ce` column's description: `baseline` on, stage 1's GPU as this
/// process numbers it (`None`: another host), the copy it measured.
pub fn describe_ce(baseline: bool, ce_dst: Option<usize>, path: Option<CopyPath>) -> String {
    match (baseline, ce_dst, path) {
        (false, _, _) => "not measured (--no-baseline)".into(),
        (true, None, _) => {
            "not measured (stage 1's GPU is not visible to rank 0: another host)".into()
        }
        (true, Some(_), Some(p)) => format!(
            "one chunk by the {} (a chunk that fits in L2 is read from the cache)",
            p.route()
        ),
        (true, Some(_), None) => "not measured".into(),
    }
}

/// The run's configuration beside its rows, for `--json` and `--csv`.
#[derive(Serialize)]
struct Info<'a> {
    #[serde(flatten)]
    run: crate::results::RunEnv,
    config: &'a Config,
    gpus: Vec<String>,
    /// NCCL's version and call, or why its baseline did not run.
    nccl: &'a str,
}

fn write_files(ctx: &Context, rows: &[Row]) -> Result<()> {
    let info = Info {
        run: crate::results::RunEnv::capture("pipeline"),
        config: ctx.cfg,
        gpus: ctx.infos.iter().map(|i| i.gpu_name.clone()).collect(),
        nccl: &ctx.nccl_note,
    };
    if let Some(p) = ctx.json {
        let doc = serde_json::json!({ "run": info, "rows": rows });
        std::fs::write(p, serde_json::to_string(&doc)?)
            .map_err(|e| anyhow::anyhow!("writing {}: {e}", p.display()))?;
    }
    if let Some(p) = ctx.csv {
        crate::results::write_csv(p, &info, rows)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_copy_engine_column_names_the_stages_gpus_and_one_direction() {
        let p = CopyPath::new(0, 1, 4 << 20, 50 << 20);
        let d = describe_ce(true, Some(1), Some(p));
        assert!(
            d.contains("GPU 0 -> GPU 1") && d.contains("one direction"),
            "{d}"
        );
        let one = describe_ce(true, Some(0), Some(CopyPath::new(0, 0, 1 << 20, 50 << 20)));
        assert!(one.contains("no link crossed"), "{one}");
        assert!(describe_ce(true, None, None).contains("another host"));
        assert!(describe_ce(false, Some(1), Some(p)).contains("--no-baseline"));
    }

    fn times(chunk: u64, timed: u64, span_ns: f64) -> NcclTimes {
        NcclTimes {
            chunk,
            timed,
            span_ns,
        }
    }

    #[test]
    fn nccl_links_are_measured_where_the_data_lands() {
        // Stage 0's own span is not a link; stages 1 and 2 receive.
        let all = vec![
            vec![times(1 << 20, 100, 1.0)],
            vec![times(1 << 20, 100, 1e6)],
            vec![times(1 << 20, 100, 2e6)],
        ];
        let links = nccl_links(&all, 1 << 20).unwrap();
        let per = (100u64 << 20) as f64;
        assert_eq!(links, vec![per / 1e6, per / 2e6]);
        assert_eq!(nccl_links(&all, 64), None, "a chunk size NCCL did not run");
    }

    /// Two stages, one case of 1 KiB chunks on `path`, 10 of 11 chunks timed.
    fn one_case(path: &str, baseline: bool) -> Config {
        serde_json::from_value(serde_json::json!({
            "stages": 2, "chunk_sizes": [1024], "slots": [8], "paths": [path], "levels": ["block"],
            "chunks": 11, "warmup": 1, "slot_bytes": null, "blocks": null, "threads": null,
            "slow_stage": null, "delay_us": 0, "fault_timeout_ns": 1, "corrupt_stage": null, "baseline": baseline
        }))
        .unwrap()
    }

    #[test]
    fn the_nccl_columns_are_in_every_row_and_file() {
        let cfg = one_case("store", true);
        let stage = |first, last| StageResult {
            arrive_first: first,
            arrive_last: last,
            ..Default::default()
        };
        let (a, b) = (stage(0, 0), stage(0, 9 * 1024));
        let mut r = row(&cfg, &cfg.cases()[0], 1, &[&a, &b], true);
        assert_eq!(r.min_link_gbps, 1.0);
        let none = serde_json::to_value(&r).unwrap();
        for key in ["nccl_link_gbps", "nccl_gbps", "link_vs_nccl", "ce_gbps"] {
            assert!(none[key].is_null(), "{key} without NCCL: {none}");
        }
        add_nccl(&mut r, &[vec![], vec![times(1024, 10, 5120.0)]]);
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["nccl_link_gbps"], serde_json::json!([2.0]));
        assert_eq!(v["nccl_gbps"], 2.0);
        assert_eq!(v["link_vs_nccl"], 0.5);
    }

    #[test]
    fn two_gpus_clocks_are_never_subtracted() {
        let cfg = one_case("ll", false);
        // Stage 1's clock runs 77 µs ahead of stage 0's on another GPU.
        let a = StageResult {
            t_start: vec![1_000],
            ..Default::default()
        };
        let b = StageResult {
            arrive_last: 9 * 1024,
            done_ns: 80_000,
            t_end: vec![78_000],
            ..Default::default()
        };
        let apart = row(&cfg, &cfg.cases()[0], 1, &[&a, &b], false);
        assert_eq!((apart.latency.is_none(), apart.e2e_gbps), (true, None));
        assert_eq!(
            apart.min_link_gbps, 1.0,
            "a link is timed on its receiver's clock alone"
        );
        let v = serde_json::to_value(&apart).unwrap();
        assert!(v["latency"].is_null() && v["e2e_gbps"].is_null(), "{v}");
        let shared = row(&cfg, &cfg.cases()[0], 1, &[&a, &b], true);
        assert_eq!(shared.latency.map(|l| l.p50_ns), Some(77_000.0));
    }

    #[test]
    fn the_wire_column_counts_the_lines_flags() {
        for (path, wire) in [("store", 1.0), ("ll", 2.0), ("ll128", 128.0 / 120.0)] {
            let cfg = one_case(path, false);
            let b = StageResult {
                arrive_last: 9 * 1024,
                ..Default::default()
            };
            let r = row(
                &cfg,
                &cfg.cases()[0],
                1,
                &[&StageResult::default(), &b],
                true,
            );
            assert_eq!(
                (r.min_link_gbps, r.min_link_wire_gbps),
                (1.0, wire),
                "{path}"
            );
        }
    }
}
