//! The kernels of `cuda/pipeline.cu`, host side: their parameter and report
//! structs (mirrored field for field; the sizes are asserted on both sides)
//! and the launcher of a stage's kernel at a level.

use std::mem::size_of;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream, DeviceRepr, DriverError};

use crate::gpu::kernels::KernelReport;
use crate::gpu::launch;

// How a chunk moves between two stages (`PIPE_PATH_*` in `cuda/`, numbered
// as `Path::code`): put, nixlPut from a staging slot + nixlAtomicAdd ready
// and credit words; store, stores through nixlGetPtr's pointer + release
// stores; ll and ll128, lines through the pointer, no ready word (ll128 at
// warp and block level only). The pipeline offers every path.
pub use crate::gpu::path::Path;

/// The data paths the stage kernels implement (`PIPE_PATH_*`); the
/// configuration refuses the others ([`crate::gpu::path::refuse_missing`]).
pub const PATHS: [Path; 4] = [Path::Put, Path::Store, Path::Ll, Path::Ll128];

pub use crate::gpu::level::Level;

/// `PipeParams`: one stage's run of `chunks` chunks. Offsets are bytes into
/// the window ([`super::ring::Window`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct PipeParams {
    /// `nixlMemViewH` of the local view of the window (one element).
    pub local_mvh: u64,
    /// `nixlMemViewH` of the remote view: element `r` is rank `r`'s window.
    pub remote_mvh: u64,
    pub window: u64,
    /// [`PipeReport`].
    pub report: u64,
    /// `[stamps]` u64, stage 0: when channel 0 began each timed chunk
    /// (LL: just before its leading lane's line store), `%globaltimer` ns.
    pub t_start: u64,
    /// `[stamps]` u64, last stage: when channel 0's leading lane had
    /// checked its share of the chunk (LL: its own line, just after it
    /// arrived).
    pub t_end: u64,
    pub off_ring: u64,
    pub off_stage: u64,
    pub off_ready: u64,
    pub off_credit: u64,
    /// Payload bytes per chunk; bytes from one of a channel's slices to its
    /// next in its ring (`ring::slice_stride`); payload bytes per channel.
    pub chunk_bytes: u64,
    pub slice_stride: u64,
    pub slice_bytes: u64,
    /// Chunks in all, the untimed ones first, and the timed ones stamped.
    pub chunks: u64,
    pub warmup: u64,
    pub stamps: u64,
    /// Every wait's limit, ns.
    pub timeout_ns: u64,
    /// This stage sleeps this long per chunk (`--slow-stage`), ns.
    pub delay_ns: u64,
    pub stage: u32,
    pub stages: u32,
    pub slots: u32,
    pub path: u32,
    /// 1: every rank on this GPU (GPU-scope fences suffice).
    pub same_gpu: u32,
    /// Test hook: this stage garbles word 0 of this chunk (−1: none).
    pub corrupt_chunk: i32,
    /// The most chunks one handshake covers (1 ..= 4; the LL path 1).
    pub batch: u32,
    pub reserved: u32,
}

/// `PipeReport`: what one stage's kernel saw. It begins with the suite's
/// [`KernelReport`], so [`crate::gpu::run::run_watched`] zeroes it, reads
/// it and cancels through it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct PipeReport {
    pub base: KernelReport,
    /// What the wait that gave up waited for: 1 a ready word (or LL line)
    /// from the previous stage, 2 a credit from the next.
    pub wait_on: u32,
    pub wait_channel: u32,
    pub wait_chunk: u64,
    /// Slots found holding a later chunk than the one expected.
    pub overwrites: u64,
    /// Last stage: wrong words, and the first one.
    pub mismatches: u64,
    pub bad_chunk: u64,
    pub bad_offset: u64,
    pub bad_got: u32,
    pub bad_want: u32,
    /// 1: nixlGetPtr gave no pointer to a neighbour's window.
    pub null_ptr: u32,
    /// Channel 0's handshakes over the run: the chunks over this is the
    /// mean batch.
    pub handshakes: u32,
    /// Time waiting for credits over the timed chunks, summed over channels,
    /// ns (counted on the SM clock, converted with the kernel's own
    /// clock against `%globaltimer`).
    pub stall_ns: u64,
    /// `%globaltimer` when the first timed chunk and the last chunk had
    /// arrived (max over channels), and when the last one's work ended.
    pub arrive_first: u64,
    pub arrive_last: u64,
    pub done_ns: u64,
    /// Last stage: payload bytes verified.
    pub checked: u64,
}

