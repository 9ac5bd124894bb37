//! A VRAM ring's device side: the slots' memory, the stream the staged
//! copies are queued on, the page-locked staging in both directions, and
//! what the copies cost.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use cudarc::driver::{CudaContext, CudaStream, DriverError};
use serde_json::json;

use super::staging::{CopyOp, Plan, SlotSpans, plan};
use crate::gpu::pinned::{self, Direction, PinnedBuffer, Rows};
use crate::gpu::{DeviceBuffer, Gpu};

/// What the staged copies of a VRAM ring cost, for diagnosing a GPU run.
#[derive(Clone, Copy, Debug, Default)]
pub struct CopyStats {
    /// `cuMemcpy*Async` calls, 1D and 2D.
    pub calls: u64,
    /// Of those, 2D copies (one row per slot).
    pub calls_2d: u64,
    /// Pieces moved (a 2D copy moves one per row).
    pub pieces: u64,
    pub bytes: u64,
    /// Stream synchronisations (batches waited for, plus one-off calls).
    pub syncs: u64,
    /// Host time inside the copy calls (enqueueing, not the transfer).
    pub issue: Duration,
    /// Host time inside the synchronisations.
    pub wait: Duration,
    /// Host time writing headers and pattern into staging (sender).
    pub stage: Duration,
    /// Whether the driver refused a 2D copy, so the ring went on with one
    /// copy per piece.
    pub fell_back_to_1d: bool,
}

impl CopyStats {
    pub fn json(&self) -> serde_json::Value {
        json!({
            "calls": self.calls,
            "calls_2d": self.calls_2d,
            "pieces": self.pieces,
            "bytes": self.bytes,
            "syncs": self.syncs,
            "issue_ms": self.issue.as_secs_f64() * 1e3,
            "wait_ms": self.wait.as_secs_f64() * 1e3,
            "stage_ms": self.stage.as_secs_f64() * 1e3,
            "fell_back_to_1d": self.fell_back_to_1d,
        })
    }

    /// One line: calls, pieces, syncs, and the mean host cost of each.
    pub fn summary(&self) -> String {
        let per = |d: Duration, n: u64| {
            if n == 0 {
                0.0
            } else {
                d.as_secs_f64() * 1e6 / n as f64
            }
        };
        format!(
            "{} copy calls ({} of them 2D) moving {} pieces, {} B; {:.2} µs per call to enqueue; {} syncs, {:.2} µs each{}",
            self.calls,
            self.calls_2d,
            self.pieces,
            self.bytes,
            per(self.issue, self.calls),
            self.syncs,
            per(self.wait, self.syncs),
            if self.fell_back_to_1d {
                " (the driver refused 2D copies: fell back to one copy per piece)"
            } else {
                ""
            }
        )
    }
}

/// A VRAM ring's device side and its staging.
pub(super) struct Device {
    pub(super) buf: DeviceBuffer,
    pub(super) stats: CopyStats,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    slot_len: usize,
    /// Sender: headers and pattern on their way into the slots.
    fill: Option<PinnedBuffer>,
    /// H2D copies out of `fill` queued and not waited for: `fill` must not
    /// be written, nor the slots posted, before a synchronisation.
    fill_pending: bool,
    /// Receiver: headers and checked bytes read back from the slots.
    read: Option<PinnedBuffer>,
    /// Bytes of `read` that the queued checks occupy.
    read_used: usize,
    /// D2H copies into `read` queued and not waited for.
    reads_pending: bool,
    /// Whether pieces may share a 2D copy: the slot stride is within the
    /// device's maximum pitch, and the driver has not refused one.
    two_d: bool,
}

impl Device {
    /// `len` zeroed bytes on `gpu` for slots of `slot_len` bytes.
    pub(super) fn new(gpu: &Gpu, len: usize, slot_len: usize) -> Result<Self> {
        let buf = DeviceBuffer::zeroed(&gpu.ctx, len).with_context(|| {
            format!(
                "allocating {len} bytes on GPU {} for the slots",
                gpu.ordinal
            )
        })?;
        let max_pitch = pinned::max_copy_pitch(&gpu.ctx)
            .with_context(|| format!("reading GPU {}'s maximum copy pitch", gpu.ordinal))?;
        Ok(Self {
            buf,
            stats: CopyStats::default(),
            ctx: gpu.ctx.clone(),
            stream: gpu.stream.clone(),
            slot_len,
            fill: None,
            fill_pending: false,
            read: None,
            read_used: 0,
            reads_pending: false,
            two_d: slot_len <= max_pitch,
        })
    }

