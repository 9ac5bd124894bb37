//! Page-locked host memory, and the copies between it and device memory
//! that a streaming loop queues in batches.
//!
//! A copy between the GPU and pageable memory (a `Vec`) goes through a
//! driver bounce buffer and does not return before it is done, so an
//! "async" copy is in effect synchronous; from page-locked memory the copy
//! engine reads or writes the bytes itself and `cuMemcpy*Async` returns at
//! once. That is what lets a loop queue a batch of copies and wait once.
//!
//! The allocation is cudarc's ([`PinnedHostSlice`]). The copies are raw
//! driver calls because cudarc's safe copies do not fit: it has no 2D copy;
//! it copies only whole `CudaSlice`s and whole pinned slices, not a piece
//! at a byte offset of a [`DeviceBuffer`] (memory NIXL registers, which is
//! not a `CudaSlice`, see there) into a piece of staging; and it treats a
//! sub-slice of pinned memory as pageable, synchronising the stream after
//! every copy, which is the cost batching exists to avoid.

use std::ptr::NonNull;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream, DriverError, PinnedHostSlice, result, sys};

use super::DeviceBuffer;

/// Page-locked ("pinned") host memory, zeroed at allocation, freed on drop.
///
/// Cached (`cuMemHostAlloc` flags 0): `CudaContext::alloc_pinned` asks
/// for write-combined memory, which the CPU reads uncached, many times
/// slower, and a receiver reads every staged byte with the CPU.
pub struct PinnedBuffer {
    mem: PinnedHostSlice<u8>,
    /// `mem`'s bytes. cudarc's `as_slice` first waits on an event that only
    /// cudarc's own copies record; the copies here are queued with the raw
    /// calls below, and their callers synchronise the stream themselves
    /// before touching the bytes, so the slices are formed from this.
    ptr: NonNull<u8>,
}

// SAFETY: plain host memory owned exclusively, like a Vec<u8>.
unsafe impl Send for PinnedBuffer {}

impl PinnedBuffer {
    /// `len` zeroed bytes (at least 1) of page-locked memory in `ctx`.
    ///
    /// Errors: the driver cannot pin that much (page-locked memory is
    /// limited by the machine's RAM and `ulimit -l`).
    pub fn zeroed(ctx: &Arc<CudaContext>, len: usize) -> Result<Self, DriverError> {
        let len = len.max(1);
        // SAFETY: the bytes are initialised below before any slice is formed.
        let mut mem = unsafe { ctx.alloc_pinned_with_flags::<u8>(len, 0)? };
        let ptr = NonNull::new(mem.as_mut_ptr()?).expect("cuMemHostAlloc returned null");
        // SAFETY: `len` bytes were just allocated and nothing else uses them.
        unsafe { ptr.as_ptr().write_bytes(0, len) };
        Ok(Self { mem, ptr })
    }

    /// Bytes.
    pub fn len(&self) -> usize {
        self.mem.len()
    }

    pub fn is_empty(&self) -> bool {
        self.mem.is_empty()
    }

    /// The bytes. Form slices only while no copy into or out of them is in
    /// flight (after the stream they were queued on is synchronised).
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: allocated and initialised for `len` bytes; copies queued
        // by the functions below are the callers' to wait for (their
        // safety contracts).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len()) }
    }

    /// As [`as_slice`](Self::as_slice), writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` is exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len()) }
    }

    /// Address of byte `offset`, which must be in bounds (asserted).
    fn at(&mut self, offset: usize, len: usize) -> *mut u8 {
        assert!(
            offset.checked_add(len).is_some_and(|e| e <= self.len()),
            "staging bytes {offset}+{len} outside the {}-byte pinned buffer",
            self.len()
        );
        // SAFETY: in bounds, checked above.
        unsafe { self.ptr.as_ptr().add(offset) }
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        // cudarc frees the memory (`cuMemFreeHost`) after this, and the
        // driver wants the owning context current for that. Nothing
        // useful to do with an error here: the process is tearing down.
        let _ = self.mem.context().bind_to_thread();
    }
}

/// Which way a copy goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// From pinned staging into device memory.
    HostToDevice,
    /// From device memory into pinned staging.
    DeviceToHost,
}

/// The shape of one 2D copy, in bytes: `rows` rows of `width` bytes; on the
/// device, row r starts at `device_offset + r·device_pitch` of the buffer;
/// in staging, the rows are packed back to back from `host_offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rows {
    pub device_offset: usize,
    pub device_pitch: usize,
    pub host_offset: usize,
    pub width: usize,
    pub rows: usize,
}

/// The largest device pitch, bytes, that a 2D copy on `ctx`'s GPU accepts
/// (`CU_DEVICE_ATTRIBUTE_MAX_PITCH`).
pub fn max_copy_pitch(ctx: &CudaContext) -> Result<usize, DriverError> {
    let v = ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_PITCH)?;
    Ok(v.max(0) as usize)
}

