//! Device memory that NIXL can register as VRAM.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream, DriverError, result, sys};
use nixl_sys::{MemType, MemoryRegion, NixlDescriptor};

/// `len` bytes of memory on one GPU, allocated with `cuMemAlloc` (never
/// managed memory) and freed on drop.
///
/// Raw rather than `cudarc::CudaSlice` because NIXL and a peer process write
/// into it behind the allocator's back, so cudarc's event tracking would
/// only get in the way; every copy here is followed by a stream sync.
pub struct DeviceBuffer {
    ptr: sys::CUdeviceptr,
    len: usize,
    ctx: Arc<CudaContext>,
}

// SAFETY: a device address is plain data; access goes through the driver.
unsafe impl Send for DeviceBuffer {}
unsafe impl Sync for DeviceBuffer {}

impl DeviceBuffer {
    /// Allocates `len` (≥ 1) zeroed bytes on `ctx`'s GPU; the zeroing is
    /// complete on return, so work queued on any stream afterwards sees it
    /// done.
    pub fn zeroed(ctx: &Arc<CudaContext>, len: usize) -> Result<Self, DriverError> {
        assert!(len > 0, "DeviceBuffer of 0 bytes");
        ctx.bind_to_thread()?;
        // SAFETY: context is current; the allocation is freed exactly once in Drop.
        let ptr = unsafe { result::malloc_sync(len)? };
        let buf = Self {
            ptr,
            len,
            ctx: ctx.clone(),
        };
        // Zeroed means zeroed when this returns. cuMemsetD8 would return
        // before its work is done (for device memory it is asynchronous to
        // the host) and queue it on the legacy default stream, which nothing
        // orders before our non-blocking streams: an upload right after the
        // allocation could land first and be zeroed afterwards (it was: ep's
        // tables read back as 0 with four ranks sharing one GPU under MPS).
        // So the zeroing goes on the legacy stream and we wait for that
        // stream alone; no other stream's work is waited for.
        // SAFETY: ptr is valid for len bytes; the null stream is the context's
        // legacy default stream, which always exists.
        unsafe {
            result::memset_d8_async(ptr, 0, len, std::ptr::null_mut())?;
            result::stream::synchronize(std::ptr::null_mut())?;
        }
        Ok(buf)
    }

    /// Device address (`CUdeviceptr`), as NIXL descriptors and kernels take it.
    pub fn addr(&self) -> u64 {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The context the memory belongs to.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// GPU ordinal, the descriptor's `devId`.
    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    /// Copies `data` (≤ len bytes) to the start of the buffer and waits.
    pub fn upload(&self, stream: &CudaStream, data: &[u8]) -> Result<(), DriverError> {
        assert!(data.len() <= self.len);
        self.ctx.bind_to_thread()?;
        // SAFETY: bounds checked above; the host slice outlives the sync.
        unsafe { result::memcpy_htod_async(self.ptr, data, stream.cu_stream())? };
        stream.synchronize()
    }

    /// Copies the first `out.len()` bytes into `out` and waits.
    pub fn download(&self, stream: &CudaStream, out: &mut [u8]) -> Result<(), DriverError> {
        assert!(out.len() <= self.len);
        self.ctx.bind_to_thread()?;
        // SAFETY: bounds checked above; the host slice outlives the sync.
        unsafe { result::memcpy_dtoh_async(out, self.ptr, stream.cu_stream())? };
        stream.synchronize()
    }

    /// The first 8 bytes as a little-endian `u64` (a signal, a counter), after
    /// the work queued on `stream`.
    pub fn read_u64(&self, stream: &CudaStream) -> Result<u64, DriverError> {
        let mut raw = [0u8; 8];
        self.download(stream, &mut raw)?;
        Ok(u64::from_le_bytes(raw))
    }

    /// The whole buffer as little-endian `u64`s (stamps, counters), after
    /// the work queued on `stream`; a trailing partial word is left out.
    pub fn read_u64s(&self, stream: &CudaStream) -> Result<Vec<u64>, DriverError> {
        let mut raw = vec![0u8; self.len];
        self.download(stream, &mut raw)?;
        Ok(raw
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect())
    }

    /// Sets every byte to zero and waits.
    pub fn zero(&self, stream: &CudaStream) -> Result<(), DriverError> {
        self.ctx.bind_to_thread()?;
        // SAFETY: ptr is valid for len bytes.
        unsafe { result::memset_d8_async(self.ptr, 0, self.len, stream.cu_stream())? };
        stream.synchronize()
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // Nothing useful to do with an error here: the process is tearing down.
        let _ = self.ctx.bind_to_thread();
        // SAFETY: allocated in zeroed(), freed once.
        let _ = unsafe { result::free_sync(self.ptr) };
    }
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceBuffer(GPU {}, {:#x}, {} B)",
            self.ordinal(),
            self.ptr,
            self.len
        )
    }
}

impl MemoryRegion for DeviceBuffer {
    unsafe fn as_ptr(&self) -> *const u8 {
        self.ptr as *const u8
    }
    fn size(&self) -> usize {
        self.len
    }
}

impl NixlDescriptor for DeviceBuffer {
    fn mem_type(&self) -> MemType {
        MemType::Vram
    }
    fn device_id(&self) -> u64 {
        self.ordinal() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::Gpu;

    /// A buffer is zero when `zeroed` returns, and stays what is uploaded
    /// into it after that. The zeroing must not land later: a large zeroing
    /// queued just before keeps a small one waiting behind it while the
    /// upload (on our stream) runs, and the context's sync then lets every
    /// queued zeroing finish before we read back. Without a GPU: SKIP.
    #[test]
    fn an_upload_right_after_allocation_is_not_zeroed_later() {
        let Ok(gpu) = Gpu::open(0) else {
            println!("SKIP: no GPU here");
            return;
        };
        let data: Vec<u8> = (0..4096u32).map(|i| (i % 251 + 1) as u8).collect();
        for round in 0..8 {
            let big = DeviceBuffer::zeroed(&gpu.ctx, 1 << 30).unwrap();
            let small = DeviceBuffer::zeroed(&gpu.ctx, data.len()).unwrap();
            small.upload(&gpu.stream, &data).unwrap();
            gpu.ctx.synchronize().unwrap();
            let mut back = vec![0u8; data.len()];
            small.download(&gpu.stream, &mut back).unwrap();
            let zeros = back.iter().filter(|&&b| b == 0).count();
            assert!(
                back == data,
                "round {round}: {zeros} of {} uploaded bytes read back as 0 (the allocation's zeroing landed after the upload)",
                data.len()
            );
            drop(big);
        }
    }
}
