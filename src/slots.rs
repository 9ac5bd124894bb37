//! A ring of transfer slots in one registered region, in DRAM or VRAM:
//! slot `i` is an 8-byte sequence header (little-endian `u64`) followed by
//! the payload, the layout of the seeds' streaming example
//! (`[Seq(8B) + Data][Seq(8B) + Data]...`).
//!
//! The payload of sequence number `s` is [`pattern`] variant `s`, so the
//! receiver can tell this round's bytes from the previous occupant's.
//! VRAM slots are filled and checked through a host staging buffer (one
//! `cuMemcpy` each way), DRAM slots in place.

use std::ops::Range;
use std::sync::Arc;

use anyhow::{Context, Result};
use cudarc::driver::{CudaContext, CudaStream, result};
use nixl_sys::{Agent, RegistrationHandle};

use crate::gpu::{DeviceBuffer, Gpu};
use crate::nixl::memory::HostBuffer;
use crate::nixl::serdes::{Desc, DescList, MemType};
use crate::pattern::{self, Mismatch};

/// Bytes of the sequence header at the start of every slot.
pub const HEADER_BYTES: usize = 8;

/// The header value of a slot that holds no sequence yet.
pub const EMPTY: u64 = u64::MAX;

enum Region {
    Host(HostBuffer),
    Device { buf: DeviceBuffer, ctx: Arc<CudaContext>, stream: Arc<CudaStream> },
}

/// `slots` slots of [`HEADER_BYTES`] + `payload` bytes, contiguous.
pub struct SlotRing {
    region: Region,
    slots: usize,
    payload: usize,
    /// VRAM only: one slot's bytes on the host.
    staging: Vec<u8>,
}

impl SlotRing {
    /// A ring in page-aligned DRAM, every header [`EMPTY`].
    pub fn host(slots: usize, payload: usize) -> Self {
        let mut ring = Self { region: Region::Host(HostBuffer::new(slots * (HEADER_BYTES + payload))), slots, payload, staging: Vec::new() };
        for i in 0..slots {
            ring.set_header(i, EMPTY).expect("DRAM header writes cannot fail");
        }
        ring
    }

    /// A ring in `gpu`'s memory (`cuMemAlloc`), every header [`EMPTY`].
    ///
    /// Errors: out of device memory, or any CUDA error, naming the GPU.
    pub fn device(gpu: &Gpu, slots: usize, payload: usize) -> Result<Self> {
        let len = slots * (HEADER_BYTES + payload);
        let buf = DeviceBuffer::zeroed(&gpu.ctx, len)
            .with_context(|| format!("allocating {len} bytes on GPU {} for the slots", gpu.ordinal))?;
        let mut ring = Self {
            region: Region::Device { buf, ctx: gpu.ctx.clone(), stream: gpu.stream.clone() },
            slots,
            payload,
            staging: vec![0; HEADER_BYTES + payload],
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
            Region::Device { .. } => MemType::Vram,
        }
    }

    fn addr(&self) -> u64 {
        match &self.region {
            Region::Host(b) => b.addr(),
            Region::Device { buf, .. } => buf.addr(),
        }
    }

    fn dev_id(&self) -> u64 {
        match &self.region {
            Region::Host(_) => 0,
            Region::Device { buf, .. } => buf.ordinal() as u64,
        }
    }

    /// Registers the whole region with `agent` (one registration).
    pub fn register(&self, agent: &Agent) -> Result<RegistrationHandle> {
        let r = match &self.region {
            Region::Host(b) => agent.register_memory(b, None),
            Region::Device { buf, .. } => agent.register_memory(buf, None),
        };
        r.with_context(|| format!("registering {} bytes of {:?} slots with NIXL", self.len(), self.mem_type()))
    }

    /// One descriptor per slot (header + payload), in slot order.
    pub fn descs(&self) -> DescList {
        let (base, len, dev_id) = (self.addr(), self.slot_len() as u64, self.dev_id());
        DescList::new(self.mem_type(), (0..self.slots as u64).map(|i| Desc { addr: base + i * len, len, dev_id }).collect())
    }

    /// One descriptor covering the whole region.
    pub fn whole(&self) -> DescList {
        DescList::new(self.mem_type(), vec![Desc { addr: self.addr(), len: self.len() as u64, dev_id: self.dev_id() }])
    }

    fn offset(&self, slot: usize) -> usize {
        assert!(slot < self.slots, "slot {slot} out of {}", self.slots);
        slot * self.slot_len()
    }

    /// The sequence header of `slot` as it is in memory now (a peer may be
    /// writing it: read it only after a completion or notification says
    /// the write landed).
    pub fn header(&mut self, slot: usize) -> Result<u64> {
        let off = self.offset(slot);
        match &self.region {
            Region::Host(b) => {
                // SAFETY: in bounds; volatile because a peer writes this
                // memory behind the compiler's back.
                let v = unsafe { std::ptr::read_volatile(b.as_slice().as_ptr().add(off) as *const [u8; 8]) };
                Ok(u64::from_le_bytes(v))
            }
            Region::Device { buf, ctx, stream } => {
                let mut v = [0u8; 8];
                ctx.bind_to_thread()?;
                // SAFETY: in bounds of the allocation; synchronised below.
                unsafe { result::memcpy_dtoh_async(&mut v[..], buf.addr() + off as u64, stream.cu_stream())? };
                stream.synchronize()?;
                Ok(u64::from_le_bytes(v))
            }
        }
    }

