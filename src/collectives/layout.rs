//! The vocabulary every operation shares and where its bytes go: the
//! algorithms, data paths and types; how elements are cut into chunks and
//! slices (the index arithmetic the kernels of `cuda/collectives.cu`
//! share); the registered window; nccl-tests' sweep of sizes. What differs
//! between operations lives in [`super::ops`].

use clap::ValueEnum;
use serde::{Deserialize, Serialize};

use crate::cli::{UsageError, fmt_bytes};

/// Ranks the kernels are written for (`COLL_MAX_RANKS`).
pub const MAX_RANKS: u32 = 16;
/// Blocks per call at most (`COLL_MAX_BLOCKS`): the flag slots per phase.
/// Two per SM of an H100 or H200 (132 SMs), for `--blocks`; a run's own
/// limit is one block per SM (its share of them), the residency the
/// kernels are compiled for (`__launch_bounds__(COLL_THREADS, 1)`).
pub const MAX_BLOCKS: u32 = 264;
/// Threads per block (`COLL_THREADS`).
pub const THREADS: u32 = 512;
/// Flag slots per block and member (`flag_offset`'s phases): two-shot's
/// two phases, and the ring's piece counts (`PIECE_PHASE`, one slot a step).
pub const FLAG_PHASES: u64 = 3;
/// Slices and chunks start at multiples of this many elements: 16-byte
/// vectors for bf16 and f32 alike (`COLL_ALIGN_ELEMS`).
pub const ALIGN_ELEMS: u64 = 8;
/// Bytes of work per block before another block is added, for one-shot
/// and two-shot. On four H100s (`--block-bytes`, 32 KiB – 4 MiB, every op):
/// 8 KiB took ours ÷ NCCL's time to 1.12 (geometric mean), 16 KiB to 1.20,
/// 32 KiB to 1.28; sizes whose grid is at the SM limit either way read the
/// same.
pub const BLOCK_BYTES: u64 = 8 << 10;
/// The same for the line algorithms (LL, LL128, two-shot in LL128 lines).
/// A warp's lines are a chain (it loads a line's data, stores it, and
/// only then loads the next; it polls a line, uses it, then polls the
/// next), so a block should give each warp about one quad of LL128 lines
/// (16 warps × 4 × 120 bytes = 7.5 KiB) or each thread one LL line (512 ×
/// 8 bytes). On four H200s, 16 KiB – 2 MiB: 4 KiB took the 4-rank calls
/// from 8 KiB's 10.3–12.96 µs to 8.6–9.5 µs at 64 KiB and from 12.6 to 9.7
/// µs for a 256 KiB reduce-scatter; 2 KiB read as 4 KiB.
pub const LINE_BLOCK_BYTES: u64 = 4 << 10;
/// One-shot and two-shot cut a block's share into pieces of at most this
/// many bytes, dealt round the blocks, so that every block works through
/// the buffer beside the others ([`pieces`]). With one slice per block,
/// from about 1 MiB a block the pages in use at once outgrew what the GPU
/// keeps translated, and blocks ended unevenly: on two H200s at 512 MiB
/// the last block of a two-shot allreduce ended 35 % after the first.
pub const PIECE_BYTES: u64 = 256 << 10;
/// The LL algorithms run up to this size: its lines carry 8 bytes of data
/// in 16, and every receiving thread polls its own lines, which pays only
/// while the flag, not the data, sets the time (MSCCL++ uses LL packets up
/// to 16–64 KiB).
pub const LL_MAX_BYTES: u64 = 64 << 10;
/// Bytes of one LL line: `{u32 data, u32 epoch, u32 data, u32 epoch}`
/// (the format of [`crate::gpu::ll`]).
pub const LL_LINE_BYTES: u64 = 16;
/// The LL128 algorithms run up to this size: LL's one-shot data movement in
/// 128-byte lines of 120 data bytes ([`crate::gpu::ll::LL128`]), the
/// protocol NCCL runs on NVLink between LL's sizes and its bulk ring. Every
/// rank still pushes its whole buffer to every peer, which stops paying
/// once the bus, not the flags, sets the time.
pub const LL128_MAX_BYTES: u64 = 4 << 20;