    /// Waits for everything queued on the stream: both directions.
    fn sync(&mut self) -> Result<(), DriverError> {
        self.ctx.bind_to_thread()?;
        let t = Instant::now();
        self.stream.synchronize()?;
        self.synced(t);
        Ok(())
    }

    /// Books a synchronisation that started at `t`.
    fn synced(&mut self, t: Instant) {
        self.stats.wait += t.elapsed();
        self.stats.syncs += 1;
        self.fill_pending = false;
        self.reads_pending = false;
    }

    /// One-off: reads `out.len()` bytes at `offset` of the region and waits.
    pub(super) fn read_at(&mut self, offset: usize, out: &mut [u8]) -> Result<()> {
        let t = Instant::now();
        pinned::read_at(&self.buf, offset, out, &self.stream)?;
        self.synced(t);
        Ok(())
    }

    /// One-off: writes `data` at `offset` of the region and waits.
    pub(super) fn write_at(&mut self, offset: usize, data: &[u8]) -> Result<()> {
        let t = Instant::now();
        pinned::write_at(&self.buf, offset, data, &self.stream)?;
        self.synced(t);
        Ok(())
    }

    /// See [`SlotRing::reserve_staging`](super::SlotRing::reserve_staging).
    pub(super) fn reserve(
        &mut self,
        fill_bytes: usize,
        read_bytes: usize,
        checks_queued: bool,
    ) -> Result<()> {
        if fill_bytes > 0 {
            if self.fill_pending {
                self.sync()?;
            }
            grow(&mut self.fill, &self.ctx, fill_bytes)?;
        }
        if read_bytes > 0 {
            ensure!(
                !checks_queued,
                "cannot resize the read staging with checks queued"
            );
            grow(&mut self.read, &self.ctx, read_bytes)?;
        }
        Ok(())
    }

    /// Lays out a batch of fills (`spans`, one entry per slot) in the fill
    /// staging, lets `stage` write the bytes there (timed as
    /// [`CopyStats::stage`]), and queues the H2D copies without waiting. A
    /// previous batch still pending is waited for first, since its staging
    /// is about to be overwritten.
    pub(super) fn queue_fills(
        &mut self,
        spans: &[SlotSpans],
        stage: impl FnOnce(&mut [u8], &Plan),
    ) -> Result<()> {
        if self.fill_pending {
            self.sync()?;
        }
        let plan = plan(spans, 0, self.two_d);
        grow(&mut self.fill, &self.ctx, plan.end)?;
        let staging = self.fill.as_mut().expect("grown above");
        let t = Instant::now();
        stage(staging.as_mut_slice(), &plan);
        self.stats.stage += t.elapsed();
        self.ctx.bind_to_thread()?;
        // Pending from here: even a failed call may leave earlier copies queued.
        self.fill_pending = true;
        // SAFETY: the plan's device ranges lie in the ring (the caller
        // checked the slots, spans lie within a slot), its staging ranges
        // within `plan.end` ≤ the staging's length; the staging is neither
        // written nor freed before a synchronisation (fill_pending, Drop).
        unsafe { self.issue(&plan.copies, Direction::HostToDevice)? };
        Ok(())
    }

    /// Whether queued fills have not been waited for.
    pub(super) fn fill_pending(&self) -> bool {
        self.fill_pending
    }

    /// Waits for the queued fills; no-op when none are pending.
    pub(super) fn fill_wait(&mut self) -> Result<()> {
        if self.fill_pending {
            self.sync()?;
        }
        Ok(())
    }

    /// Lays out a batch of reads (`spans`) in the read staging after the
    /// reads already queued, and queues the D2H copies without waiting;
    /// returns the layout. The staging grows only while `checks_queued` is
    /// false (growing reallocates it).
    pub(super) fn queue_reads(&mut self, spans: &[SlotSpans], checks_queued: bool) -> Result<Plan> {
        let plan = plan(spans, self.read_used, self.two_d);
        let have = self.read.as_ref().map_or(0, |p| p.len());
        if plan.end > have {
            ensure!(
                !checks_queued,
                "the read staging ({have} bytes) is too small for this batch ({} bytes queued, {} more): reserve more, or check the queued slots first",
                self.read_used,
                plan.end - self.read_used
            );
            grow(&mut self.read, &self.ctx, plan.end)?;
        }
        self.ctx.bind_to_thread()?;
        self.reads_pending = true;
        self.read_used = plan.end;
        // SAFETY: as in queue_fills; the staging is read only after a
        // synchronisation (read_staging's callers wait first).
        unsafe { self.issue(&plan.copies, Direction::DeviceToHost)? };
        Ok(plan)
    }

    /// Waits for the queued reads; no-op when none are pending.
    pub(super) fn reads_wait(&mut self) -> Result<()> {
        if self.reads_pending {
            self.sync()?;
        }
        Ok(())
    }

