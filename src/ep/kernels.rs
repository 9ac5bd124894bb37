//! The kernels of `cuda/ep.cu`, host side: their structs (mirrored field for
//! field from `cuda/ep_common.cuh`; `tests/ep_abi.rs` compares every offset
//! with a host build of that header) and typed launchers.

use std::mem::size_of;
use std::sync::Arc;

use crate::gpu::kernels::KernelReport;
use crate::gpu::launch;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream, DeviceRepr, DriverError};

/// `EpParams`: what every EP kernel receives. Pointers are device
/// addresses; offsets are into the rank's window
/// ([`super::config::WindowLayout`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct EpParams {
    /// `nixlMemViewH` of the local view of the window (one buffer, index 0).
    pub local_mvh: u64,
    /// `nixlMemViewH` of the remote view: element `r` is rank `r`'s window,
    /// this rank's own entry a null agent; 0 with a single rank.
    pub remote_mvh: u64,
    pub window: u64,
    /// [`EpReport`].
    pub report: u64,
    /// [`EpVerify`].
    pub verify: u64,
    /// `[timing_slots][2]` × [`EpTiming`] (dispatch, combine), by step.
    pub timing: u64,
    /// `[n_entries]` × [`super::layout::SendEntry`].
    pub entries: u64,
    /// `[ranks][tokens]` i32: slot of token `t` on rank `d`, or −1.
    pub send_slot: u64,
    /// `[ranks][tokens]` u32: source token per (source, slot).
    pub expect_tokens: u64,
    /// `[ranks]` u32: tokens expected from each source.
    pub expect_count: u64,
    /// `[ranks][tokens][topk]` u32: every rank's routing.
    pub all_experts: u64,
    /// `[ranks][tokens][topk]` f32.
    pub all_weights: u64,
    /// `[ranks]` u32, written by dispatch: tokens received per source.
    pub recv_count: u64,
    /// `[ranks]` u64: the dispatch counters' low halves at the last completion.
    pub prev_low: u64,
    /// `[4]` u64: this rank's grid flags.
    pub grid_flags: u64,
    /// `[tokens][hidden]` bf16: the combined output.
    pub out: u64,
    /// `[ranks]` i32 in this rank's memory (not the window): 1 = rank
    /// masked. The host sets it between launches
    /// ([`super::rig::Rig::set_mask`]); a wait that passes
    /// `fault_timeout_ns` sets it (docs/EP.md §13).
    pub mask: u64,
    /// One u32: the global step number every kernel uses (data, counter
    /// targets, timing slot). The host sets it once at the start of a phase
    /// ([`super::rig::Rig::set_step`]); [`Step::Advance`], queued at the
    /// end of every step, adds 1, so one captured graph replays every step.
    pub step: u64,
    pub off_dispatch_count: u64,
    pub off_combine_flags: u64,
    pub off_barrier: u64,
    pub off_recv_x: u64,
    pub off_recv_meta: u64,
    pub off_combine_recv: u64,
    pub off_x: u64,
    pub off_meta: u64,
    pub off_y: u64,
    pub seed: u64,
    /// GPU-side timeout of a wait on this rank's own blocks (fatal), and of
    /// every wait when `fault_timeout_ns` is 0, ns.
    pub timeout_ns: u64,
    /// A wait on another rank that lasts this long from its own start masks
    /// that rank and goes on without it, ns; 0: never mask (every wait is
    /// fatal after `timeout_ns`, as before masking existed).
    pub fault_timeout_ns: u64,
    pub rank: u32,
    pub ranks: u32,
    pub tokens: u32,
    pub hidden: u32,
    pub topk: u32,
    pub local_experts: u32,
    pub meta_bytes: u32,
    pub n_entries: u32,
    pub chunks: u32,
    pub chunk_bytes: u32,
    /// [`super::config::Path::code`].
    pub path: u32,
    /// Steps the timing buffer holds; a kernel of a later step is not
    /// stamped (the step number itself lives on the device, `step`).
    pub timing_slots: u32,
    /// Slots per combine flag ([`super::config::Shape::combine_batch`]).
    pub combine_batch: u32,
    /// Flags per expert rank: ⌈tokens / combine_batch⌉.
    pub combine_batches: u32,
    /// 1 when every rank shares this GPU: the releases that order data
    /// before a signal are GPU-scope; 0: system scope (ranks on other GPUs
    /// observe through the link). [`super::config::Grid::gpu_scope`].
    pub gpu_scope: u32,
    /// High-throughput combine: warps of each block that send batches while
    /// the others reduce tokens as they arrive (the senders join the
    /// reduction once their batches are out). 1..=16.
    pub combine_senders: u32,
    /// High-throughput combine: pieces a token's reduction is claimed in
    /// ([`super::config::Shape::combine_pieces`]).
    pub combine_pieces: u32,
}

