//! `simple_write`'s kernels (`cuda/kernels.cu`) on the host: the levels,
//! data paths, fence scopes and ways of waiting they offer, their parameter
//! structs (mirrored field for field, layout pinned by const assertions here
//! and `static_assert`s there), how a buffer is split among the groups, and
//! typed launchers. What every program's kernels share (memory view
//! elements, the report, the view check) is in [`crate::gpu::kernels`].

use std::mem::{offset_of, size_of};
use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaStream, DeviceRepr, DriverError, LaunchConfig,
    PushKernelArg,
};

use crate::gpu::Gpu;
use crate::gpu::launch::{grid, launch};
use crate::gpu::module::{Fatbin, KernelsError, load};
use crate::nixl::view::MemViewElem;

pub use crate::gpu::level::Level;
pub use crate::gpu::path::Path;

/// The write kernel of `level` on `path` in `cuda/kernels.cu`.
fn write_kernel(level: Level, path: WritePath) -> &'static str {
    let WritePath::Data(path) = path else {
        return "nixl_flag_write";
    };
    match (path, level) {
        (Path::Ll, Level::Thread) => "nixl_ll_write_thread",
        (Path::Ll, Level::Warp) => "nixl_ll_write_warp",
        (Path::Ll, Level::Block) => "nixl_ll_write_block",
        (Path::Ll128, Level::Thread) => "nixl_ll128_write_thread",
        (Path::Ll128, Level::Warp) => "nixl_ll128_write_warp",
        (Path::Ll128, Level::Block) => "nixl_ll128_write_block",
        (Path::Put, Level::Thread) => "nixl_write_signal_thread",
        (Path::Put, Level::Warp) => "nixl_write_signal_warp",
        (Path::Put, Level::Block) => "nixl_write_signal_block",
        (Path::Store, Level::Thread) => "nixl_store_signal_thread",
        (Path::Store, Level::Warp) => "nixl_store_signal_warp",
        (Path::Store, Level::Block) => "nixl_store_signal_block",
    }
}

/// Parameters of the initiator's write + signal kernels (`WriteParams`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct WriteParams {
    /// Local view of the two source buffers (index = iteration parity).
    pub src: MemViewElem,
    /// Remote view of the target's data buffer.
    pub dst: MemViewElem,
    /// Remote view of the target's 8-byte signal.
    pub signal: MemViewElem,
    /// Device address of the local 8-byte ack word the target increments.
    pub ack: u64,
    /// Device address of a zeroed [`KernelReport`](crate::gpu::kernels::KernelReport).
    pub report: u64,
    /// Ping-pong only: device address of `iters + 2` u64 slots: each round
    /// trip in SM cycles, then `clock64` at the start and end of the timed
    /// iterations (for calibration against the report's globaltimer stamps).
    pub iter_cycles: u64,
    /// Bytes per iteration.
    pub size: u64,
    /// Bytes per group (see [`slice_for`]).
    pub slice: u64,
    /// Ack value before this launch.
    pub ack_base: u64,
    /// GPU-side timeout for each wait, ns.
    pub timeout_ns: u64,
    pub warmup: u32,
    pub iters: u32,
    /// Global index of the first iteration (its parity picks the source).
    pub first_iter: u32,
    /// [`WRITE_PINGPONG`], [`WRITE_HOST_SEQUENCED`], [`WRITE_STAMP`].
    pub flags: u32,
    /// With [`WRITE_STAMP`]: the `iter_cycles` slot that gets the kernel's
    /// start time (`%globaltimer`, ns).
    pub stamp_index: u32,
    /// `--hbm` kernels: iteration `i` (global) reads and writes slot
    /// `i % slots` of the sources and the destination, `slot_bytes` apart
    /// ([`crate::simple_write::plan::Round::slots`]); 0 or 1 elsewhere.
    pub slots: u32,
    /// Store path: device addresses of the two sources (local pointers).
    pub src_addr: [u64; 2],
    /// 0: each group moves one contiguous slice; else chunks of this many
    /// bytes dealt round-robin to the groups ([`signals_per_iter`]).
    pub chunk: u64,
    /// Flag path: iteration `i` (global index) stores `signal_base + i + 1`
    /// into the target's signal (wrapping arithmetic).
    pub signal_base: u64,
    /// Ping-pong with `--breakdown`: device address of `4 × iters` u64
    /// slots, per timed iteration `clock64` at the message's first
    /// instruction, its data issued, its fence returned and its signal
    /// issued ([`crate::simple_write::initiator_role::rounds::Breakdown`]);
    /// 0: not recorded.
    pub phase_cycles: u64,
    /// `--hbm` kernels: bytes from one slot to the next.
    pub slot_bytes: u64,
}

