//! What the kernels of every program share on the host: the report every
//! kernel writes, the stream wait on a word, and the check of a memory
//! view's layout (the memory view element NIXL's device calls take is
//! [`crate::nixl::view::MemViewElem`], beside the views it indexes). Each
//! program's own kernel interface lives with the program
//! (`simple_write::kernels`, `ep::kernels`, `collectives::kernels`).

use std::mem::size_of;

use cudarc::driver::{CudaStream, DriverError};

pub use super::module::{KernelsError, availability};

/// What a kernel reports back (`KernelReport` in cuda/kernel_report.h). Times are
/// `%globaltimer` nanoseconds of the GPU that ran the kernel.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct KernelReport {
    /// When the timed iterations began (initiator) / warm-up ended (target).
    pub t_start_ns: u64,
    /// When the final acknowledgement (initiator) or signal (target) was seen; 0 if never.
    pub t_end_ns: u64,
    /// Last value the waiting thread read: the ack word (initiator) or the signal (target).
    pub observed: u64,
    /// NIXL device calls that returned an error.
    pub errors: u32,
    /// The first such `nixl_status_t` (e.g. −3 = `NIXL_ERR_BACKEND`).
    pub first_status: i32,
    /// 1 when a wait gave up at its deadline, 2 when the host cancelled it.
    pub timed_out: u32,
    /// Written (non-zero) by the host to stop a running wait early.
    pub cancel: u32,
}

// The layout contract with the kernels; a mismatch fails the build.
const _: () = {
    assert!(size_of::<KernelReport>() == 40);
};

/// Queues a wait on `stream` until the u64 at device address `addr` is at
/// least `value` (`cuStreamWaitValue64`, GEQ). Nothing runs on the GPU while
/// it waits; it has no timeout of its own, so whoever queues it must be
/// able to release it ([`crate::gpu::run::run_watched`] does, at its deadline).
///
/// # Safety
/// `addr` must be valid device memory until the wait completes.
pub unsafe fn wait_value_geq(
    stream: &CudaStream,
    addr: u64,
    value: u64,
) -> Result<(), DriverError> {
    unsafe {
        cudarc::driver::sys::cuStreamWaitValue64_v2(
            stream.cu_stream(),
            addr,
            value,
            cudarc::driver::sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32,
        )
        .result()
    }
}

/// The layout version of UCX's device memory lists that the kernels were
/// compiled against (`UCP_DEVICE_MEM_LIST_VERSION_V1`, passed by the build),
/// if they were built.
pub const MEM_LIST_VERSION: Option<&str> = option_env!("NIXL_UCX_MEM_LIST_VERSION");

/// The NIXL device header the kernels were compiled against
/// (`gpu/ucx/nixl_device.cuh` of NIXL 1.x, or the backend-neutral
/// `gpu/nixl_device.cuh` after it; passed by the build), if they were built.
pub const DEVICE_HEADER: Option<&str> = option_env!("NIXL_DEVICE_HEADER");

/// The header of a memory view's device memory list: layout version,
/// lanes per element, elements. Read once per view, on the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ViewHeader {
    pub version: u16,
    pub lanes: u16,
    pub elements: u32,
}

/// Kernels built against NIXL 1.x's UCX header (the others: `None`, nothing
/// read): reads the header of the memory list behind `view` (a device pointer,
/// on the current context's GPU) and fails unless its layout version is
/// the one the kernels were compiled against and it holds at least
/// `elements` elements. A mismatch means NIXL's bundled UCX lays the list
/// out differently from the UCX headers the kernels inline, and every
/// device call would misread it.
pub fn check_view(
    view: &nixl_sys::MemView,
    elements: u32,
    what: &str,
) -> anyhow::Result<Option<ViewHeader>> {
    // With the backend-neutral header a handle is NIXL's own wrapper, not
    // UCX's list: nothing of ours reads behind it (the library checks).
    if DEVICE_HEADER != Some("gpu/ucx/nixl_device.cuh") {
        return Ok(None);
    }
    let mut raw = [0u8; 8];
    // SAFETY: a prepared view's handle points at device memory holding at
    // least the 8-byte header; the copy is synchronous.
    unsafe { cudarc::driver::result::memcpy_dtoh_sync(&mut raw, view.as_ptr() as u64) }?;
    let h = ViewHeader {
        version: u16::from_le_bytes([raw[0], raw[1]]),
        lanes: u16::from_le_bytes([raw[2], raw[3]]),
        elements: u32::from_le_bytes([raw[4], raw[5], raw[6], raw[7]]),
    };
    let want: Option<u16> = MEM_LIST_VERSION.and_then(|v| v.parse().ok());
    if want.is_some_and(|w| w != h.version) {
        anyhow::bail!(
            "the memory view of {what} has UCX layout version {} but the kernels were compiled for {}: NIXL's \
             bundled UCX and the UCX device headers disagree; rebuild against headers of the UCX that NIXL \
             ships (UCX_INCLUDE_DIR)",
            h.version,
            MEM_LIST_VERSION.unwrap_or("?")
        );
    }
    if h.elements < elements {
        anyhow::bail!(
            "the memory view of {what} has {} element(s), expected {elements}",
            h.elements
        );
    }
    Ok(Some(h))
}
