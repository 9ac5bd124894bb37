//! What every rank of a run follows: the options beyond the shared
//! configuration, and the setup rank 0 makes from every rank's info.

use std::path::PathBuf;

use anyhow::Result;
use serde::{Deserialize, Serialize};

use super::config::RunConfig;
use super::report::NcclStatus;
use super::report::RankInfo;
use crate::cli::UsageError;
use crate::ranks::sm_share::{RankGpu, ranks_sharing, sm_share};

/// Fault injection for tests: one wrong value, so the checks must fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Corrupt {
    /// A received activation, on the last rank, first timed iteration.
    Dispatch,
    /// A combined output value, on the last rank, first timed iteration.
    Combine,
}

/// What the run needs beyond the configuration every rank shares.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    /// `--gpus`: how many GPUs the ranks share round-robin.
    pub gpus: Option<u32>,
    pub json: Option<PathBuf>,
    pub csv: Option<PathBuf>,
    /// simple_write's best put bandwidth at the same size, GB/s (the ×put column).
    pub ref_put_gbps: Option<f64>,
    pub corrupt: Option<Corrupt>,
    /// A death in the middle of a dispatch (`--inject die-mid-dispatch=R`):
    /// rank R, after the middle timed step of its first phase, dispatches
    /// to every active rank but the highest and then kills itself
    /// (SIGKILL), so one survivor waits out the fault timeout on it in the
    /// dispatch and the others only in the combine.
    pub die_mid_dispatch: Option<u32>,
}

/// Decisions made from the first phase's [`RankInfo`]s, which all follow
/// (every member of the first phase makes the same; one is stored).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Setup {
    /// Blocks of every phase kernel (the receivers count one signal per
    /// block, so every rank must use the same number).
    pub blocks: u32,
    /// Ranks on the busiest GPU.
    pub max_ranks_on_gpu: u32,
    /// Why the NCCL baseline is skipped, if it is.
    pub baseline_skip: Option<String>,
    /// The first phase's ranks as they introduced themselves, in rank
    /// order (the report's): whoever reports at the end has them.
    #[serde(default)]
    pub infos: Vec<RankInfo>,
}

/// The decisions from every first-phase rank's info: one grid for all (each
/// rank's share of its GPU's SMs, the smallest share wins), and whether the
/// NCCL baseline can run (one rank per GPU, NCCL everywhere).
pub fn make_setup(cfg: &RunConfig, infos: &[RankInfo]) -> Result<Setup> {
    let gpus: Vec<RankGpu> = infos
        .iter()
        .map(|i| (i.host.as_str(), i.gpu_uuid.as_str(), i.sm_count))
        .collect();
    let (introduced, share) = sm_share(&gpus);
    // An elastic run's first phase may hold fewer ranks than will share a
    // GPU later; each rank counted every rank of the capacity that will
    // run on its GPU, and the grid is sized for that many at once (the
    // combine kernel's blocks must all be resident together).
    let later = |i: &RankInfo| (i.sm_count / i.ranks_on_gpu.max(1)).max(1);
    let share = infos.iter().map(later).fold(share, u32::min);
    let max_ranks_on_gpu = infos
        .iter()
        .map(|i| i.ranks_on_gpu)
        .fold(introduced, u32::max);
    let sharing = |i: &RankInfo| ranks_sharing(&gpus, (&i.host, &i.gpu_uuid));
    let blocks = cfg.blocks.unwrap_or(share);
    for i in infos {
        // A rank that counts every rank on its GPU releases at GPU scope
        // (config.rs Grid::gpu_scope): that must be true of the UUIDs.
        // (Only when every rank introduced itself: an elastic run's first
        // phase may hold fewer ranks than share the GPU later.)
        let all_here = infos.len() as u32 == cfg.shape.ranks;
        if all_here && i.ranks_on_gpu > sharing(i) {
            return Err(anyhow::anyhow!(
                "rank {} counts {} rank(s) on its GPU, but only {} report its GPU {} on {}: the ranks see different GPUs under one ordinal (CUDA_VISIBLE_DEVICES differs between them); give every rank the same visible GPUs",
                i.rank,
                i.ranks_on_gpu,
                sharing(i),
                i.gpu_uuid,
                i.host
            ));
        }
    }
    for i in infos {
        let room = i.blocks_per_sm * i.sm_count / sharing(i).max(i.ranks_on_gpu);
        if blocks > room {
            return Err(UsageError(format!(
                "--blocks {blocks}: rank {} can keep only {room} blocks resident at once ({} SMs × {} blocks, shared by {} \
                 rank(s)); the combine kernel's blocks wait for each other, so use at most {room}",
                i.rank,
                i.sm_count,
                i.blocks_per_sm,
                sharing(i)
            ))
            .into());
        }
    }
    let baseline_skip = if !cfg.baseline {
        Some("--no-baseline".into())
    } else if max_ranks_on_gpu > 1 {
        Some(format!(
            "{max_ranks_on_gpu} ranks share a GPU; NCCL needs one rank per GPU"
        ))
    } else {
        infos.iter().find_map(|i| match &i.nccl {
            NcclStatus::Unavailable(why) => Some(format!("rank {}: {why}", i.rank)),
            NcclStatus::Ready(_) => None,
        })
    };
    Ok(Setup {
        blocks,
        max_ranks_on_gpu,
        baseline_skip,
        infos: infos.to_vec(),
    })
}
