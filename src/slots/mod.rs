//! A ring of transfer slots in one registered region, in DRAM or VRAM:
//! slot `i` is an 8-byte sequence header (little-endian `u64`) followed by
//! the payload, the layout of the streaming example in upstream's Python
//! examples (NIXL PR #980)
//! (`[Seq(8B) + Data][Seq(8B) + Data]...`).
//!
//! The payload of sequence number `s` is [`pattern`](crate::pattern)
//! variant `s`, so the receiver can tell this round's bytes from the
//! previous occupant's. DRAM slots are filled and checked in place. VRAM
//! slots go through host staging, and for a streaming loop that staging is
//! the cost that matters:
//!
//! - The staging is page-locked ([`PinnedBuffer`](crate::gpu::PinnedBuffer)):
//!   from pageable memory an "async" copy is in effect synchronous.
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
//!
//! Where things are: this file has the ring and its one-off helpers;
//! `fill.rs` the sender's batched fills, `check.rs` the receiver's batched
//! checks, `staging.rs` how a batch is laid out in staging and which copies
//! move it, `device.rs` the VRAM side (staging buffers, queued copies,
//! their cost); [`Coverage`] says which bytes a loop fills and checks, and
//! [`Phases`] times a loop's phases.

mod check;
mod coverage;
mod device;
mod fill;
pub mod phases;
mod staging;

use std::ops::Range;

use anyhow::{Context, Result};
use nixl_sys::{Agent, RegistrationHandle};

mod verify;

pub use coverage::{Coverage, SAMPLE_BLOCK};
pub use device::CopyStats;
pub use phases::Phases;
pub use verify::SlotCheck;

