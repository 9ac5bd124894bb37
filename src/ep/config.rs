//! What one MoE step looks like: modes, shapes, their limits, and the
//! memory every rank lays out the same way.
//!
//! All ranks parse the same command line; rank 0 publishes its
//! [`RunConfig`] and every other rank refuses to run with a different one,
//! so a mixed-up launch fails at once instead of hanging on a mismatched
//! buffer size.

use serde::{Deserialize, Serialize};

use crate::cli::UsageError;
use crate::ranks::membership::OnDeath;

/// DeepEP's two kinds of kernels, here as two shapes of one pipeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// High-throughput ("normal" in DeepEP): 4096 tokens per rank by default,
    /// a grid sized for bandwidth, one message per (token, destination rank).
    Ht,
    /// Low-latency: 128 tokens per rank by default, each token split over
    /// several warps so every SM has work; the same messages (see docs/EP.md
    /// for why this mode also sends each token once per rank).
    Ll,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Ht => "ht",
            Mode::Ll => "ll",
        }
    }

    /// Default (tokens, hidden, top-k, experts): DeepEP's benchmark shapes
    /// (DeepSeek-V3: hidden 7168, 256 routed experts, top-8).
    pub fn default_shape(self) -> (u32, u32, u32, u32) {
        match self {
            Mode::Ht => (4096, 7168, 8, 256),
            Mode::Ll => (128, 7168, 8, 256),
        }
    }

    /// Default (timed iterations, warm-up iterations).
    pub fn default_iters(self) -> (u32, u32) {
        match self {
            Mode::Ht => (50, 5),
            Mode::Ll => (200, 20),
        }
    }
}

/// How tokens pick their experts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum RoutingKind {
    /// Every expert equally likely.
    Uniform,
    /// Zipf over expert ids (probability ∝ 1/(e+1)): low-numbered experts,
    /// and so rank 0, receive most tokens.
    Skewed,
}

impl RoutingKind {
    /// The name `--routing` takes.
    pub fn name(self) -> &'static str {
        match self {
            RoutingKind::Uniform => "uniform",
            RoutingKind::Skewed => "skewed",
        }
    }
}

pub use crate::gpu::path::{Path, PathChoice};

/// The data paths ep implements (`EP_PATH_*` in `cuda/ep_common.cuh`);
/// `--path ll` is refused ([`crate::gpu::path::refuse_missing`]).
pub const PATHS: [Path; 2] = [Path::Put, Path::Store];

/// Most ranks one run may have (each block signals every rank; the wait
/// thread walks them in turn).
pub const MAX_RANKS: u32 = 64;
const _: () = assert!(MAX_RANKS <= crate::ranks::plan::MAX_CAPACITY);
/// Most experts a token may pick (the message's metadata holds them all).
pub const MAX_TOPK: u32 = 32;
/// Most tokens per rank.
pub const MAX_TOKENS: u32 = 1 << 20;
/// Largest hidden size.
pub const MAX_HIDDEN: u32 = 1 << 16;

/// The problem each rank holds: `tokens` tokens of `hidden` bf16 values,
/// each routed to `topk` of `experts` experts, `experts / ranks` per rank
/// (expert `e` lives on rank `e / local_experts`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shape {
    pub tokens: u32,
    pub hidden: u32,
    pub topk: u32,
    pub experts: u32,
    pub ranks: u32,
}

impl Shape {
    /// Checks the shape and the iteration count (the 64-bit counters keep a
    /// running token count in their low 32 bits). Errors are usage errors
    /// (exit 2) that name the fix.
    pub fn validate(&self, total_iterations: u64) -> Result<(), UsageError> {
        let u = |m: String| Err(UsageError(m));
        let Shape {
            tokens: t,
            hidden: h,
            topk: k,
            experts: e,
            ranks: n,
        } = *self;
        if n == 0 || n > MAX_RANKS {
            return u(format!(
                "{n} ranks: between 1 and {MAX_RANKS} are supported"
            ));
        }
        if t == 0 || t > MAX_TOKENS {
            return u(format!(
                "--tokens {t}: each rank needs between 1 and {MAX_TOKENS} tokens"
            ));
        }
        if h == 0 || h % 8 != 0 || h > MAX_HIDDEN {
            return u(format!(
                "--hidden {h}: must be a positive multiple of 8 (tokens move as 16-byte vectors of bf16) and at most {MAX_HIDDEN}"
            ));
        }
        if e == 0 || e % n != 0 {
            return u(format!(
                "--experts {e} is not divisible by the {n} ranks: every rank hosts experts/ranks experts; pick a multiple of {n}"
            ));
        }
        if k == 0 || k > e {
            return u(format!(
                "--topk {k}: each token picks between 1 and --experts ({e}) distinct experts"
            ));
        }
        if k > MAX_TOPK {
            return u(format!(
                "--topk {k}: at most {MAX_TOPK} experts per token are supported"
            ));
        }
        if u64::from(t) * total_iterations >= 1 << 31 {
            return u(format!(
                "--tokens {t} × {total_iterations} iterations: the completion counters count tokens in 31 bits; use fewer iterations"
            ));
        }
        Ok(())
    }