/// `EpReport`: what went wrong in an iteration's launches: the
/// [`KernelReport`] every kernel writes (which
/// [`crate::gpu::run::run_watched`] zeroes, reads and cancels through), then
/// which wait gave up. `cuda/ep_common.cuh`'s struct of the same name.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct EpReport {
    /// Errors, the last value a wait saw, timed out, the host's cancel word.
    pub base: KernelReport,
    /// [`WAIT_BARRIER`] … [`WAIT_BLOCKS`].
    pub wait_kind: u32,
    /// The rank that wait was for.
    pub wait_rank: u32,
    /// The value it waited for.
    pub wait_target: u64,
    /// Ptr path: 1 + the rank whose `nixlGetPtr` returned null.
    pub null_ptr_rank: u32,
    pub reserved: u32,
    /// Bit `r`: this launch masked rank `r` (a wait on it passed the fault
    /// timeout). Not a failure: the kernels went on without it.
    pub masked_bits: u64,
    /// `%globaltimer` (ns) when the launch's first masking happened.
    pub first_mask_ns: u64,
    /// `%globaltimer` (ns) when the wait that made it began.
    pub first_wait_ns: u64,
    /// [`WAIT_BARRIER`], [`WAIT_DISPATCH`] or [`WAIT_COMBINE`]: that wait.
    pub mask_kind: u32,
    /// The rank it masked.
    pub mask_rank: u32,
}

impl EpReport {
    /// The ranks this launch masked.
    pub fn newly_masked(&self) -> super::mask::Mask {
        super::mask::Mask(self.masked_bits)
    }

    /// How long the wait that made the first masking had waited when it
    /// masked, ns (the fault timeout and the polling granularity); `None`
    /// when nothing was masked.
    pub fn first_mask_waited_ns(&self) -> Option<u64> {
        (self.masked_bits != 0).then(|| self.first_mask_ns.saturating_sub(self.first_wait_ns))
    }
}

/// A rank's arrival at the phase barrier.
pub const WAIT_BARRIER: u32 = 1;
/// A rank's dispatch data.
pub const WAIT_DISPATCH: u32 = 2;
/// A batch of a rank's combine contributions.
pub const WAIT_COMBINE: u32 = 3;
/// This rank's block 0 releasing the grid.
pub const WAIT_GRID: u32 = 4;
/// This rank's blocks finishing the reduction.
pub const WAIT_BLOCKS: u32 = 5;

/// `EpVerify`: the first wrong value a check kernel found.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct EpVerify {
    pub mismatches: u32,
    /// [`BAD_COUNT`] … [`BAD_COMBINED`].
    pub kind: u32,
    pub src_rank: u32,
    pub token: u32,
    pub slot: u32,
    pub h: u32,
    pub expert: u32,
    pub got_bits: u32,
    pub want_bits: u32,
    pub got: f32,
    pub reference: f32,
    pub bound: f32,
}

pub const BAD_COUNT: u32 = 1;
pub const BAD_META: u32 = 2;
pub const BAD_X: u32 = 3;
pub const BAD_CONTRIBUTION: u32 = 4;
pub const BAD_COMBINED: u32 = 5;

