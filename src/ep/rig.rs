//! One rank's device memory: the registered window peers write into, the
//! tables the kernels read, their state and reports — and the kernel
//! parameters that point at all of it; and the host's hands on the mask,
//! the step word and the per-source words (`set_mask`, `set_step`,
//! `reset_source`; docs/EP.md §13).

use anyhow::{Context, Result};
use cudarc::driver::{CudaStream, result};

use super::config::{Grid, Path, RunConfig, Shape, WindowLayout};
use super::kernels::{EpParams, EpReport, EpTiming, EpVerify};
use super::mask::Mask;
use super::model::Model;
use crate::gpu::{DeviceBuffer, Gpu};
use crate::nixl::serdes::Desc;
use crate::nixl::view::Views;

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
    /// `[ranks]` i32: 1 = masked ([`EpParams::mask`]).
    mask: DeviceBuffer,
    /// One u32: the global step number ([`EpParams::step`]).
    step: DeviceBuffer,
    /// Steps `timing` holds.
    timing_slots: u32,
    /// Ranks the window and the mask are sized for (the capacity).
    ranks: u32,
    pub out: DeviceBuffer,
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
            mask: alloc(4 * n, "the mask")?,
            step: alloc(8, "the step word")?,
            timing_slots: u32::try_from(iterations).context("more steps than 2^32")?,
            ranks: s.ranks,
            out: alloc(t * s.token_bytes(), "the combined output")?,
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

    /// Kernel parameters on `path`: the same for every step (the step
    /// number lives on the device, [`Rig::set_step`]). Masking is off
    /// (`fault_timeout_ns` 0: every wait is fatal after `cfg.timeout_ns`);
    /// an elastic run sets `p.fault_timeout_ns = cfg.fault_timeout_ns`.
    pub fn params(
        &self,
        cfg: &RunConfig,
        model: &Model,
        grid: &Grid,
        views: Views,
        path: Path,
    ) -> EpParams {
        let s = &model.shape;
        let l = &self.layout;
        EpParams {
            local_mvh: views.local,
            remote_mvh: views.remote,
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
            mask: self.mask.addr(),
            step: self.step.addr(),
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
            fault_timeout_ns: 0,
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
            timing_slots: self.timing_slots,
            combine_batch: s.combine_batch(),
            combine_batches: s.combine_batches(),
            gpu_scope: u32::from(grid.gpu_scope),
            combine_senders: cfg
                .combine_senders
                .unwrap_or_else(|| super::config::combine_senders(path, grid.shared)),
            combine_pieces: s.combine_pieces(),
        }
    }

    /// Device memory this rank needs, bytes: the window plus the rest.
    pub fn bytes_needed(model: &Model) -> u64 {
        WindowLayout::new(&model.shape).bytes + model.side_bytes()
    }
}

/// The values of the words source `r` writes into a rank's window, had `r`
/// taken part in every step before `step` (what the kernels' targets
/// assume): see [`Rig::reset_source`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SourceBaseline {
    /// `barrier[r]`: two arrivals per step (dispatch, combine), each the
    /// store path's value `2·step + phase + 1` or the put path's +1.
    pub barrier: u64,
    /// `dispatch_count[r]`: `blocks` signals per step in the high half; the
    /// low half (running token total) restarts at 0 with `prev_low[r]`.
    pub dispatch_count: u64,
    /// Each `combine_flags[r][batch]`: one add per step per batch, or per
    /// block when there is one batch.
    pub combine_flag: u64,
}

impl SourceBaseline {
    /// The baseline before `step` for a grid of `blocks` blocks.
    pub fn at(shape: &Shape, blocks: u32, step: u32) -> Self {
        let (b, s) = (u64::from(blocks), u64::from(step));
        let adds = if shape.combine_batches() == 1 { b } else { 1 };
        Self {
            barrier: 2 * s,
            dispatch_count: (s * b) << 32,
            combine_flag: s * adds,
        }
    }
}