/// How an operation is carried out. Allgather and reduce-scatter have three
/// (one shot: every rank pushes to every rank; LL and LL128, the same in
/// lines); allreduce has five ([`super::ops::allreduce`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Algo {
    /// Every rank pushes its whole input to every peer and sums all N.
    OneShot,
    /// Reduce-scatter (rank c sums chunk c), then allgather of the sums.
    TwoShot,
    /// One-shot in LL lines: 8 bytes of data and the call's epoch in one
    /// 16-byte store, so no fence and no separate flag; the receiver polls
    /// every line. Store path only, up to [`LL_MAX_BYTES`].
    Ll,
    /// One-shot in LL128 lines: 120 data bytes and a flag word carrying the
    /// call's epoch in 128 bytes, each line stored by eight lanes of one
    /// warp store (NCCL's LL128): no fence and no separate flag, 15/16 of
    /// the wire is data. Store path over NVLink only, up to
    /// [`LL128_MAX_BYTES`].
    Ll128,
    /// Two-shot in LL128 lines, with no barrier between its halves: each
    /// line of a rank's chunk is summed as it arrives and its sum pushed on
    /// at once (allreduce only). Half of one-shot's bytes per rank on 4
    /// ranks, so it overtakes LL128's one shot as the bus starts to set
    /// the time. Store path over NVLink only, up to [`LL128_MAX_BYTES`].
    TwoShotLl128,
    /// Reduce-scatter in a ring with the sum riding on the push: at each of
    /// N − 1 steps a rank adds its own piece of a chunk to the partial sum
    /// the rank before it stored and stores the result into the next rank's
    /// window (NCCL's ring, one piece per flag). No pass of its own for the
    /// sum, one peer at a time. Allreduce: two-shot with this reduce-scatter
    /// for its first half. Store path only (nixlPut cannot add).
    Ring,
}

impl Algo {
    pub fn name(self) -> &'static str {
        match self {
            Algo::OneShot => "one-shot",
            Algo::TwoShot => "two-shot",
            Algo::Ll => "ll",
            Algo::Ll128 => "ll128",
            Algo::TwoShotLl128 => "two-shot-ll128",
            Algo::Ring => "ring",
        }
    }

    /// `COLL_ONE_SHOT` …: the call's algorithm, for the record (its kernel
    /// entry already is one).
    pub fn code(self) -> u32 {
        self as u32
    }

    /// Whether its receive rows are LL128 lines (the window's LL128 area).
    pub fn ll128_lines(self) -> bool {
        matches!(self, Algo::Ll128 | Algo::TwoShotLl128)
    }

    /// Bytes of work per block: [`LINE_BLOCK_BYTES`] for the line
    /// algorithms, [`BLOCK_BYTES`] for the others.
    pub fn block_bytes(self) -> u64 {
        match self {
            Algo::Ll | Algo::Ll128 | Algo::TwoShotLl128 => LINE_BLOCK_BYTES,
            Algo::OneShot | Algo::TwoShot | Algo::Ring => BLOCK_BYTES,
        }
    }
}

/// `--algo`: which algorithms to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum AlgoChoice {
    OneShot,
    TwoShot,
    /// LL lines (store path, up to 64 KiB).
    Ll,
    /// LL128 lines (store path over NVLink, up to 4 MiB).
    Ll128,
    /// Allreduce's two-shot in LL128 lines (store path over NVLink, up to 4
    /// MiB); allgather and reduce-scatter run their LL128.
    TwoShotLl128,
    /// Reduce-scatter in a ring, the sum riding on the push, and allreduce's
    /// two-shot with it for its first half (store path); allgather runs its
    /// one-shot
    Ring,
    /// One-shot up to the size two-shot overtakes it (8 MiB on 2 ranks, 4 MiB
    /// on 3, 2 MiB on 4 or more, measured across NVLink), two-shot above;
    /// from 32 MiB the rings on the store path (allreduce, reduce-scatter);
    /// no lines (`--tune` and `--tuned` pick them).
    Auto,
    /// One-shot and two-shot at every size, LL, LL128 and two-shot in LL128
    /// lines where they run (the last above LL's sizes), the ring above LL's
    /// sizes.
    All,
}

pub use crate::gpu::path::{Path, PathChoice};

/// The data paths collectives implements (`COLL_PATH_*` in
/// `cuda/collectives.cu`); `--path ll` is refused
/// ([`super::plan::RunConfig::validate`]): its LL lines are an algorithm
/// (`--algo ll`) on the store path.
pub const PATHS: [Path; 2] = [Path::Put, Path::Store];

/// Element type.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum Dtype {
    F32,
    Bf16,
}

impl Dtype {
    pub fn bytes(self) -> u64 {
        match self {
            Dtype::F32 => 4,
            Dtype::Bf16 => 2,
        }
    }
    /// nccl-tests' type column.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "float",
            Dtype::Bf16 => "bfloat16",
        }
    }
    pub fn code(self) -> u32 {
        self as u32
    }
}

