//! The copy engine, as the baseline every device put is compared with.
//!
//! Two things the driver does not do for you: peer access must be enabled
//! before a copy between two GPUs, or the driver stages it through host
//! memory (measured on two H200s: 38 GB/s instead of 396); and a copy
//! queued on a stream returns at once, so its time is read from events.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream, DriverError, result, sys};

use super::DeviceBuffer;

/// Lets kernels and copies on `from`'s GPU reach memory on `to`'s GPU
/// (`cuCtxEnablePeerAccess`). Enabling it twice is not an error.
///
/// Errors: the GPUs cannot reach each other (no NVLink or PCIe P2P).
pub fn enable_peer_access(
    from: &Arc<CudaContext>,
    to: &Arc<CudaContext>,
) -> Result<(), PeerAccessError> {
    from.bind_to_thread().map_err(|e| PeerAccessError {
        from: from.ordinal(),
        to: to.ordinal(),
        why: e.to_string(),
    })?;
    // SAFETY: both contexts are live.
    let r = unsafe { sys::cuCtxEnablePeerAccess(to.cu_ctx(), 0) };
    match r {
        sys::CUresult::CUDA_SUCCESS | sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => {
            Ok(())
        }
        other => Err(PeerAccessError {
            from: from.ordinal(),
            to: to.ordinal(),
            why: format!("{other:?}"),
        }),
    }
}

/// Peer access could not be enabled.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot enable peer access from GPU {from} to GPU {to} ({why}): a copy between them would be staged \
     through the host and not comparable"
)]
pub struct PeerAccessError {
    pub from: usize,
    pub to: usize,
    pub why: String,
}

/// Queues a copy of `len` bytes from `src` to `dst` on `stream`: a peer
/// copy (`cuMemcpyPeerAsync`) when they live on different GPUs, else a
/// device-to-device copy. Both must hold `len` bytes.
pub fn copy_async(
    dst: &DeviceBuffer,
    src: &DeviceBuffer,
    len: usize,
    stream: &CudaStream,
) -> Result<(), DriverError> {
    assert!(len <= dst.len() && len <= src.len());
    // SAFETY: both buffers are live and hold `len` bytes; the caller keeps
    // them alive until the stream is synchronized.
    unsafe {
        if dst.ordinal() == src.ordinal() {
            result::memcpy_dtod_async(dst.addr(), src.addr(), len, stream.cu_stream())
        } else {
            result::memcpy_peer_async(
                dst.context().cu_ctx(),
                dst.addr(),
                src.context().cu_ctx(),
                src.addr(),
                len,
                stream.cu_stream(),
            )
        }
    }
}

/// Copy-engine rate for `len` bytes from `src` to `dst`, GB/s (1e9 B/s):
/// two untimed copies, then `iters` back-to-back copies between CUDA events
/// on `stream`.
pub fn copy_rate(
    dst: &DeviceBuffer,
    src: &DeviceBuffer,
    len: usize,
    iters: u32,
    stream: &Arc<CudaStream>,
) -> Result<f64, DriverError> {
    for _ in 0..2 {
        copy_async(dst, src, len, stream)?;
    }
    let timing = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
    let start = stream.record_event(timing)?;
    for _ in 0..iters {
        copy_async(dst, src, len, stream)?;
    }
    let end = stream.record_event(timing)?;
    let ms = start.elapsed_ms(&end)? as f64;
    Ok(len as f64 * iters as f64 / (ms * 1e6))
}