/// Queues one 2D copy (`cuMemcpy2DAsync`) of `shape` between `dev` and
/// `host` on `stream`, without waiting. Bounds are asserted.
///
/// Errors: the driver refuses the shape (a pitch it does not support,
/// e.g. above [`max_copy_pitch`]); its parameter checks fail before
/// anything is queued.
///
/// # Safety
/// `dev` and `host` stay allocated, and the CPU neither reads nor writes
/// `host`'s copied bytes, until `stream` is synchronised; `dev`'s context
/// is current.
pub unsafe fn copy_rows_async(
    dir: Direction,
    dev: &DeviceBuffer,
    host: &mut PinnedBuffer,
    shape: Rows,
    stream: &CudaStream,
) -> Result<(), DriverError> {
    let Rows {
        device_offset,
        device_pitch,
        host_offset,
        width,
        rows,
    } = shape;
    if rows == 0 {
        return Ok(());
    }
    let dev_end = device_offset + (rows - 1) * device_pitch + width;
    assert!(dev_end <= dev.len(), "2D copy past the device buffer");
    let h = host.at(host_offset, rows * width);
    let d = dev.addr() + device_offset as u64;
    let (host_type, device_type) = (
        sys::CUmemorytype::CU_MEMORYTYPE_HOST,
        sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
    );
    let mut p = sys::CUDA_MEMCPY2D {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: host_type,
        srcHost: std::ptr::null(),
        srcDevice: 0,
        srcArray: std::ptr::null_mut(),
        srcPitch: 0,
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: device_type,
        dstHost: std::ptr::null_mut(),
        dstDevice: 0,
        dstArray: std::ptr::null_mut(),
        dstPitch: 0,
        WidthInBytes: width,
        Height: rows,
    };
    match dir {
        Direction::HostToDevice => {
            (p.srcHost, p.srcPitch) = (h as *const _, width);
            (p.dstDevice, p.dstPitch) = (d, device_pitch);
        }
        Direction::DeviceToHost => {
            (p.srcMemoryType, p.srcDevice, p.srcPitch) = (device_type, d, device_pitch);
            (p.dstMemoryType, p.dstHost, p.dstPitch) = (host_type, h as *mut _, width);
        }
    }
    // SAFETY: both ranges are in bounds (asserted above); the caller keeps
    // them alive and untouched until the stream is synchronised.
    unsafe { sys::cuMemcpy2DAsync_v2(&p, stream.cu_stream()) }.result()
}

/// Queues one copy of `len` bytes between `dev` at `device_offset` and
/// `host` at `host_offset` on `stream` (`cuMemcpyHtoDAsync` or
/// `cuMemcpyDtoHAsync`), without waiting. Bounds are asserted.
///
/// # Safety
/// As [`copy_rows_async`].
pub unsafe fn copy_async(
    dir: Direction,
    dev: &DeviceBuffer,
    device_offset: usize,
    host: &mut PinnedBuffer,
    host_offset: usize,
    len: usize,
    stream: &CudaStream,
) -> Result<(), DriverError> {
    assert!(
        device_offset + len <= dev.len(),
        "copy past the device buffer"
    );
    let h = host.at(host_offset, len);
    let d = dev.addr() + device_offset as u64;
    let s = stream.cu_stream();
    // SAFETY: in bounds (asserted); the caller keeps both sides alive and
    // untouched until the stream is synchronised.
    unsafe {
        match dir {
            Direction::HostToDevice => sys::cuMemcpyHtoDAsync_v2(d, h as *const _, len, s),
            Direction::DeviceToHost => sys::cuMemcpyDtoHAsync_v2(h as *mut _, d, len, s),
        }
    }
    .result()
}

/// Copies `out.len()` bytes of `dev` from `offset` into `out` and waits for
/// `stream` (so also for everything queued on it before). For one-off
/// reads; a loop batches through [`PinnedBuffer`] instead.
pub fn read_at(
    dev: &DeviceBuffer,
    offset: usize,
    out: &mut [u8],
    stream: &CudaStream,
) -> Result<(), DriverError> {
    assert!(
        offset + out.len() <= dev.len(),
        "read past the device buffer"
    );
    dev.context().bind_to_thread()?;
    // SAFETY: in bounds; `out` outlives the synchronisation below.
    unsafe {
        result::memcpy_dtoh_async(out, dev.addr() + offset as u64, stream.cu_stream())?;
    }
    stream.synchronize()
}

/// Copies `data` into `dev` at `offset` and waits for `stream` (so also for
/// everything queued on it before).
pub fn write_at(
    dev: &DeviceBuffer,
    offset: usize,
    data: &[u8],
    stream: &CudaStream,
) -> Result<(), DriverError> {
    assert!(
        offset + data.len() <= dev.len(),
        "write past the device buffer"
    );
    dev.context().bind_to_thread()?;
    // SAFETY: in bounds; `data` outlives the synchronisation below.
    unsafe {
        result::memcpy_htod_async(dev.addr() + offset as u64, data, stream.cu_stream())?;
    }
    stream.synchronize()
}
