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

/// What a copy-engine baseline measured, so every report can say it beside
/// the figure: the GPUs (this process's ordinals; equal when the copy stays
/// on one GPU), one direction, and whether the copy's working set fits in
/// L2 (then the rate is the cache's, not the link's or HBM's).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CopyPath {
    pub src_gpu: usize,
    pub dst_gpu: usize,
    /// Bytes per copy.
    pub bytes: u64,
    /// Bytes the copy touches on the source GPU (source, plus the
    /// destination when it is on the same GPU), against its L2.
    pub working_set_bytes: u64,
    /// `None`: the L2 size is unknown.
    pub fits_l2: Option<bool>,
}

impl CopyPath {
    /// A copy of `bytes` from GPU `src_gpu` to `dst_gpu`, the source GPU's L2
    /// `l2_bytes` (0: unknown).
    pub fn new(src_gpu: usize, dst_gpu: usize, bytes: u64, l2_bytes: u64) -> Self {
        let copies = if src_gpu == dst_gpu { 2 } else { 1 };
        let working_set_bytes = bytes.saturating_mul(copies);
        Self {
            src_gpu,
            dst_gpu,
            bytes,
            working_set_bytes,
            fits_l2: (l2_bytes > 0).then_some(working_set_bytes <= l2_bytes),
        }
    }

    /// Where the copy goes, e.g. `copy engine GPU 0 -> GPU 1 (peer copy,
    /// one direction)`.
    pub fn route(&self) -> String {
        Self::route_between(self.src_gpu, self.dst_gpu)
    }

    /// [`CopyPath::route`] of a copy from GPU `src` to GPU `dst`.
    pub fn route_between(src: usize, dst: usize) -> String {
        let how = if src == dst {
            "device-to-device copy on one GPU: no link crossed"
        } else {
            "peer copy, one direction"
        };
        format!("copy engine GPU {src} -> GPU {dst} ({how})")
    }

    /// One line for a report: the route, the size, and whether the working
    /// set fits in L2.
    pub fn describe(&self) -> String {
        let cache = match self.fits_l2 {
            Some(true) => "working set in L2",
            Some(false) => "working set larger than L2",
            None => "L2 size unknown",
        };
        format!("{}, {} B per copy, {cache}", self.route(), self.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::CopyPath;

    #[test]
    fn a_copy_between_two_gpus_names_both_and_one_direction() {
        let d = CopyPath::new(0, 1, 4 << 20, 50 << 20).describe();
        assert!(d.contains("GPU 0 -> GPU 1"), "{d}");
        assert!(d.contains("one direction"), "{d}");
        assert!(d.contains("in L2"), "{d}");
    }

    #[test]
    fn a_copy_on_one_gpu_says_it_crosses_no_link_and_counts_both_buffers() {
        let p = CopyPath::new(2, 2, 32 << 20, 50 << 20);
        assert_eq!(p.working_set_bytes, 64 << 20);
        assert_eq!(p.fits_l2, Some(false));
        assert!(p.describe().contains("no link crossed"));
    }
}