/// Wait for the target's acknowledgement after every iteration (latency).
pub const WRITE_PINGPONG: u32 = 1;
/// Never spin on the acknowledgement: the host queues stream waits between
/// launches (see [`WaitMode::Stream`]).
pub const WRITE_HOST_SEQUENCED: u32 = 2;
/// Record the kernel's start time in `iter_cycles[stamp_index]`.
pub const WRITE_STAMP: u32 = 4;
/// Release the data before the signal at GPU scope, not system scope:
/// enough when both processes use the same GPU ([`FenceScope`]).
pub const WRITE_GPU_SCOPE: u32 = 8;

/// The scope of the release that orders a put's data before its signal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FenceScope {
    /// GPU scope when both processes use the same GPU, else system scope.
    Auto,
    /// `fence.acq_rel.sys` / `red.release.sys`: required across GPUs (the
    /// peer observes our stores through the link, outside our GPU).
    System,
    /// `fence.acq_rel.gpu` / `red.release.gpu`: orders stores for every
    /// observer on this GPU, so only correct when the target shares it.
    Gpu,
}

impl FenceScope {
    /// Every scope, as `--fence-scope` offers them.
    pub const ALL: [FenceScope; 3] = [FenceScope::Auto, FenceScope::System, FenceScope::Gpu];

    /// Lower-case name, as on the command line.
    pub fn name(self) -> &'static str {
        match self {
            FenceScope::Auto => "auto",
            FenceScope::System => "system",
            FenceScope::Gpu => "gpu",
        }
    }

    /// Resolves `Auto` for a pair of processes.
    pub fn resolve(self, same_gpu: bool) -> FenceScope {
        match self {
            FenceScope::Auto if same_gpu => FenceScope::Gpu,
            FenceScope::Auto => FenceScope::System,
            s => s,
        }
    }
}

impl std::str::FromStr for FenceScope {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        FenceScope::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| format!("unknown fence scope '{s}' (auto, system, gpu)"))
    }
}

/// How a side waits for the other's signal or acknowledgement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitMode {
    /// A kernel spins on the word with system-scope acquire loads (the
    /// device-API pattern; right when the two processes use different GPUs).
    Kernel,
    /// The stream waits (`cuStreamWaitValue64`), then a one-thread kernel
    /// acknowledges or stamps: nothing occupies the GPU while waiting, which
    /// matters when both processes share one GPU (their kernels cannot run
    /// at the same time, so a spinning kernel holds the GPU for whole time
    /// slices).
    Stream,
    /// Stream when both processes use the same GPU, else kernel.
    Auto,
}

impl WaitMode {
    /// Resolves `Auto`: a stream wait when both processes share a GPU
    /// without MPS (their kernels cannot run at the same time), else a
    /// spinning kernel (different GPUs, or MPS running both at once).
    pub fn resolve(self, same_gpu: bool, mps: bool) -> WaitMode {
        match self {
            WaitMode::Auto if same_gpu && !mps => WaitMode::Stream,
            WaitMode::Auto => WaitMode::Kernel,
            m => m,
        }
    }

    /// Every mode, as `--wait` offers them.
    pub const ALL: [WaitMode; 3] = [WaitMode::Kernel, WaitMode::Stream, WaitMode::Auto];

    /// How the waiting is done, for messages.
    pub fn describe(self) -> &'static str {
        match self {
            WaitMode::Kernel => "spinning kernel",
            WaitMode::Stream => "stream wait (cuStreamWaitValue64)",
            WaitMode::Auto => "kernel or stream wait, decided per pair of GPUs",
        }
    }

    /// Lower-case name, as on the command line.
    pub fn name(self) -> &'static str {
        match self {
            WaitMode::Kernel => "kernel",
            WaitMode::Stream => "stream",
            WaitMode::Auto => "auto",
        }
    }
}

impl clap::ValueEnum for WaitMode {
    fn value_variants<'a>() -> &'a [Self] {
        &Self::ALL
    }
    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        let help = match self {
            WaitMode::Kernel => {
                "a kernel spins on the word (the device-API pattern; different GPUs, or MPS)"
            }
            WaitMode::Stream => {
                "cuStreamWaitValue64, then a one-thread kernel: leaves the GPU free while waiting"
            }
            WaitMode::Auto => "stream when both processes share a GPU without MPS, else kernel",
        };
        Some(clap::builder::PossibleValue::new(self.name()).help(help))
    }
}

