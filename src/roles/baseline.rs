//! Same-run baselines for the device puts: what the copy engine and NIXL's
//! host API achieve between the same two buffers' GPUs, at the same size.
//!
//! - copy engine: `cuMemcpyPeerAsync` to a buffer on the target's GPU (peer
//!   access enabled first: without it the driver stages the copy through the
//!   host, REFERENCE §2 measured 38 GB/s instead of 396), or
//!   `cuMemcpyDtoDAsync` when both processes share a GPU; CUDA events around
//!   back-to-back copies, warm-up excluded;
//! - NIXL host API: a WRITE of the same bytes into the target's registered
//!   buffer through the initiator's agent (UCX picks cuda_ipc, which drives
//!   the copy engine), posted and completed `iters` times, timed on the host
//!   (so it carries per-transfer host overhead).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use cudarc::driver::{CudaContext, result, sys};
use nixl_sys::{Agent, XferOp};

use crate::gpu::{DeviceBuffer, Gpu};
use crate::nixl::serdes::{Desc, DescList, MemType};

/// Baselines measured for one size. Rates in GB/s (1e9 B/s).
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct Baselines {
    /// Copy engine, CUDA-event timed.
    pub copy_engine_gbps: Option<f64>,
    /// NIXL host-API WRITE, host timed.
    pub nixl_write_gbps: Option<f64>,
}

impl Baselines {
    /// The best of the two, the reference each device-put row is compared to.
    pub fn best(&self) -> Option<f64> {
        match (self.copy_engine_gbps, self.nixl_write_gbps) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }
}

/// Where copy-engine baselines copy to.
enum Destination {
    /// Another GPU of this process: its context and a buffer there.
    Peer {
        ctx: Arc<CudaContext>,
        buf: DeviceBuffer,
    },
    /// The initiator's own GPU (both processes share it).
    Local(DeviceBuffer),
}

/// Buffers for the baselines, allocated once for the largest size.
pub struct BaselineRig {
    /// Zeroed source of the NIXL WRITE: the target's buffer must never hold
    /// valid pattern data that a later round did not write.
    scratch: DeviceBuffer,
    dest: Destination,
    /// GPU ordinal the copy engine writes to, for the report.
    pub dest_gpu: usize,
}

impl BaselineRig {
    /// Allocates `size` bytes of scratch on the initiator's GPU and a
    /// destination on `target_gpu` (an ordinal of this process) — enabling
    /// peer access between the two — or on the initiator's GPU when they
    /// are the same.
    pub fn new(gpu: &Gpu, target_gpu: usize, size: usize) -> Result<Self> {
        let scratch = DeviceBuffer::zeroed(&gpu.ctx, size)?;
        let dest = if target_gpu == gpu.ordinal {
            Destination::Local(DeviceBuffer::zeroed(&gpu.ctx, size)?)
        } else {
            let peer = CudaContext::new(target_gpu)
                .context("opening a context on the target's GPU for the copy-engine baseline")?;
            let buf = DeviceBuffer::zeroed(&peer, size)?;
            enable_peer_access(&gpu.ctx, &peer)?;
            enable_peer_access(&peer, &gpu.ctx)?;
            gpu.bind()?;
            Destination::Peer { ctx: peer, buf }
        };
        Ok(Self {
            scratch,
            dest,
            dest_gpu: target_gpu,
        })
    }

    /// Copy-engine rate for `size` bytes from `src`, GB/s.
    pub fn copy_engine(
        &self,
        gpu: &Gpu,
        src: &DeviceBuffer,
        size: usize,
        iters: u32,
    ) -> Result<f64> {
        gpu.bind()?;
        let s = gpu.stream.cu_stream();
        let copy = || -> Result<()> {
            // SAFETY: both buffers hold at least `size` bytes and outlive the sync below.
            unsafe {
                match &self.dest {
                    Destination::Peer { ctx, buf } => sys::cuMemcpyPeerAsync(
                        buf.addr(),
                        ctx.cu_ctx(),
                        src.addr(),
                        gpu.ctx.cu_ctx(),
                        size,
                        s,
                    )
                    .result()?,
                    Destination::Local(buf) => {
                        result::memcpy_dtod_async(buf.addr(), src.addr(), size, s)?
                    }
                }
            }
            Ok(())
        };
        for _ in 0..2 {
            copy()?;
        }
        let timing = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = gpu.stream.record_event(timing)?;
        for _ in 0..iters {
            copy()?;
        }
        let end = gpu.stream.record_event(timing)?;
        let ms = start.elapsed_ms(&end)? as f64;
        Ok(size as f64 * iters as f64 / (ms * 1e6))
    }

