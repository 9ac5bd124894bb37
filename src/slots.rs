//! A ring of transfer slots in one registered region, in DRAM or VRAM:
//! slot `i` is an 8-byte sequence header (little-endian `u64`) followed by
//! the payload, the layout of the seeds' streaming example
//! (`[Seq(8B) + Data][Seq(8B) + Data]...`).
//!
//! The payload of sequence number `s` is [`pattern`] variant `s`, so the
//! receiver can tell this round's bytes from the previous occupant's.
//! DRAM slots are filled and checked in place. VRAM slots go through host
//! staging, and for a streaming loop that staging is the cost that matters:
//!
//! - The staging is page-locked (`cuMemHostAlloc`, [`Pinned`]). A copy
//!   between the GPU and pageable memory (a `Vec`) goes through a driver
//!   bounce buffer and does not return before it is done, so an "async"
//!   copy is in effect synchronous; from page-locked memory the copy engine
//!   reads or writes the bytes itself and `cuMemcpy*Async` returns at once.
//! - Copies are queued in batches and waited for with one stream
//!   synchronisation per batch ([`SlotRing::fill_queue`] /
//!   [`SlotRing::fill_wait`] for the sender, [`SlotRing::queue_checks`] /
//!   [`SlotRing::check_queued`] for the receiver) instead of one per piece:
//!   each synchronisation is a round trip to the GPU of several µs, which
//!   is most of what a slot's transfer takes (16 MiB at ~1.2 TB/s is
//!   ~14 µs).
//! - Only the header and the checked byte ranges move, and pieces of a
//!   batch that sit at the same offset of consecutive slots (the header
//!   with the first sampled block, the last block) move in one 2D copy with
//!   one row per slot, so a batch of k sampled slots costs about k + 2
//!   copy calls rather than 3k.
//!
//! The one-call helpers ([`SlotRing::header`], [`SlotRing::verify`],
//! [`SlotRing::fill`]) remain for one-off use; they wait before returning.

use std::ops::Range;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use cudarc::driver::{CudaContext, CudaStream, DriverError, result, sys};
use nixl_sys::{Agent, RegistrationHandle};
use serde_json::json;

use crate::gpu::{DeviceBuffer, Gpu};
use crate::nixl::memory::HostBuffer;
use crate::nixl::serdes::{Desc, DescList, MemType};
use crate::pattern::{self, Mismatch};

/// Bytes of the sequence header at the start of every slot.
pub const HEADER_BYTES: usize = 8;

/// The header value of a slot that holds no sequence yet.
pub const EMPTY: u64 = u64::MAX;

/// One slot and the sequence it holds (or should hold), with the payload
/// byte ranges to fill or check (each starting at a multiple of 8).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotJob {
    pub slot: usize,
    pub seq: u64,
    pub ranges: Vec<Range<usize>>,
}

/// What [`SlotRing::check_queued`] found in one slot: its header, and when
/// the header is the expected sequence, the first payload mismatch in the
/// checked ranges (`None`: all match). When the header is not the
/// expected sequence the payload is not checked (`mismatch` is `None`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotCheck {
    pub slot: usize,
    pub seq: u64,
    pub header: u64,
    pub mismatch: Option<Mismatch>,
}

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

/// Page-locked host memory (`cuMemHostAlloc`), freed on drop.
///
/// Flags 0, i.e. cached: `CudaContext::alloc_pinned` asks for
/// write-combined memory, which the CPU reads uncached, many times slower,
/// and the receiver reads every staged byte with the CPU.
struct Pinned {
    ptr: NonNull<u8>,
    len: usize,
    ctx: Arc<CudaContext>,
}

// SAFETY: plain host memory owned exclusively, like a Vec<u8>.
unsafe impl Send for Pinned {}

impl Pinned {
    fn new(ctx: &Arc<CudaContext>, len: usize) -> Result<Self, DriverError> {
        let len = len.max(1);
        ctx.bind_to_thread()?;
        // SAFETY: a plain allocation, freed exactly once in Drop.
        let ptr = unsafe { result::malloc_host(len, 0)? } as *mut u8;
        let ptr = NonNull::new(ptr).expect("cuMemHostAlloc returned success and a null pointer");
        // Initialised, so every slice of it is sound to form.
        // SAFETY: `len` bytes were just allocated.
        unsafe { ptr.as_ptr().write_bytes(0, len) };
        Ok(Self {
            ptr,
            len,
            ctx: ctx.clone(),
        })
    }

    /// The bytes; callers form slices only while no copy into or out of
    /// them is in flight (after a synchronisation).
    fn as_slice(&self) -> &[u8] {
        // SAFETY: allocated and initialised for `len` bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` is exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // Nothing useful to do with an error here: the process is tearing down.
        let _ = self.ctx.bind_to_thread();
        // SAFETY: from malloc_host in new(), freed once; the ring
        // synchronises its stream before dropping staging (Device's Drop).
        let _ = unsafe { result::free_host(self.ptr.as_ptr() as *mut _) };
    }
}

/// A VRAM ring's device side and its staging.
struct Device {
    buf: DeviceBuffer,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// Sender: headers and pattern on their way into the slots.
    fill: Option<Pinned>,
    /// H2D copies out of `fill` queued and not waited for: `fill` must not
    /// be written, nor the slots posted, before a synchronisation.
    fill_pending: bool,
    /// Receiver: headers and checked bytes read back from the slots.
    read: Option<Pinned>,
    /// Bytes of `read` that the queued checks occupy.
    read_used: usize,
    /// D2H copies into `read` queued and not waited for.
    reads_pending: bool,
    /// Whether pieces may share a 2D copy: the slot stride is within the
    /// device's maximum pitch, and the driver has not refused one.
    two_d: bool,
    stats: CopyStats,
}

