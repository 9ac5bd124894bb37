//! Allreduce (sum): every rank ends with the sum of all inputs, `count`
//! elements in and out. Six algorithms: one-shot (every rank pushes its
//! whole input to every peer and sums all N), two-shot (reduce-scatter,
//! then allgather of the sums: 2(N−1)/N of the data per rank, the bus
//! optimum), ring (two-shot whose reduce-scatter is the ring's, the sum
//! riding on the push; store path, large sizes), LL (one-shot in 16-byte
//! lines that carry the call's epoch, store path, small sizes), LL128
//! (one-shot in 128-byte lines, mid sizes) and two-shot in LL128 lines.
//! docs/COLLECTIVES.md compares them.

use anyhow::Result;
use cudarc::nccl::{result, sys};

use super::{AUTO_RING_MIN, Collective, lines_up_to, peer_share, ring_reduce_scatter};
use crate::collectives::layout::{Algo, AlgoChoice, LL_MAX_BYTES, LL128_MAX_BYTES, split};
use crate::collectives::nccl::{NcclCall, check};
use crate::collectives::reference::{Model, input};

/// The largest allreduce `auto` runs one-shot on `ranks` ranks, two-shot
/// above: where two-shot's time fell below one-shot's, one rank per GPU
/// across NVLink (four H100s and two H200s, 2026-11-27: at 2 MiB with 4
/// ranks, 4 MiB with 3, between 8 and 16 MiB with 2). More ranks than were
/// measured take the 4-rank figure: one-shot's bytes per rank grow with N.
pub fn auto_one_shot_max(ranks: u32) -> u64 {
    match ranks {
        0..=2 => 8 << 20,
        3 => 4 << 20,
        _ => 2 << 20,
    }
}

/// `auto`'s choices for an allreduce of `bytes` on `ranks` ranks, in
/// preference order: each path runs the first that runs there (the ring,
/// from [`AUTO_RING_MIN`], on the store path only).
pub fn auto_algos(bytes: u64, ranks: u32) -> Vec<Algo> {
    if bytes <= auto_one_shot_max(ranks) {
        vec![Algo::OneShot]
    } else if bytes >= AUTO_RING_MIN {
        vec![Algo::Ring, Algo::TwoShot]
    } else {
        vec![Algo::TwoShot]
    }
}

/// Whether `--algo all` runs two-shot in LL128 lines on a buffer of
/// `bytes`: from above LL's sizes (below them its second flight costs more
/// than it saves) up to [`LL128_MAX_BYTES`].
pub fn two_shot_lines(bytes: u64) -> bool {
    bytes > LL_MAX_BYTES && bytes <= LL128_MAX_BYTES
}

pub struct Allreduce;

