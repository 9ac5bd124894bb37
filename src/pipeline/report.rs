//! What a run reports: every stage's figures gathered on rank 0, one row
//! per case (per-link and end-to-end throughput, one chunk's latency
//! through the chain, each stage's stall on credits, overwritten slots),
//! beside the same run's copy engine; the table on stdout, `--json`,
//! `--csv`.
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
use crate::cli::fmt_bytes;
use crate::gpu::{DeviceBuffer, Gpu};
use crate::say;
use crate::stats::Summary;

/// What each rank tells the others about its GPU.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankInfo {
    pub rank: u32,
    pub host: String,
    pub gpu_name: String,
    pub gpu_uuid: String,
    pub sm_count: u32,
    pub mps: bool,
}

crate::json_value!(RankInfo => "rank description", Vec<StageResult> => "stage results");

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
    /// Channels carrying data (thread groups, each its own ring words).
    pub channels: u32,
    /// Chunks timed (after the warm-up).
    pub timed_chunks: u64,
    /// Per link, into stage 1, 2, …: GB/s.
    pub link_gbps: Vec<f64>,
    pub min_link_gbps: f64,
    /// The slowest link's time per chunk, ns: with one slot and two stages
    /// a round trip (the chunk there, its credit back).
    pub link_ns_per_chunk: f64,
    pub e2e_gbps: f64,
    /// Channel 0's slice of a chunk: stage 0's start to the last stage's
    /// end of its check, ns.
    pub latency: Summary,
    /// Per stage: time one channel waited for credits, µs, and as a share
    /// of the timed run.
    pub stall_us: Vec<f64>,
    pub stall_share: Vec<f64>,
    /// Slots found overwritten, all stages.
    pub overwrites: u64,
    /// The copy engine's same-size device-to-device copy, GB/s; the
    /// slowest link against it.
    pub ce_gbps: Option<f64>,
    pub link_vs_ce: Option<f64>,
}

/// What the report needs from the run.
pub struct Context<'a> {
    pub cfg: &'a Config,
    pub infos: &'a [RankInfo],
    pub gpu: &'a Gpu,
    pub json: Option<&'a Path>,
    pub csv: Option<&'a Path>,
    /// The channels of a case that carry data.
    pub channels: Box<dyn Fn(&Case) -> u32 + 'a>,
}

/// One row from every stage's result of `case` (`stages[r]`: rank r's).
pub fn row(cfg: &Config, case: &Case, channels: u32, stages: &[&StageResult]) -> Row {
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
        channels,
        timed_chunks: timed,
        min_link_gbps: link.iter().copied().fold(f64::INFINITY, f64::min),
        link_gbps: link,
        link_ns_per_chunk: per_chunk,
        e2e_gbps: gbps(timed * case.chunk, span),
        latency: Summary::of(&lat),
        stall_us: stages.iter().map(|s| per_channel(s) / 1e3).collect(),
        stall_share: stages
            .iter()
            .map(|s| per_channel(s) / span.max(1) as f64)
            .collect(),
        overwrites: stages.iter().map(|s| s.overwrites).sum(),
        ce_gbps: None,
        link_vs_ce: None,
    }
}

/// Rank 0: the rows (with the copy engine beside them), the table, the files.
pub fn publish(ctx: &Context, all: &[Vec<StageResult>]) -> Result<()> {
    let cfg = ctx.cfg;
    let mut rows = Vec::new();
    for (n, case) in cfg.cases().iter().enumerate() {
        let stages: Vec<&StageResult> = all.iter().map(|r| &r[n]).collect();
        rows.push(row(cfg, case, (ctx.channels)(case), &stages));
    }
    if cfg.baseline {
        for r in &mut rows {
            let ce = copy_engine(ctx.gpu, r.chunk_bytes)?;
            r.ce_gbps = Some(ce);
            r.link_vs_ce = Some(r.min_link_gbps / ce);
        }
    }
    print_table(ctx, &rows);
    write_files(ctx, &rows)
}

/// The copy engine's device-to-device rate for `bytes`, GB/s: 50 copies
/// (at least 64 MiB in all) between events, after two untimed ones.
fn copy_engine(gpu: &Gpu, bytes: u64) -> Result<f64> {
    let src = DeviceBuffer::zeroed(&gpu.ctx, bytes as usize)?;
    let dst = DeviceBuffer::zeroed(&gpu.ctx, bytes as usize)?;
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
    say!(
        "{:>5} {:>6} {:>8} {:>5} {:>5} {:>9} {:>8} {:>9} {:>9} {:>9} {:>8} {:>8} {:>5}  stall us per stage (share)",
        "path",
        "level",
        "chunk",
        "slots",
        "chan",
        "link min",
        "us/chunk",
        "e2e",
        "ce GB/s",
        "link/ce",
        "lat p50",
        "lat p99",
        "ovw"
    );
    for r in rows {
        let stalls: Vec<String> = (r.stall_us.iter().zip(&r.stall_share))
            .map(|(us, sh)| format!("{us:.0} ({:.0}%)", sh * 100.0))
            .collect();
        say!(
            "{:>5} {:>6} {:>8} {:>5} {:>5} {:>9.2} {:>8.3} {:>9.2} {:>9} {:>9} {:>8.2} {:>8.2} {:>5}  {}",
            r.path,
            r.level,
            fmt_bytes(r.chunk_bytes),
            r.slots,
            r.channels,
            r.min_link_gbps,
            r.link_ns_per_chunk / 1e3,
            r.e2e_gbps,
            r.ce_gbps.map_or("-".into(), |v| format!("{v:.2}")),
            r.link_vs_ce.map_or("-".into(), |v| format!("{v:.2}")),
            r.latency.p50_ns / 1e3,
            r.latency.p99_ns / 1e3,
            r.overwrites,
            stalls.join(", ")
        );
    }
    say!(
        "# link min: the slowest link's GB/s (1e9 B/s) of payload, us/chunk its time per chunk; lat: channel 0's slice \
         of a chunk through the chain, us; stall: one channel's wait for credits over the timed chunks"
    );
}

/// The run's configuration beside its rows, for `--json` and `--csv`.
#[derive(Serialize)]
struct Info<'a> {
    #[serde(flatten)]
    run: crate::results::RunEnv,
    config: &'a Config,
    gpus: Vec<String>,
}

fn write_files(ctx: &Context, rows: &[Row]) -> Result<()> {
    let info = Info {
        run: crate::results::RunEnv::capture("pipeline"),
        config: ctx.cfg,
        gpus: ctx.infos.iter().map(|i| i.gpu_name.clone()).collect(),
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