/// Slice `i` of `parts` over `total` elements, `[lo, hi)`: slices of
/// ⌈total/parts⌉ rounded up to [`ALIGN_ELEMS`], the last ones shorter or
/// empty. Mirrors `split()` in `cuda/collectives.cu`.
pub fn split(total: u64, parts: u64, i: u64) -> (u64, u64) {
    let per = split_share(total, parts);
    let lo = (i * per).min(total);
    (lo, (lo + per).min(total))
}

/// A share of [`split`]: ⌈total/parts⌉ rounded up to [`ALIGN_ELEMS`].
fn split_share(total: u64, parts: u64) -> u64 {
    total.div_ceil(parts).div_ceil(ALIGN_ELEMS) * ALIGN_ELEMS
}

/// Block `i` of `parts`' pieces of `total` elements, `[lo, hi)` each:
/// pieces of the block's share ([`split`]'s, ⌈total/parts⌉ rounded up to
/// [`ALIGN_ELEMS`]) or of `piece_elems` (a multiple of [`ALIGN_ELEMS`]),
/// whichever is smaller, piece k to block k mod `parts`. Mirrors
/// `for_pieces()` in `cuda/collectives.cu`.
pub fn pieces(
    total: u64,
    parts: u64,
    i: u64,
    piece_elems: u64,
) -> impl Iterator<Item = (u64, u64)> {
    let piece = split_share(total, parts).min(piece_elems).max(1);
    (0..)
        .map(move |k| (i + k * parts) * piece)
        .take_while(move |&lo| lo < total)
        .map(move |lo| (lo, (lo + piece).min(total)))
}

/// Bytes past a 16-byte boundary at which reduce-scatter's chunk `chunk`
/// (of `count` elements of `elem_bytes`) starts in the receive rows
/// (`row_skew` in `cuda/collectives.cu`): as far as the chunk starts past
/// one in the input, in place (the output lies skewed alike, so the sum
/// lines up) and on the put path where the chunk is not 8-byte aligned
/// (UCX's block copy would move single bytes; with offsets that miss a
/// boundary alike it moves 16-byte vectors past a head); 0 elsewhere, as an
/// out-of-place output is aligned. A multiple of `elem_bytes`; a row holds
/// `count` elements past it within its stride, which is at least twice the
/// chunk or 256 bytes.
pub fn row_skew(path: Path, in_place: bool, chunk: u32, count: u64, elem_bytes: u64) -> u64 {
    let skew = u64::from(chunk) * count * elem_bytes % 16;
    match in_place || (path == Path::Put && skew % 8 != 0) {
        true => skew,
        false => 0,
    }
}

/// `--piece-bytes` as elements of `elem_bytes` for the kernels: a
/// multiple of [`ALIGN_ELEMS`], at least one.
pub fn piece_elems(piece_bytes: u64, elem_bytes: u64) -> u64 {
    (piece_bytes / elem_bytes / ALIGN_ELEMS).max(1) * ALIGN_ELEMS
}

/// Round `v` up to a multiple of 256 bytes.
fn align256(v: u64) -> u64 {
    v.div_ceil(256) * 256
}

/// One rank's registered window, offsets in bytes; sized once for the
/// largest call of the run.
///
/// | region | size | written by |
/// |---|---|---|
/// | flags | [`FLAG_PHASES`] × [`MAX_BLOCKS`] × [`MAX_RANKS`] u64 | peers' signals |
/// | abort | [`MAX_RANKS`] u64 | peers abandoning a step (elastic runs) |
/// | in | the largest input | this rank |
/// | out\[2\] | the largest output, ×2 (call parity) | this rank; peers (allgather, two-shot) |
/// | recv\[2\] | ranks × `recv_stride`, ×2 (call parity) | peers |
/// | ll\[2\] | ranks × `ll_stride`, ×2 (call parity) | peers (LL lines) |
/// | ll128\[2\] | ranks × `ll128_stride`, ×2 (call parity) | peers (LL128 lines) |
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WindowLayout {
    pub flags: u64,
    pub abort: u64,
    pub input: u64,
    pub out: [u64; 2],
    pub recv: [u64; 2],
    /// Bytes per source row in a receive area.
    pub recv_stride: u64,
    pub ll: [u64; 2],
    /// Bytes per source row in an LL area: the lines of the largest LL call.
    pub ll_stride: u64,
    pub ll128: [u64; 2],
    /// Bytes per source row in an LL128 area: the lines of the largest
    /// LL128 call.
    pub ll128_stride: u64,
    pub bytes: u64,
}