    /// The read staging (empty before any was allocated), once
    /// [`reads_wait`](Self::reads_wait) returned.
    pub(super) fn read_staging(&self) -> &[u8] {
        debug_assert!(!self.reads_pending);
        self.read.as_ref().map_or(&[], |p| p.as_slice())
    }

    /// Frees the read staging's queued space (after its checks were done).
    pub(super) fn reads_done(&mut self) {
        self.read_used = 0;
    }

    /// Queues `copies` on the stream between the slots and the staging of
    /// `dir`, without waiting. 2D copies for multi-row ops while the driver
    /// accepts them; if it refuses one (it may, for pitches it does not
    /// like), that op and all later ones go row by row.
    ///
    /// # Safety
    /// Every op's staging bytes lie in that staging, which stays allocated
    /// and untouched by the CPU until the stream is synchronised; the
    /// context is current.
    unsafe fn issue(&mut self, copies: &[CopyOp], dir: Direction) -> Result<(), DriverError> {
        let t = Instant::now();
        let mut result = Ok(());
        for op in copies {
            self.stats.pieces += op.rows as u64;
            self.stats.bytes += (op.rows * op.len) as u64;
            // SAFETY (both): the caller's contract.
            if op.rows > 1 && self.two_d && unsafe { self.try_rows(op, dir) } {
                continue;
            }
            result = unsafe { self.rows_one_by_one(op, dir) };
            if result.is_err() {
                break;
            }
        }
        self.stats.issue += t.elapsed();
        result
    }

    /// Queues `op` as one copy per row.
    ///
    /// # Safety
    /// As [`issue`](Self::issue).
    unsafe fn rows_one_by_one(&mut self, op: &CopyOp, dir: Direction) -> Result<(), DriverError> {
        for r in 0..op.rows {
            let dev_at = (op.first_slot + r) * self.slot_len + op.at;
            let (buf, stream, host) = self.parts(dir);
            // SAFETY: the caller's contract.
            unsafe {
                pinned::copy_async(
                    dir,
                    buf,
                    dev_at,
                    host,
                    op.staging + r * op.len,
                    op.len,
                    stream,
                )?
            };
            self.stats.calls += 1;
        }
        Ok(())
    }

    /// Tries `op` as one 2D copy; false (and 2D off from now on) if the
    /// driver refused it, which it does before queueing anything.
    ///
    /// # Safety
    /// As [`issue`](Self::issue).
    unsafe fn try_rows(&mut self, op: &CopyOp, dir: Direction) -> bool {
        let shape = Rows {
            device_offset: op.first_slot * self.slot_len + op.at,
            device_pitch: self.slot_len,
            host_offset: op.staging,
            width: op.len,
            rows: op.rows,
        };
        let (buf, stream, host) = self.parts(dir);
        // SAFETY: the caller's contract.
        match unsafe { pinned::copy_rows_async(dir, buf, host, shape, stream) } {
            Ok(()) => {
                self.stats.calls += 1;
                self.stats.calls_2d += 1;
                true
            }
            Err(e) => {
                tracing::warn!(
                    "cuMemcpy2DAsync refused {} rows of {} B, pitch {} ({e}); copying piece by piece from now on",
                    op.rows,
                    op.len,
                    self.slot_len
                );
                self.two_d = false;
                self.stats.fell_back_to_1d = true;
                false
            }
        }
    }

    /// The slots, the stream, and the staging copies of `dir` use.
    fn parts(&mut self, dir: Direction) -> (&DeviceBuffer, &CudaStream, &mut PinnedBuffer) {
        let host = match dir {
            Direction::HostToDevice => self.fill.as_mut(),
            Direction::DeviceToHost => self.read.as_mut(),
        }
        .expect("a batch is planned into existing staging");
        (&self.buf, &self.stream, host)
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // Copies may still be in flight (an error path left a batch
        // queued): the staging they use must outlive them.
        let _ = self.ctx.bind_to_thread();
        let _ = self.stream.synchronize();
    }
}

/// Makes `staging` hold at least `need` bytes (reallocating: callers make
/// sure no copy uses it).
fn grow(staging: &mut Option<PinnedBuffer>, ctx: &Arc<CudaContext>, need: usize) -> Result<()> {
    if staging.as_ref().is_none_or(|p| p.len() < need) {
        // Free the old one first: pinned memory is a scarce resource.
        *staging = None;
        *staging = Some(
            PinnedBuffer::zeroed(ctx, need)
                .with_context(|| format!("allocating {need} bytes of page-locked staging"))?,
        );
    }
    Ok(())
}
