//! Allgather: every rank ends with all ranks' inputs side by side, rank
//! r's `count` elements at slot r of an output of ranks × count. One shot:
//! every rank pushes its input into its slot of every rank's output (its
//! own included) and waits for every peer's. LL (store path, small sizes):
//! the same in 16-byte lines that carry the call's epoch, no fence and no
//! flag (`allgather_ll` in `cuda/collectives.cu`).

use anyhow::Result;
use cudarc::nccl::result;

use super::{Collective, peer_share};
use crate::collectives::layout::Algo;
use crate::collectives::nccl::{NcclCall, check};
use crate::collectives::reference::{Model, input};

pub struct Allgather;

impl Collective for Allgather {
    fn name(&self) -> &'static str {
        "allgather"
    }

    fn code(&self) -> u32 {
        1 // COLL_ALLGATHER
    }

    fn redop(&self) -> &'static str {
        "none"
    }

    fn bus_factor(&self, ranks: u32) -> f64 {
        peer_share(ranks)
    }

    fn elems(&self, count: u64, ranks: u32) -> (u64, u64) {
        (count, count * u64::from(ranks))
    }

    /// The input is this rank's slot of the output.
    fn in_place(&self, out: u64, slot: u64) -> (u64, u64) {
        (out + slot, out)
    }

    fn kernel(&self, algo: Algo) -> &'static str {
        match algo {
            Algo::Ll => "coll_allgather_ll",
            Algo::Ll128 => "coll_allgather_ll128",
            _ => "coll_allgather",
        }
    }

    fn expected(&self, _ranks: u32, _rank: u32, count: u64, call: u64, i: u64) -> f32 {
        input((i / count) as u32, i % count, call)
    }

    /// LL and LL128 move the same elements as the one shot, packed in lines.
    fn model(&self, _algo: Algo, m: &mut Model) {
        let (n, c) = (m.ranks, m.count);
        for r in 0..n {
            for b in 0..m.blocks {
                for (lo, hi) in m.pieces(c, b).collect::<Vec<_>>() {
                    let (i, o) = m.io(r);
                    let at = o + (u64::from(r) * c + lo) as usize;
                    for d in 0..n {
                        m.send(r, d, i + lo as usize, at, hi - lo);
                    }
                }
            }
        }
    }

    unsafe fn nccl(&self, c: &NcclCall) -> Result<()> {
        // SAFETY: as the caller promised.
        let r =
            unsafe { result::all_gather(c.input, c.output, c.count, c.dtype, c.comm, c.stream) };
        check("ncclAllGather", r).map(drop)
    }
}