    /// Experts hosted by each rank.
    pub fn local_experts(&self) -> u32 {
        self.experts / self.ranks
    }

    /// The rank hosting expert `e`.
    pub fn rank_of(&self, expert: u32) -> u32 {
        expert / self.local_experts()
    }

    /// Bytes of one token's activations (bf16): what DeepEP counts per copy.
    pub fn token_bytes(&self) -> u64 {
        2 * u64::from(self.hidden)
    }

    /// Slots per combine flag: an expert rank signals its contributions to
    /// an origin in batches of this many tokens, so the origin can add them
    /// up while the rest is still arriving: the smallest power of two whose
    /// rows hold at least 112 KiB, from 2 to 16 (8 for 7168 values). Below
    /// 512 tokens one batch holds them all, and every block of the grid
    /// copies a share and signals once (cuda/ep.cu, `send_outputs_all`):
    /// with so few tokens the batches were too small to keep the grid busy
    /// and their fences ran one after another.
    ///
    /// Measured on two H200s at EP2 (2026-11-28): smaller batches let the
    /// reduction follow the data closer, but each costs its sender warps a
    /// sync and a release (the put path a fence and an atomic): 4 096 tokens
    /// of 7 168 values combined in 179 µs with 8 slots (store path; put
    /// 187), 186 (192) with 16, 178 (204) with 4; 3 001, 600 and 1 500
    /// tokens (the last of 2 056 values) were fastest with this rule too. A
    /// count of batches the grid's blocks share unevenly costs most: 14
    /// slots for 4 096 values made 293 batches, 3 on some of the 132 blocks
    /// and 2 on the rest (114 µs against 108 with 8 slots and 109 with 16).
    pub fn combine_batch(&self) -> u32 {
        if self.tokens < 512 {
            return self.tokens.max(1);
        }
        let rows = (112 * 1024u64).div_ceil(self.token_bytes()).max(1);
        (rows.next_power_of_two() as u32).clamp(2, 16)
    }

    /// Pieces one token's reduction is claimed in by the high-throughput
    /// combine's warps: at most four passes of the kernel's loads each (a
    /// pass: 32 lanes × 4 vectors of 16 bytes, cuda/ep.cu `reduce_token`),
    /// 2 for 7168 values. The last tokens to arrive are then added by two
    /// warps each; smaller pieces cost more than they gave on the store
    /// path (a claim and a wait each): on two H200s at EP2 (2026-11-28),
    /// 2 pieces made its combine 2 % faster than whole tokens, 7 one-pass
    /// pieces 3 % slower; the put path was 2 % faster with 2 pieces.
    pub fn combine_pieces(&self) -> u32 {
        (self.hidden / 8).div_ceil(4 * 32 * 4).max(1)
    }

    /// Flags per expert rank: ⌈tokens / combine_batch⌉.
    pub fn combine_batches(&self) -> u32 {
        self.tokens.div_ceil(self.combine_batch())
    }

    /// Bytes of one token's metadata record (see [`meta_record`]): a
    /// 16-byte header, then `topk` expert ids and `topk` weights, rounded up
    /// to 16 bytes so records stay vector-aligned.
    pub fn meta_bytes(&self) -> u64 {
        (16 + 8 * u64::from(self.topk)).div_ceil(16) * 16
    }
}

/// The metadata record of one token, as it travels beside the activations:
/// `[u32 source token, u32 source rank, u32 top-k, u32 0]`, `topk` × i32
/// global expert ids, `topk` × f32 gate weights, zero padding.
pub fn meta_record(
    shape: &Shape,
    src_rank: u32,
    token: u32,
    experts: &[u32],
    weights: &[f32],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(shape.meta_bytes() as usize);
    for w in [token, src_rank, shape.topk, 0] {
        out.extend_from_slice(&w.to_le_bytes());
    }
    for e in experts {
        out.extend_from_slice(&e.to_le_bytes());
    }
    for w in weights {
        out.extend_from_slice(&w.to_le_bytes());
    }
    out.resize(shape.meta_bytes() as usize, 0);
    out
}