impl Device {
    /// Waits for everything queued on the stream: both directions.
    fn sync(&mut self) -> Result<(), DriverError> {
        self.ctx.bind_to_thread()?;
        let t = Instant::now();
        self.stream.synchronize()?;
        self.stats.wait += t.elapsed();
        self.stats.syncs += 1;
        self.fill_pending = false;
        self.reads_pending = false;
        Ok(())
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

enum Region {
    Host(HostBuffer),
    Device(Box<Device>),
}

/// One slot's share of a batch of staged copies.
struct Staged {
    job: SlotJob,
    /// Where the header and the ranges sit in staging (empty for DRAM
    /// rings, which are read in place).
    pieces: Vec<Piece>,
}

/// `slots` slots of [`HEADER_BYTES`] + `payload` bytes, contiguous.
pub struct SlotRing {
    region: Region,
    slots: usize,
    payload: usize,
    /// Checks queued by [`queue_checks`](Self::queue_checks), in order.
    queued: Vec<Staged>,
}

impl SlotRing {
    /// A ring in page-aligned DRAM, every header [`EMPTY`].
    pub fn host(slots: usize, payload: usize) -> Self {
        let region = Region::Host(HostBuffer::new(slots * (HEADER_BYTES + payload)));
        let mut ring = Self {
            region,
            slots,
            payload,
            queued: Vec::new(),
        };
        for i in 0..slots {
            ring.set_header(i, EMPTY)
                .expect("DRAM header writes cannot fail");
        }
        ring
    }

    /// A ring in `gpu`'s memory (`cuMemAlloc`), every header [`EMPTY`].
    /// Staging is allocated on first use, or ahead with
    /// [`reserve_staging`](Self::reserve_staging).
    ///
    /// Errors: out of device memory, or any CUDA error, naming the GPU.
    pub fn device(gpu: &Gpu, slots: usize, payload: usize) -> Result<Self> {
        let slot_len = HEADER_BYTES + payload;
        let len = slots * slot_len;
        let buf = DeviceBuffer::zeroed(&gpu.ctx, len).with_context(|| {
            format!(
                "allocating {len} bytes on GPU {} for the slots",
                gpu.ordinal
            )
        })?;
        let max_pitch = gpu
            .ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_PITCH)
            .with_context(|| format!("reading GPU {}'s maximum copy pitch", gpu.ordinal))?;
        let device = Device {
            buf,
            ctx: gpu.ctx.clone(),
            stream: gpu.stream.clone(),
            fill: None,
            fill_pending: false,
            read: None,
            read_used: 0,
            reads_pending: false,
            two_d: slot_len <= max_pitch.max(0) as usize,
            stats: CopyStats::default(),
        };
        let mut ring = Self {
            region: Region::Device(Box::new(device)),
            slots,
            payload,
            queued: Vec::new(),
        };
        for i in 0..slots {
            ring.set_header(i, EMPTY)?;
        }
        Ok(ring)
    }

    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Payload bytes per slot (the header not counted).
    pub fn payload(&self) -> usize {
        self.payload
    }

    /// Bytes per slot, header included.
    pub fn slot_len(&self) -> usize {
        HEADER_BYTES + self.payload
    }

    /// Bytes of the whole region.
    pub fn len(&self) -> usize {
        self.slots * self.slot_len()
    }

    /// Whether the ring has no slots.
    pub fn is_empty(&self) -> bool {
        self.slots == 0
    }

    /// NIXL memory type of the region.
    pub fn mem_type(&self) -> MemType {
        match self.region {
            Region::Host(_) => MemType::Dram,
            Region::Device(_) => MemType::Vram,
        }
    }

    /// The staged copies' counters (VRAM rings; `None` for DRAM).
    pub fn copy_stats(&self) -> Option<CopyStats> {
        match &self.region {
            Region::Host(_) => None,
            Region::Device(d) => Some(d.stats),
        }
    }

    /// Zeroes the counters of [`copy_stats`](Self::copy_stats) (to count a
    /// loop without the set-up).
    pub fn reset_copy_stats(&mut self) {
        if let Region::Device(d) = &mut self.region {
            d.stats = CopyStats::default();
        }
    }

    fn addr(&self) -> u64 {
        match &self.region {
            Region::Host(b) => b.addr(),
            Region::Device(d) => d.buf.addr(),
        }
    }

    fn dev_id(&self) -> u64 {
        match &self.region {
            Region::Host(_) => 0,
            Region::Device(d) => d.buf.ordinal() as u64,
        }
    }

    /// Registers the whole region with `agent` (one registration).
    pub fn register(&self, agent: &Agent) -> Result<RegistrationHandle> {
        let r = match &self.region {
            Region::Host(b) => agent.register_memory(b, None),
            Region::Device(d) => agent.register_memory(&d.buf, None),
        };
        r.with_context(|| {
            format!(
                "registering {} bytes of {:?} slots with NIXL",
                self.len(),
                self.mem_type()
            )
        })
    }

    /// One descriptor per slot (header + payload), in slot order.
    pub fn descs(&self) -> DescList {
        let (base, len, dev_id) = (self.addr(), self.slot_len() as u64, self.dev_id());
        DescList::new(
            self.mem_type(),
            (0..self.slots as u64)
                .map(|i| Desc {
                    addr: base + i * len,
                    len,
                    dev_id,
                })
                .collect(),
        )
    }

    /// One descriptor covering the whole region.
    pub fn whole(&self) -> DescList {
        DescList::new(
            self.mem_type(),
            vec![Desc {
                addr: self.addr(),
                len: self.len() as u64,
                dev_id: self.dev_id(),
            }],
        )
    }

    fn offset(&self, slot: usize) -> usize {
        assert!(slot < self.slots, "slot {slot} out of {}", self.slots);
        slot * self.slot_len()
    }

    fn check_job(&self, j: &SlotJob) {
        self.offset(j.slot);
        for r in &j.ranges {
            assert!(
                r.start <= r.end && r.end <= self.payload,
                "range {r:?} outside the {}-byte payload",
                self.payload
            );
            assert_eq!(
                r.start % 8,
                0,
                "range {r:?} does not start at a multiple of 8"
            );
        }
    }

    /// Allocates the staging of a VRAM ring ahead of a timed loop:
    /// `fill_bytes` for [`fill_queue`](Self::fill_queue) batches,
    /// `read_bytes` for [`queue_checks`](Self::queue_checks) batches (a
    /// slot's share is at most [`HEADER_BYTES`] + the lengths of its
    /// ranges). No-op for DRAM rings and for a size of 0.
    pub fn reserve_staging(&mut self, fill_bytes: usize, read_bytes: usize) -> Result<()> {
        if let Region::Device(d) = &mut self.region {
            if fill_bytes > 0 {
                if d.fill_pending {
                    d.sync()?;
                }
                grow(&mut d.fill, &d.ctx, fill_bytes)?;
            }
            if read_bytes > 0 {
                ensure!(
                    self.queued.is_empty(),
                    "cannot resize the read staging with checks queued"
                );
                grow(&mut d.read, &d.ctx, read_bytes)?;
            }
        }
        Ok(())
    }

    /// The sequence header of `slot` as it is in memory now (a peer may be
    /// writing it: read it only after a completion or notification says
    /// the write landed). VRAM: one copy and a wait.
    pub fn header(&mut self, slot: usize) -> Result<u64> {
        let off = self.offset(slot);
        match &mut self.region {
            Region::Host(b) => {
                // SAFETY: in bounds; volatile because a peer writes this
                // memory behind the compiler's back.
                let v = unsafe {
                    std::ptr::read_volatile(b.as_slice().as_ptr().add(off) as *const [u8; 8])
                };
                Ok(u64::from_le_bytes(v))
            }
            Region::Device(d) => {
                let mut v = [0u8; 8];
                d.ctx.bind_to_thread()?;
                // SAFETY: in bounds of the allocation; synchronised below.
                unsafe {
                    result::memcpy_dtoh_async(
                        &mut v[..],
                        d.buf.addr() + off as u64,
                        d.stream.cu_stream(),
                    )?
                };
                d.sync()?;
                Ok(u64::from_le_bytes(v))
            }
        }
    }

    /// Sets the sequence header of `slot`. VRAM: one copy and a wait.
    pub fn set_header(&mut self, slot: usize, value: u64) -> Result<()> {
        let off = self.offset(slot);
        match &mut self.region {
            Region::Host(b) => {
                b.as_mut_slice()[off..off + HEADER_BYTES].copy_from_slice(&value.to_le_bytes());
                Ok(())
            }
            Region::Device(d) => {
                let v = value.to_le_bytes();
                d.ctx.bind_to_thread()?;
                // SAFETY: in bounds; `v` outlives the synchronize.
                unsafe {
                    result::memcpy_htod_async(
                        d.buf.addr() + off as u64,
                        &v[..],
                        d.stream.cu_stream(),
                    )?
                };
                d.sync()?;
                Ok(())
            }
        }
    }

    /// Writes sequence `seq` into `slot`: the header, and the payload bytes
    /// in `ranges` (byte ranges of the payload, each starting at a multiple
    /// of 8) as pattern (`seed`, `seq`). Bytes outside `ranges` keep
    /// whatever they held. Done when it returns (VRAM: one batch and a
    /// wait, see [`fill_queue`](Self::fill_queue)).
    pub fn fill(
        &mut self,
        slot: usize,
        seed: u64,
        seq: u64,
        ranges: &[Range<usize>],
    ) -> Result<()> {
        let off = self.offset(slot);
        let slot_len = self.slot_len();
        match &mut self.region {
            Region::Host(b) => {
                let s = &mut b.as_mut_slice()[off..off + slot_len];
                s[..HEADER_BYTES].copy_from_slice(&seq.to_le_bytes());
                for r in ranges {
                    pattern::fill_at(
                        &mut s[HEADER_BYTES + r.start..HEADER_BYTES + r.end],
                        r.start as u64,
                        seed,
                        seq,
                    );
                }
                Ok(())
            }
            Region::Device(_) => {
                self.fill_queue(
                    seed,
                    &[SlotJob {
                        slot,
                        seq,
                        ranges: ranges.to_vec(),
                    }],
                )?;
                self.fill_wait()
            }
        }
    }

    /// Fills every job's slot as [`fill`](Self::fill) does. DRAM: in
    /// place, done on return. VRAM: writes headers and pattern into pinned
    /// staging and queues the H2D copies without waiting; call
    /// [`fill_wait`](Self::fill_wait) before anything reads these slots (a
    /// NIXL WRITE from them: UCX copies on its own stream, which is not
    /// ordered after ours, so only a host-side wait orders them). A
    /// previous batch still pending is waited for first, since its staging
    /// is about to be overwritten. The jobs' slots must be distinct.
    pub fn fill_queue(&mut self, seed: u64, jobs: &[SlotJob]) -> Result<()> {
        for j in jobs {
            self.check_job(j);
        }
        let slot_len = self.slot_len();
        let d = match &mut self.region {
            Region::Host(_) => {
                for j in jobs {
                    self.fill(j.slot, seed, j.seq, &j.ranges)?;
                }
                return Ok(());
            }
            Region::Device(d) => d,
        };
        if d.fill_pending {
            d.sync()?;
        }
        let spans: Vec<_> = jobs.iter().map(|j| (j.slot, spans(&j.ranges))).collect();
        let plan = plan(&spans, 0, d.two_d);
        grow(&mut d.fill, &d.ctx, plan.end)?;
        let staging = d.fill.as_mut().expect("grown above");
        let t = Instant::now();
        for (j, pieces) in jobs.iter().zip(&plan.pieces) {
            stage_fill(staging.as_mut_slice(), pieces, j, seed);
        }
        d.stats.stage += t.elapsed();
        let host = staging.ptr.as_ptr();
        d.ctx.bind_to_thread()?;
        // Pending from here: even a failed call may leave earlier copies queued.
        d.fill_pending = true;
        // SAFETY: the plan's device ranges lie in the ring (slots checked
        // above, spans within a slot), its staging ranges within `plan.end`
        // ≤ the staging's length; the staging is neither written nor freed
        // before a synchronisation (fill_pending, Drop).
        unsafe { issue(d, &plan.copies, Dir::ToDevice, slot_len, host)? };
        Ok(())
    }

    /// Whether VRAM fills are queued and not yet waited for.
    pub fn fill_pending(&self) -> bool {
        matches!(&self.region, Region::Device(d) if d.fill_pending)
    }

    /// Waits for the queued fills (one stream synchronisation). No-op when
    /// none are pending.
    pub fn fill_wait(&mut self) -> Result<()> {
        if let Region::Device(d) = &mut self.region {
            if d.fill_pending {
                d.sync()?;
            }
        }
        Ok(())
    }

    /// Queues a check of each job's slot: its header, and the payload
    /// bytes in its ranges against pattern (`seed`, `seq`), done by
    /// [`check_queued`](Self::check_queued). DRAM: nothing to do yet (the
    /// slot is read in place then). VRAM: queues the D2H copies of header
    /// and ranges into pinned staging, without waiting. Read a slot only
    /// after a notification says its data landed.
    ///
    /// Errors if the staging cannot hold this batch while earlier checks
    /// are still queued (reserve enough with
    /// [`reserve_staging`](Self::reserve_staging)).
    pub fn queue_checks(&mut self, jobs: Vec<SlotJob>) -> Result<()> {
        for j in &jobs {
            self.check_job(j);
        }
        let slot_len = self.slot_len();
        let d = match &mut self.region {
            Region::Host(_) => {
                self.queued.extend(jobs.into_iter().map(|job| Staged {
                    job,
                    pieces: Vec::new(),
                }));
                return Ok(());
            }
            Region::Device(d) => d,
        };
        let spans: Vec<_> = jobs.iter().map(|j| (j.slot, spans(&j.ranges))).collect();
        let plan = plan(&spans, d.read_used, d.two_d);
        let have = d.read.as_ref().map_or(0, |p| p.len);
        if plan.end > have {
            ensure!(
                self.queued.is_empty(),
                "the read staging ({have} bytes) is too small for this batch ({} bytes queued, {} more): reserve more, or check the queued slots first",
                d.read_used,
                plan.end - d.read_used
            );
            grow(&mut d.read, &d.ctx, plan.end)?;
        }
        let host = d.read.as_mut().expect("grown above").ptr.as_ptr();
        d.ctx.bind_to_thread()?;
        d.reads_pending = true;
        d.read_used = plan.end;
        self.queued.extend(
            jobs.into_iter()
                .zip(plan.pieces)
                .map(|(job, pieces)| Staged { job, pieces }),
        );
        // SAFETY: as in fill_queue; the staging is read only after a
        // synchronisation (check_queued waits first).
        unsafe { issue(d, &plan.copies, Dir::ToHost, slot_len, host)? };
        Ok(())
    }

    /// Slots queued for checking.
    pub fn queued_checks(&self) -> usize {
        self.queued.len()
    }

    /// Waits for the queued checks' copies (one stream synchronisation for
    /// the whole batch); no-op for DRAM or when none are pending.
    pub fn wait_queued(&mut self) -> Result<()> {
        if let Region::Device(d) = &mut self.region {
            if d.reads_pending {
                d.sync()?;
            }
        }
        Ok(())
    }

    /// Checks every queued slot, in queue order, and empties the queue.
    /// Waits for the copies first if [`wait_queued`](Self::wait_queued) has
    /// not. A slot's payload is checked only when its header holds the
    /// expected sequence.
    pub fn check_queued(&mut self, seed: u64) -> Result<Vec<SlotCheck>> {
        self.wait_queued()?;
        let slot_len = self.slot_len();
        let mut out = Vec::with_capacity(self.queued.len());
        for s in &self.queued {
            let (slot, seq, ranges) = (s.job.slot, s.job.seq, &s.job.ranges);
            let check = match &self.region {
                Region::Host(b) => {
                    let off = slot * slot_len;
                    // SAFETY: in bounds; volatile, as in header().
                    let h = unsafe {
                        std::ptr::read_volatile(b.as_slice().as_ptr().add(off) as *const [u8; 8])
                    };
                    let header = u64::from_le_bytes(h);
                    let bytes = &b.as_slice()[off + HEADER_BYTES..off + slot_len];
                    let mismatch = if header == seq {
                        verify_ranges(ranges, seed, seq, |r| &bytes[r.clone()])
                    } else {
                        None
                    };
                    SlotCheck {
                        slot,
                        seq,
                        header,
                        mismatch,
                    }
                }
                Region::Device(d) => {
                    let staging = d
                        .read
                        .as_ref()
                        .expect("checks were queued, so the staging exists")
                        .as_slice();
                    check_staged(staging, &s.pieces, &s.job, seed)
                }
            };
            out.push(check);
        }
        self.queued.clear();
        if let Region::Device(d) = &mut self.region {
            d.read_used = 0;
        }
        Ok(out)
    }

    /// Checks the payload bytes in `ranges` of `slot` against pattern
    /// (`seed`, `seq`); the first mismatch (offsets relative to the payload).
    /// VRAM: one copy and a wait per range.
    pub fn verify(
        &mut self,
        slot: usize,
        seed: u64,
        seq: u64,
        ranges: &[Range<usize>],
    ) -> Result<Option<Mismatch>> {
        let off = self.offset(slot);
        match &mut self.region {
            Region::Host(b) => {
                let bytes = &b.as_slice()[off + HEADER_BYTES..off + HEADER_BYTES + self.payload];
                Ok(verify_ranges(ranges, seed, seq, |r| &bytes[r.clone()]))
            }
            Region::Device(d) => {
                let (mut first, mut count): (Option<Mismatch>, u64) = (None, 0);
                for r in ranges {
                    let mut piece = vec![0u8; r.len()];
                    d.ctx.bind_to_thread()?;
                    let src = d.buf.addr() + (off + HEADER_BYTES + r.start) as u64;
                    // SAFETY: in bounds; synchronised before the bytes are read.
                    unsafe {
                        result::memcpy_dtoh_async(&mut piece[..], src, d.stream.cu_stream())?
                    };
                    d.sync()?;
                    if let Some(m) = verify_at(&piece, r.start as u64, seed, seq) {
                        count += m.count;
                        first.get_or_insert(m);
                    }
                }
                Ok(first.map(|m| Mismatch { count, ..m }))
            }
        }
    }

    #[cfg(test)]
    fn host_bytes(&self) -> &[u8] {
        match &self.region {
            Region::Host(b) => b.as_slice(),
            Region::Device(_) => panic!("not a DRAM ring"),
        }
    }
}

/// Makes `staging` hold at least `need` bytes (reallocating: callers make
/// sure no copy uses it).
fn grow(staging: &mut Option<Pinned>, ctx: &Arc<CudaContext>, need: usize) -> Result<()> {
    if staging.as_ref().is_none_or(|p| p.len < need) {
        // Free the old one first: pinned memory is a scarce resource.
        *staging = None;
        *staging = Some(
            Pinned::new(ctx, need)
                .with_context(|| format!("allocating {need} bytes of page-locked staging"))?,
        );
    }
    Ok(())
}

// ------------------------------------------------------ copy planning
//
// Pure functions, so the layout logic is tested on the host (tests below
// emulate the copies with memcpy); only `issue` talks to the driver.

/// A contiguous piece of a slot (`at`: offset from the slot's start,
/// header included) and where it sits in staging.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Piece {
    at: usize,
    len: usize,
    staging: usize,
}

