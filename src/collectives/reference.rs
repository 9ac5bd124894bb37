//! The CPU reference's harness: every rank's input, and a model of all
//! ranks' windows in which an operation's algorithm replays the kernels'
//! pushes and sums over the same window offsets and slices (each
//! operation's own model is in its file under [`super::ops`]), so the
//! index arithmetic is tested without a GPU.

use crate::collectives::layout::Path;

/// Input element `i` of `rank` in call `call`: a small integer in [-4, 4],
/// so every sum of up to 64 ranks is exact in bf16 and f32 whatever the
/// order. Mirrors `coll_input()` in `cuda/collectives.cu`.
pub fn input(rank: u32, i: u64, call: u64) -> f32 {
    let v = (i.wrapping_mul(7) + u64::from(rank) * 13 + (call & 0xffff_ffff) * 5) % 9;
    v as f32 - 4.0
}

/// The windows of all ranks, as f32 elements (offsets in elements);
/// unwritten elements are NaN, so reading one shows. What an operation's
/// model ([`super::ops::Collective::model`]) works on.
pub struct Model {
    pub ranks: u32,
    /// nccl-tests' count of the call.
    pub count: u64,
    /// Blocks of the call: every algorithm slices by them as its kernel does.
    pub blocks: u64,
    /// One-shot and two-shot: elements per piece at most
    /// ([`crate::collectives::layout::pieces`]).
    pub piece_elems: u64,
    /// The call's data path and whether it runs in place (where
    /// reduce-scatter's rows are skewed: [`crate::collectives::layout::row_skew`]).
    pub path: Path,
    pub in_place: bool,
    /// Bytes of the call's element type (an offset here counts elements).
    pub elem_bytes: u64,
    /// Every rank's input and output offsets.
    io: Vec<(usize, usize)>,
    /// The receive rows: the first row's offset, elements per row.
    rows: (usize, usize),
    win: Vec<Vec<f32>>,
}

impl Model {
    /// `ranks` windows of `len` elements, NaN; rank `r`'s input and output
    /// at `io[r]`, the receive rows at `rows` (offset, elements per row).
    pub fn new(
        count: u64,
        blocks: u32,
        len: usize,
        io: Vec<(usize, usize)>,
        rows: (usize, usize),
    ) -> Self {
        let ranks = io.len() as u32;
        Self {
            ranks,
            count,
            blocks: u64::from(blocks),
            piece_elems: u64::MAX,
            path: Path::Store,
            in_place: false,
            elem_bytes: 4,
            win: vec![vec![f32::NAN; len]; ranks as usize],
            io,
            rows,
        }
    }

    /// Block `b`'s pieces of `total` elements, as the kernels deal them.
    pub fn pieces(&self, total: u64, b: u64) -> impl Iterator<Item = (u64, u64)> {
        crate::collectives::layout::pieces(total, self.blocks, b, self.piece_elems)
    }

    /// Writes `n` input elements of every rank for call `call` ([`input`]).
    pub fn fill(&mut self, n: u64, call: u64) {
        for r in 0..self.ranks {
            let at = self.io(r).0;
            for i in 0..n {
                self.win[r as usize][at + i as usize] = input(r, i, call);
            }
        }
    }

    /// The first `n` output elements of every rank.
    pub fn outputs(&self, n: u64) -> Vec<Vec<f32>> {
        (0..self.ranks)
            .map(|r| {
                let at = self.io(r).1;
                self.win[r as usize][at..at + n as usize].to_vec()
            })
            .collect()
    }

    /// Rank `r`'s input and output offsets.
    pub fn io(&self, r: u32) -> (usize, usize) {
        self.io[r as usize]
    }

    /// The receive row that rank `src` writes in every peer's window.
    pub fn recv(&self, src: u32) -> usize {
        self.rows.0 + src as usize * self.rows.1
    }

    /// `send_to`: rank `from` copies `len` elements to rank `to`.
    pub fn send(&mut self, from: u32, to: u32, src: usize, dst: usize, len: u64) {
        let data: Vec<f32> = self.win[from as usize][src..src + len as usize].to_vec();
        self.win[to as usize][dst..dst + len as usize].copy_from_slice(&data);
    }

    /// `reduce`: `out[i] = Σ_s src[s][i]` in rank order, `i` in `[lo, hi)`.
    pub fn reduce(&mut self, r: u32, out: usize, src: &[isize], lo: u64, hi: u64) {
        self.reduce_to(r, r, out, src, lo, hi);
    }

    /// `reduce` of rank `r`'s sources into rank `to`'s window (the ring's
    /// sum stored over the link).
    pub fn reduce_to(&mut self, r: u32, to: u32, out: usize, src: &[isize], lo: u64, hi: u64) {
        for i in lo..hi {
            let v: f32 = src
                .iter()
                .map(|&s| self.win[r as usize][(s + i as isize) as usize])
                .sum();
            self.win[to as usize][out + i as usize] = v;
        }
    }

    /// Sources: own input at `own`, peers' receive rows shifted back by
    /// `shift` elements (forward where negative).
    pub fn sources(&self, r: u32, own: usize, shift: i64) -> Vec<isize> {
        (0..self.ranks)
            .map(|s| match s == r {
                true => own as isize,
                false => self.recv(s) as isize - shift as isize,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_are_small_integers_and_sums_stay_exact_in_bf16() {
        // 64 ranks × 4 = 256: the largest integer range bf16 holds exactly.
        for i in 0..1000 {
            let v = input(i as u32 % 16, i, i / 3);
            assert!(v.fract() == 0.0 && v.abs() <= 4.0);
        }
    }
}
