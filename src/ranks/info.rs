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
    /// The GPU's CUDA ordinal in this rank's process (under
    /// `CUDA_VISIBLE_DEVICES`, of the devices it makes visible).
    #[serde(default)]
    pub gpu_ordinal: usize,
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
            gpu_ordinal: g.ordinal,
            gpu_name: g.name,
            gpu_uuid: g.uuid,
            sm_count: gpu.sm_count,
            mps: g.mps,
            nccl,
        })
    }
}

/// One rank's seat, for [`placement`]: the machine and GPU it ran on.
#[derive(Clone, Copy, Debug)]
pub struct Seat<'a> {
    pub rank: u32,
    pub host: &'a str,
    /// CUDA ordinal in the rank's process.
    pub gpu_ordinal: usize,
    /// 32 lowercase hex digits; equal on ranks that share a GPU.
    pub gpu_uuid: &'a str,
}

impl RankInfo {
    /// This rank's [`Seat`].
    pub fn seat(&self) -> Seat<'_> {
        Seat {
            rank: self.rank,
            host: &self.host,
            gpu_ordinal: self.gpu_ordinal,
            gpu_uuid: &self.gpu_uuid,
        }
    }
}

/// The line a report prints under its header to say where every rank
/// ran, and so where the same-run baseline ran (NCCL's calls run on the
/// same ranks, hence on the same GPUs):
/// `GPUs, ours and the baseline's alike: rank 0 on GPU 0 (3f2a9c1e), ranks 1, 2 on GPU 1 (77ab0c12)`.
/// Ranks that share a GPU (one UUID) stand together, in rank order; a GPU
/// is named by its CUDA ordinal in its first rank and the first 8 hex
/// digits of its UUID (what `nvidia-smi -L` prints after `GPU-`), with the
/// host before it where the ranks span machines. `baseline_ran`: false
/// (no baseline, or it was skipped) leaves the baseline out.
pub fn placement(seats: &[Seat], baseline_ran: bool) -> String {
    let mut gpus: Vec<(Seat, Vec<u32>)> = Vec::new();
    let mut sorted = seats.to_vec();
    sorted.sort_by_key(|s| s.rank);
    for s in sorted {
        match gpus
            .iter_mut()
            .find(|(g, _)| g.host == s.host && g.gpu_uuid == s.gpu_uuid)
        {
            Some((_, ranks)) => ranks.push(s.rank),
            None => gpus.push((s, vec![s.rank])),
        }
    }
    let hosts: std::collections::BTreeSet<&str> = seats.iter().map(|s| s.host).collect();
    let each: Vec<String> = (gpus.iter())
        .map(|(g, ranks)| {
            let who = match ranks.as_slice() {
                [r] => format!("rank {r}"),
                _ => format!(
                    "ranks {}",
                    ranks
                        .iter()
                        .map(u32::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            };
            let host = if hosts.len() > 1 {
                format!("{} ", g.host)
            } else {
                String::new()
            };
            let uuid = &g.gpu_uuid[..g.gpu_uuid.len().min(8)];
            format!("{who} on {host}GPU {} ({uuid})", g.gpu_ordinal)
        })
        .collect();
    let lead = if baseline_ran {
        "GPUs, ours and the baseline's alike"
    } else {
        "GPUs"
    };
    format!("{lead}: {}", each.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seat(
        rank: u32,
        host: &'static str,
        gpu_ordinal: usize,
        gpu_uuid: &'static str,
    ) -> Seat<'static> {
        Seat {
            rank,
            host,
            gpu_ordinal,
            gpu_uuid,
        }
    }

    #[test]
    fn one_rank_per_gpu_names_every_gpu_in_rank_order() {
        let seats = [
            seat(1, "h", 1, "77ab0c12ffffffffffffffffffffffff"),
            seat(0, "h", 0, "3f2a9c1e00000000000000000000000"),
        ];
        assert_eq!(
            placement(&seats, true),
            "GPUs, ours and the baseline's alike: rank 0 on GPU 0 (3f2a9c1e), rank 1 on GPU 1 (77ab0c12)"
        );
    }

    #[test]
    fn ranks_that_share_a_gpu_stand_together() {
        let seats = [
            seat(0, "h", 0, "aaaaaaaa"),
            seat(1, "h", 1, "bbbbbbbb"),
            seat(2, "h", 0, "aaaaaaaa"),
        ];
        assert_eq!(
            placement(&seats, false),
            "GPUs: ranks 0, 2 on GPU 0 (aaaaaaaa), rank 1 on GPU 1 (bbbbbbbb)"
        );
    }

    /// The same ordinal and UUID on two machines cannot be one GPU: the
    /// host tells them apart and is named.
    #[test]
    fn ranks_on_two_machines_name_the_host() {
        let seats = [seat(0, "a", 0, "cccccccc"), seat(1, "b", 0, "cccccccc")];
        assert_eq!(
            placement(&seats, true),
            "GPUs, ours and the baseline's alike: rank 0 on a GPU 0 (cccccccc), rank 1 on b GPU 0 (cccccccc)"
        );
    }
}