/// One copy call: `rows` pieces of `len` bytes at offset `at` of the
/// consecutive slots `first_slot..first_slot + rows` (rows a slot apart on
/// the device), packed back to back in staging from `staging`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct CopyOp {
    first_slot: usize,
    at: usize,
    len: usize,
    rows: usize,
    staging: usize,
}

struct Plan {
    copies: Vec<CopyOp>,
    /// Per slot of the batch, its pieces in order of `at`.
    pieces: Vec<Vec<Piece>>,
    /// The staging offset after the batch.
    end: usize,
}

/// The spans (offset in the slot, length) a job moves: the header and the
/// payload `ranges`, sorted, overlapping or touching ones merged, empty
/// ones dropped. Merging only touching spans moves no byte outside them.
fn spans(ranges: &[Range<usize>]) -> Vec<(usize, usize)> {
    let mut v: Vec<(usize, usize)> = std::iter::once((0, HEADER_BYTES))
        .chain(
            ranges
                .iter()
                .filter(|r| !r.is_empty())
                .map(|r| (HEADER_BYTES + r.start, HEADER_BYTES + r.end)),
        )
        .collect();
    v.sort_unstable();
    let mut merged: Vec<(usize, usize)> = Vec::with_capacity(v.len());
    for (s, e) in v {
        match merged.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => merged.push((s, e)),
        }
    }
    merged.into_iter().map(|(s, e)| (s, e - s)).collect()
}