const _: () = {
    assert!(size_of::<PipeParams>() == 176);
    assert!(size_of::<PipeReport>() == 144);
};

// SAFETY: plain #[repr(C)] data whose layout matches the kernel parameter.
unsafe impl DeviceRepr for PipeParams {}

/// The stage kernels loaded into one GPU's context, one entry per level
/// and path (`pipe_<level>_<path>`: the path is a constant in each, so a
/// kernel holds only its path's code and registers).
pub struct PipeKernels {
    _module: Arc<CudaModule>,
    /// `[level][path]`, as [`Level`] and [`Path::code`] number them; `None`
    /// where the pair has no kernel (LL128 at thread level: a quad of lines
    /// needs a warp; the configuration refuses it).
    entries: Vec<[Option<CudaFunction>; 4]>,
}

/// Whether the stage kernels have an entry for `path` at `level`.
pub fn has_kernel(level: Level, path: Path) -> bool {
    !(level == Level::Thread && path == Path::Ll128)
}

impl PipeKernels {
    /// Loads the embedded fatbin into `ctx`.
    pub fn load(ctx: &Arc<CudaContext>) -> anyhow::Result<Self> {
        let module = crate::gpu::module::load(ctx, crate::gpu::module::Fatbin::Pipeline)?;
        let f = |level: Level, path: Path| -> anyhow::Result<Option<CudaFunction>> {
            if !has_kernel(level, path) {
                return Ok(None);
            }
            let name = format!("pipe_{}_{}", level.name(), path.name());
            (module.load_function(&name).map(Some))
                .map_err(|e| anyhow::anyhow!("kernel {name} missing from the pipeline fatbin: {e}"))
        };
        let mut entries = Vec::new();
        for level in Level::ALL {
            let [put, store, ll, ll128] = PATHS;
            entries.push([
                f(level, put)?,
                f(level, store)?,
                f(level, ll)?,
                f(level, ll128)?,
            ]);
        }
        Ok(Self {
            entries,
            _module: module,
        })
    }

    /// The entry for `path` at `level`; `CUDA_ERROR_NOT_FOUND` where there
    /// is none ([`has_kernel`]).
    fn entry(&self, level: Level, path: u32) -> Result<&CudaFunction, DriverError> {
        let missing = DriverError(cudarc::driver::sys::cudaError_enum::CUDA_ERROR_NOT_FOUND);
        (self.entries[level as usize].get(path as usize))
            .and_then(Option::as_ref)
            .ok_or(missing)
    }

    /// Most blocks of `threads` threads of the stage kernel at `level` for
    /// `path` resident at once on one SM (`cuOccupancyMaxActiveBlocksPerMultiprocessor`).
    pub fn blocks_per_sm(
        &self,
        level: Level,
        path: Path,
        threads: u32,
    ) -> Result<u32, DriverError> {
        self.entry(level, path.code())?
            .occupancy_max_active_blocks_per_multiprocessor(threads, 0, None)
    }

    /// Queues this stage's kernel at `level` for `p.path` over `blocks` ×
    /// `threads`.
    ///
    /// # Safety
    /// Every address in `p` must stay valid until the kernel completes.
    pub unsafe fn launch(
        &self,
        s: &CudaStream,
        level: Level,
        (blocks, threads): (u32, u32),
        p: &PipeParams,
    ) -> Result<(), DriverError> {
        let f = self.entry(level, p.path)?;
        // SAFETY: as this function's contract; `PipeParams` is the entries'.
        unsafe { launch::launch(s, f, (blocks, threads), p) }
    }
}
