//! Host memory that NIXL can register.

use nixl_sys::{MemType, MemoryRegion, NixlDescriptor};

/// A page-aligned, zero-initialised host (DRAM) buffer.
///
/// Page alignment matters to UCX's shared-memory and TCP transports, which
/// register whole pages; a `Vec<u8>` would do, but this keeps registrations
/// from sharing pages with unrelated heap data.
pub struct HostBuffer {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: HostBuffer owns its allocation exclusively, like Vec<u8>.
unsafe impl Send for HostBuffer {}
unsafe impl Sync for HostBuffer {}

const PAGE: usize = 4096;

impl HostBuffer {
    /// Allocates `len` bytes (≥ 1), zeroed.
    pub fn new(len: usize) -> Self {
        assert!(len > 0, "HostBuffer of 0 bytes");
        let layout = std::alloc::Layout::from_size_align(len, PAGE).expect("buffer size overflows");
        // SAFETY: layout has non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr =
            std::ptr::NonNull::new(ptr).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        Self { ptr, len }
    }

    /// The bytes, read as they are now. Remote writes land here behind
    /// Rust's back; read only after the transfer is known complete.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for len bytes for the life of self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// Mutable view, for filling before a transfer.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Address as NIXL descriptors carry it.
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.len, PAGE).unwrap();
        // SAFETY: allocated in new() with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) }
    }
}

impl std::fmt::Debug for HostBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HostBuffer({:#x}, {} B)", self.addr(), self.len)
    }
}

impl MemoryRegion for HostBuffer {
    unsafe fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }
    fn size(&self) -> usize {
        self.len
    }
}

impl NixlDescriptor for HostBuffer {
    fn mem_type(&self) -> MemType {
        MemType::Dram
    }
    fn device_id(&self) -> u64 {
        0
    }
}