/// The copies that move `slots` (each a slot and its spans, in batch order)
/// with staging laid out from `base`. With `coalesce`, a span at the same
/// offset and of the same length in the slots of consecutive batch entries
/// that are consecutive slots joins one 2D copy, a row per slot.
fn plan(slots: &[(usize, Vec<(usize, usize)>)], base: usize, coalesce: bool) -> Plan {
    let mut copies: Vec<CopyOp> = Vec::new();
    // Per entry, per span: (copy, row).
    let mut rows: Vec<Vec<(usize, usize)>> = Vec::with_capacity(slots.len());
    for (i, (slot, spans)) in slots.iter().enumerate() {
        let follows = coalesce && i > 0 && slots[i - 1].0 + 1 == *slot;
        let mut mine = Vec::with_capacity(spans.len());
        for &(at, len) in spans {
            // The copy the previous entry's identical span went into: its
            // last row is the previous slot, so this slot is its next row.
            let ext = if follows {
                rows[i - 1]
                    .iter()
                    .map(|&(c, _)| c)
                    .find(|&c| copies[c].at == at && copies[c].len == len)
            } else {
                None
            };
            match ext {
                Some(c) => {
                    debug_assert_eq!(copies[c].first_slot + copies[c].rows, *slot);
                    mine.push((c, copies[c].rows));
                    copies[c].rows += 1;
                }
                None => {
                    mine.push((copies.len(), 0));
                    copies.push(CopyOp {
                        first_slot: *slot,
                        at,
                        len,
                        rows: 1,
                        staging: 0,
                    });
                }
            }
        }
        rows.push(mine);
    }
    let mut end = base;
    for c in &mut copies {
        c.staging = end;
        end += c.len * c.rows;
    }
    let pieces = slots
        .iter()
        .zip(&rows)
        .map(|((_, spans), mine)| {
            spans
                .iter()
                .zip(mine)
                .map(|(&(at, len), &(c, r))| Piece {
                    at,
                    len,
                    staging: copies[c].staging + r * len,
                })
                .collect()
        })
        .collect();
    Plan {
        copies,
        pieces,
        end,
    }
}