    /// Sets the sequence header of `slot`.
    pub fn set_header(&mut self, slot: usize, value: u64) -> Result<()> {
        let off = self.offset(slot);
        match &mut self.region {
            Region::Host(b) => {
                b.as_mut_slice()[off..off + HEADER_BYTES].copy_from_slice(&value.to_le_bytes());
                Ok(())
            }
            Region::Device { buf, ctx, stream } => {
                let v = value.to_le_bytes();
                ctx.bind_to_thread()?;
                // SAFETY: in bounds; `v` outlives the synchronize.
                unsafe { result::memcpy_htod_async(buf.addr() + off as u64, &v[..], stream.cu_stream())? };
                stream.synchronize()?;
                Ok(())
            }
        }
    }

    /// Writes sequence `seq` into `slot`: the header, and the payload bytes
    /// in `ranges` (byte ranges of the payload, each starting at a multiple
    /// of 8) as pattern (`seed`, `seq`). Bytes outside `ranges` keep
    /// whatever they held.
    pub fn fill(&mut self, slot: usize, seed: u64, seq: u64, ranges: &[Range<usize>]) -> Result<()> {
        let off = self.offset(slot);
        let slot_len = self.slot_len();
        match &mut self.region {
            Region::Host(b) => {
                let s = &mut b.as_mut_slice()[off..off + slot_len];
                s[..HEADER_BYTES].copy_from_slice(&seq.to_le_bytes());
                for r in ranges {
                    pattern::fill_at(&mut s[HEADER_BYTES + r.start..HEADER_BYTES + r.end], r.start as u64, seed, seq);
                }
                Ok(())
            }
            Region::Device { buf, ctx, stream } => {
                let s = &mut self.staging;
                s[..HEADER_BYTES].copy_from_slice(&seq.to_le_bytes());
                ctx.bind_to_thread()?;
                for r in ranges {
                    let piece = &mut s[HEADER_BYTES + r.start..HEADER_BYTES + r.end];
                    pattern::fill_at(piece, r.start as u64, seed, seq);
                    let dst = buf.addr() + (off + HEADER_BYTES + r.start) as u64;
                    // SAFETY: in bounds; the staging buffer outlives the synchronize.
                    unsafe { result::memcpy_htod_async(dst, &*piece, stream.cu_stream())? };
                }
                // SAFETY: as above.
                unsafe { result::memcpy_htod_async(buf.addr() + off as u64, &s[..HEADER_BYTES], stream.cu_stream())? };
                stream.synchronize()?;
                Ok(())
            }
        }
    }

    /// Checks the payload bytes in `ranges` of `slot` against pattern
    /// (`seed`, `seq`); the first mismatch (offsets relative to the payload).
    pub fn verify(&mut self, slot: usize, seed: u64, seq: u64, ranges: &[Range<usize>]) -> Result<Option<Mismatch>> {
        let off = self.offset(slot);
        let mut first: Option<Mismatch> = None;
        let mut count = 0;
        for r in ranges {
            let bytes: &[u8] = match &mut self.region {
                Region::Host(b) => &b.as_slice()[off + HEADER_BYTES + r.start..off + HEADER_BYTES + r.end],
                Region::Device { buf, ctx, stream } => {
                    let piece = &mut self.staging[HEADER_BYTES + r.start..HEADER_BYTES + r.end];
                    ctx.bind_to_thread()?;
                    let src = buf.addr() + (off + HEADER_BYTES + r.start) as u64;
                    // SAFETY: in bounds; synchronised before the bytes are read.
                    unsafe { result::memcpy_dtoh_async(&mut *piece, src, stream.cu_stream())? };
                    stream.synchronize()?;
                    piece
                }
            };
            if let Some(m) = verify_at(bytes, r.start as u64, seed, seq) {
                count += m.count;
                first.get_or_insert(m);
            }
        }
        Ok(first.map(|m| Mismatch { count, ..m }))
    }
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
    let count = bytes.iter().zip(&expect).filter(|(a, b)| a != b).count() as u64;
    let i = bytes.iter().zip(&expect).position(|(a, b)| a != b)?;
    Some(Mismatch { offset: start + i as u64, expected: expect[i], actual: bytes[i], count })
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
        assert!(r.verify(1, 5, 41, &[0..64]).unwrap().is_some(), "stale sequence must fail");
        let m = r.verify(0, 5, 42, &[4088..4096]).unwrap().unwrap();
        assert_eq!((m.offset, m.count > 0), (4088, true));
        assert_eq!(r.descs().descs.len(), 3);
        assert_eq!(r.descs().descs[1].addr - r.descs().descs[0].addr, 4104);
        assert_eq!(r.whole().descs[0].len, 3 * 4104);
    }
}
