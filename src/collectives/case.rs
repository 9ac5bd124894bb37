//! One collective call as every rank makes it (a case of the sweep), and
//! what the harness derives from its operation ([`super::ops`]): nccl-tests'
//! count and size, the elements in and out, the grid, where input and output
//! sit in the window, and the CPU run of its algorithm.

use serde::{Deserialize, Serialize};

use super::layout::{Algo, Dtype, MAX_BLOCKS, Path, WindowLayout};
use super::ops::Op;
use super::reference::Model;

/// One collective call, as every rank makes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Case {
    pub op: Op,
    pub algo: Algo,
    pub path: Path,
    pub dtype: Dtype,
    pub in_place: bool,
    /// nccl-tests' count ([`count_for`]).
    pub count: u64,
}

/// The element count nccl-tests reports for a buffer of `bytes`: how many
/// the larger of `op`'s input and output holds, per `count` (all elements
/// for allreduce, elements per rank for allgather and reduce-scatter),
/// rounded down. 0 when the size holds less than that.
pub fn count_for(op: Op, dtype: Dtype, ranks: u32, bytes: u64) -> u64 {
    let (i, o) = op.spec().elems(1, ranks);
    bytes / (dtype.bytes() * i.max(o))
}

impl Case {
    /// Bytes of the whole buffer (nccl-tests' size): the larger of input
    /// and output, the output of allgather, the input of reduce-scatter.
    pub fn bytes(&self, ranks: u32) -> u64 {
        let (i, o) = self.elems(ranks);
        i.max(o) * self.dtype.bytes()
    }

    /// Elements of one rank's input and of its output.
    pub fn elems(&self, ranks: u32) -> (u64, u64) {
        self.op.spec().elems(self.count, ranks)
    }

    /// Thread blocks of the call: one per `block_bytes` (`--block-bytes`;
    /// without it the algorithm's own, [`Algo::block_bytes`]) of the
    /// elements the blocks divide, within `1..=max_blocks`. Every rank
    /// computes the same.
    pub fn blocks(&self, ranks: u32, max_blocks: u32, block_bytes: Option<u64>) -> u32 {
        let basis = self.op.spec().block_elems(self.algo, self.count, ranks);
        let per = block_bytes.unwrap_or(self.algo.block_bytes()).max(1);
        let want = (basis * self.dtype.bytes()).div_ceil(per);
        want.clamp(1, u64::from(max_blocks.clamp(1, MAX_BLOCKS))) as u32
    }

    /// Window offsets of the input and output in call number `call` of
    /// `rank`: outputs alternate by parity; in place, the input sits where
    /// nccl-tests puts it ([`super::ops::Collective::in_place`]).
    pub fn in_out(&self, w: &WindowLayout, rank: u32, call: u64) -> (u64, u64) {
        let out = w.out[(call % 2) as usize];
        match self.in_place {
            false => (w.input, out),
            true => {
                let slot = u64::from(rank) * self.count * self.dtype.bytes();
                self.op.spec().in_place(out, slot)
            }
        }
    }