/// Parameters of the target's wait kernel (`WaitParams`). Iteration `i` of
/// a round is complete when the signal reaches `base + (i + 1) * step`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct WaitParams {
    /// Remote view of the initiator's ack word.
    pub ack: MemViewElem,
    /// Device address of the local signal word.
    pub signal: u64,
    /// Device address of a zeroed [`KernelReport`](crate::gpu::kernels::KernelReport).
    pub report: u64,
    /// Device address of `iters` u64 slots for the globaltimer at which each
    /// timed iteration completed, or 0.
    pub iter_ns: u64,
    /// Signal value before the round.
    pub base: u64,
    /// Signals per iteration.
    pub step: u64,
    /// GPU-side timeout, ns.
    pub timeout_ns: u64,
    pub warmup: u32,
    pub iters: u32,
    /// 1: acknowledge every iteration (ping-pong).
    pub pong: u32,
    /// How the acknowledgement travels ([`AckMode`] as u32).
    pub ack_mode: u32,
    /// The initiator's ack word before this round (the flag stores
    /// `ack_base + n` for the round's n-th acknowledgement).
    pub ack_base: u64,
    /// LL and LL128 paths: device address of our data buffer, read as
    /// lines (16 or 128 bytes).
    pub lines: u64,
    /// LL and LL128 paths: lines per iteration ([`crate::gpu::ll::Format::lines`]).
    pub line_count: u64,
    /// LL and LL128 paths: sequence number of the round's first iteration (≥ 1).
    pub first_seq: u32,
    pub reserved: u32,
    /// LL128 bandwidth rounds over a grid: device address of two zeroed
    /// u32, the blocks past the warm-up's wait and the round's end (the
    /// last one acknowledges and stamps); 0 with one block.
    pub done: u64,
}

/// How the target acknowledges (`ACK_*` in kernels.cu). An acknowledgement
/// carries no data, so it needs no release: a bare flag (a relaxed store of
/// the new count through the peer pointer) is the cheapest answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum AckMode {
    /// The flag where the transport maps the initiator's memory (cuda_ipc),
    /// else `nixlAtomicAdd(+1)` (RDMA): the put path, which runs anywhere.
    FlagOrNixl = 0,
    /// The flag; the peer pointer must exist (store, LL, LL128 and flag paths).
    Flag = 2,
}

impl AckMode {
    /// The acknowledgement a round on `path` uses.
    pub fn of(path: WritePath) -> Self {
        match path {
            WritePath::Data(Path::Put) => AckMode::FlagOrNixl,
            WritePath::Data(Path::Store | Path::Ll | Path::Ll128) | WritePath::Flag => {
                AckMode::Flag
            }
        }
    }
}

// The layout contract with kernels.cu; a mismatch fails the build.
const _: () = {
    assert!(size_of::<WriteParams>() == 200);
    assert!(offset_of!(WriteParams, phase_cycles) == 184);
    assert!(offset_of!(WriteParams, slot_bytes) == 192);
    assert!(offset_of!(WriteParams, ack) == 72 && offset_of!(WriteParams, warmup) == 128);
    assert!(offset_of!(WriteParams, src_addr) == 152);
    assert!(offset_of!(WriteParams, signal_base) == 176);
    assert!(size_of::<WaitParams>() == 128);
    assert!(offset_of!(WaitParams, ack_base) == 88 && offset_of!(WaitParams, first_seq) == 112);
};

// SAFETY: plain #[repr(C)] data whose layout matches the kernel parameters.
unsafe impl DeviceRepr for WriteParams {}
unsafe impl DeviceRepr for WaitParams {}

/// Bytes each of `groups` groups puts so that `size` bytes are covered:
/// an even split rounded up to 16 bytes, so every slice but the last starts
/// 16-byte aligned and the put takes its vectorised path.
pub fn slice_for(size: u64, groups: u64) -> u64 {
    let even = size.div_ceil(groups.max(1));
    even.div_ceil(16) * 16
}

/// Groups that actually receive a slice (each sends one signal per iteration).
pub fn active_groups(size: u64, slice: u64) -> u64 {
    size.div_ceil(slice.max(1))
}