impl Collective for Allreduce {
    fn name(&self) -> &'static str {
        "allreduce"
    }

    fn code(&self) -> u32 {
        0 // COLL_ALLREDUCE
    }

    fn bus_factor(&self, ranks: u32) -> f64 {
        2.0 * peer_share(ranks)
    }

    fn elems(&self, count: u64, _ranks: u32) -> (u64, u64) {
        (count, count)
    }

    fn in_place(&self, out: u64, _slot: u64) -> (u64, u64) {
        (out, out)
    }

    fn algorithms(&self) -> &'static [Algo] {
        &[
            Algo::OneShot,
            Algo::TwoShot,
            Algo::Ll,
            Algo::Ll128,
            Algo::TwoShotLl128,
            Algo::Ring,
        ]
    }

    fn chosen(&self, choice: AlgoChoice, bytes: u64, ranks: u32) -> Vec<Algo> {
        match choice {
            AlgoChoice::OneShot => vec![Algo::OneShot],
            AlgoChoice::Ring => vec![Algo::Ring],
            AlgoChoice::TwoShot => vec![Algo::TwoShot],
            AlgoChoice::Ll => vec![Algo::Ll],
            AlgoChoice::Ll128 => vec![Algo::Ll128],
            AlgoChoice::TwoShotLl128 => vec![Algo::TwoShotLl128],
            AlgoChoice::Auto => auto_algos(bytes, ranks),
            AlgoChoice::All => [Algo::OneShot, Algo::TwoShot]
                .into_iter()
                .chain(lines_up_to(bytes))
                .chain(two_shot_lines(bytes).then_some(Algo::TwoShotLl128))
                .chain((bytes > LL_MAX_BYTES).then_some(Algo::Ring))
                .collect(),
        }
    }

    /// Two-shot's and the ring's blocks divide one rank's chunk, the
    /// others' the whole.
    fn block_elems(&self, algo: Algo, count: u64, ranks: u32) -> u64 {
        match algo {
            Algo::TwoShot | Algo::TwoShotLl128 | Algo::Ring => split(count, u64::from(ranks), 0).1,
            _ => count,
        }
    }

    fn kernel(&self, algo: Algo) -> &'static str {
        match algo {
            Algo::OneShot => "coll_allreduce_one_shot",
            Algo::Ring => "coll_allreduce_ring",
            Algo::TwoShot => "coll_allreduce_two_shot",
            Algo::Ll => "coll_allreduce_ll",
            Algo::Ll128 => "coll_allreduce_ll128",
            Algo::TwoShotLl128 => "coll_allreduce_two_shot_ll128",
        }
    }

    fn expected(&self, ranks: u32, _rank: u32, _count: u64, call: u64, i: u64) -> f32 {
        (0..ranks).map(|r| input(r, i, call)).sum()
    }

    fn model(&self, algo: Algo, m: &mut Model) {
        match algo {
            // LL and LL128 move the same elements as one-shot, packed in
            // lines (the line formats are crate::gpu::ll's, tested there).
            Algo::OneShot | Algo::Ll | Algo::Ll128 => one_shot(m),
            Algo::TwoShot | Algo::TwoShotLl128 => two_shot(m),
            Algo::Ring => ring(m),
        }
    }

    unsafe fn nccl(&self, c: &NcclCall) -> Result<()> {
        let sum = sys::ncclRedOp_t::ncclSum;
        // SAFETY: as the caller promised.
        let r = unsafe {
            result::all_reduce(c.input, c.output, c.count, c.dtype, sum, c.comm, c.stream)
        };
        check("ncclAllReduce", r).map(drop)
    }
}

fn one_shot(m: &mut Model) {
    let (n, c) = (m.ranks, m.count);
    for r in 0..n {
        for b in 0..m.blocks {
            for (lo, hi) in m.pieces(c, b).collect::<Vec<_>>() {
                for d in (0..n).filter(|&d| d != r) {
                    let (i, dst) = (m.io(r).0, m.recv(r));
                    m.send(r, d, i + lo as usize, dst + lo as usize, hi - lo);
                }
            }
        }
    }
    for r in 0..n {
        let (i, o) = m.io(r);
        let src = m.sources(r, i, 0);
        for b in 0..m.blocks {
            for (lo, hi) in m.pieces(c, b).collect::<Vec<_>>() {
                m.reduce(r, o, &src, lo, hi);
            }
        }
    }
}

fn two_shot(m: &mut Model) {
    let (n, c) = (m.ranks, m.count);
    // Block b's pieces of chunk d: (chunk start, lo, hi), lo and hi within it.
    let slices = |m: &Model, d: u32, b: u64| {
        let (c0, c1) = split(c, u64::from(n), u64::from(d));
        m.pieces(c1 - c0, b)
            .map(move |(lo, hi)| (c0, lo, hi))
            .collect::<Vec<_>>()
    };
    for r in 0..n {
        for b in 0..m.blocks {
            for d in (0..n).filter(|&d| d != r) {
                for (c0, lo, hi) in slices(m, d, b) {
                    let (i, dst) = (m.io(r).0, m.recv(r));
                    m.send(r, d, i + (c0 + lo) as usize, dst + lo as usize, hi - lo);
                }
            }
        }
    }
    for r in 0..n {
        let (i, o) = m.io(r);
        for b in 0..m.blocks {
            for (c0, lo, hi) in slices(m, r, b) {
                let src = m.sources(r, i, c0 as i64);
                m.reduce(r, o, &src, c0 + lo, c0 + hi);
            }
        }
    }
    allgather_sums(m);
}

