//! The operations, one file each over one harness, as nccl-tests gives each
//! collective its `src/<op>.cu`: every operation states in its own file its
//! counts (the elements of one rank's input and output), where its input
//! sits in place, its bus-bandwidth factor and its NCCL call, and beside
//! them its algorithms, the kernel entry of each in `cuda/collectives.cu`,
//! and the CPU model and reference its results are checked against. The
//! harness ([`super::case::Case`], the window, the session, the report)
//! asks only through [`Collective`].
//!
//! Adding an operation: a file here implementing [`Collective`], its line
//! in the table ([`Op`] and [`Op::spec`]), and in `cuda/collectives.cu` its
//! algorithm under a `COLL_ENTRY` and its input and expected output in
//! `coll_fill` and `coll_check`.

use anyhow::Result;
use clap::ValueEnum;
use serde::{Deserialize, Serialize};

use super::layout::{Algo, AlgoChoice, LL_MAX_BYTES, LL128_MAX_BYTES, Path};
use super::nccl::NcclCall;
use super::reference::Model;

pub mod allgather;
pub mod allreduce;
pub mod reduce_scatter;

/// What one collective operation is, for every part of the harness.
/// Counts are nccl-tests': `count` is all elements for allreduce, the
/// elements per rank for allgather and reduce-scatter.
pub trait Collective: Sync {
    /// nccl-tests' name and `--op`'s: `allreduce`.
    fn name(&self) -> &'static str;

    /// `COLL_ALLREDUCE` …: the operation `coll_fill` and `coll_check` fill
    /// and check for.
    fn code(&self) -> u32;

    /// nccl-tests' redop column.
    fn redop(&self) -> &'static str {
        "sum"
    }

    /// nccl-tests' bus bandwidth factor: busbw = algbw × this.
    fn bus_factor(&self, ranks: u32) -> f64;

    /// Elements of one rank's input and of its output in a call of `count`
    /// on `ranks` ranks. The larger is nccl-tests' buffer (its size).
    fn elems(&self, count: u64, ranks: u32) -> (u64, u64);

    /// In place: where the input and the output start, bytes, given the
    /// output buffer at `out` and this rank's slot of it `slot` bytes in
    /// (rank × count × element size): nccl-tests' placement.
    fn in_place(&self, out: u64, slot: u64) -> (u64, u64);

    /// Every algorithm it has, in the order a sweep runs them: by default
    /// the one shot, LL and LL128 (allgather, reduce-scatter).
    fn algorithms(&self) -> &'static [Algo] {
        &[Algo::OneShot, Algo::Ll, Algo::Ll128]
    }

    /// The algorithms `--algo` picks for a buffer of `bytes` on `ranks` ranks.
    fn chosen(&self, choice: AlgoChoice, bytes: u64, _ranks: u32) -> Vec<Algo> {
        one_shot_or_ll(choice, bytes)
    }

    /// Whether `algo` runs a buffer of `bytes` over `path`.
    fn runs(&self, algo: Algo, bytes: u64, path: Path) -> bool {
        ll_runs(algo, bytes, path)
    }

    /// The table's algo column.
    fn algo_column(&self, algo: Algo) -> &'static str {
        algo.name()
    }

    /// Elements the call's blocks divide among them (sizes the grid).
    fn block_elems(&self, _algo: Algo, count: u64, _ranks: u32) -> u64 {
        count
    }

    /// `algo`'s kernel entry in `cuda/collectives.cu` (`COLL_ENTRY`): it
    /// takes one `CollParams`.
    fn kernel(&self, algo: Algo) -> &'static str;

    /// The expected output element `i` of `rank` in call `call` (the
    /// inputs of [`super::reference::input`]; `coll_check`'s `expected()`
    /// on the GPU).
    fn expected(&self, ranks: u32, rank: u32, count: u64, call: u64, i: u64) -> f32;

    /// Replays `algo`'s pushes and sums on `m`, block by block, as its
    /// kernel makes them.
    fn model(&self, algo: Algo, m: &mut Model);

    /// Queues NCCL's same call.
    ///
    /// # Safety
    /// The buffers of `c` must hold the call's elements until it completes.
    unsafe fn nccl(&self, c: &NcclCall) -> Result<()>;
}

/// The algorithms of an operation that has one shot, LL and LL128
/// (allgather, reduce-scatter) for `--algo` and a buffer of `bytes`: LL or
/// LL128 as asked for (allreduce's two-shot in LL128 lines too), each also
/// with `all` up to where it runs; any other choice is the one shot (they
/// have no two-shot, and `auto` never picks lines).
pub fn one_shot_or_ll(choice: AlgoChoice, bytes: u64) -> Vec<Algo> {
    match choice {
        AlgoChoice::Ll => vec![Algo::Ll],
        AlgoChoice::Ll128 | AlgoChoice::TwoShotLl128 => vec![Algo::Ll128],
        AlgoChoice::All => [Algo::OneShot]
            .into_iter()
            .chain(lines_up_to(bytes))
            .collect(),
        _ => vec![Algo::OneShot],
    }
}