/// The staging offset of slot bytes `at..at + len`, which one piece holds.
fn locate(pieces: &[Piece], at: usize, len: usize) -> usize {
    let p = pieces
        .iter()
        .find(|p| p.at <= at && at + len <= p.at + p.len)
        .unwrap_or_else(|| panic!("slot bytes {at}+{len} are in no staged piece: {pieces:?}"));
    p.staging + (at - p.at)
}

/// Writes `job`'s header and pattern where its `pieces` sit in `staging`.
fn stage_fill(staging: &mut [u8], pieces: &[Piece], job: &SlotJob, seed: u64) {
    let h = locate(pieces, 0, HEADER_BYTES);
    staging[h..h + HEADER_BYTES].copy_from_slice(&job.seq.to_le_bytes());
    for r in job.ranges.iter().filter(|r| !r.is_empty()) {
        let at = locate(pieces, HEADER_BYTES + r.start, r.len());
        pattern::fill_at(
            &mut staging[at..at + r.len()],
            r.start as u64,
            seed,
            job.seq,
        );
    }
}

/// Checks `job`'s slot from the copies of its `pieces` in `staging`.
fn check_staged(staging: &[u8], pieces: &[Piece], job: &SlotJob, seed: u64) -> SlotCheck {
    let h = locate(pieces, 0, HEADER_BYTES);
    let header = u64::from_le_bytes(staging[h..h + HEADER_BYTES].try_into().expect("8 bytes"));
    let mismatch = if header == job.seq {
        verify_ranges(&job.ranges, seed, job.seq, |r| {
            if r.is_empty() {
                return &[];
            }
            let at = locate(pieces, HEADER_BYTES + r.start, r.len());
            &staging[at..at + r.len()]
        })
    } else {
        None
    };
    SlotCheck {
        slot: job.slot,
        seq: job.seq,
        header,
        mismatch,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dir {
    ToDevice,
    ToHost,
}

/// Queues `copies` on the ring's stream between its slots and the staging
/// at `host`, without waiting. 2D copies for multi-row ops while the
/// driver accepts them; if it refuses one (it may, for pitches it does not
/// like), that op and all later ones go row by row.
///
/// # Safety
/// Every op's device bytes lie in the ring and its staging bytes in the
/// allocation at `host`, which stays allocated and untouched by the CPU
/// until the stream is synchronised; the ring's context is current.
unsafe fn issue(
    d: &mut Device,
    copies: &[CopyOp],
    dir: Dir,
    slot_len: usize,
    host: *mut u8,
) -> Result<(), DriverError> {
    let stream = d.stream.cu_stream();
    let t = Instant::now();
    let result = (|| -> Result<(), DriverError> {
        for op in copies {
            let dev = d.buf.addr() + (op.first_slot * slot_len + op.at) as u64;
            // SAFETY: within the staging allocation (caller).
            let h = unsafe { host.add(op.staging) };
            d.stats.pieces += op.rows as u64;
            d.stats.bytes += (op.rows * op.len) as u64;
            if op.rows > 1 && d.two_d {
                let (host_pitch, dev_pitch) = (op.len, slot_len);
                let p = sys::CUDA_MEMCPY2D {
                    srcXInBytes: 0,
                    srcY: 0,
                    srcMemoryType: if dir == Dir::ToDevice {
                        sys::CUmemorytype::CU_MEMORYTYPE_HOST
                    } else {
                        sys::CUmemorytype::CU_MEMORYTYPE_DEVICE
                    },
                    srcHost: if dir == Dir::ToDevice {
                        h as *const _
                    } else {
                        std::ptr::null()
                    },
                    srcDevice: if dir == Dir::ToDevice { 0 } else { dev },
                    srcArray: std::ptr::null_mut(),
                    srcPitch: if dir == Dir::ToDevice {
                        host_pitch
                    } else {
                        dev_pitch
                    },
                    dstXInBytes: 0,
                    dstY: 0,
                    dstMemoryType: if dir == Dir::ToDevice {
                        sys::CUmemorytype::CU_MEMORYTYPE_DEVICE
                    } else {
                        sys::CUmemorytype::CU_MEMORYTYPE_HOST
                    },
                    dstHost: if dir == Dir::ToDevice {
                        std::ptr::null_mut()
                    } else {
                        h as *mut _
                    },
                    dstDevice: if dir == Dir::ToDevice { dev } else { 0 },
                    dstArray: std::ptr::null_mut(),
                    dstPitch: if dir == Dir::ToDevice {
                        dev_pitch
                    } else {
                        host_pitch
                    },
                    WidthInBytes: op.len,
                    Height: op.rows,
                };
                // SAFETY: the struct describes ranges the caller vouches for.
                match unsafe { sys::cuMemcpy2DAsync_v2(&p, stream) }.result() {
                    Ok(()) => {
                        d.stats.calls += 1;
                        d.stats.calls_2d += 1;
                        continue;
                    }
                    Err(e) => {
                        // Parameter checks fail before anything is queued.
                        eprintln!(
                            "[slots] cuMemcpy2DAsync refused {} rows of {} B, pitch {slot_len} ({e}); copying piece by piece from now on",
                            op.rows, op.len
                        );
                        d.two_d = false;
                        d.stats.fell_back_to_1d = true;
                    }
                }
            }
            for r in 0..op.rows {
                let (dev, h) = (dev + (r * slot_len) as u64, unsafe { h.add(r * op.len) });
                // SAFETY: as above.
                unsafe {
                    match dir {
                        Dir::ToDevice => {
                            sys::cuMemcpyHtoDAsync_v2(dev, h as *const _, op.len, stream)
                                .result()?
                        }
                        Dir::ToHost => {
                            sys::cuMemcpyDtoHAsync_v2(h as *mut _, dev, op.len, stream).result()?
                        }
                    }
                }
                d.stats.calls += 1;
            }
        }
        Ok(())
    })();
    d.stats.issue += t.elapsed();
    result
}

/// The first mismatch of the payload `ranges` against pattern (`seed`,
/// `seq`), `bytes(r)` giving each range's bytes; the count covers all.
fn verify_ranges<'a>(
    ranges: &[Range<usize>],
    seed: u64,
    seq: u64,
    bytes: impl Fn(&Range<usize>) -> &'a [u8],
) -> Option<Mismatch> {
    let mut first: Option<Mismatch> = None;
    let mut count = 0;
    for r in ranges {
        if let Some(m) = verify_at(bytes(r), r.start as u64, seed, seq) {
            count += m.count;
            first.get_or_insert(m);
        }
    }
    first.map(|m| Mismatch { count, ..m })
}

/// [`pattern::verify`] for bytes that sit at `start` of the pattern: the
/// pattern module checks from offset 0, so check a copy laid out from 0
/// only when `start` is not 0.
fn verify_at(bytes: &[u8], start: u64, seed: u64, seq: u64) -> Option<Mismatch> {
    if start == 0 {
        return pattern::verify(bytes, seed, seq);
    }
    let mut expect = vec![0u8; bytes.len()];
    pattern::fill_at(&mut expect, start, seed, seq);
    // The common case first: one memcmp rather than two byte-wise scans.
    if bytes == expect.as_slice() {
        return None;
    }
    let count = bytes.iter().zip(&expect).filter(|(a, b)| a != b).count() as u64;
    let i = bytes.iter().zip(&expect).position(|(a, b)| a != b)?;
    Some(Mismatch {
        offset: start + i as u64,
        expected: expect[i],
        actual: bytes[i],
        count,
    })
}

#[cfg(test)]
// Single ranges are what the callers pass for a whole payload.
#[allow(clippy::single_range_in_vec_init)]
mod tests {
    use super::*;

    #[test]
    fn host_ring_fills_and_verifies_in_pieces() {
        let mut r = SlotRing::host(3, 4096);
        assert_eq!(r.header(2).unwrap(), EMPTY);
        r.fill(1, 5, 42, &[0..4096]).unwrap();
        assert_eq!(r.header(1).unwrap(), 42);
        assert_eq!(r.verify(1, 5, 42, &[0..4096]).unwrap(), None);
        assert_eq!(r.verify(1, 5, 42, &[1024..2048, 4000..4096]).unwrap(), None);
        assert!(
            r.verify(1, 5, 41, &[0..64]).unwrap().is_some(),
            "stale sequence must fail"
        );
        let m = r.verify(0, 5, 42, &[4088..4096]).unwrap().unwrap();
        assert_eq!((m.offset, m.count > 0), (4088, true));
        assert_eq!(r.descs().descs.len(), 3);
        assert_eq!(r.descs().descs[1].addr - r.descs().descs[0].addr, 4104);
        assert_eq!(r.whole().descs[0].len, 3 * 4104);
    }

    #[test]
    fn host_ring_queued_checks_classify_like_header_and_verify() {
        let mut r = SlotRing::host(2, 4096);
        r.fill(0, 5, 10, &[0..4096]).unwrap();
        r.fill(1, 5, 13, &[0..4096]).unwrap();
        let jobs = vec![
            SlotJob {
                slot: 0,
                seq: 10,
                ranges: vec![0..4096],
            },
            SlotJob {
                slot: 1,
                seq: 11,
                ranges: vec![0..4096],
            },
        ];
        r.queue_checks(jobs).unwrap();
        assert_eq!(r.queued_checks(), 2);
        let c = r.check_queued(5).unwrap();
        assert_eq!(r.queued_checks(), 0);
        assert_eq!(
            c[0],
            SlotCheck {
                slot: 0,
                seq: 10,
                header: 10,
                mismatch: None
            }
        );
        // A later sequence in the header: reported as found, payload not checked.
        assert_eq!(
            c[1],
            SlotCheck {
                slot: 1,
                seq: 11,
                header: 13,
                mismatch: None
            }
        );
        assert!(r.copy_stats().is_none());
    }

    #[test]
    fn spans_join_the_header_and_touching_ranges_only() {
        assert_eq!(spans(&[0..4096]), vec![(0, 4104)]);
        assert_eq!(spans(&[]), vec![(0, 8)]);
        assert_eq!(spans(&[8192..12288, 0..4096, 4096..8192]), vec![(0, 12296)]);
        assert_eq!(
            spans(&[4096..8192, 100..100, 16384..20000]),
            vec![(0, 8), (4104, 4096), (16392, 3616)]
        );
        assert_eq!(spans(&[0..64, 32..128]), vec![(0, 136)]);
    }

    #[test]
    fn plans_coalesce_identical_pieces_of_consecutive_slots() {
        let same = |slot| (slot, vec![(0, 4104), (65544, 4096)]);
        // Slots 6, 7, then the ring wraps to 0, 1.
        let batch = vec![
            same(6),
            same(7),
            same(0),
            (1, vec![(0, 4104), (8200, 4096), (65544, 4096)]),
        ];
        let p = plan(&batch, 100, true);
        let shape: Vec<_> = p
            .copies
            .iter()
            .map(|c| (c.first_slot, c.at, c.rows))
            .collect();
        assert_eq!(
            shape,
            vec![
                (6, 0, 2),
                (6, 65544, 2),
                (0, 0, 2),
                (0, 65544, 2),
                (1, 8200, 1)
            ]
        );
        assert_eq!(p.end, 100 + 4 * 4104 + 4 * 4096 + 4096);
        assert_eq!(p.copies[0].staging, 100);
        assert_eq!(
            p.pieces[1][0],
            Piece {
                at: 0,
                len: 4104,
                staging: 100 + 4104
            }
        );
        assert_eq!(
            p.pieces[1][1],
            Piece {
                at: 65544,
                len: 4096,
                staging: 100 + 2 * 4104 + 4096
            }
        );
        let flat = plan(&batch, 0, false);
        assert!(flat.copies.iter().all(|c| c.rows == 1));
        assert_eq!(flat.copies.len(), 9);
        assert_eq!(flat.end, p.end - 100);
        // Staging pieces never overlap.
        let mut all: Vec<_> = p
            .pieces
            .iter()
            .flatten()
            .map(|x| (x.staging, x.staging + x.len))
            .collect();
        all.sort_unstable();
        assert!(all.windows(2).all(|w| w[0].1 <= w[1].0));
    }

    /// What the driver does with a plan, done with memcpy on host memory.
    fn emulate(
        copies: &[CopyOp],
        dir: Dir,
        region: &mut [u8],
        slot_len: usize,
        staging: &mut [u8],
    ) {
        for op in copies {
            for r in 0..op.rows {
                let d = (op.first_slot + r) * slot_len + op.at;
                let h = op.staging + r * op.len;
                match dir {
                    Dir::ToDevice => region[d..d + op.len].copy_from_slice(&staging[h..h + op.len]),
                    Dir::ToHost => staging[h..h + op.len].copy_from_slice(&region[d..d + op.len]),
                }
            }
        }
    }

    /// The first, a sequence-dependent and the last 4 KiB block, as the
    /// streaming example samples (including picks next to the others).
    fn sample(payload: usize, seq: u64) -> Vec<Range<usize>> {
        let blocks = payload / 4096;
        let pick = (seq as usize * 5) % blocks;
        let last = (payload - 4096) & !7;
        let mut v = vec![0..4096, pick * 4096..(pick + 1) * 4096, last..payload];
        v.sort_by_key(|r| r.start);
        v.dedup_by(|b, a| b.start < a.end);
        v
    }

    /// The staged (VRAM) path, its copies emulated, leaves the same bytes
    /// and finds the same problems as the in-place (DRAM) path.
    #[test]
    fn staged_fill_and_check_agree_with_the_in_place_ring() {
        let (n, payload, seed) = (5usize, 6 * 4096 + 24, 9u64);
        let slot_len = HEADER_BYTES + payload;
        for coalesce in [false, true] {
            let mut reference = SlotRing::host(n, payload);
            let mut image = reference.host_bytes().to_vec();
            for first in [0u64, 3, 8, 16] {
                // A batch: consecutive sequences, distinct slots, wrapping.
                let jobs: Vec<SlotJob> = (first..first + n as u64)
                    .map(|seq| SlotJob {
                        slot: seq as usize % n,
                        seq,
                        ranges: sample(payload, seq),
                    })
                    .collect();
                for j in &jobs {
                    reference.fill(j.slot, seed, j.seq, &j.ranges).unwrap();
                }
                let spans: Vec<_> = jobs.iter().map(|j| (j.slot, spans(&j.ranges))).collect();
                let p = plan(&spans, 0, coalesce);
                let mut staging = vec![0u8; p.end];
                for (j, pieces) in jobs.iter().zip(&p.pieces) {
                    stage_fill(&mut staging, pieces, j, seed);
                }
                emulate(&p.copies, Dir::ToDevice, &mut image, slot_len, &mut staging);
                assert!(
                    image == reference.host_bytes(),
                    "staged fill differs (first {first}, coalesce {coalesce})"
                );
                if coalesce {
                    assert!(p.copies.len() < spans.iter().map(|s| s.1.len()).sum::<usize>());
                }

                // Damage: a payload byte of one slot, the header of another
                // (overwritten by the sequence a lap later).
                let (bad, lapped) = (jobs[1].slot, jobs[3].slot);
                let byte = bad * slot_len + HEADER_BYTES + jobs[1].ranges.last().unwrap().start + 5;
                let hdr = lapped * slot_len;
                image[byte] ^= 0x40;
                image[hdr..hdr + 8].copy_from_slice(&(jobs[3].seq + n as u64).to_le_bytes());
                let flat = std::mem::take(&mut image);
                let mut damaged = SlotRing::host(n, payload);
                if let Region::Host(b) = &mut damaged.region {
                    b.as_mut_slice().copy_from_slice(&flat);
                }
                image = flat;

                let p = plan(&spans, 77, coalesce);
                let mut staging = vec![0u8; p.end];
                emulate(&p.copies, Dir::ToHost, &mut image, slot_len, &mut staging);
                let staged: Vec<SlotCheck> = jobs
                    .iter()
                    .zip(&p.pieces)
                    .map(|(j, pieces)| check_staged(&staging, pieces, j, seed))
                    .collect();
                damaged.queue_checks(jobs.clone()).unwrap();
                let in_place = damaged.check_queued(seed).unwrap();
                assert_eq!(staged, in_place);
                assert!(
                    staged[1].mismatch.is_some_and(|m| m.count == 1),
                    "{:?}",
                    staged[1]
                );
                assert_eq!(staged[3].header, jobs[3].seq + n as u64);
                assert!(
                    staged.iter().enumerate().all(|(i, c)| i == 1
                        || i == 3
                        || (c.header == c.seq && c.mismatch.is_none()))
                );

                // Undo the damage for the next round.
                image[byte] ^= 0x40;
                image[hdr..hdr + 8].copy_from_slice(&jobs[3].seq.to_le_bytes());
            }
        }
    }
}
