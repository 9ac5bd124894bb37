//! What a rank tells the others about itself when the ranks meet: its
//! machine, its GPU and whether NCCL loaded there. The N-rank programs
//! (`collectives`, `pipeline`) gather one from every rank to decide who
//! shares a GPU (under MPS or not), how many SMs each may take, whether
//! NCCL's baseline can run, and to name the GPUs in their reports. (`ep`
//! adds what its kernels need and keeps a larger one.)

use anyhow::Result;
use serde::{Deserialize, Serialize};

use crate::gpu::Gpu;
use crate::ranks::nccl::NcclStatus;

/// One rank's description, as it publishes it (JSON under the program's
/// `rank/<r>/info` key).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankInfo {
    pub rank: u32,
    /// The machine's host name ([`crate::results::hostname`]).
    pub host: String,
    /// `cuDeviceGetName`.
    pub gpu_name: String,
    /// `cuDeviceGetUuid` as 32 lowercase hex digits: equal on ranks that
    /// share a GPU.
    pub gpu_uuid: String,
    /// Streaming multiprocessors of the whole GPU.
    pub sm_count: u32,
    /// Whether this rank's CUDA context is an MPS client: ranks sharing its
    /// GPU then run their kernels at the same time instead of in turns.
    pub mps: bool,
    /// Whether NCCL loaded in this rank ([`crate::ranks::nccl::prepare`]).
    pub nccl: NcclStatus,
}

crate::json_value!(RankInfo => "rank description");

impl RankInfo {
    /// Rank `rank` on `gpu`, with `nccl` as [`crate::ranks::nccl::prepare`]
    /// found it. Errors: the driver cannot describe the GPU.
    pub fn describe(rank: u32, gpu: &Gpu, nccl: NcclStatus) -> Result<Self> {
        let g = gpu.info()?;
        Ok(Self {
            rank,
            host: crate::results::hostname(),
            gpu_name: g.name,
            gpu_uuid: g.uuid,
            sm_count: gpu.sm_count,
            mps: g.mps,
            nccl,
        })
    }
}