    /// The CPU run of this call (number `call`, `blocks` blocks, pieces of
    /// at most `piece_elems`) on `ranks` ranks over the kernels' own window
    /// offsets and slices: every rank's output.
    pub fn simulate(&self, ranks: u32, blocks: u32, piece_elems: u64, call: u64) -> Vec<Vec<f32>> {
        let w = WindowLayout::new(self.bytes(ranks), self.bytes(ranks), ranks);
        let e = self.dtype.bytes();
        let elem = |bytes: u64| (bytes / e) as usize;
        let io = (0..ranks)
            .map(|r| self.in_out(&w, r, call))
            .map(|(i, o)| (elem(i), elem(o)))
            .collect();
        let rows = (elem(w.recv[(call % 2) as usize]), elem(w.recv_stride));
        let mut m = Model::new(self.count, blocks, elem(w.bytes), io, rows);
        m.piece_elems = piece_elems;
        m.path = self.path;
        m.in_place = self.in_place;
        m.elem_bytes = e;
        let (n_in, n_out) = self.elems(ranks);
        m.fill(n_in, call);
        self.op.spec().model(self.algo, &mut m);
        m.outputs(n_out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collectives::layout::BLOCK_BYTES;

    fn case(op: Op, algo: Algo, count: u64) -> Case {
        Case {
            op,
            algo,
            path: Path::Store,
            dtype: Dtype::F32,
            in_place: false,
            count,
        }
    }

    #[test]
    fn nccl_tests_accounting() {
        assert_eq!(count_for(Op::Allreduce, Dtype::F32, 3, 1 << 20), 1 << 18);
        assert_eq!(count_for(Op::Allgather, Dtype::F32, 8, 1 << 20), 32768);
        assert_eq!(count_for(Op::ReduceScatter, Dtype::Bf16, 3, 8), 1);
        assert_eq!(count_for(Op::Allgather, Dtype::F32, 3, 8), 0);
        assert_eq!(Op::Allgather.spec().bus_factor(4), 0.75);
        let c = Case {
            dtype: Dtype::Bf16,
            ..case(Op::Allgather, Algo::OneShot, 100)
        };
        assert_eq!(c.bytes(3), 600);
        assert_eq!(c.elems(3), (100, 300));
    }

    #[test]
    fn blocks_grow_with_size_and_stay_within_the_limit() {
        let mut c = case(Op::Allreduce, Algo::OneShot, 2);
        assert_eq!(c.blocks(3, 44, None), 1);
        c.count = 64 << 20;
        assert_eq!(c.blocks(3, 44, None), 44);
        assert_eq!(c.blocks(3, 1000, None), MAX_BLOCKS);
        c.count = BLOCK_BYTES; // 4× BLOCK_BYTES of f32
        assert_eq!(c.blocks(3, 44, None), 4);
        c.algo = Algo::TwoShot; // a third of it per rank's chunk
        assert_eq!(c.blocks(3, 44, None), 2);
        c.algo = Algo::Ll128; // the line algorithms take half as much per block
        assert_eq!(c.blocks(3, 44, None), 8);
        assert_eq!(c.blocks(3, 44, Some(BLOCK_BYTES)), 4); // unless --block-bytes says
    }

    #[test]
    fn in_place_sits_in_the_output() {
        let w = WindowLayout::new(1000, 0, 3);
        let mut c = Case {
            in_place: true,
            ..case(Op::ReduceScatter, Algo::OneShot, 10)
        };
        assert_eq!(c.in_out(&w, 2, 1), (w.out[1], w.out[1] + 80));
        c.op = Op::Allgather;
        assert_eq!(c.in_out(&w, 2, 0), (w.out[0] + 80, w.out[0]));
        c.in_place = false;
        assert_eq!(c.in_out(&w, 2, 3), (w.input, w.out[1]));
    }

    #[test]
    fn every_algorithm_gives_every_rank_the_reference() {
        let mut checked = 0;
        for (op, algo) in Op::every_algorithm() {
            for ranks in [2u32, 3, 4] {
                for count in [1u64, 2, 7, 8, 9, 33, 100] {
                    for blocks in [1u32, 3, 5] {
                        for (in_place, dtype, path) in [
                            (false, Dtype::F32, Path::Store),
                            (true, Dtype::Bf16, Path::Store),
                            (false, Dtype::F32, Path::Put),
                        ] {
                            let case = Case {
                                in_place,
                                dtype,
                                path,
                                ..case(op, algo, count)
                            };
                            let call = u64::from(blocks) + count;
                            // Pieces of 8 elements deal several per block
                            // from 17 elements on; 2^20, one slice each.
                            for piece in [8, 1 << 20] {
                                checked += agree(&case, ranks, blocks, piece, call);
                            }
                        }
                    }
                }
            }
        }
        assert!(checked > 10_000);
    }

    /// Compares every rank's simulated output with the reference; returns
    /// the elements compared.
    fn agree(case: &Case, ranks: u32, blocks: u32, piece: u64, call: u64) -> usize {
        let out = case.simulate(ranks, blocks, piece, call);
        for (r, o) in out.iter().enumerate() {
            for (i, &got) in o.iter().enumerate() {
                let want = (case.op.spec()).expected(ranks, r as u32, case.count, call, i as u64);
                assert_eq!(
                    got, want,
                    "{case:?} ranks {ranks} blocks {blocks} piece {piece}: rank {r} element {i}"
                );
            }
        }
        out.iter().map(Vec::len).sum()
    }

    #[test]
    fn references_of_allgather_and_reduce_scatter() {
        use super::super::reference::input;
        assert_eq!(Op::Allgather.spec().expected(3, 0, 5, 1, 7), input(1, 2, 1));
        assert_eq!(
            Op::ReduceScatter.spec().expected(3, 2, 5, 1, 1),
            (0..3).map(|r| input(r, 11, 1)).sum::<f32>()
        );
    }
}