/// The ring's reduce-scatter over two-shot's chunks, then two-shot's
/// allgather of the sums (`allreduce_ring`).
fn ring(m: &mut Model) {
    let (n, c) = (u64::from(m.ranks), m.count);
    ring_reduce_scatter(m, |d| {
        let (c0, c1) = split(c, n, u64::from(d));
        (c0, c0, c1 - c0)
    });
    allgather_sums(m);
}

/// Two-shot's second half (`allgather_sums`): every rank pushes its
/// chunk's sums from its output to the same place in every peer's.
fn allgather_sums(m: &mut Model) {
    let (n, c) = (m.ranks, m.count);
    for r in 0..n {
        let (c0, c1) = split(c, u64::from(n), u64::from(r));
        for b in 0..m.blocks {
            for (lo, hi) in m.pieces(c1 - c0, b).collect::<Vec<_>>() {
                for d in (0..n).filter(|&d| d != r) {
                    let at = m.io(r).1 + (c0 + lo) as usize;
                    m.send(r, d, at, at, hi - lo);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collectives::layout::Path;

    #[test]
    fn algo_picks_by_size_and_path() {
        let a = Allreduce;
        assert_eq!(a.bus_factor(2), 1.0);
        assert_eq!(a.bus_factor(4), 1.5);
        assert_eq!(a.chosen(AlgoChoice::All, LL_MAX_BYTES, 4).len(), 4);
        assert_eq!(
            a.chosen(AlgoChoice::All, LL_MAX_BYTES + 1, 4),
            vec![
                Algo::OneShot,
                Algo::TwoShot,
                Algo::Ll128,
                Algo::TwoShotLl128,
                Algo::Ring
            ]
        );
        assert_eq!(a.chosen(AlgoChoice::All, LL128_MAX_BYTES + 1, 4).len(), 3);
        assert_eq!(a.chosen(AlgoChoice::Ring, 8, 4), vec![Algo::Ring]);
        assert!(
            a.runs(Algo::Ring, 1 << 30, Path::Store) && !a.runs(Algo::Ring, 1 << 30, Path::Put)
        );
        assert_eq!(a.chosen(AlgoChoice::Auto, 2 << 20, 4), vec![Algo::OneShot]);
        assert_eq!(a.chosen(AlgoChoice::Auto, 4 << 20, 4), vec![Algo::TwoShot]);
        assert_eq!(a.chosen(AlgoChoice::Auto, 4 << 20, 2), vec![Algo::OneShot]);
        assert_eq!(a.chosen(AlgoChoice::Auto, 16 << 20, 2), vec![Algo::TwoShot]);
        assert_eq!(
            a.chosen(AlgoChoice::Auto, AUTO_RING_MIN, 4),
            vec![Algo::Ring, Algo::TwoShot]
        );
        assert!(!a.runs(Algo::Ll, 8, Path::Put) && a.runs(Algo::Ll, 8, Path::Store));
        assert_eq!(a.chosen(AlgoChoice::Ll128, 1 << 20, 4), vec![Algo::Ll128]);
        assert!(
            a.runs(Algo::Ll128, 4 << 20, Path::Store) && !a.runs(Algo::Ll128, 8 << 20, Path::Store)
        );
        assert!(!a.runs(Algo::Ll128, 8, Path::Put));
        assert!(!a.runs(Algo::TwoShotLl128, 8, Path::Put));
        assert!(!a.runs(Algo::TwoShotLl128, 8 << 20, Path::Store));
        assert!(a.runs(Algo::TwoShot, 1 << 30, Path::Put));
    }
}