/// Everything that must be equal on every rank for a run to make sense.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunConfig {
    pub mode: Mode,
    pub shape: Shape,
    pub routing: RoutingKind,
    pub paths: Vec<Path>,
    pub iters: u32,
    pub warmup: u32,
    pub seed: u64,
    /// GPU-side timeout of every wait, ns.
    pub timeout_ns: u64,
    /// How long a wait for another rank's data may take before that rank
    /// is masked as failed (`--fault-timeout`, elastic runs), ns.
    #[serde(default = "default_fault_timeout_ns")]
    pub fault_timeout_ns: u64,
    /// Thread blocks per phase kernel, when given (`--blocks`).
    pub blocks: Option<u32>,
    /// Run the NCCL all-to-all baseline (unless ranks share GPUs).
    pub baseline: bool,
    /// High-throughput combine: warps per block that send while the others
    /// reduce (`--combine-senders`, hidden, for measuring; default
    /// [`combine_senders`]).
    #[serde(default)]
    pub combine_senders: Option<u32>,
    /// Run every path's steps a second time replayed from a CUDA graph
    /// captured once per phase and path (`--graph`), beside the stream
    /// launches.
    #[serde(default)]
    pub graph: bool,
    /// What a rank's death does: the survivors mask it and go on (elastic
    /// runs: `--plan`, `--elastic`), or the run stops naming it.
    #[serde(default)]
    pub on_death: OnDeath,
}

pub use crate::ranks::membership::DEFAULT_FAULT_TIMEOUT_NS;

fn default_fault_timeout_ns() -> u64 {
    DEFAULT_FAULT_TIMEOUT_NS
}

/// Warps of a high-throughput combine block that send batches before they
/// reduce (cuda/ep.cu, `ep_combine`; `--combine-senders` overrides it):
/// warps 1 ..= this send, warp 0 raises each batch's flag, the others
/// reduce tokens from the start, as their batches arrive. Across GPUs the
/// sends are bound by the link, and few senders keep it almost as busy as
/// all 16: on two H200s at EP2 (2026-11-28, 16 slots a batch), the store
/// path's combine took 189 µs with 4 senders against 202 with 16, its
/// sends alone 170 against 167; the put path's, bound by the warps issuing
/// nixlPut, was fastest with 8 (198-200 against 203); with warp 0 raising
/// the flags and 8-slot batches, 3 and 5 senders (store) and 7 and 10 (put)
/// were slower than 4 and 8. Ranks sharing a GPU send with every warp but
/// the flag's (15): there sends and reduction draw on the same HBM, and on
/// one H100 under MPS every split measured slower than all 16 sending
/// (store path 245 µs with 16, 247-251 with 8-14; put path 268 against
/// 280-292); 15 and warp 0 beat all 16 sending (4 ranks on two H200s
/// under MPS: put 707 -> 663 µs, store 609 -> 606).
pub fn combine_senders(path: Path, shared_gpu: bool) -> u32 {
    match (shared_gpu, path) {
        (true, _) => 15,
        (false, Path::Store) => 4,
        (false, _) => 8,
    }
}

impl RunConfig {
    /// Iterations of every path together, warm-up included: how far the
    /// counters advance in one run.
    pub fn total_iterations(&self) -> u64 {
        self.runs().len() as u64 * u64::from(self.iters + self.warmup)
    }

    /// The runs of steps of one phase, in order: every path launched on the
    /// stream and, with `--graph`, replayed from a CUDA graph after it.
    pub fn runs(&self) -> Vec<(Path, bool)> {
        let graphs: &[bool] = if self.graph { &[false, true] } else { &[false] };
        (self.paths.iter())
            .flat_map(|&p| graphs.iter().map(move |&g| (p, g)))
            .collect()
    }
}

