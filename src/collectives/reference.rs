//! The CPU reference: every rank's input, every expected output element,
//! and a step-by-step model of each algorithm's pushes and sums over the
//! same window offsets and slices as the kernels — so the index arithmetic
//! is tested without a GPU.

use super::layout::{Algo, Case, Op, WindowLayout, split};

/// Input element `i` of `rank` in call `call`: a small integer in [-4, 4],
/// so every sum of up to 64 ranks is exact in bf16 and f32 whatever the
/// order. Mirrors `coll_input()` in `cuda/collectives.cu`.
pub fn input(rank: u32, i: u64, call: u64) -> f32 {
    let v = (i.wrapping_mul(7) + u64::from(rank) * 13 + (call & 0xffff_ffff) * 5) % 9;
    v as f32 - 4.0
}

/// Expected output element `i` of `rank` (mirrors `expected()` in the
/// kernels): allgather, rank i/count's input at i mod count; allreduce,
/// the sum over ranks at i; reduce-scatter, the sum at rank·count + i.
pub fn expected(op: Op, ranks: u32, rank: u32, count: u64, call: u64, i: u64) -> f32 {
    let sum = |at: u64| (0..ranks).map(|r| input(r, at, call)).sum();
    match op {
        Op::Allgather => input((i / count) as u32, i % count, call),
        Op::Allreduce => sum(i),
        Op::ReduceScatter => sum(u64::from(rank) * count + i),
    }
}

/// The windows of all ranks, as f32 elements (offsets in bytes / element
/// size); unwritten elements are NaN, so reading one shows.
struct Model {
    case: Case,
    ranks: u32,
    blocks: u64,
    w: WindowLayout,
    win: Vec<Vec<f32>>,
    call: u64,
}

impl Model {
    fn e(&self) -> u64 {
        self.case.dtype.bytes()
    }
    fn io(&self, r: u32) -> (usize, usize) {
        let (i, o) = self.w.in_out(&self.case, r, self.call);
        ((i / self.e()) as usize, (o / self.e()) as usize)
    }
    fn recv(&self, src: u32) -> usize {
        ((self.w.recv[(self.call % 2) as usize] + u64::from(src) * self.w.recv_stride) / self.e())
            as usize
    }
    /// `send_to`: rank `from` copies `len` elements to rank `to`.
    fn send(&mut self, from: u32, to: u32, src: usize, dst: usize, len: u64) {
        let data: Vec<f32> = self.win[from as usize][src..src + len as usize].to_vec();
        self.win[to as usize][dst..dst + len as usize].copy_from_slice(&data);
    }
    /// `reduce`: out[i] = Σ_s src[s][i] in rank order, i in [lo, hi).
    fn reduce(&mut self, r: u32, out: usize, src: &[isize], lo: u64, hi: u64) {
        for i in lo..hi {
            let v: f32 = src
                .iter()
                .map(|&s| self.win[r as usize][(s + i as isize) as usize])
                .sum();
            self.win[r as usize][out + i as usize] = v;
        }
    }
    /// Sources: own input at `own`, peers' receive rows shifted by `shift`.
    fn sources(&self, r: u32, own: usize, shift: u64) -> Vec<isize> {
        (0..self.ranks)
            .map(|s| match s == r {
                true => own as isize,
                false => self.recv(s) as isize - shift as isize,
            })
            .collect()
    }
}

/// Runs `case` (call number `call`, `blocks` blocks) through the model and
/// returns every rank's output.
pub fn simulate(case: &Case, ranks: u32, blocks: u32, call: u64) -> Vec<Vec<f32>> {
    let w = WindowLayout::new(case.bytes(ranks), ranks);
    let len = (w.bytes / case.dtype.bytes()) as usize;
    let mut m = Model {
        case: *case,
        ranks,
        blocks: u64::from(blocks),
        w,
        win: vec![vec![f32::NAN; len]; ranks as usize],
        call,
    };
    let (n_in, n_out) = case.elems(ranks);
    for r in 0..ranks {
        let at = m.io(r).0;
        for i in 0..n_in {
            m.win[r as usize][at + i as usize] = input(r, i, call);
        }
    }
    match (case.op, case.algo) {
        // LL moves the same elements as one-shot, packed in lines (the
        // line format is crate::gpu::ll's, tested there).
        (Op::Allreduce, Algo::OneShot | Algo::Ll) => one_shot(&mut m),
        (Op::Allreduce, Algo::TwoShot) => two_shot(&mut m),
        (Op::Allgather, _) => allgather(&mut m),
        (Op::ReduceScatter, _) => reduce_scatter(&mut m),
    }
    (0..ranks)
        .map(|r| {
            let at = m.io(r).1;
            m.win[r as usize][at..at + n_out as usize].to_vec()
        })
        .collect()
}