/// This rank's own grid words before `step`: `grid_flags[2]` (blocks done
/// with the combine, `blocks` per step) and `grid_flags[3]` (the combine's
/// claims: `tokens` × [`Shape::combine_pieces`] + one per warp per step).
pub fn local_baseline(shape: &Shape, blocks: u32, step: u32) -> [u64; 2] {
    let (b, s) = (u64::from(blocks), u64::from(step));
    let warps = b * u64::from(super::config::THREADS / 32);
    let pieces = u64::from(shape.tokens) * u64::from(shape.combine_pieces());
    [s * b, s * (pieces + warps)]
}

fn u64_bytes(words: &[u64]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// The host's hands on the mask, the step word and the per-source words.
/// Every call is stream-ordered and waits for the copy; call them between
/// steps (no kernel of this rank queued), and `reset_*` only before the
/// phase's barrier (no peer writes into the window then).
impl Rig {
    /// Copies `data` to device address `addr` (inside one of this rig's
    /// buffers) on `stream`, and waits.
    fn write(&self, stream: &CudaStream, addr: u64, data: &[u8]) -> Result<()> {
        self.window.context().bind_to_thread()?;
        // SAFETY: callers pass addresses inside this rig's live buffers, with
        // room for `data`; the host slice outlives the synchronize.
        unsafe { result::memcpy_htod_async(addr, data, stream.cu_stream())? };
        stream.synchronize()?;
        Ok(())
    }

    /// Sets the mask for a phase: `masked` (e.g. [`Mask::all_but`] the
    /// phase's members) get 1, everyone else 0. The kernels then skip the
    /// masked ranks (docs/EP.md §13).
    pub fn set_mask(&self, stream: &CudaStream, masked: impl Into<Mask>) -> Result<()> {
        let words: Vec<u8> = masked
            .into()
            .words(self.ranks)
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        self.write(stream, self.mask.addr(), &words)
    }

    /// The mask as it is now (after the work queued on `stream`): the
    /// host's plus what the kernels masked since.
    pub fn mask(&self, stream: &CudaStream) -> Result<Mask> {
        let mut raw = vec![0u8; 4 * self.ranks as usize];
        self.mask.download(stream, &mut raw)?;
        let words: Vec<i32> = raw
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        Ok(Mask::from_words(&words))
    }

    /// Sets the global step number the next step's kernels use (once at
    /// the start of a phase; [`super::kernels::Step::Advance`] moves it on).
    pub fn set_step(&self, stream: &CudaStream, step: u32) -> Result<()> {
        self.write(stream, self.step.addr(), &step.to_le_bytes())
    }

    /// The step word as it is now (after the work queued on `stream`).
    pub fn step(&self, stream: &CudaStream) -> Result<u32> {
        Ok(self.step.read_u64(stream)? as u32)
    }

    /// The report of the last launch (after the work queued on `stream`):
    /// [`EpReport::newly_masked`], the times of the first masking, and
    /// the fatal-wait fields.
    pub fn read_report(&self, stream: &CudaStream) -> Result<EpReport> {
        let mut r = EpReport::default();
        self.report
            .download(stream, bytemuck::bytes_of_mut(&mut r))?;
        Ok(r)
    }
}

// Resetting a rank id for a new incarnation, and why it is safe.
//
// Every word in a window has exactly one writer rank: source r writes
// `barrier[r]`, `dispatch_count[r]`, `combine_flags[r][*]` and the rows
// `recv_x[r]`, `recv_meta[r]`, `combine_recv[r]`; nobody else does. The
// kernels' targets are absolute functions of the global step (barrier
// 2·step + phase + 1, counter high half (step + 1)·blocks, flags
// (step + 1)·adds): they assume r took part in every step from 0. Both data
// paths reach the same values — the store path stores the barrier value and
// adds to counters and flags with `red.release`, the put path adds 1 to the
// barrier and the same amounts to counters and flags with `nixlAtomicAdd` —
// so one baseline serves both, and both modes (they differ only in how
// many flags there are and who adds to them).
//
// A source that is masked stops writing (its senders are dead, or skip us
// once they masked us) and its words are never read while it is masked, so
// they may fall behind. They are read again only when r is unmasked, which
// happens only at the start of a phase in which r joins (a new process: a
// rank masked during a phase stays masked to its end, and a survivor the
// others masked exits). So before the phase's barrier every member sets
// r's words in its window to the baseline of the phase's first step
// (`reset_source`), and the joiner, whose window and bookkeeping start at
// zero, sets every source's words and its own grid words (`reset_all`).
// No peer writes into a window before the barrier, and no kernel of ours
// runs, so nothing races the host's writes. Data rows are not cleared: a row
// is read only below the count, or after the flag, that arrives with it.
// `prev_low[r]` and `recv_count[r]` are this rank's bookkeeping of r's
// running token total: both restart at 0 with the counter's low half.
//
// Late writes: a SIGKILLed process's kernels die with its context. A
// SIGSTOPped one's queued kernels still finish its current step on the GPU
// (and then its host launches nothing), so its last write lands within that
// step, long before the id can be reused at a later phase's start.
impl Rig {
    /// Sets every word source `r` writes into this rank's window, and this
    /// rank's bookkeeping of `r` (`prev_low[r]`, `recv_count[r]`), to the
    /// values they would have had `r` taken part in every step before
    /// `step` ([`SourceBaseline::at`]): call it for each rank joining at the
    /// phase whose first step is `step`, before the phase's barrier. `blocks`:
    /// the phase kernels' grid (the same for the whole run).
    pub fn reset_source(
        &self,
        stream: &CudaStream,
        shape: &Shape,
        blocks: u32,
        r: u32,
        step: u32,
    ) -> Result<()> {
        anyhow::ensure!(
            r < self.ranks,
            "rank {r} is outside the capacity {}",
            self.ranks
        );
        let base = SourceBaseline::at(shape, blocks, step);
        let (w, l, r64) = (self.window.addr(), &self.layout, u64::from(r));
        self.write(stream, w + l.barrier + 8 * r64, &base.barrier.to_le_bytes())?;
        self.write(
            stream,
            w + l.dispatch_count + 8 * r64,
            &base.dispatch_count.to_le_bytes(),
        )?;
        let batches = shape.combine_batches() as usize;
        let flags = u64_bytes(&vec![base.combine_flag; batches]);
        let at = l.combine_flags + 8 * r64 * batches as u64;
        self.write(stream, w + at, &flags)?;
        self.write(stream, self.prev_low.addr() + 8 * r64, &0u64.to_le_bytes())?;
        self.write(
            stream,
            self.recv_count.addr() + 4 * r64,
            &0u32.to_le_bytes(),
        )
    }

    /// Sets this rank's own grid words to their values before `step`
    /// ([`local_baseline`]): a new process's, which start at 0. Harmless on a
    /// survivor (they already hold these values).
    pub fn reset_local(
        &self,
        stream: &CudaStream,
        shape: &Shape,
        blocks: u32,
        step: u32,
    ) -> Result<()> {
        let words = local_baseline(shape, blocks, step);
        self.write(stream, self.grid_flags.addr() + 16, &u64_bytes(&words))
    }

    /// A new process joining at `step`: [`Rig::reset_source`] for every
    /// rank (itself included: its own barrier word and counter) and
    /// [`Rig::reset_local`].
    pub fn reset_all(
        &self,
        stream: &CudaStream,
        shape: &Shape,
        blocks: u32,
        step: u32,
    ) -> Result<()> {
        for r in 0..self.ranks {
            self.reset_source(stream, shape, blocks, r, step)?;
        }
        self.reset_local(stream, shape, blocks, step)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(tokens: u32) -> Shape {
        Shape {
            tokens,
            hidden: 64,
            topk: 2,
            experts: 8,
            ranks: 4,
        }
    }

    #[test]
    fn the_baseline_is_what_every_step_before_adds() {
        // Low latency: one flag per expert rank, one add per block and step.
        let ll = SourceBaseline::at(&shape(128), 66, 5);
        assert_eq!(ll.barrier, 10);
        assert_eq!(ll.dispatch_count, (5 * 66) << 32);
        assert_eq!(ll.combine_flag, 5 * 66);
        // High throughput: one add per batch and step.
        let ht = SourceBaseline::at(&shape(4096), 66, 5);
        assert!(shape(4096).combine_batches() > 1);
        assert_eq!(ht.combine_flag, 5);
        // Step 0: a fresh window (all zero) is the baseline.
        let zero = SourceBaseline::at(&shape(4096), 66, 0);
        assert_eq!(
            (zero.barrier, zero.dispatch_count, zero.combine_flag),
            (0, 0, 0)
        );
        assert_eq!(local_baseline(&shape(128), 66, 0), [0, 0]);
        assert_eq!(
            local_baseline(&shape(128), 66, 3),
            [3 * 66, 3 * (128 + 66 * 16)]
        );
        // 7168 values: a token's reduction is claimed in 2 pieces.
        let wide = Shape {
            hidden: 7168,
            ..shape(4096)
        };
        assert_eq!(
            local_baseline(&wide, 132, 2),
            [2 * 132, 2 * (4096 * 2 + 132 * 16)]
        );
    }

    /// The words of one source in a receiver's window, as the kernels move
    /// them (`put`: the barrier by adds; `store`: by stores).
    struct Words {
        barrier: u64,
        count: u64,
        flag: u64,
    }

    impl Words {
        fn from(b: SourceBaseline) -> Self {
            Words {
                barrier: b.barrier,
                count: b.dispatch_count,
                flag: b.combine_flag,
            }
        }

        /// One step of the source: two barrier arrivals, a signal of 2
        /// tokens per block, its combine adds.
        fn take_part(&mut self, s: &Shape, blocks: u64, step: u64, put: bool) {
            for phase in 0..2 {
                self.barrier = if put {
                    self.barrier + 1
                } else {
                    2 * step + phase + 1
                };
            }
            self.count += blocks * ((1 << 32) | 2);
            self.flag += if s.combine_batches() == 1 { blocks } else { 1 };
        }

        /// Whether the receiver's targets of `step` are met (as the
        /// kernels compute them).
        fn targets_met(&self, s: &Shape, blocks: u64, step: u64) -> bool {
            let adds = if s.combine_batches() == 1 { blocks } else { 1 };
            self.barrier >= 2 * step + 2
                && self.count >> 32 >= (step + 1) * blocks
                && self.flag >= (step + 1) * adds
        }
    }

    #[test]
    fn a_source_that_leaves_and_comes_back_as_a_new_process_meets_every_target_in_its_step() {
        let blocks = 7u64;
        for s in [shape(128), shape(4096)] {
            for put in [false, true] {
                // Present for steps 0..5; gone for 5..9 (masked, its words
                // frozen where it died: one block of step 5 had signalled);
                // back from step 9 as a new process, after the reset.
                let mut w = Words::from(SourceBaseline::at(&s, blocks as u32, 0));
                for step in 0..5 {
                    assert!(!w.targets_met(&s, blocks, step), "met before step {step}");
                    w.take_part(&s, blocks, step, put);
                    assert!(w.targets_met(&s, blocks, step));
                }
                w.count += (1 << 32) | 2;
                // Left as they are, the words would never meet a later
                // step's targets: the new process would be masked again.
                assert!(!w.targets_met(&s, blocks, 9));
                w = Words::from(SourceBaseline::at(&s, blocks as u32, 9));
                for step in 9..12 {
                    assert!(!w.targets_met(&s, blocks, step), "met before step {step}");
                    w.take_part(&s, blocks, step, put);
                    assert!(w.targets_met(&s, blocks, step), "step {step}");
                }
                // The running token total restarts from 0, as prev_low does.
                assert_eq!(w.count & 0xffff_ffff, 3 * blocks * 2);
            }
        }
    }
}