/// Where each buffer sits in a rank's registered window. Every rank uses
/// the same layout, so a sender computes offsets in the peer's window from
/// its own. All offsets are multiples of 256 bytes.
///
/// Peers write only the first four regions; the last three are this rank's
/// sources (registered too, because `nixlPut` copies from a local view).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct WindowLayout {
    /// `ranks` × u64: dispatch completion counter per source rank.
    pub dispatch_count: u64,
    /// `[ranks][combine_batches]` × u64: one flag per batch of
    /// [`Shape::combine_batch`] slots of each expert rank's contributions.
    pub combine_flags: u64,
    /// `ranks` × u64: barrier arrivals per source rank.
    pub barrier: u64,
    /// `[ranks][tokens][hidden]` bf16: dispatched activations by source, slot.
    pub recv_x: u64,
    /// `[ranks][tokens][meta]`: their metadata records.
    pub recv_meta: u64,
    /// `[ranks][tokens][hidden]` bf16: combine contributions by expert rank, slot.
    pub combine_recv: u64,
    /// `[tokens][hidden]` bf16: this rank's activations (the dispatch input).
    pub x: u64,
    /// `[tokens][meta]`: this rank's metadata records.
    pub meta: u64,
    /// `[ranks][tokens][hidden]` bf16: expert outputs to send back, by source, slot.
    pub y: u64,
    /// Total bytes.
    pub bytes: u64,
}

fn align256(v: u64) -> u64 {
    v.div_ceil(256) * 256
}

impl WindowLayout {
    pub fn new(s: &Shape) -> Self {
        let n = u64::from(s.ranks);
        let t = u64::from(s.tokens);
        let rows = n * t * s.token_bytes();
        let mut at = 0u64;
        let mut take = |len: u64| {
            let here = at;
            at = align256(at + len);
            here
        };
        let dispatch_count = take(8 * n);
        let combine_flags = take(8 * n * u64::from(s.combine_batches()));
        let barrier = take(8 * n);
        let recv_x = take(rows);
        let recv_meta = take(n * t * s.meta_bytes());
        let combine_recv = take(rows);
        let x = take(t * s.token_bytes());
        let meta = take(t * s.meta_bytes());
        let y = take(rows);
        Self {
            dispatch_count,
            combine_flags,
            barrier,
            recv_x,
            recv_meta,
            combine_recv,
            x,
            meta,
            y,
            bytes: at,
        }
    }
}

/// The launch shape of the phase kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grid {
    pub blocks: u32,
    pub threads: u32,
    /// Chunks each token's copy is cut into; one warp copies one chunk.
    pub chunks: u32,
    /// Bytes per chunk (a multiple of 16; the last chunk may be shorter).
    pub chunk_bytes: u32,
    /// Every rank runs on this rank's GPU: a GPU-scope release orders the
    /// data before a signal for every observer (they all use this GPU's
    /// memory system). Otherwise a peer observes through the link, and only
    /// a system-scope release does.
    pub gpu_scope: bool,
    /// Another rank runs on this GPU too (under MPS): the combine's sends
    /// and reduction share its HBM ([`combine_senders`]).
    #[serde(default)]
    pub shared: bool,
}

/// Threads per block of the phase kernels: 16 warps.
pub const THREADS: u32 = 512;