impl WindowLayout {
    /// The window for calls whose buffers hold at most `max_bytes` (the
    /// whole buffer of nccl-tests' size) on `ranks` ranks, of which LL128
    /// calls at most `ll128_bytes` (0: the run has none, and the LL128 area
    /// takes no memory).
    pub fn new(max_bytes: u64, ll128_bytes: u64, ranks: u32) -> Self {
        let flags = 0;
        let flag_bytes = FLAG_PHASES * u64::from(MAX_BLOCKS) * u64::from(MAX_RANKS) * 8;
        let data = align256(max_bytes.max(16));
        let abort = flag_bytes;
        let input = align256(abort + u64::from(MAX_RANKS) * 8);
        let out0 = input + data;
        let out1 = out0 + data;
        let recv_stride = data;
        let recv_bytes = u64::from(ranks) * recv_stride;
        let recv0 = out1 + data;
        let recv1 = recv0 + recv_bytes;
        let ll_stride = align256(ll_bytes(max_bytes.min(LL_MAX_BYTES)));
        let ll0 = recv1 + recv_bytes;
        let ll1 = ll0 + u64::from(ranks) * ll_stride;
        let ll128_stride = align256(ll128_row_bytes(
            ll128_bytes.min(max_bytes).min(LL128_MAX_BYTES),
            ranks,
        ));
        let ll128_0 = ll1 + u64::from(ranks) * ll_stride;
        let ll128_1 = ll128_0 + u64::from(ranks) * ll128_stride;
        Self {
            flags,
            abort,
            input,
            out: [out0, out1],
            recv: [recv0, recv1],
            recv_stride,
            ll: [ll0, ll1],
            ll_stride,
            ll128: [ll128_0, ll128_1],
            ll128_stride,
            bytes: ll128_1 + u64::from(ranks) * ll128_stride,
        }
    }

    /// The receive area of call number `call` of `algo` (by call parity)
    /// and its bytes per source row: the LL or LL128 area for lines, else
    /// the receive rows.
    pub fn recv_area(&self, algo: Algo, call: u64) -> (u64, u64) {
        let parity = (call % 2) as usize;
        match algo {
            Algo::Ll => (self.ll[parity], self.ll_stride),
            Algo::Ll128 | Algo::TwoShotLl128 => (self.ll128[parity], self.ll128_stride),
            _ => (self.recv[parity], self.recv_stride),
        }
    }
}

/// Bytes an LL128 row for one source takes for calls of up to `bytes`:
/// one-shot's lines of the whole buffer, or two-shot's two halves of the
/// lines of the largest chunk (⌈bytes/ranks⌉ rounded up to
/// [`ALIGN_ELEMS`] elements of at most 4 bytes), whichever is larger.
pub fn ll128_row_bytes(bytes: u64, ranks: u32) -> u64 {
    if bytes == 0 {
        return 0;
    }
    let wire = |b| crate::gpu::ll::LL128.wire_bytes(b);
    let chunk = bytes.div_ceil(u64::from(ranks.max(1))) + ALIGN_ELEMS * 4;
    wire(bytes).max(2 * wire(chunk))
}

/// Bytes the LL lines of `bytes` of data take: 8 data bytes per line.
pub fn ll_bytes(bytes: u64) -> u64 {
    bytes.div_ceil(8) * LL_LINE_BYTES
}