fn one_shot(m: &mut Model) {
    let (n, c) = (m.ranks, m.case.count);
    for r in 0..n {
        for b in 0..m.blocks {
            let (lo, hi) = split(c, m.blocks, b);
            for d in (0..n).filter(|&d| d != r) {
                let (i, dst) = (m.io(r).0, m.recv(r));
                m.send(r, d, i + lo as usize, dst + lo as usize, hi - lo);
            }
        }
    }
    for r in 0..n {
        let (i, o) = m.io(r);
        let src = m.sources(r, i, 0);
        for b in 0..m.blocks {
            let (lo, hi) = split(c, m.blocks, b);
            m.reduce(r, o, &src, lo, hi);
        }
    }
}

fn two_shot(m: &mut Model) {
    let (n, c) = (m.ranks, m.case.count);
    let slice = |m: &Model, d: u32, b: u64| {
        let (c0, c1) = split(c, u64::from(n), u64::from(d));
        let (lo, hi) = split(c1 - c0, m.blocks, b);
        (c0, lo, hi)
    };
    for r in 0..n {
        for b in 0..m.blocks {
            for d in (0..n).filter(|&d| d != r) {
                let (c0, lo, hi) = slice(m, d, b);
                let (i, dst) = (m.io(r).0, m.recv(r));
                m.send(r, d, i + (c0 + lo) as usize, dst + lo as usize, hi - lo);
            }
        }
    }
    for r in 0..n {
        let (i, o) = m.io(r);
        for b in 0..m.blocks {
            let (c0, lo, hi) = slice(m, r, b);
            let src = m.sources(r, i, c0);
            m.reduce(r, o, &src, c0 + lo, c0 + hi);
        }
    }
    for r in 0..n {
        for b in 0..m.blocks {
            let (c0, lo, hi) = slice(m, r, b);
            for d in (0..n).filter(|&d| d != r) {
                let at = m.io(r).1 + (c0 + lo) as usize;
                m.send(r, d, at, at, hi - lo);
            }
        }
    }
}

fn allgather(m: &mut Model) {
    let (n, c) = (m.ranks, m.case.count);
    for r in 0..n {
        for b in 0..m.blocks {
            let (lo, hi) = split(c, m.blocks, b);
            for d in 0..n {
                let (i, o) = m.io(r);
                m.send(
                    r,
                    d,
                    i + lo as usize,
                    o + (u64::from(r) * c + lo) as usize,
                    hi - lo,
                );
            }
        }
    }
}

fn reduce_scatter(m: &mut Model) {
    let (n, c) = (m.ranks, m.case.count);
    for r in 0..n {
        for b in 0..m.blocks {
            let (lo, hi) = split(c, m.blocks, b);
            for d in (0..n).filter(|&d| d != r) {
                let (i, dst) = (m.io(r).0, m.recv(r));
                m.send(
                    r,
                    d,
                    i + (u64::from(d) * c + lo) as usize,
                    dst + lo as usize,
                    hi - lo,
                );
            }
        }
    }
    for r in 0..n {
        let (i, o) = m.io(r);
        let src = m.sources(r, i + (u64::from(r) * c) as usize, 0);
        for b in 0..m.blocks {
            let (lo, hi) = split(c, m.blocks, b);
            m.reduce(r, o, &src, lo, hi);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::layout::{Dtype, Path};
    use super::*;

    #[test]
    fn inputs_are_small_integers_and_sums_stay_exact_in_bf16() {
        for i in 0..1000 {
            let v = input(i as u32 % 16, i, i / 3);
            assert!(v.fract() == 0.0 && v.abs() <= 4.0);
        }
        // 64 ranks × 4 = 256: the largest integer range bf16 holds exactly.
        assert_eq!(expected(Op::Allgather, 3, 0, 5, 1, 7), input(1, 2, 1));
        assert_eq!(
            expected(Op::ReduceScatter, 3, 2, 5, 1, 1),
            (0..3).map(|r| input(r, 11, 1)).sum::<f32>()
        );
    }

    #[test]
    fn every_algorithm_gives_every_rank_the_reference() {
        let mut checked = 0;
        for (op, algo) in [
            (Op::Allreduce, Algo::OneShot),
            (Op::Allreduce, Algo::TwoShot),
            (Op::Allreduce, Algo::Ll),
            (Op::Allgather, Algo::OneShot),
            (Op::ReduceScatter, Algo::OneShot),
        ] {
            for ranks in [2u32, 3, 4] {
                for count in [1u64, 2, 7, 8, 9, 33, 100] {
                    for blocks in [1u32, 3, 5] {
                        for (in_place, dtype) in [(false, Dtype::F32), (true, Dtype::Bf16)] {
                            let case = Case {
                                op,
                                algo,
                                path: Path::Store,
                                dtype,
                                in_place,
                                count,
                            };
                            let call = u64::from(blocks) + count;
                            let out = simulate(&case, ranks, blocks, call);
                            for (r, o) in out.iter().enumerate() {
                                for (i, &got) in o.iter().enumerate() {
                                    let want = expected(op, ranks, r as u32, count, call, i as u64);
                                    assert_eq!(
                                        got, want,
                                        "{case:?} ranks {ranks} blocks {blocks}: rank {r} element {i}"
                                    );
                                }
                                checked += o.len();
                            }
                        }
                    }
                }
            }
        }
        assert!(checked > 10_000);
    }
}