/// The line algorithms `--algo all` adds for a buffer of `bytes`: LL up to
/// [`LL_MAX_BYTES`], LL128 up to [`LL128_MAX_BYTES`].
pub fn lines_up_to(bytes: u64) -> impl Iterator<Item = Algo> {
    [(Algo::Ll, LL_MAX_BYTES), (Algo::Ll128, LL128_MAX_BYTES)]
        .into_iter()
        .filter(move |&(_, max)| bytes <= max)
        .map(|(algo, _)| algo)
}

/// Whether `algo` runs a buffer of `bytes` over `path`: lines and the ring
/// need peer pointers (store path); LL's carry half their bytes in data, so
/// it stops at [`LL_MAX_BYTES`], LL128 at [`LL128_MAX_BYTES`]; the others
/// run everywhere.
pub fn ll_runs(algo: Algo, bytes: u64, path: Path) -> bool {
    match algo {
        Algo::Ll => path == Path::Store && bytes <= LL_MAX_BYTES,
        Algo::Ll128 | Algo::TwoShotLl128 => path == Path::Store && bytes <= LL128_MAX_BYTES,
        Algo::Ring => path == Path::Store,
        Algo::OneShot | Algo::TwoShot => true,
    }
}

/// The smallest buffer `auto` runs in a ring where the ring runs (the
/// store path): where the rings' time fell below two-shot's and the one
/// shot's on 3 and 4 ranks, one rank per GPU across NVLink (four H200s,
/// 2026-11-28: 0.92–0.99× from 32 MiB, 1.01–1.17× below 16 MiB on 4
/// ranks; 2 ranks were 0.82–0.98× from 256 KiB).
pub const AUTO_RING_MIN: u64 = 32 << 20;

/// The ring's reduce-scatter as `ring_reduce_scatter` in
/// `cuda/collectives.cu` runs it, over the chunks `chunk(c)` gives (input
/// offset, output offset, elements; offsets in elements from the rank's
/// input and output): at step s rank r adds its piece of chunk
/// (r − s − 1) mod n to what the rank before it stored in r's receive row
/// s − 1 and stores the sum into the next rank's row s; at the last step,
/// into its own output (chunk r).
pub fn ring_reduce_scatter(m: &mut Model, chunk: impl Fn(u32) -> (u64, u64, u64)) {
    let n = m.ranks;
    for s in 0..n {
        for r in 0..n {
            let (i, o) = m.io(r);
            let (at, out_at, len) = chunk((r + 2 * n - s - 1) % n);
            let mut src = vec![(i + at as usize) as isize];
            if s > 0 {
                src.push(m.recv(s - 1) as isize);
            }
            let (to, out) = match s + 1 == n {
                true => (r, o + out_at as usize),
                false => ((r + 1) % n, m.recv(s)),
            };
            for b in 0..m.blocks {
                for (lo, hi) in m.pieces(len, b).collect::<Vec<_>>() {
                    m.reduce_to(r, to, out, &src, lo, hi);
                }
            }
        }
    }
}

/// (n − 1)/n: the share of a buffer a rank exchanges with its peers,
/// nccl-tests' bus bandwidth factor of allgather and reduce-scatter
/// (allreduce moves it twice).
pub fn peer_share(ranks: u32) -> f64 {
    let n = f64::from(ranks);
    (n - 1.0) / n
}

/// The table of operations: `--op`'s values, in the order a sweep runs them.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum Op {
    Allreduce,
    Allgather,
    ReduceScatter,
}

impl Op {
    /// Every operation, in the table's order.
    pub fn all() -> &'static [Op] {
        Op::value_variants()
    }

    /// The operation itself.
    pub fn spec(self) -> &'static dyn Collective {
        match self {
            Op::Allreduce => &allreduce::Allreduce,
            Op::Allgather => &allgather::Allgather,
            Op::ReduceScatter => &reduce_scatter::ReduceScatter,
        }
    }

    pub fn name(self) -> &'static str {
        self.spec().name()
    }

    /// Every (operation, algorithm) there is: every kernel entry.
    pub fn every_algorithm() -> impl Iterator<Item = (Op, Algo)> {
        (Op::all().iter()).flat_map(|&op| op.spec().algorithms().iter().map(move |&a| (op, a)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_names_each_operation_as_op_takes_it() {
        for &op in Op::all() {
            assert_eq!(Op::from_str(op.name(), false), Ok(op));
        }
        let entries: std::collections::BTreeSet<_> = Op::every_algorithm()
            .map(|(op, a)| op.spec().kernel(a))
            .collect();
        // allreduce one-shot, two-shot, ll, ll128, two-shot-ll128 and ring;
        // allgather and reduce-scatter one-shot, ll and ll128, and
        // reduce-scatter's ring: one entry each in cuda/collectives.cu.
        assert_eq!(entries.len(), 13);
        for e in &entries {
            let src = include_str!("../../../cuda/collectives.cu");
            let name = e.trim_start_matches("coll_");
            assert!(
                src.contains(&format!("COLL_ENTRY({name})")),
                "{e} has no COLL_ENTRY"
            );
        }
    }
}