/// `EpTiming`: one phase on one rank, from the barrier to completion.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct EpTiming {
    /// `clock64` of block 0's first thread (cycles).
    pub clock_start: u64,
    pub clock_end: u64,
    /// `%globaltimer` (ns), to calibrate the cycles.
    pub gt_start: u64,
    pub gt_end: u64,
}

const _: () = {
    assert!(size_of::<EpParams>() == 312);
    assert!(std::mem::offset_of!(EpParams, off_dispatch_count) == 144);
    assert!(std::mem::offset_of!(EpParams, rank) == 240);
    assert!(size_of::<EpReport>() == 96);
    assert!(std::mem::offset_of!(EpReport, base) == 0);
    assert!(size_of::<EpVerify>() == 48);
    assert!(size_of::<EpTiming>() == 32);
    assert!(size_of::<super::layout::SendEntry>() == 12);
};

// SAFETY: plain #[repr(C)] data whose layout matches the kernel parameter.
unsafe impl DeviceRepr for EpParams {}

/// Whether the EP kernels were compiled in, and if not, why.
pub fn availability() -> Result<(), &'static str> {
    crate::gpu::module::availability()
}

/// The EP kernels loaded into one GPU's context.
pub struct EpKernels {
    _module: Arc<CudaModule>,
    fill: CudaFunction,
    dispatch: CudaFunction,
    verify_dispatch: CudaFunction,
    expert: CudaFunction,
    combine: CudaFunction,
    verify_combine: CudaFunction,
    advance: CudaFunction,
}

/// One EP kernel of an iteration, in the order they are queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    Fill,
    Dispatch,
    VerifyDispatch,
    Expert,
    Combine,
    VerifyCombine,
    /// `ep_advance`: the step word + 1, the last kernel of every step
    /// (its first thread does it; launch it with 1 block).
    Advance,
}

impl EpKernels {
    /// Loads the embedded fatbin into `ctx`.
    pub fn load(ctx: &Arc<CudaContext>) -> anyhow::Result<Self> {
        let module = crate::gpu::module::load(ctx, crate::gpu::module::Fatbin::Ep)?;
        let f = |name: &str| {
            module
                .load_function(name)
                .map_err(|e| anyhow::anyhow!("kernel {name} missing from the EP fatbin: {e}"))
        };
        Ok(Self {
            fill: f("ep_fill")?,
            dispatch: f("ep_dispatch")?,
            verify_dispatch: f("ep_verify_dispatch")?,
            expert: f("ep_expert")?,
            combine: f("ep_combine")?,
            verify_combine: f("ep_verify_combine")?,
            advance: f("ep_advance")?,
            _module: module,
        })
    }

    fn function(&self, step: Step) -> &CudaFunction {
        match step {
            Step::Fill => &self.fill,
            Step::Dispatch => &self.dispatch,
            Step::VerifyDispatch => &self.verify_dispatch,
            Step::Expert => &self.expert,
            Step::Combine => &self.combine,
            Step::VerifyCombine => &self.verify_combine,
            Step::Advance => &self.advance,
        }
    }

    /// Most blocks of [`super::config::THREADS`] threads of the phase
    /// kernels resident at once on one SM (the combine kernel's blocks wait
    /// for each other, so its grid must fit at once).
    pub fn blocks_per_sm(&self) -> Result<u32, DriverError> {
        let t = super::config::THREADS;
        let a = self
            .dispatch
            .occupancy_max_active_blocks_per_multiprocessor(t, 0, None)?;
        let b = self
            .combine
            .occupancy_max_active_blocks_per_multiprocessor(t, 0, None)?;
        Ok(a.min(b))
    }

    /// Queues `step` with `blocks` × [`super::config::THREADS`] threads.
    ///
    /// # Safety
    /// Every address in `p` must stay valid until the kernel completes.
    pub unsafe fn launch(
        &self,
        stream: &CudaStream,
        step: Step,
        blocks: u32,
        p: &EpParams,
    ) -> Result<(), DriverError> {
        let shape = (blocks, super::config::THREADS);
        // SAFETY: as this function's contract; `EpParams` is `ep_*`'s parameter.
        unsafe { launch::launch(stream, self.function(step), shape, p) }
    }
}
