//! One rank's device memory: the registered window peers write into, the
//! tables the kernels read, their state and reports — and the kernel
//! parameters that point at all of it.

use anyhow::{Context, Result};
use cudarc::driver::result;

use super::config::{Grid, Path, RunConfig, WindowLayout};
use super::kernels::{EpKernels, EpParams, EpReport, EpTiming, EpVerify};
use super::model::Model;
use crate::gpu::{DeviceBuffer, Gpu};
use crate::nixl::serdes::Desc;

/// Device buffers of one rank (freed on drop; deregister the window first).
pub struct Rig {
    pub layout: WindowLayout,
    /// The registered window (see [`WindowLayout`]).
    pub window: DeviceBuffer,
    pub report: DeviceBuffer,
    pub verify: DeviceBuffer,
    pub timing: DeviceBuffer,
    entries: DeviceBuffer,
    send_slot: DeviceBuffer,
    expect_tokens: DeviceBuffer,
    expect_count: DeviceBuffer,
    all_experts: DeviceBuffer,
    all_weights: DeviceBuffer,
    recv_count: DeviceBuffer,
    prev_low: DeviceBuffer,
    grid_flags: DeviceBuffer,
    pub out: DeviceBuffer,
    /// `ranks` u64 for [`super::kernels::EpKernels::launch_probe`].
    pub probe: DeviceBuffer,
}

/// Copies `data` to `offset` bytes into `buf` and waits.
pub fn upload_at(gpu: &Gpu, buf: &DeviceBuffer, offset: u64, data: &[u8]) -> Result<()> {
    assert!(offset + data.len() as u64 <= buf.len() as u64);
    gpu.bind()?;
    // SAFETY: bounds checked above; the host slice outlives the sync.
    unsafe { result::memcpy_htod_async(buf.addr() + offset, data, gpu.stream.cu_stream())? };
    gpu.sync()?;
    Ok(())
}

impl Rig {
    /// Allocates everything (zeroed) and uploads the model's tables and this
    /// rank's metadata records. `iterations`: of the whole run, for the
    /// timing slots.
    pub fn new(gpu: &Gpu, model: &Model, iterations: u64) -> Result<Self> {
        let s = &model.shape;
        let (n, t) = (u64::from(s.ranks), u64::from(s.tokens));
        let layout = WindowLayout::new(s);
        let alloc = |len: u64, what: &str| {
            DeviceBuffer::zeroed(&gpu.ctx, len.max(8) as usize)
                .with_context(|| format!("allocating {what} ({len} bytes) on GPU {}", gpu.ordinal))
        };
        let with = |data: Vec<u8>, what: &str| -> Result<DeviceBuffer> {
            let b = alloc(data.len() as u64, what)?;
            b.upload(&gpu.stream, &data)?;
            Ok(b)
        };
        let (experts, weights) = model.routing_bytes();
        let rig = Self {
            window: alloc(layout.bytes, "the window")?,
            report: alloc(size_of::<EpReport>() as u64, "the report")?,
            verify: alloc(size_of::<EpVerify>() as u64, "the verify report")?,
            timing: alloc(
                iterations * 2 * size_of::<EpTiming>() as u64,
                "the timing slots",
            )?,
            entries: with(model.entries_bytes(), "the send list")?,
            send_slot: with(model.send_slot_bytes(), "the send slots")?,
            expect_tokens: with(model.expect_tokens_bytes(), "the expected tokens")?,
            expect_count: with(model.expect_count_bytes(), "the expected counts")?,
            all_experts: with(experts, "the routing")?,
            all_weights: with(weights, "the gate weights")?,
            recv_count: alloc(4 * n, "the receive counts")?,
            prev_low: alloc(8 * n, "the counter state")?,
            grid_flags: alloc(32, "the grid flags")?,
            out: alloc(t * s.token_bytes(), "the combined output")?,
            probe: alloc(8 * n, "the pointer probe")?,
            layout,
        };
        upload_at(gpu, &rig.window, layout.meta, &model.meta_bytes())?;
        Ok(rig)
    }

    /// The window as one VRAM descriptor, as peers address it.
    pub fn window_desc(&self) -> Desc {
        Desc {
            addr: self.window.addr(),
            len: self.window.len() as u64,
            dev_id: self.window.ordinal() as u64,
        }
    }

    /// Kernel parameters for `iteration` on `path`.
    pub fn params(
        &self,
        cfg: &RunConfig,
        model: &Model,
        grid: &Grid,
        views: (u64, u64),
        path: Path,
        iteration: u32,
    ) -> EpParams {
        let s = &model.shape;
        let l = &self.layout;
        EpParams {
            local_mvh: views.0,
            remote_mvh: views.1,
            window: self.window.addr(),
            report: self.report.addr(),
            verify: self.verify.addr(),
            timing: self.timing.addr(),
            entries: self.entries.addr(),
            send_slot: self.send_slot.addr(),
            expect_tokens: self.expect_tokens.addr(),
            expect_count: self.expect_count.addr(),
            all_experts: self.all_experts.addr(),
            all_weights: self.all_weights.addr(),
            recv_count: self.recv_count.addr(),
            prev_low: self.prev_low.addr(),
            grid_flags: self.grid_flags.addr(),
            out: self.out.addr(),
            off_dispatch_count: l.dispatch_count,
            off_combine_flags: l.combine_flags,
            off_barrier: l.barrier,
            off_recv_x: l.recv_x,
            off_recv_meta: l.recv_meta,
            off_combine_recv: l.combine_recv,
            off_x: l.x,
            off_meta: l.meta,
            off_y: l.y,
            seed: cfg.seed,
            timeout_ns: cfg.timeout_ns,
            rank: model.rank,
            ranks: s.ranks,
            tokens: s.tokens,
            hidden: s.hidden,
            topk: s.topk,
            local_experts: s.local_experts(),
            meta_bytes: s.meta_bytes() as u32,
            n_entries: model.send.entries.len() as u32,
            chunks: grid.chunks,
            chunk_bytes: grid.chunk_bytes,
            path: path.code(),
            iteration,
            combine_batch: s.combine_batch(),
            combine_batches: s.combine_batches(),
            gpu_scope: u32::from(grid.gpu_scope),
            combine_senders: cfg
                .combine_senders
                .unwrap_or(super::config::COMBINE_SENDERS),
        }
    }

    /// The ranks whose window `nixlGetPtr` does not map through the remote
    /// view `remote` (the store path needs every one): probes all `ranks`.
    pub fn unmapped_peers(
        &self,
        gpu: &Gpu,
        kernels: &EpKernels,
        remote: u64,
        ranks: u32,
        rank: u32,
    ) -> Result<Vec<usize>> {
        // SAFETY: the view is live; the probe buffer holds `ranks` u64.
        unsafe { kernels.launch_probe(&gpu.stream, remote, ranks, rank, self.probe.addr())? };
        let mut raw = vec![0u8; 8 * ranks as usize];
        self.probe.download(&gpu.stream, &mut raw)?;
        Ok(raw
            .chunks(8)
            .enumerate()
            .filter(|(_, c)| c.iter().all(|&b| b == 0))
            .map(|(r, _)| r)
            .collect())
    }

    /// Device memory this rank needs, bytes: the window plus the rest.
    pub fn bytes_needed(model: &Model) -> u64 {
        WindowLayout::new(&model.shape).bytes + model.side_bytes()
    }
}