    /// NIXL host-API WRITE rate for `size` bytes into `remote` (the target's
    /// data buffer, owned by agent `target`), GB/s, host timed.
    pub fn nixl_write(
        &self,
        agent: &Agent,
        remote: &DescList,
        target: &str,
        size: usize,
        iters: u32,
        timeout: Duration,
    ) -> Result<f64> {
        let local = DescList::new(
            MemType::Vram,
            vec![Desc {
                addr: self.scratch.addr(),
                len: size as u64,
                dev_id: self.scratch.ordinal() as u64,
            }],
        );
        let d = remote.descs[0];
        let remote = DescList::new(
            MemType::Vram,
            vec![Desc {
                len: size as u64,
                ..d
            }],
        );
        let req = agent
            .create_xfer_req(
                XferOp::Write,
                &local.to_xfer_dlist()?,
                &remote.to_xfer_dlist()?,
                target,
                None,
            )
            .context("creating the NIXL WRITE baseline request")?;
        let run = |n: u32| -> Result<Duration> {
            let start = Instant::now();
            for _ in 0..n {
                crate::nixl::xfer::post_and_wait(agent, &req, "the NIXL WRITE baseline", timeout)?;
            }
            Ok(start.elapsed())
        };
        run(2)?;
        let t = run(iters)?;
        Ok(size as f64 * iters as f64 / t.as_nanos() as f64)
    }

    /// The scratch buffer, which must be registered with the agent for the
    /// NIXL WRITE.
    pub fn scratch(&self) -> &DeviceBuffer {
        &self.scratch
    }
}

fn enable_peer_access(from: &Arc<CudaContext>, to: &Arc<CudaContext>) -> Result<()> {
    from.bind_to_thread()?;
    // SAFETY: both contexts are live; enabling twice is reported, not harmful.
    let r = unsafe { sys::cuCtxEnablePeerAccess(to.cu_ctx(), 0) };
    match r {
        sys::CUresult::CUDA_SUCCESS | sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => {
            Ok(())
        }
        other => bail!(
            "cannot enable peer access from GPU {} to GPU {} ({other:?}): the copy-engine baseline would be staged through \
             the host and not comparable",
            from.ordinal(),
            to.ordinal()
        ),
    }
}

/// Iterations for the copy-engine baseline: about a quarter second at
/// 400 GB/s, between 5 and 1000.
pub fn ce_iters(size: u64) -> u32 {
    (0.25 * 400e9 / size.max(1) as f64).clamp(5.0, 1000.0) as u32
}

/// Iterations for the NIXL WRITE baseline: fewer, each carries host round trips.
pub fn nixl_iters(size: u64) -> u32 {
    (0.1 * 400e9 / size.max(1) as f64).clamp(3.0, 200.0) as u32
}

/// The ordinal of the GPU whose UUID is `uuid` (as [`uuid_string`] prints
/// it), among this process's visible GPUs.
pub fn find_gpu(uuid: &str) -> Option<usize> {
    let n = crate::gpu::context::device_count().ok()?;
    // Device handles, not contexts: a context would take memory on every GPU.
    (0..n).find(|&i| {
        result::device::get(i as i32)
            .ok()
            .and_then(|d| result::device::get_uuid(d).ok())
            .map(|u| uuid_string(&u))
            .as_deref()
            == Some(uuid)
    })
}

/// A GPU UUID as lowercase hex.
pub fn uuid_string(u: &sys::CUuuid) -> String {
    u.bytes
        .iter()
        .map(|b| format!("{:02x}", *b as u8))
        .collect()
}