impl Grid {
    /// The grid for `shape` on a GPU with `sm_count` SMs shared by
    /// `ranks_per_gpu` ranks: one block per SM of this rank's share, so
    /// ranks sharing a GPU under MPS leave each other SMs (a spinning kernel
    /// that takes every SM can starve the peer's), and all blocks are
    /// resident at once (the combine kernel's blocks wait for each other).
    /// `sends` is how many (token, destination) copies one phase makes;
    /// tokens are cut into as many chunks as keeps every warp at one chunk
    /// at most (two chunks on some warps made the slowest warp copy twice
    /// as long), but never below 512 bytes (one 16-byte vector per lane).
    /// `ranks_per_gpu` equal to the shape's ranks means all ranks share this
    /// GPU (`make_setup` checked that the ranks' own counts agree with their
    /// GPUs' UUIDs), and the releases may be GPU-scope.
    pub fn new(
        shape: &Shape,
        sm_count: u32,
        ranks_per_gpu: u32,
        blocks: Option<u32>,
        sends: u64,
    ) -> Self {
        let blocks = blocks.unwrap_or((sm_count / ranks_per_gpu.max(1)).max(1));
        let warps = u64::from(blocks) * u64::from(THREADS / 32);
        let row = shape.token_bytes();
        let max_chunks = (row / 512).max(1);
        let chunks = (warps / sends.max(1)).clamp(1, max_chunks);
        let chunk_bytes = row.div_ceil(chunks).div_ceil(16) * 16;
        Self {
            blocks,
            threads: THREADS,
            chunks: row.div_ceil(chunk_bytes) as u32,
            chunk_bytes: chunk_bytes as u32,
            gpu_scope: ranks_per_gpu >= shape.ranks,
            shared: ranks_per_gpu > 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(t: u32, h: u32, k: u32, e: u32, n: u32) -> Shape {
        Shape {
            tokens: t,
            hidden: h,
            topk: k,
            experts: e,
            ranks: n,
        }
    }

    #[test]
    fn bad_shapes_are_usage_errors_naming_the_fix() {
        for (s, needle) in [
            (shape(4096, 7168, 8, 255, 2), "not divisible"),
            (shape(4096, 7168, 9, 8, 2), "distinct experts"),
            (shape(4096, 7168, 0, 8, 2), "between 1"),
            (shape(0, 7168, 8, 256, 2), "--tokens 0"),
            (shape(16, 7001, 8, 256, 2), "multiple of 8"),
            (shape(16, 64, 33, 64, 2), "at most 32"),
        ] {
            let err = s.validate(10).unwrap_err().0;
            assert!(err.contains(needle), "{s:?}: {err}");
        }
        assert!(shape(4096, 7168, 8, 256, 2).validate(100).is_ok());
        assert!(shape(1 << 20, 8, 1, 2, 2).validate(4096).is_err());
    }

    #[test]
    fn window_regions_are_aligned_and_disjoint() {
        let s = shape(100, 7168, 8, 256, 3);
        let w = WindowLayout::new(&s);
        let rows = 3 * 100 * 14336;
        let regions = [
            (w.dispatch_count, 24),
            (w.combine_flags, 8 * 3),
            (w.barrier, 24),
            (w.recv_x, rows),
            (w.recv_meta, 3 * 100 * 80),
            (w.combine_recv, rows),
            (w.x, 100 * 14336),
            (w.meta, 100 * 80),
            (w.y, rows),
        ];
        for pair in regions.windows(2) {
            assert_eq!(pair[0].0 % 256, 0);
            assert!(pair[0].0 + pair[0].1 <= pair[1].0);
        }
        assert!(w.y + rows <= w.bytes);
        assert_eq!(s.meta_bytes(), 80);
    }

    #[test]
    fn combine_batches_hold_112_kib_and_tokens_are_reduced_in_pieces() {
        let g = |t, h| shape(t, h, 8, 256, 2).combine_batch();
        assert_eq!(g(4096, 7168), 8, "8 rows of 14 KiB");
        assert_eq!(g(600, 7168), 8);
        assert_eq!(g(4096, 4096), 16, "14 rows of 8 KiB, up to a power of two");
        assert_eq!(g(1500, 2056), 16, "at most 16");
        assert_eq!(g(100, 7168), 100, "below 512 tokens, one batch");
        let p = |h| shape(4096, h, 8, 256, 2).combine_pieces();
        assert_eq!((p(7168), p(4096), p(2056), p(8)), (2, 1, 1, 1));
    }

    #[test]
    fn grids_leave_sms_to_ranks_sharing_a_gpu_and_split_small_batches() {
        let ll = shape(128, 7168, 8, 256, 2);
        let g = Grid::new(&ll, 132, 1, None, 256);
        assert_eq!(g.blocks, 132);
        assert!(g.chunks > 1 && g.chunk_bytes % 16 == 0);
        assert!(u64::from(g.chunks) * u64::from(g.chunk_bytes) >= ll.token_bytes());
        assert!(
            !g.gpu_scope,
            "one rank of two on this GPU: the peer is elsewhere"
        );
        let shared = Grid::new(&ll, 132, 2, None, 256);
        assert_eq!(shared.blocks, 66);
        assert!(shared.gpu_scope, "both ranks on this GPU");
        // At most one chunk per warp: 66 × 16 warps over 256 copies is 4
        // chunks (1024 units), not 5 (1280, two on some warps).
        assert_eq!((shared.chunks, shared.chunk_bytes), (4, 3584));
        let ht = shape(4096, 7168, 8, 256, 2);
        assert_eq!(Grid::new(&ht, 132, 1, None, 8192).chunks, 1);
        let tiny = shape(1, 8, 1, 2, 2);
        let g = Grid::new(&tiny, 132, 1, None, 1);
        assert_eq!((g.chunks, g.chunk_bytes), (1, 16));
    }
}
