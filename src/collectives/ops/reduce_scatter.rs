//! Reduce-scatter (sum): rank r ends with the sum over ranks of chunk r of
//! their inputs, `count` elements out of ranks × count in. One shot: every
//! rank pushes chunk d of its input to rank d's receive row for it, waits
//! for every peer's, and sums its own chunk from all N. LL (store path,
//! small sizes): the same in 16-byte lines that carry the call's epoch
//! (`reduce_scatter_ll` in `cuda/collectives.cu`).

use anyhow::Result;
use cudarc::nccl::{result, sys};

use super::{AUTO_RING_MIN, Collective, one_shot_or_ll, peer_share, ring_reduce_scatter};
use crate::collectives::layout::{Algo, AlgoChoice, LL_MAX_BYTES, row_skew};
use crate::collectives::nccl::{NcclCall, check};
use crate::collectives::reference::{Model, input};

pub struct ReduceScatter;

impl Collective for ReduceScatter {
    fn name(&self) -> &'static str {
        "reduce-scatter"
    }

    fn code(&self) -> u32 {
        2 // COLL_REDUCE_SCATTER
    }

    fn bus_factor(&self, ranks: u32) -> f64 {
        peer_share(ranks)
    }

    fn elems(&self, count: u64, ranks: u32) -> (u64, u64) {
        (count * u64::from(ranks), count)
    }

    /// The input is the whole buffer; this rank's slot of it becomes the
    /// output.
    fn in_place(&self, out: u64, slot: u64) -> (u64, u64) {
        (out, out + slot)
    }

    fn algorithms(&self) -> &'static [Algo] {
        &[Algo::OneShot, Algo::Ll, Algo::Ll128, Algo::Ring]
    }

    /// As the one shot's and LL's, and the ring where asked for, with
    /// `all` above LL's sizes (below, N − 1 flags in a row cost more than
    /// the sum it saves), and first with `auto` from [`AUTO_RING_MIN`]
    /// (the store path runs it, the put path the one shot).
    fn chosen(&self, choice: AlgoChoice, bytes: u64, _ranks: u32) -> Vec<Algo> {
        match choice {
            AlgoChoice::Ring => vec![Algo::Ring],
            AlgoChoice::Auto if bytes >= AUTO_RING_MIN => vec![Algo::Ring, Algo::OneShot],
            AlgoChoice::All if bytes > LL_MAX_BYTES => {
                let mut algos = one_shot_or_ll(choice, bytes);
                algos.push(Algo::Ring);
                algos
            }
            _ => one_shot_or_ll(choice, bytes),
        }
    }

    fn kernel(&self, algo: Algo) -> &'static str {
        match algo {
            Algo::Ll => "coll_reduce_scatter_ll",
            Algo::Ll128 => "coll_reduce_scatter_ll128",
            Algo::Ring => "coll_reduce_scatter_ring",
            _ => "coll_reduce_scatter",
        }
    }

    fn expected(&self, ranks: u32, rank: u32, count: u64, call: u64, i: u64) -> f32 {
        let at = u64::from(rank) * count + i;
        (0..ranks).map(|r| input(r, at, call)).sum()
    }

    /// LL and LL128 move the same elements as the one shot, packed in lines.
    /// Chunk d lands in d's rows at its skew ([`row_skew`], in elements
    /// here).
    fn model(&self, algo: Algo, m: &mut Model) {
        if algo == Algo::Ring {
            let c = m.count;
            return ring_reduce_scatter(m, |chunk| (u64::from(chunk) * c, 0, c));
        }
        let (n, c, e) = (m.ranks, m.count, m.elem_bytes);
        let (path, in_place) = (m.path, m.in_place);
        let skew = |d: u32| (row_skew(path, in_place, d, c, e) / e) as usize;
        for r in 0..n {
            for b in 0..m.blocks {
                for (lo, hi) in m.pieces(c, b).collect::<Vec<_>>() {
                    for d in (0..n).filter(|&d| d != r) {
                        let (i, dst) = (m.io(r).0, m.recv(r) + skew(d));
                        let at = i + (u64::from(d) * c + lo) as usize;
                        m.send(r, d, at, dst + lo as usize, hi - lo);
                    }
                }
            }
        }
        for r in 0..n {
            let (i, o) = m.io(r);
            let src = m.sources(r, i + (u64::from(r) * c) as usize, -(skew(r) as i64));
            for b in 0..m.blocks {
                for (lo, hi) in m.pieces(c, b).collect::<Vec<_>>() {
                    m.reduce(r, o, &src, lo, hi);
                }
            }
        }
    }

    unsafe fn nccl(&self, c: &NcclCall) -> Result<()> {
        let sum = sys::ncclRedOp_t::ncclSum;
        // SAFETY: as the caller promised.
        let r = unsafe {
            result::reduce_scatter(c.input, c.output, c.count, c.dtype, sum, c.comm, c.stream)
        };
        check("ncclReduceScatter", r).map(drop)
    }
}