/// Signals per iteration: one per group with data. Contiguous layout
/// (`chunk` 0): the groups with a slice of [`slice_for`]. Interleaved:
/// chunks of `chunk` bytes dealt round-robin, so every group with at least
/// one chunk.
pub fn signals_per_iter(size: u64, groups: u64, chunk: u64) -> u64 {
    match chunk {
        0 => active_groups(size, slice_for(size, groups)),
        c => groups.min(size.div_ceil(c)),
    }
}

/// What a round's write kernel sends (its template argument `P`,
/// `PATH_*` in `cuda/kernels.cu`): the payload on a data [`Path`], or, in
/// the floor row (`--floor`), one bare flag and no data. The flag is no
/// `--path` a user picks, so it is simple_write's alone, not a [`Path`].
/// Serialized (in the plan, in results) by [`WritePath::name`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(into = "&'static str", try_from = "String")]
pub enum WritePath {
    Data(Path),
    /// No data: one relaxed store of a flag, the floor a ping-pong row is
    /// compared with.
    Flag,
}

impl WritePath {
    /// `put`, `store`, `ll`, `ll128` ([`Path::name`]) or `flag`.
    pub fn name(self) -> &'static str {
        match self {
            WritePath::Data(p) => p.name(),
            WritePath::Flag => "flag",
        }
    }

    /// The kernel's `P`: [`Path::code`], or `PATH_FLAG` = 4.
    pub fn code(self) -> u32 {
        match self {
            WritePath::Data(p) => p.code(),
            WritePath::Flag => 4,
        }
    }

    /// Bytes that cross the link per payload byte ([`Path::wire_factor`];
    /// 1 for the flag, which has no payload).
    pub fn wire_factor(self) -> f64 {
        match self {
            WritePath::Data(p) => p.wire_factor(),
            WritePath::Flag => 1.0,
        }
    }
}

impl From<Path> for WritePath {
    fn from(p: Path) -> Self {
        WritePath::Data(p)
    }
}

/// `round.path == Path::Ll`: whether the round moves data on that path.
impl PartialEq<Path> for WritePath {
    fn eq(&self, p: &Path) -> bool {
        *self == WritePath::Data(*p)
    }
}

impl From<WritePath> for &'static str {
    fn from(w: WritePath) -> Self {
        w.name()
    }
}

impl TryFrom<String> for WritePath {
    type Error = String;
    fn try_from(name: String) -> Result<Self, String> {
        match Path::ALL.into_iter().find(|p| p.name() == name) {
            Some(p) => Ok(WritePath::Data(p)),
            None if name == "flag" => Ok(WritePath::Flag),
            None => Err(format!("unknown write path '{name}'")),
        }
    }
}

impl std::fmt::Display for WritePath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The launch shape of the one-thread kernels (wait, stamp, ack).
const ONE_THREAD: LaunchConfig = grid(1, 1);

/// The kernels loaded into one GPU's context.
pub struct Kernels {
    _module: Arc<CudaModule>,
    /// Write + signal, indexed `[path][level]` (the flag path: one kernel).
    write: [[CudaFunction; 3]; 5],
    /// The LL path's spinning ping-pong, by level (`nixl_ll_pingpong_*`).
    ll_pingpong: [CudaFunction; 3],
    /// The LL128 path's spinning ping-pong, by level (`nixl_ll128_pingpong_*`).
    ll128_pingpong: [CudaFunction; 3],
    /// `--hbm`: put and store rotating through slots, `[path][level]`.
    write_hbm: [[CudaFunction; 3]; 2],
    wait: CudaFunction,
    ll_wait: CudaFunction,
    /// The LL target's wait in ping-pong rounds (`nixl_ll_pong_wait`).
    ll_pong_wait: CudaFunction,
    /// The LL128 target's wait in bandwidth rounds (`nixl_ll128_wait`).
    ll128_wait: CudaFunction,
    /// The LL128 target's wait in ping-pong rounds (`nixl_ll128_pong_wait`).
    ll128_pong_wait: CudaFunction,
    stamp: CudaFunction,
    ack: CudaFunction,
}