use crate::cli::UsageError;
use crate::gpu::Gpu;
use crate::nixl::memory::HostBuffer;
use crate::nixl::serdes::{Desc, DescList, MemType};
use device::Device;
use staging::Piece;

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
        let device = Device::new(
            gpu,
            slots * (HEADER_BYTES + payload),
            HEADER_BYTES + payload,
        )?;
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
        let checks_queued = !self.queued.is_empty();
        if let Region::Device(d) = &mut self.region {
            d.reserve(fill_bytes, read_bytes, checks_queued)?;
        }
        Ok(())
    }

    /// The sequence header of `slot` as it is in memory now (a peer may be
    /// writing it: read it only after a completion or notification says
    /// the write landed). VRAM: one copy and a wait.
    pub fn header(&mut self, slot: usize) -> Result<u64> {
        let off = self.offset(slot);
        match &mut self.region {
            Region::Host(b) => Ok(read_header(b.as_slice(), off)),
            Region::Device(d) => {
                let mut v = [0u8; 8];
                d.read_at(off, &mut v)?;
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
            Region::Device(d) => d.write_at(off, &value.to_le_bytes()),
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

/// The header at `off` of DRAM slots, read volatile: a peer writes this
/// memory behind the compiler's back.
fn read_header(region: &[u8], off: usize) -> u64 {
    let bytes = &region[off..off + HEADER_BYTES];
    // SAFETY: the 8 bytes are in bounds (sliced above); read_volatile has
    // no alignment requirement for a byte array.
    let v = unsafe { std::ptr::read_volatile(bytes.as_ptr() as *const [u8; 8]) };
    u64::from_le_bytes(v)
}

/// The two roles of a stream through a ring, as `--role` takes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Role {
    /// Registers the slot ring, publishes it, consumes and verifies.
    Receiver,
    /// Writes sequence after sequence into the receiver's slots.
    Sender,
}

impl crate::exchange::pair::Roles for Role {
    const BOTH: [Self; 2] = [Role::Receiver, Role::Sender];
    fn name(self) -> &'static str {
        match self {
            Role::Receiver => "receiver",
            Role::Sender => "sender",
        }
    }
}

/// The options of a streaming ring and its flow control, as `send_recv`
/// and `send_recv_bench` take them (flatten into the program's arguments):
/// the defaults of upstream's Python example (NIXL PR #980), 64 slots × 16 MiB and 1000 transfers.
#[derive(Clone, Debug, clap::Args)]
pub struct RingArgs {
    /// Slots in the ring.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub num_buffers: u32,
    /// Payload bytes per slot (K, M, G suffixes: powers of 1024); each slot
    /// also has an 8-byte header.
    #[arg(long, default_value = "16M", value_parser = crate::cli::parse_bytes)]
    pub buffer_size: u64,
    /// Sequences to send.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    pub num_transfers: u64,
    /// The receiver reports progress every this many transfers
    /// [default: num-buffers/4, at least 1].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub progress_every: Option<u32>,
    /// The sender waits when this many transfers ahead of the receiver's
    /// last progress report [default: num-buffers-4, at least 1].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub backpressure_at: Option<u32>,
    /// Never wait for the receiver. Shows what backpressure prevents: with
    /// a receiver slower than the sender (--consume-us) slots are
    /// overwritten before they are consumed, the receiver counts the
    /// overruns and the run exits 3.
    #[arg(long)]
    pub no_backpressure: bool,
    /// Microseconds the receiver spends on each slot after checking it,
    /// as a slow consumer would.
    #[arg(long, default_value_t = 0)]
    pub consume_us: u64,
}

impl RingArgs {
    /// `--progress-every` in effect.
    pub fn every(&self) -> u64 {
        self.progress_every.unwrap_or((self.num_buffers / 4).max(1)) as u64
    }

    /// `--backpressure-at` in effect.
    pub fn at(&self) -> u64 {
        let default = self.num_buffers.saturating_sub(4).max(1);
        self.backpressure_at.unwrap_or(default) as u64
    }

    /// Checks these options before anything is allocated: what clap cannot
    /// express. `host_rings` rings of this size are to live in this
    /// machine's memory (0 for rings in VRAM).
    ///
    /// Errors ([`UsageError`], exit 2): `--backpressure-at` over
    /// `--num-buffers` (the sender would overwrite slots not yet consumed),
    /// `--progress-every` over `--backpressure-at` (the sender would wait
    /// for a report that never comes), a ring over 1 TiB, or more host
    /// memory than this machine has available.
    pub fn check(&self, host_rings: u64) -> Result<(), UsageError> {
        let (n, payload, every, at) = (
            self.num_buffers as u64,
            self.buffer_size,
            self.every(),
            self.at(),
        );
        let ensure = |ok: bool, msg: String| if ok { Ok(()) } else { Err(UsageError(msg)) };
        ensure(
            at <= n,
            format!(
                "--backpressure-at {at} exceeds --num-buffers {n}: the sender would overwrite slots the receiver has not consumed"
            ),
        )?;
        // The sender stops at `at` ahead and waits for a report; reports come
        // every `every`. With every > at the receiver could consume everything
        // posted without reaching the next report: both would wait forever.
        ensure(
            every <= at,
            format!(
                "--progress-every {every} exceeds --backpressure-at {at}: the sender would wait for a report that never comes"
            ),
        )?;
        let ring = (payload as u128 + HEADER_BYTES as u128) * n as u128;
        ensure(
            ring <= 1 << 40,
            format!(
                "--num-buffers {n} × (--buffer-size {payload} + an 8-byte header) is {ring} bytes, more than 1 TiB: \
                 use fewer or smaller slots"
            ),
        )?;
        if host_rings == 0 {
            return Ok(());
        }
        crate::cli::check_host_memory(
            ring as u64 * host_rings,
            &format!(
                "{host_rings} ring(s) of {n} × {} (--num-buffers × --buffer-size, plus headers)",
                crate::cli::fmt_bytes(payload)
            ),
            "use fewer or smaller slots (--num-buffers, --buffer-size)",
        )
    }
}
