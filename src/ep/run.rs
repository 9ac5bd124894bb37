//! One rank's GPU run, from its arguments to its exit: local checks first
//! (every problem at once), the GPU it runs on and whether its memory
//! suffices (usage errors, exit 2), then the store, the agreement with the
//! other ranks on configuration and plan, and the session
//! ([`super::session`]).

use std::time::Duration;

use anyhow::Result;

use super::config::RunConfig;
use super::kernels::EpKernels;
use super::model::Model;
use super::nccl::{self, NcclStatus};
use super::report::RankInfo;
use super::rig::Rig;
use super::session;
use super::setup::RunOptions;
use crate::cli::UsageError;
use crate::gpu::Gpu;
use crate::gpu::context::device_count;
use crate::ranks::env::RankEnv;
use crate::ranks::plan::Plan;
use crate::ranks::rank::{RankOptions, run_rank};

/// Runs this rank through the phases of `plan` it lives (in an elastic
/// run, `cfg.on_death` survive, the kernels mask a rank that stops and the
/// survivors agree on it; else every wait on a rank is fatal). Errors:
/// usage errors (exit 2), data mismatches (exit 3), anything else (exit 1),
/// each naming the cause.
pub fn run(env: &RankEnv, plan: &Plan, cfg: &RunConfig, opts: &RunOptions) -> Result<()> {
    // May re-execute this process (see nccl.rs): before anything else.
    let nccl_status = nccl::start(cfg.baseline, false);
    check_machine(cfg.baseline)?;
    let (gpu, ranks_on_gpu) = open_gpu(env, opts)?;
    let model = Model::new(cfg, env.rank);
    check_memory(&gpu, &model, ranks_on_gpu, cfg.baseline)?;
    let kernels = EpKernels::load(&gpu.ctx)?;
    let info = rank_info(env, &gpu, &kernels, ranks_on_gpu, nccl_status)?;
    tracing::info!(
        "GPU {} ({}), {} rank(s) on it, MPS {}; {}",
        info.gpu_ordinal,
        info.gpu_name,
        ranks_on_gpu,
        if info.mps { "on" } else { "off" },
        info.nccl
    );
    let local = session::Local {
        gpu: &gpu,
        kernels: &kernels,
        model: &model,
        info: &info,
    };
    let ro = RankOptions {
        timeout: Duration::from_nanos(cfg.timeout_ns),
        fault_timeout: Duration::from_nanos(cfg.fault_timeout_ns),
        on_death: cfg.on_death,
    };
    run_rank(env, plan, ro, |rank| session::run(rank, cfg, opts, &local))
}

/// Everything local that must hold, reported together (with, when the
/// `baseline` is asked for and NCCL cannot be found, where it was looked
/// for). `ep --ranks N` checks it once before starting the ranks; under
/// torchrun each rank does.
pub fn check_machine(baseline: bool) -> Result<()> {
    let nccl = || match crate::ranks::nccl::find_library() {
        Err(why) if baseline => format!("\n  (the NCCL baseline would be skipped too: {why})"),
        _ => String::new(),
    };
    crate::machine::check("ep", nccl).map(|_| ())
}

/// Opens GPU `LOCAL_RANK mod gpus`; returns it and how many of this
/// machine's ranks share it.
fn open_gpu(env: &RankEnv, opts: &RunOptions) -> Result<(Gpu, u32)> {
    let visible = device_count()? as u32;
    let gpus = opts.gpus.unwrap_or(visible);
    if gpus > visible {
        return Err(UsageError(format!("--gpus {gpus}: this machine has {visible} GPU(s)")).into());
    }
    let ordinal = env.local_rank % gpus;
    let sharing = (0..env.local_world).filter(|l| l % gpus == ordinal).count() as u32;
    Ok((Gpu::open(ordinal as usize)?, sharing.max(1)))
}

/// Usage error when this rank's buffers cannot fit, named with the numbers.
fn check_memory(gpu: &Gpu, model: &Model, ranks_on_gpu: u32, baseline: bool) -> Result<()> {
    let mut need = Rig::bytes_needed(model);
    if baseline {
        let sum = |v: &[u64]| v.iter().sum::<u64>();
        need += sum(&model.pairs.0.send).max(sum(&model.pairs.1.send))
            + sum(&model.pairs.0.recv).max(sum(&model.pairs.1.recv));
    }
    let (free, total) = gpu.ctx.mem_get_info()?;
    let (free, total) = (free as u64, total as u64);
    if need > free || need * u64::from(ranks_on_gpu) > total {
        return Err(UsageError(format!(
            "--tokens {} × --hidden {} on {} ranks needs about {} MiB per rank on GPU {} ({} rank(s) share it), which has {} MiB \
             free of {} MiB: use fewer tokens, a smaller hidden size, more GPUs or --no-baseline",
            model.shape.tokens,
            model.shape.hidden,
            model.shape.ranks,
            need >> 20,
            gpu.ordinal,
            ranks_on_gpu,
            free >> 20,
            total >> 20
        ))
        .into());
    }
    Ok(())
}

fn rank_info(
    env: &RankEnv,
    gpu: &Gpu,
    k: &EpKernels,
    ranks_on_gpu: u32,
    nccl: NcclStatus,
) -> Result<RankInfo> {
    let g = gpu.info()?;
    Ok(RankInfo {
        rank: env.rank,
        host: crate::results::hostname(),
        pid: std::process::id(),
        gpu_ordinal: g.ordinal,
        gpu_name: g.name,
        gpu_uuid: g.uuid,
        sm_count: gpu.sm_count,
        blocks_per_sm: k.blocks_per_sm()?,
        ranks_on_gpu,
        mps: g.mps,
        nccl,
    })
}