impl Kernels {
    /// Loads the embedded fatbin into `ctx`.
    pub fn load(ctx: &Arc<CudaContext>) -> Result<Self, KernelsError> {
        let module = load(ctx, Fatbin::Kernels)?;
        let err = |source| KernelsError::Load {
            gpu: ctx.ordinal(),
            source,
        };
        let f = |name: &str| module.load_function(name).map_err(err);
        let row = |p: WritePath| -> Result<[CudaFunction; 3], KernelsError> {
            Ok([
                f(write_kernel(Level::Thread, p))?,
                f(write_kernel(Level::Warp, p))?,
                f(write_kernel(Level::Block, p))?,
            ])
        };
        Ok(Self {
            write: [
                row(Path::Put.into())?,
                row(Path::Store.into())?,
                row(Path::Ll.into())?,
                row(Path::Ll128.into())?,
                row(WritePath::Flag)?,
            ],
            ll_pingpong: [
                f("nixl_ll_pingpong_thread")?,
                f("nixl_ll_pingpong_warp")?,
                f("nixl_ll_pingpong_block")?,
            ],
            ll128_pingpong: [
                f("nixl_ll128_pingpong_thread")?,
                f("nixl_ll128_pingpong_warp")?,
                f("nixl_ll128_pingpong_block")?,
            ],
            write_hbm: [
                [
                    f("nixl_write_signal_hbm_thread")?,
                    f("nixl_write_signal_hbm_warp")?,
                    f("nixl_write_signal_hbm_block")?,
                ],
                [
                    f("nixl_store_signal_hbm_thread")?,
                    f("nixl_store_signal_hbm_warp")?,
                    f("nixl_store_signal_hbm_block")?,
                ],
            ],
            wait: f("nixl_wait_signal")?,
            ll_wait: f("nixl_ll_wait")?,
            ll_pong_wait: f("nixl_ll_pong_wait")?,
            ll128_wait: f("nixl_ll128_wait")?,
            ll128_pong_wait: f("nixl_ll128_pong_wait")?,
            stamp: f("nixl_stamp")?,
            ack: f("nixl_ack")?,
            _module: module,
        })
    }

    fn write_fn(&self, path: WritePath, level: Level) -> &CudaFunction {
        &self.write[path.code() as usize][level as usize]
    }

    /// The most blocks a write kernel on `gpu` may have: all resident at
    /// once (they wait on each other through the acknowledgement). Under
    /// MPS the peer process's wait kernel may share the GPU and must find
    /// room, or the round stalls until the timeout: one block per SM, and
    /// one SM left free. Measured on an H200 under MPS: 264×512 at 16 MiB
    /// (every SM full) and 256×256 at 4 MiB (two blocks on most SMs) both
    /// stalled; one block per SM with one SM free ran every size from 8 B
    /// to 1 GiB on both paths (H100 and H200).
    pub fn grid_limit(
        &self,
        gpu: &Gpu,
        path: WritePath,
        level: Level,
        threads: u32,
    ) -> Result<u32, DriverError> {
        let per_sm = self.blocks_per_sm(path, level, threads)?;
        Ok(if gpu.mps {
            gpu.sm_count
                .saturating_sub(1)
                .max(1)
                .min(per_sm * gpu.sm_count)
        } else {
            per_sm * gpu.sm_count
        })
    }

    /// Blocks of `threads` threads one SM holds at once.
    pub fn blocks_per_sm(
        &self,
        path: WritePath,
        level: Level,
        threads: u32,
    ) -> Result<u32, DriverError> {
        self.write_fn(path, level)
            .occupancy_max_active_blocks_per_multiprocessor(threads, 0, None)
    }

    /// Queues the write + signal kernel: `blocks` × `threads`. An LL or
    /// LL128 ping-pong with a spinning wait runs `nixl_ll_pingpong_*` or
    /// `nixl_ll128_pingpong_*`, whose shortcuts for small messages (the next
    /// message read while the ack is awaited) are kept out of the bandwidth
    /// kernels (`cuda/kernels.cu`, `line_ping_pong`); a put or store round
    /// with `p.slots > 1` runs the `--hbm` kernels.
    ///
    /// # Safety
    /// The views, ack word and report in `p` must stay valid until the
    /// kernel completes.
    pub unsafe fn launch_write(
        &self,
        stream: &CudaStream,
        (path, level): (WritePath, Level),
        blocks: u32,
        threads: u32,
        p: &WriteParams,
    ) -> Result<(), DriverError> {
        let spinning_pingpong = p.flags & (WRITE_PINGPONG | WRITE_HOST_SEQUENCED) == WRITE_PINGPONG;
        let f = match path {
            WritePath::Data(Path::Ll) if spinning_pingpong => &self.ll_pingpong[level as usize],
            WritePath::Data(Path::Ll128) if spinning_pingpong => {
                &self.ll128_pingpong[level as usize]
            }
            WritePath::Data(Path::Put | Path::Store) if p.slots > 1 => {
                &self.write_hbm[path.code() as usize][level as usize]
            }
            _ => self.write_fn(path, level),
        };
        // SAFETY: as this function's contract.
        unsafe { launch(stream, f, (blocks, threads), p) }
    }