/// The sweep's buffer sizes, nccl-tests' `-b/-e/-f`: `begin`, ×`factor`,
/// up to `end` inclusive.
pub fn sizes(begin: u64, end: u64, factor: u64) -> Result<Vec<u64>, UsageError> {
    if begin > end {
        return Err(UsageError(format!(
            "-b {} is larger than -e {}",
            fmt_bytes(begin),
            fmt_bytes(end)
        )));
    }
    if factor < 2 {
        return Err(UsageError("-f must be at least 2".into()));
    }
    let mut v = vec![begin];
    while let Some(next) = v.last().unwrap().checked_mul(factor).filter(|&n| n <= end) {
        v.push(next);
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_cover_everything_once_and_start_aligned() {
        for total in [0u64, 1, 2, 7, 8, 9, 100, 1000, 4097] {
            for parts in [1u64, 2, 3, 5, 44, 128] {
                let mut next = 0;
                for i in 0..parts {
                    let (lo, hi) = split(total, parts, i);
                    assert_eq!(lo, next.min(total), "total {total} parts {parts} i {i}");
                    assert!(lo <= hi && hi <= total);
                    assert!(lo == total || lo % ALIGN_ELEMS == 0);
                    next = hi;
                }
                assert_eq!(next, total, "total {total} parts {parts}");
            }
        }
        // Pieces: every element once, each piece within one block's deal.
        for total in [0u64, 1, 7, 8, 100, 1000, 4099] {
            for parts in [1u64, 2, 3, 7, 132] {
                for piece in [8u64, 16, 64, 1 << 20] {
                    let mut seen = vec![0u8; total as usize];
                    for i in 0..parts {
                        for (lo, hi) in pieces(total, parts, i, piece) {
                            assert!(lo < hi && hi <= total && lo % ALIGN_ELEMS == 0);
                            seen[lo as usize..hi as usize]
                                .iter_mut()
                                .for_each(|s| *s += 1);
                        }
                    }
                    assert!(seen.iter().all(|&s| s == 1), "{total} {parts} {piece}");
                }
            }
        }
        // Small shares are split's slices, one per block.
        assert_eq!(
            pieces(1000, 3, 1, 1 << 20).collect::<Vec<_>>(),
            vec![split(1000, 3, 1)]
        );
        assert_eq!(
            pieces(100, 2, 1, 16).collect::<Vec<_>>(),
            vec![(16, 32), (48, 64), (80, 96)]
        );
        assert_eq!(piece_elems(PIECE_BYTES, 4), 65536);
        assert_eq!(piece_elems(1, 2), ALIGN_ELEMS);
        assert_eq!(split(10, 3, 0), (0, 8));
        assert_eq!(split(10, 3, 1), (8, 10));
        assert_eq!(split(10, 3, 2), (10, 10));
    }

    #[test]
    fn an_ll128_row_holds_two_shots_halves() {
        // The kernel's second half starts after the largest chunk's lines.
        let wire = |b| crate::gpu::ll::LL128.wire_bytes(b);
        for ranks in 2..=MAX_RANKS {
            for e in [2u64, 4] {
                for count in (1..5000).step_by(37).chain([1 << 20, (4 << 20) / e]) {
                    let chunk = split(count, u64::from(ranks), 0).1 * e;
                    let row = ll128_row_bytes(count * e, ranks);
                    assert!(
                        row >= 2 * wire(chunk) && row >= wire(count * e),
                        "{ranks} {e} {count}"
                    );
                }
            }
        }
    }

    #[test]
    fn sizes_follow_nccl_tests() {
        assert_eq!(sizes(8, 64, 2).unwrap(), vec![8, 16, 32, 64]);
        assert_eq!(sizes(8, 100, 4).unwrap(), vec![8, 32]);
        assert!(sizes(64, 8, 2).is_err() && sizes(8, 64, 1).is_err());
    }

    #[test]
    fn window_regions_do_not_overlap() {
        let w = WindowLayout::new(1000, 1000, 3);
        assert!(w.input >= 2 * 128 * 16 * 8);
        assert_eq!(w.out[0], w.input + 1024);
        assert_eq!(w.recv[1], w.recv[0] + 3 * 1024);
        assert_eq!(w.ll[0], w.recv[1] + 3 * 1024);
        assert_eq!(w.ll_stride, 2048); // 1000 B in 125 lines of 16 B, rounded to 256
        assert_eq!(w.ll128[0], w.ll[1] + 3 * 2048);
        assert_eq!(w.ll128_stride, 1280); // 1000 B in 9 lines of 128 B, rounded to 256
        assert_eq!(w.bytes, w.ll128[1] + 3 * 1280);
        assert_eq!(
            WindowLayout::new(1 << 30, 0, 2).ll_stride,
            ll_bytes(LL_MAX_BYTES)
        );
        assert_eq!(w.recv_area(Algo::Ll, 3), (w.ll[1], w.ll_stride));
        assert_eq!(w.recv_area(Algo::Ll128, 4), (w.ll128[0], w.ll128_stride));
        // A run without LL128 calls reserves nothing for them.
        assert_eq!(WindowLayout::new(1 << 30, 0, 2).ll128_stride, 0);
        // 4 MiB in 34,953 lines of 128 B; on 2 ranks two-shot's halves of
        // the largest chunk (2 MiB + 32 B bound) take one line more.
        assert_eq!(
            WindowLayout::new(1 << 30, 1 << 30, 4).ll128_stride,
            (34953 * 128u64).div_ceil(256) * 256
        );
        assert_eq!(
            WindowLayout::new(1 << 30, 1 << 30, 2).ll128_stride,
            (2 * 17477 * 128u64).div_ceil(256) * 256
        );
        assert_eq!(w.recv_area(Algo::TwoShot, 2), (w.recv[0], w.recv_stride));
    }
}