    /// Queues the target's wait kernel (one thread).
    ///
    /// # Safety
    /// As for [`Kernels::launch_write`].
    pub unsafe fn launch_wait(
        &self,
        stream: &CudaStream,
        p: &WaitParams,
    ) -> Result<(), DriverError> {
        // SAFETY: as this function's contract.
        unsafe { launch(stream, &self.wait, (1, 1), p) }
    }

    /// Queues the target's wait on `path`'s lines (LL or LL128): `blocks`
    /// blocks of `threads` threads polling them (at most 1024; more than one
    /// block only for LL128 bandwidth rounds, whose warps then deal the
    /// lines among the grid); when `p.pong`, `nixl_ll_pong_wait` or
    /// `nixl_ll128_pong_wait`, where each thread (LL128: each warp) polls
    /// its own line (quad) of a small message.
    ///
    /// # Safety
    /// As for [`Kernels::launch_write`]; `p.lines` must hold
    /// `p.line_count` lines, and with more than one block `p.done` must be
    /// two zeroed u32.
    pub unsafe fn launch_ll_wait(
        &self,
        stream: &CudaStream,
        path: Path,
        (blocks, threads): (u32, u32),
        p: &WaitParams,
    ) -> Result<(), DriverError> {
        // Whole warps: the kernel's lanes vote together (it refuses others).
        let threads = threads.clamp(1, 1024).next_multiple_of(32);
        let f = match (path, p.pong != 0) {
            (Path::Ll128, true) => &self.ll128_pong_wait,
            (Path::Ll128, false) => &self.ll128_wait,
            (_, true) => &self.ll_pong_wait,
            (_, false) => &self.ll_wait,
        };
        // SAFETY: as this function's contract.
        unsafe { launch(stream, f, (blocks.max(1), threads), p) }
    }
}

impl Kernels {
    /// Queues `nixl_stamp`: records `%globaltimer` as the report's start
    /// (`which` 0) or end (1) and the value of the u64 at `word`.
    ///
    /// # Safety
    /// `report` and `word` must be device addresses valid until it runs.
    pub unsafe fn launch_stamp(
        &self,
        stream: &CudaStream,
        report: u64,
        word: u64,
        which: u32,
    ) -> Result<(), DriverError> {
        let mut b = stream.launch_builder(&self.stamp);
        b.arg(&report).arg(&word).arg(&which);
        unsafe { b.launch(ONE_THREAD) }.map(|_| ())
    }

    /// Queues `nixl_ack`: `nixlAtomicAdd(1)` on the peer's ack word, stamping
    /// as [`Kernels::launch_stamp`] (`which` 2: no stamp).
    ///
    /// # Safety
    /// As for [`Kernels::launch_stamp`]; `ack` must name a live memory view.
    pub unsafe fn launch_ack(
        &self,
        stream: &CudaStream,
        ack: &MemViewElem,
        report: u64,
        signal: u64,
        which: u32,
    ) -> Result<(), DriverError> {
        let mut b = stream.launch_builder(&self.ack);
        b.arg(ack).arg(&report).arg(&signal).arg(&which);
        unsafe { b.launch(ONE_THREAD) }.map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_paths_keep_their_names_and_kernel_codes() {
        let all = [
            Path::Put.into(),
            Path::Store.into(),
            Path::Ll.into(),
            Path::Ll128.into(),
            WritePath::Flag,
        ];
        for (code, w) in all.into_iter().enumerate() {
            assert_eq!(w.code() as usize, code, "{w}");
            let json = serde_json::to_string(&w).unwrap();
            assert_eq!(json, format!("\"{}\"", w.name()));
            assert_eq!(serde_json::from_str::<WritePath>(&json).unwrap(), w);
        }
        assert!(WritePath::from(Path::Ll) == Path::Ll && WritePath::Flag != Path::Put);
        assert!(serde_json::from_str::<WritePath>("\"ll256\"").is_err());
    }

    #[test]
    fn slices_cover_the_buffer_with_aligned_starts() {
        for size in [1u64, 8, 15, 16, 17, 1000, 1 << 20, (64 << 20) + 3] {
            for groups in [1u64, 2, 3, 32, 132, 528] {
                let s = slice_for(size, groups);
                assert_eq!(s % 16, 0);
                let active = active_groups(size, s);
                assert!(active <= groups, "size {size} groups {groups}");
                assert!(active * s >= size && (active - 1) * s < size);
            }
        }
    }
}
